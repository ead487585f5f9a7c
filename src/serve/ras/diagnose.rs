//! `POST /job/diagnose`: NCCL's RAS diagnostics (2.31+) run on demand through the RAS
//! port's `DIAGNOSTICS` command, and judged (`nccl::ras_diagnostics`).
//!
//! The command, recorded from real NCCL 2.32.3 (tests/data/ras/gpu-h200x4-2.32.3/): after
//! the `CLIENT PROTOCOL 2` handshake, `DIAGNOSTICS` (no argument: `DIAGNOSTICS all` is
//! `ERROR: Unknown command`) returns the `NCCL DIAG` lines and closes, 4 to 33 ms on 2
//! ranks; under `SET FORMAT json` it answers `ERROR: diagnostics only supports text
//! output`; while a run is in flight, `BUSY: diagnostics already in progress` (string of
//! 2.32.3's libnccl.so.2). Older servers answer `ERROR: Unknown command DIAGNOSTICS`.
//!
//! Bounded as STATUS is (client.rs: 2 s connect and handshake, 12 s and 16 MiB for the
//! reply), one run at a time, and at most one start per `MIN_GAP`: a probe or a script
//! looping on the endpoint cannot turn NCCL's RAS thread into a diagnostics loop. The
//! request's own thread waits for the run; /healthz and the watcher are never behind it.

use super::client;
use crate::nccl::ras_diagnostics::{self, Diagnostics};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two starts.
pub const MIN_GAP: Duration = Duration::from_secs(30);

/// Runs one at a time, at most one start per `MIN_GAP`.
#[derive(Default)]
pub struct Gate {
    /// When the last run started, and whether it is still running.
    last: Mutex<Option<(Instant, bool)>>,
}

impl Gate {
    /// Takes the gate, or says how long to wait (whole seconds, at least 1).
    fn enter(&self, now: Instant) -> Result<(), u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match *last {
            Some((_, true)) => Err(1),
            Some((at, false)) if now.duration_since(at) < MIN_GAP => {
                Err((MIN_GAP - now.duration_since(at)).as_secs().max(1))
            }
            _ => {
                *last = Some((now, true));
                Ok(())
            }
        }
    }

    fn leave(&self) {
        if let Some((_, running)) = self.last.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            *running = false;
        }
    }
}

/// A whole one-line refusal. NCCL closes after `ERROR: diagnostics only supports text
/// output` but not after `ERROR: Unknown command` (2.30 and older, *recorded* on 2.32.3
/// with an argument): without this the read would wait for its whole bound.
fn refused(reply: &[u8]) -> bool {
    (reply.starts_with(b"ERROR:") || reply.starts_with(b"BUSY:")) && reply.contains(&b'\n')
}

/// One `DIAGNOSTICS` query: the reply's lines, or why there is none.
pub fn query(addr: &str) -> Result<Diagnostics, String> {
    let mut session = match client::connect(addr) {
        Ok(s) => s,
        Err(None) => {
            return Err(format!(
                "nothing listens on {addr}: is the trainer's NCCL up?"
            ));
        }
        Err(Some(e)) => return Err(e),
    };
    session.handshake()?;
    let reply = session.command_reply("DIAGNOSTICS", refused)?;
    Ok(ras_diagnostics::parse(&reply))
}

/// The answer of `POST /job/diagnose`: 200 with the judged diagnostics as JSON; 404 when
/// not watching; 409 when the trainer's NCCL is known to lack them; 429 while a run is in
/// flight or within `MIN_GAP` of the last; 502 when RAS did not answer or refused.
pub fn respond(
    gate: &Gate,
    addr: &str,
    nccl_version: Option<&str>,
    run: &dyn Fn(&str) -> Result<Diagnostics, String>,
) -> super::super::http::Response {
    use super::super::http::Response;
    let first = crate::nccl::version::RAS_DIAGNOSTICS;
    if let Some(v) = nccl_version.and_then(crate::nccl::Version::parse)
        && v < first
    {
        return Response::text(
            409,
            format!("NCCL {v} has no RAS diagnostics (NCCL {first} and later)\n"),
        );
    }
    if let Err(wait) = gate.enter(Instant::now()) {
        return Response::text(
            429,
            format!(
                "diagnostics ran less than {} s ago or are running: retry in {wait} s\n",
                MIN_GAP.as_secs()
            ),
        );
    }
    let result = run(addr);
    gate.leave();
    match result {
        Err(why) => Response::text(
            502,
            format!("RAS diagnostics: {}\n", super::reply::safe(&why)),
        ),
        Ok(d) if d.lines.is_empty() => {
            let why = d
                .refused
                .as_deref()
                .unwrap_or("no NCCL DIAG lines in the reply");
            // An NCCL without the command (its version not known yet), or NCCL's own
            // one-at-a-time refusal.
            let status = match why {
                w if w.starts_with("ERROR: Unknown command") => 409,
                w if w.starts_with("BUSY:") => 429,
                _ => 502,
            };
            Response::text(status, format!("RAS diagnostics: {why}\n"))
        }
        Ok(d) => {
            let body = serde_json::json!({
                "finding": d.finding("on demand"),
                "diagnostics": d,
            });
            Response {
                status: 200,
                content_type: "application/json",
                body: serde_json::to_string_pretty(&body).unwrap_or_default() + "\n",
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_lets_one_run_at_a_time_and_one_start_per_gap() {
        let gate = Gate::default();
        let t0 = Instant::now();
        assert_eq!(gate.enter(t0), Ok(()));
        assert_eq!(gate.enter(t0), Err(1), "running");
        gate.leave();
        let wait = gate.enter(t0 + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, 20);
        assert_eq!(gate.enter(t0 + MIN_GAP), Ok(()));
    }

    #[test]
    fn an_old_nccl_is_refused_before_asking_and_a_failure_is_502() {
        let gate = Gate::default();
        let never = |_: &str| -> Result<Diagnostics, String> { panic!("asked") };
        assert_eq!(respond(&gate, "x:1", Some("2.30.7"), &never).status, 409);
        let fails = |_: &str| Err("no whole reply within 12 s (0 bytes came)".to_string());
        let r = respond(&gate, "x:1", Some("2.32.3"), &fails);
        assert_eq!(r.status, 502, "{}", r.body);
        assert_eq!(respond(&gate, "x:1", None, &fails).status, 429);
        for (answer, status) in [
            ("ERROR: Unknown command DIAGNOSTICS\n", 409),
            ("BUSY: diagnostics already in progress\n", 429),
            ("ERROR: diagnostics only supports text output\n", 502),
        ] {
            let gate = Gate::default();
            let refusal = |_: &str| Ok(ras_diagnostics::parse(answer));
            let r = respond(&gate, "x:1", None, &refusal);
            assert_eq!(r.status, status, "{answer}: {}", r.body);
            assert!(refused(answer.as_bytes()));
        }
        assert!(
            !refused(b"ERROR: Unknown comm"),
            "a refusal is whole at its line's end"
        );
    }
}
