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
                        crate::diagnostic::line(format_args!(
                            "nccl-preflight: trace: {name}: {:.3} ms",
                            started.elapsed().as_secs_f64() * 1e3
                        ));
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

    /// The call that has run longer than `deadline`, if any.
    fn overdue(&self, deadline: Duration) -> Option<String> {
        let slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref()
            .filter(|(_, started)| started.elapsed() > deadline)
            .map(|(name, _)| name.clone())
    }
}

/// A call that did not return within the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hung {
    pub call: String,
    /// The deadline the call overran (zero when the worker never ran). Not the time
    /// measured: that varies from run to run ("1.0 s", "1.1 s" on a loaded machine)
    /// and these texts reach reports and golden files.
    pub deadline: Duration,
    /// The worker thread could not be started (this process's own thread or address-space
    /// limit): nothing is stuck in a driver.
    pub not_started: bool,
}

impl std::fmt::Display for Hung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} did not return within {:.1} s",
            self.call,
            self.deadline.as_secs_f64()
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
            deadline: Duration::ZERO,
            not_started: true,
        });
    }
    let tick = (deadline / 10).clamp(Duration::from_millis(1), Duration::from_millis(50));
    loop {
        match rx.recv_timeout(tick) {
            Ok(value) => return Ok(value),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(call) = watch.overdue(deadline) {
                    return Err(Hung {
                        call,
                        deadline,
                        not_started: false,
                    });
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Hung {
                    call: format!(
                        "the {name} thread (it ended without a result: a panic in a vendor call)"
                    ),
                    deadline: Duration::ZERO,
                    not_started: false,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_hung_call_with_the_deadline_not_the_time_measured() {
        let ok = run("t", Duration::from_secs(60), false, |w| {
            w.call("quick", || 1) + w.call("quick too", || 2)
        });
        assert_eq!(ok, Ok(3));
        // The hung call waits for a release the test sends only after `run` has
        // returned (or 120 s, a hang guard): `run` came back while the call was
        // still blocked, so the deadline ended the wait, not the call. No time is
        // asserted.
        let (release, released) = mpsc::channel::<()>();
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::clone(&finished);
        let hung = run("t", Duration::from_millis(100), false, move |w| {
            w.call("fast", || ());
            w.call("nvmlDeviceGetP2PStatus(0, 1)", || {
                let _ = released.recv_timeout(Duration::from_secs(120));
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
            });
        })
        .unwrap_err();
        assert!(
            !finished.load(std::sync::atomic::Ordering::SeqCst),
            "run returned only after the hung call did"
        );
        let _ = release.send(());
        assert_eq!(hung.call, "nvmlDeviceGetP2PStatus(0, 1)");
        // The deadline, not the time measured, which varies with the machine's load.
        assert_eq!(hung.deadline, Duration::from_millis(100));
        assert_eq!(
            hung.to_string(),
            "nvmlDeviceGetP2PStatus(0, 1) did not return within 0.1 s"
        );
    }

    #[test]
    fn slow_work_between_calls_is_not_a_hang_but_a_panic_is_reported() {
        let ok = run("t", Duration::from_millis(500), true, |w| {
            std::thread::sleep(Duration::from_millis(1200));
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
