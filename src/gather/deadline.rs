//! Deadlines for vendor library calls. A GPU that fell off the bus can make an
//! NVML or CUDA call block for minutes; a preflight that hangs is worse than
//! none. The calls run on a worker thread that announces each call to a
//! `Watch`; the caller waits, and gives up as soon as one call has run longer
//! than the deadline, naming it. The worker is abandoned (it cannot be
//! cancelled); `Hung` tells the caller to leave the process with `_exit`, so
//! no library destructor runs against the stuck thread.

use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// The call in progress on a worker thread.
#[derive(Debug, Default)]
pub struct Watch {
    current: Mutex<Option<(String, Instant)>>,
    /// Print every call's duration to standard error (`--trace`).
    trace: bool,
}

impl Watch {
    /// Runs `f` as the call `name`, visible to the waiting thread while it runs.
    pub fn call<T>(&self, name: impl Into<String>, f: impl FnOnce() -> T) -> T {
        /// Clears the slot when the call ends, by return or by panic: a call
        /// that panicked is over, not hung.
        struct Done<'a>(&'a Watch);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                if self.0.trace {
                    let slot = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some((name, started)) = slot.as_ref() {
                        eprintln!(
                            "nccl-preflight: trace: {name}: {:.3} ms",
                            started.elapsed().as_secs_f64() * 1e3
                        );
                    }
                }
                self.0.set(None);
            }
        }
        self.set(Some((name.into(), Instant::now())));
        let _done = Done(self);
        f()
    }

    fn set(&self, value: Option<(String, Instant)>) {
        // A poisoned lock only means another call panicked; the slot is still usable.
        let mut slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        *slot = value;
    }

    fn overdue(&self, deadline: Duration) -> Option<(String, Duration)> {
        let slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref()
            .filter(|(_, started)| started.elapsed() > deadline)
            .map(|(name, started)| (name.clone(), started.elapsed()))
    }
}

/// A call that did not return within the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hung {
    pub call: String,
    pub waited: Duration,
}

impl std::fmt::Display for Hung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} did not return within {:.1} s",
            self.call,
            self.waited.as_secs_f64()
        )
    }
}

/// Runs `job` on a worker thread; each call it makes through the `Watch` may
/// take at most `deadline`.
pub fn run<T: Send + 'static>(
    name: &str,
    deadline: Duration,
    trace: bool,
    job: impl FnOnce(&Watch) -> T + Send + 'static,
) -> Result<T, Hung> {
    let watch = Arc::new(Watch {
        current: Mutex::default(),
        trace,
    });
    let (tx, rx) = mpsc::channel();
    let worker_watch = Arc::clone(&watch);
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tx.send(job(&worker_watch));
        });
    if let Err(e) = spawned {
        return Err(Hung {
            call: format!("starting the {name} thread ({e})"),
            waited: Duration::ZERO,
        });
    }
    let tick = (deadline / 10).clamp(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        match rx.recv_timeout(tick) {
            Ok(value) => return Ok(value),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some((call, waited)) = watch.overdue(deadline) {
                    return Err(Hung { call, waited });
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Hung {
                    call: format!(
                        "the {name} thread (it ended without a result: a panic in a vendor call)"
                    ),
                    waited: Duration::ZERO,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_results_and_names_the_hung_call() {
        let ok = run("t", Duration::from_millis(200), false, |w| {
            w.call("quick", || 1) + w.call("quick too", || 2)
        });
        assert_eq!(ok, Ok(3));
        let started = Instant::now();
        let hung = run("t", Duration::from_millis(100), false, |w| {
            w.call("fast", || ());
            w.call("nvmlDeviceGetP2PStatus(0, 1)", || {
                std::thread::sleep(Duration::from_secs(30))
            });
        })
        .unwrap_err();
        assert_eq!(hung.call, "nvmlDeviceGetP2PStatus(0, 1)");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(hung.to_string().contains("did not return within"));
    }

    #[test]
    fn slow_work_between_calls_is_not_a_hang_but_a_panic_is_reported() {
        let ok = run("t", Duration::from_millis(50), true, |w| {
            std::thread::sleep(Duration::from_millis(120));
            w.call("after", || 7)
        });
        assert_eq!(ok, Ok(7));
        let err = run("t", Duration::from_secs(5), false, |w| -> u32 {
            w.call("boom", || panic!("vendor"))
        })
        .unwrap_err();
        assert!(err.call.contains("panic"), "{err}");
    }
}
