//! XID events while `serve` runs: NVML's critical XID error events on every GPU,
//! counted per GPU and XID code. A watcher thread of its own waits on the event set
//! (1 s at a time), so a request never waits on it. Its NVML calls run under the
//! same deadline as every other vendor call (vendor::deadline, `--timeout`): a wait
//! that does not come back ends the watch and fails `gpu-xid`, instead of leaving
//! the watcher stuck while the pod looks healthy.
//!
//! Which XIDs fail readiness: those whose immediate action in NVIDIA's Xid catalog
//! (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution Bucket
//! (Immediate Action)") is a GPU reset or a restart of the machine: the GPU runs no
//! new work until then, so readiness stays failed until this process restarts (a
//! reset needs the GPU's processes gone, this one included). Every other XID
//! (RESTART_APP, IGNORE, the WORKFLOW_* ones whose outcome is GPU state) is counted,
//! and each event makes the checks run again at once, so the state it leaves (the
//! driver's recovery action, ECC, row remapping, NVLink state) is judged within one
//! run instead of one interval.

use crate::judge::Finding;
use crate::vendor::deadline::Watch;
use crate::vendor::dl::LoadError;
use crate::vendor::nvml::{EventSet, EventTypes, Nvml, NvmlError, XidError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// XIDs whose immediate action in NVIDIA's Xid catalog (revision of October 2025) is
/// RESET_GPU, RESTART_BM or RESTART_VM: code, the catalog's description, the action.
pub const NOT_READY: &[(u64, &str, &str)] = &[
    (46, "GPU stopped processing", "RESET_GPU"),
    (62, "internal micro-controller halt", "RESET_GPU"),
    (64, "GPU memory remapping failure", "RESET_GPU"),
    (79, "GPU has fallen off the bus", "RESTART_BM"),
    (95, "uncontained memory error", "RESET_GPU"),
    (109, "context switch timeout error", "RESET_GPU"),
    (110, "security fault error", "RESET_GPU"),
    (119, "GSP RPC timeout", "RESET_GPU"),
    (120, "GSP error", "RESET_GPU"),
    (136, "link training failed", "RESET_GPU"),
    (140, "ECC unrecovered error", "RESET_GPU"),
    (143, "GPU initialization error", "RESET_GPU"),
    (151, "key rotation error", "RESTART_VM"),
    (155, "NVLink SW defined error", "RESET_GPU"),
    (156, "resource retirement event", "RESET_GPU"),
    (158, "GPU fatal timeout", "RESET_GPU"),
];

pub const ID: &str = crate::finding::ids::GPU_XID;

/// Which XID codes fail readiness: the catalog's, plus `--xid-not-ready`, less `--xid-ignore`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    not_ready: BTreeSet<u64>,
}

impl XidPolicy {
    pub fn new(add: &[u64], ignore: &[u64]) -> Self {
        let mut not_ready: BTreeSet<u64> = NOT_READY.iter().map(|(code, ..)| *code).collect();
        not_ready.extend(add);
        for code in ignore {
            not_ready.remove(code);
        }
        XidPolicy { not_ready }
    }
}

/// What to do when an NVML call of the watcher did not return.
const HUNG_FIX: &str = "A GPU or the driver is hung: look for Xid errors (dmesg | grep -i xid) and drain the node; a reboot usually clears it.";

/// The catalog's words for a code that fails readiness, or the user's flag.
fn described(code: u64) -> (&'static str, &'static str) {
    NOT_READY
        .iter()
        .find(|(c, ..)| *c == code)
        .map(|(_, what, action)| (*what, *action))
        .unwrap_or(("named by --xid-not-ready", "RESET_GPU"))
}

/// The `gpu-xid` finding: fail when a GPU reported an XID that fails readiness.
pub fn finding(xids: &Xids, policy: &XidPolicy) -> Finding {
    let events: u64 = xids.counts.values().sum();
    let mut fatal = Vec::new();
    let mut evidence = Vec::new();
    let mut reboot = false;
    let mut to_reset = BTreeSet::new();
    for (&(gpu, code), &n) in &xids.counts {
        let gpu = if gpu == u32::MAX {
            String::from("?")
        } else {
            gpu.to_string()
        };
        if policy.not_ready.contains(&code) {
            let (what, action) = described(code);
            reboot |= action != "RESET_GPU";
            to_reset.insert(gpu.clone());
            fatal.push(format!("GPU {gpu}: XID {code} ({what}; {action}) x{n}"));
        } else {
            evidence.push(format!("GPU {gpu}: XID {code} x{n}, counted, not judged"));
        }
    }
    if !fatal.is_empty() {
        let fix = if reboot {
            String::from(
                "Drain the node and reboot it (NVIDIA's Xid catalog: RESTART_BM / RESTART_VM);\n\
                 see dmesg | grep -i xid and nvidia-smi -q.",
            )
        } else {
            let gpus: Vec<String> = to_reset.into_iter().collect();
            format!(
                "Drain the node, stop every process on the GPU and reset it: nvidia-smi -r -i {}\n\
                 (NVIDIA's Xid catalog: RESET_GPU). Readiness stays failed until this pod restarts.",
                gpus.join(",")
            )
        };
        let mut f = Finding::fail(ID, fatal.join("; "), fix);
        f.evidence = evidence;
        return f;
    }
    if fatal.is_empty()
        && let Some(hung) = &xids.hung
    {
        let mut f = Finding::fail(ID, format!("XID watch: {hung}"), HUNG_FIX);
        f.evidence = evidence;
        return f;
    }
    if !xids.watching && events == 0 {
        return Finding::skip(
            ID,
            format!(
                "XID events not watched: {}",
                xids.unavailable
                    .as_deref()
                    .unwrap_or("the watcher has not started")
            ),
        );
    }
    let mut f = Finding::pass(
        ID,
        if events == 0 {
            String::from("no critical XID events since this server started")
        } else {
            format!("{events} XID event(s), none that needs a GPU reset or a reboot")
        },
    );
    f.evidence = evidence;
    if let Some(why) = &xids.unavailable {
        f.evidence.push(format!("XID watch stopped: {why}"));
    }
    f
}

/// What the watcher has seen.
#[derive(Debug, Clone, Default)]
pub struct Xids {
    /// Events per (NVML GPU index, XID code); code 0 when NVML gave none.
    pub counts: BTreeMap<(u32, u64), u64>,
    /// Set while events are being watched.
    pub watching: bool,
    /// Why they are not (no NVML, events unsupported, ...).
    pub unavailable: Option<String>,
    /// The NVML call that did not return within the deadline, which ended the watch.
    pub hung: Option<String>,
}

fn register<'n>(w: &Watch, nvml: &'n Nvml) -> Result<EventSet<'n>, String> {
    let mut set = w
        .call("nvmlEventSetCreate", || nvml.create_event_set())
        .map_err(|e| format!("nvmlEventSetCreate: {e}"))?;
    let count = w
        .call("nvmlDeviceGetCount", || nvml.device_count())
        .map_err(|e| format!("nvmlDeviceGetCount: {e}"))?;
    for index in 0..count {
        let device = w
            .call(format!("nvmlDeviceGetHandleByIndex({index})"), || {
                nvml.device_by_index(index)
            })
            .map_err(|e| format!("GPU {index}: {e}"))?;
        set = w
            .call(format!("nvmlDeviceRegisterEvents({index})"), || {
                device.register_events(EventTypes::CRITICAL_XID_ERROR, set)
            })
            .map_err(|e| format!("nvmlDeviceRegisterEvents(GPU {index}): {}", e.error))?;
    }
    Ok(set)
}

/// How long one event wait lasts: 1 s, or half the deadline when that is shorter,
/// so a wait that ends on time never looks hung.
fn wait_ms(deadline: Duration) -> u32 {
    let half = deadline.as_millis() / 2;
    u32::try_from(half.clamp(1, 1000)).unwrap_or(1000)
}

/// Watches until `stop` is set. Runs on its own thread; the NVML calls run on a
/// worker under `deadline` each. When one does not return, the worker is abandoned
/// (it cannot be cancelled), `hung` names the call, and this returns.
pub fn watch(
    library: &str,
    deadline: Duration,
    state: &Arc<Mutex<Xids>>,
    stop: &'static AtomicBool,
) {
    let job = {
        let (library, state) = (library.to_string(), Arc::clone(state));
        move |w: &Watch| watch_events(w, &library, deadline, &state, stop)
    };
    if let Err(hung) = crate::vendor::deadline::run("xid-nvml", deadline, false, job) {
        let mut xids = state.lock().unwrap_or_else(|p| p.into_inner());
        xids.watching = false;
        xids.hung = Some(hung.to_string());
    }
}

fn watch_events(
    w: &Watch,
    library: &str,
    deadline: Duration,
    state: &Mutex<Xids>,
    stop: &AtomicBool,
) {
    let set_state = |f: &dyn Fn(&mut Xids)| f(&mut state.lock().unwrap_or_else(|p| p.into_inner()));
    let nvml = match crate::vendor::nvml::init(w, library) {
        Ok(n) => n,
        Err(LoadError::Missing(why)) => {
            return set_state(&|x| x.unavailable = Some(format!("NVML: {why}")));
        }
        Err(LoadError::Failed(e)) => {
            return set_state(&|x| x.unavailable = Some(format!("NVML: {e}")));
        }
    };
    let set = match register(w, &nvml) {
        Ok(s) => s,
        Err(why) => return set_state(&|x| x.unavailable = Some(why.clone())),
    };
    set_state(&|x| x.watching = true);
    let timeout = wait_ms(deadline);
    let call = format!("nvmlEventSetWait({timeout} ms)");
    while !stop.load(Ordering::Relaxed) {
        match w.call(call.as_str(), || set.wait(timeout)) {
            Ok(event) => {
                let gpu = w
                    .call("nvmlDeviceGetIndex", || event.device.index())
                    .unwrap_or(u32::MAX);
                let code = match event.event_data {
                    Some(XidError::Value(v)) => v,
                    _ => 0,
                };
                set_state(&|x| *x.counts.entry((gpu, code)).or_insert(0) += 1);
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                let why = format!("nvmlEventSetWait: {e}");
                return set_state(&|x| {
                    x.watching = false;
                    x.unavailable = Some(why.clone());
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;

    fn seen(events: &[(u32, u64, u64)]) -> Xids {
        Xids {
            counts: events.iter().map(|&(g, c, n)| ((g, c), n)).collect(),
            watching: true,
            unavailable: None,
            hung: None,
        }
    }

    #[test]
    fn reset_and_reboot_xids_fail_and_application_xids_are_counted() {
        let policy = XidPolicy::new(&[], &[]);
        let quiet = finding(&seen(&[]), &policy);
        assert_eq!(
            (quiet.status(), quiet.summary.as_str()),
            (
                Status::Pass,
                "no critical XID events since this server started"
            )
        );
        // 13 (graphics engine exception) and 94 (contained ECC) are RESTART_APP.
        let app = finding(&seen(&[(0, 13, 4), (1, 94, 1)]), &policy);
        assert_eq!(app.status(), Status::Pass);
        assert_eq!(
            app.summary,
            "5 XID event(s), none that needs a GPU reset or a reboot"
        );
        assert_eq!(app.evidence.len(), 2);
        let fallen = finding(&seen(&[(0, 13, 1), (2, 79, 2)]), &policy);
        assert_eq!(fallen.status(), Status::Fail);
        assert_eq!(
            fallen.summary,
            "GPU 2: XID 79 (GPU has fallen off the bus; RESTART_BM) x2"
        );
        assert!(fallen.remediation().unwrap().contains("reboot"));
        let gsp = finding(&seen(&[(1, 119, 1)]), &policy);
        assert_eq!(gsp.status(), Status::Fail);
        assert!(gsp.remediation().unwrap().contains("nvidia-smi -r -i 1\n"));
    }

    #[test]
    fn flags_add_and_remove_codes() {
        let policy = XidPolicy::new(&[13], &[79]);
        assert!(policy.not_ready.contains(&13) && !policy.not_ready.contains(&79));
        assert!(policy.not_ready.contains(&95));
        assert_eq!(
            finding(&seen(&[(2, 79, 1)]), &policy).status(),
            Status::Pass
        );
        let added = finding(&seen(&[(0, 13, 1)]), &policy);
        assert_eq!(added.status(), Status::Fail);
        assert!(added.summary.contains("named by --xid-not-ready"));
    }

    #[test]
    fn no_watch_skips_but_events_seen_before_it_stopped_still_count() {
        let none = Xids {
            unavailable: Some("NVML: library not found".into()),
            ..Xids::default()
        };
        let f = finding(&none, &XidPolicy::new(&[], &[]));
        assert_eq!(f.status(), Status::Skip);
        assert!(f.summary.contains("NVML: library not found"));
        let stopped = Xids {
            watching: false,
            unavailable: Some("nvmlEventSetWait: GPU is lost".into()),
            ..seen(&[(0, 79, 1)])
        };
        assert_eq!(
            finding(&stopped, &XidPolicy::new(&[], &[])).status(),
            Status::Fail
        );
    }

    #[test]
    fn the_table_holds_only_reset_and_restart_actions_once_each() {
        let mut codes = BTreeSet::new();
        for (code, what, action) in NOT_READY {
            assert!(codes.insert(*code), "XID {code} twice");
            assert!(!what.is_empty());
            assert!(
                ["RESET_GPU", "RESTART_BM", "RESTART_VM"].contains(action),
                "{code}"
            );
        }
    }

    #[test]
    fn a_hung_watch_fails_unless_a_fatal_xid_already_says_more() {
        let hung = Xids {
            hung: Some("nvmlEventSetWait(1000 ms) did not return within 10.0 s".into()),
            ..seen(&[(0, 13, 1)])
        };
        let f = finding(&hung, &XidPolicy::new(&[], &[]));
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "XID watch: nvmlEventSetWait(1000 ms) did not return within 10.0 s"
        );
        assert_eq!(f.remediation(), Some(HUNG_FIX));
        assert_eq!(f.evidence, ["GPU 0: XID 13 x1, counted, not judged"]);
        let fatal = Xids {
            hung: hung.hung.clone(),
            ..seen(&[(1, 79, 1)])
        };
        let f = finding(&fatal, &XidPolicy::new(&[], &[]));
        assert!(f.summary.starts_with("GPU 1: XID 79"), "{}", f.summary);
    }

    #[test]
    fn event_waits_end_well_inside_the_deadline() {
        assert_eq!(wait_ms(Duration::from_secs(10)), 1000);
        assert_eq!(wait_ms(Duration::from_secs(2)), 1000);
        assert_eq!(wait_ms(Duration::from_millis(500)), 250);
        assert_eq!(wait_ms(Duration::from_millis(1)), 1);
        assert_eq!(wait_ms(Duration::ZERO), 1);
    }
}
