//! The Prometheus exposition of a report, through prometheus-client.

use crate::finding::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortCounterLabels {
    device: String,
    port: String,
    counter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkCounterLabels {
    gpu: String,
    link: String,
    counter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    gpu: String,
    xid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// A label value escaped as the exposition format requires (backslash, double
/// quote and line feed as `\\`, `\"`, `\n`: Prometheus text format 0.0.4 and
/// OpenMetrics 1.0 "Escaping"). prometheus-client 0.23 writes label values as
/// they are (its issue #151), so an RDMA device or counter name holding `"` and a
/// newline would forge samples or break the scrape. Every label value that comes
/// from the host goes through here.
fn label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

const STATUSES: [Status; 4] = [Status::Pass, Status::Warn, Status::Fail, Status::Skip];

fn float_gauge(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let g = Gauge::<f64, AtomicU64>::default();
    g.set(value);
    registry.register(name, help, g);
}

fn int_gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g = Gauge::<i64>::default();
    g.set(value);
    registry.register(name, help, g);
}

/// A gauge family `name{kind="active"|"present"}`.
fn active_present(registry: &mut Registry, name: &str, help: &str, active: usize, present: usize) {
    let family = Family::<KindLabels, Gauge>::default();
    for (kind, n) in [("active", active), ("present", present)] {
        family
            .get_or_create(&KindLabels { kind: kind.into() })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    registry.register(name, help, family);
}

/// The metrics text for the last run and the XIDs seen up to now (`xid` their
/// finding); `ready` is what /readyz answers.
pub fn render(
    snapshot: &super::Snapshot,
    xid: &crate::finding::Finding,
    xids: &super::xid::Xids,
    ready: bool,
) -> String {
    let report = snapshot.report.as_ref();
    let hung = snapshot.halted.is_some();
    let mut registry = Registry::with_prefix("nccl_preflight");
    let checks = Family::<CheckLabels, Gauge>::default();
    if let Some(r) = report {
        for c in r.checks.iter().chain([xid]) {
            for s in STATUSES {
                checks
                    .get_or_create(&CheckLabels {
                        check: label_value(&c.id),
                        status: s.label().to_ascii_lowercase(),
                    })
                    .set(i64::from(c.status() == s));
            }
        }
    }
    registry.register(
        "check_status",
        "1 for the status each check had in the last run, 0 for the others",
        checks,
    );
    int_gauge(
        &mut registry,
        "ready",
        "1 when /readyz answers ready: no failed check, no XID that needs a reset",
        i64::from(ready),
    );
    float_gauge(
        &mut registry,
        "last_run_duration_seconds",
        "How long the last run of all checks took",
        snapshot.took.as_secs_f64(),
    );
    float_gauge(
        &mut registry,
        "last_run_timestamp_seconds",
        "When the last run finished, Unix time",
        snapshot
            .at
            .unwrap_or(SystemTime::UNIX_EPOCH)
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64(),
    );
    int_gauge(
        &mut registry,
        "runs",
        "Runs of the checks since this server started",
        i64::try_from(snapshot.runs).unwrap_or(i64::MAX),
    );
    int_gauge(
        &mut registry,
        "driver_hung",
        "1 when a driver call did not return and checks stopped",
        i64::from(hung),
    );
    int_gauge(
        &mut registry,
        "xid_watch",
        "1 while NVML's critical XID events are watched",
        i64::from(xids.watching),
    );
    let events = Family::<XidLabels, Gauge>::default();
    for ((gpu, code), n) in &xids.counts {
        events
            .get_or_create(&XidLabels {
                gpu: label_value(&gpu.to_string()),
                xid: code.to_string(),
            })
            .set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
    registry.register(
        "gpu_xid_events",
        "Critical XID events NVML reported since this server started, per GPU and XID",
        events,
    );
    if let Some(r) = report {
        let f = &r.facts;
        let gpus = f.gpus.nvml.loaded().map(|n| n.gpus.len()).unwrap_or(0);
        int_gauge(
            &mut registry,
            "gpus",
            "GPUs NVML lists in this container",
            gpus as i64,
        );
        let gpu_list = f
            .gpus
            .nvml
            .loaded()
            .map(|n| n.gpus.as_slice())
            .unwrap_or_default();
        let links = gpu_list.iter().flat_map(|g| &g.nvlinks);
        active_present(
            &mut registry,
            "nvlinks",
            "NVLinks over all GPUs, active and present",
            links.clone().filter(|l| l.active).count(),
            links.count(),
        );
        let ecc = Family::<GpuLabels, Gauge>::default();
        let remap_pending = Family::<GpuLabels, Gauge>::default();
        let remap_failure = Family::<GpuLabels, Gauge>::default();
        let recovery = Family::<GpuLabels, Gauge>::default();
        let link_errors = Family::<LinkCounterLabels, Gauge>::default();
        for g in gpu_list {
            let label = GpuLabels {
                gpu: g.index.to_string(),
            };
            if let Some(h) = &g.health {
                if let Some(&a) = h.recovery_action.value() {
                    recovery.get_or_create(&label).set(i64::from(a));
                }
                if let Some(n) = h.ecc_uncorrected_volatile.value() {
                    ecc.get_or_create(&label)
                        .set(i64::try_from(*n).unwrap_or(i64::MAX));
                }
                if let Some(r) = h.remapped_rows.value() {
                    remap_pending
                        .get_or_create(&label)
                        .set(i64::from(r.pending));
                    remap_failure
                        .get_or_create(&label)
                        .set(i64::from(r.failure));
                }
            }
            for l in &g.nvlinks {
                for (counter, value) in &l.error_counters {
                    link_errors
                        .get_or_create(&LinkCounterLabels {
                            gpu: g.index.to_string(),
                            link: l.link.to_string(),
                            counter: label_value(counter),
                        })
                        .set(i64::try_from(*value).unwrap_or(i64::MAX));
                }
            }
        }
        registry.register(
            "gpu_ecc_uncorrected",
            "Uncorrectable ECC errors since the driver loaded",
            ecc,
        );
        registry.register(
            "gpu_remap_pending",
            "1 when a row remapping waits for a GPU reset",
            remap_pending,
        );
        registry.register(
            "gpu_recovery_action",
            "The driver's recovery action (NVML field 230): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset",
            recovery,
        );
        registry.register(
            "gpu_remap_failure",
            "1 when a row remapping failed",
            remap_failure,
        );
        registry.register(
            "nvlink_errors",
            "Non-zero NVLink error counters (replay, recovery, crc_flit, crc_data)",
            link_errors,
        );
        let devices = f
            .rdma
            .devices
            .value()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ports = devices.iter().flat_map(|d| &d.ports);
        active_present(
            &mut registry,
            "rdma_ports",
            "RDMA ports over all devices, active and present",
            ports
                .clone()
                .filter(|p| p.state.as_deref() == Some("ACTIVE"))
                .count(),
            ports.count(),
        );
        let errors = Family::<PortCounterLabels, Gauge>::default();
        for d in devices {
            for p in &d.ports {
                for (counter, value) in &p.error_counters {
                    errors
                        .get_or_create(&PortCounterLabels {
                            device: label_value(&d.name),
                            port: p.port.to_string(),
                            counter: label_value(counter),
                        })
                        .set(i64::try_from(*value).unwrap_or(i64::MAX));
                }
            }
        }
        registry.register(
            "rdma_port_errors",
            "RDMA port error counters from sysfs (cumulative since the driver loaded)",
            errors,
        );
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Finding;
    use crate::report::Report;
    use crate::test_facts;

    #[test]
    fn rdma_device_name_with_quote_and_newline_cannot_forge_samples() {
        // Issue 18: label values were not escaped (prometheus-client issue #151).
        let hostile = "mlx5_0\"} 1\nnccl_preflight_forged{x=\"\\";
        let mut device = test_facts::rdma_device(
            hostile,
            "mlx5_core",
            "0000:0c:00.0",
            "/sys/devices/x",
            "ACTIVE",
            "InfiniBand",
        );
        device.ports[0]
            .error_counters
            .insert("symbol_error\"\n".into(), 3);
        let facts = test_facts::with_rdma(test_facts::healthy(), vec![device]);
        let snapshot = super::super::Snapshot {
            report: Some(Report::new(facts, Vec::new(), Vec::new())),
            ..Default::default()
        };
        let xid = Finding::pass("gpu-xid", "none");
        let text = render(&snapshot, &xid, &Default::default(), true);
        assert!(
            !text.lines().any(|l| l.starts_with("nccl_preflight_forged")),
            "{text}"
        );
        assert!(
            text.contains(
                r#"device="mlx5_0\"} 1\nnccl_preflight_forged{x=\"\\",port="1",counter="symbol_error\"\n"} 3"#
            ),
            "{text}"
        );
        assert_eq!(label_value("a\\b\"c\nd"), r#"a\\b\"c\nd"#);
    }
}
