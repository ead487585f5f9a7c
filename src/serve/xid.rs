//! XID events while `serve` runs: NVML's critical XID error events on every GPU,
//! counted per GPU and XID code for /metrics. A watcher thread of its own waits
//! on the event set (1 s at a time), so a request never waits on it. Which XIDs
//! should fail readiness is not decided here: the counts are for alerting.

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What the watcher has seen.
#[derive(Debug, Clone, Default)]
pub struct Xids {
    /// Events per (NVML GPU index, XID code); code 0 when NVML gave none.
    pub counts: BTreeMap<(u32, u64), u64>,
    /// Set while events are being watched.
    pub watching: bool,
    /// Why they are not (no NVML, events unsupported, ...).
    pub unavailable: Option<String>,
}

fn register(nvml: &Nvml) -> Result<nvml_wrapper::EventSet<'_>, String> {
    let mut set = nvml
        .create_event_set()
        .map_err(|e| format!("nvmlEventSetCreate: {e}"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("nvmlDeviceGetCount: {e}"))?;
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("GPU {index}: {e}"))?;
        set = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| format!("nvmlDeviceRegisterEvents(GPU {index}): {}", e.error))?;
    }
    Ok(set)
}

/// Watches until `stop` is set. Runs on its own thread.
pub fn watch(library: &str, state: &Arc<Mutex<Xids>>, stop: &AtomicBool) {
    let set_state = |f: &dyn Fn(&mut Xids)| f(&mut state.lock().unwrap_or_else(|p| p.into_inner()));
    let nvml = match Nvml::builder().lib_path(OsStr::new(library)).init() {
        Ok(n) => n,
        Err(e) => return set_state(&|x| x.unavailable = Some(format!("NVML: {e}"))),
    };
    let set = match register(&nvml) {
        Ok(s) => s,
        Err(why) => return set_state(&|x| x.unavailable = Some(why.clone())),
    };
    set_state(&|x| x.watching = true);
    while !stop.load(Ordering::Relaxed) {
        match set.wait(1000) {
            Ok(event) => {
                let gpu = event.device.index().unwrap_or(u32::MAX);
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
