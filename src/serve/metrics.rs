//! The Prometheus exposition of a report, through prometheus-client: gauges for
//! states, counters (`_total`) for cumulative counts.

use crate::finding::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
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

pub(super) fn float_gauge(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let g = Gauge::<f64, AtomicU64>::default();
    g.set(value);
    registry.register(name, help, g);
}

pub(super) fn int_gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
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

/// Registers a counter `name` (exposed as `name_total`) holding `value`. The
/// registry is built anew at every scrape from cumulative values kept elsewhere
/// (the driver's, sysfs's, this server's), so a counter starts at that value.
pub(super) fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

/// The metrics text for the last run and the XIDs seen up to now (`xid` their
/// finding); `ready` is what /readyz answers. Gauges for states, counters
/// (`_total`) for what only ever grows between restarts of this server or of the driver.
pub fn render(
    snapshot: &super::Snapshot,
    xid: &crate::finding::Finding,
    xids: &super::xid::Xids,
    ready: bool,
    job: Option<&super::ras::JobView>,
) -> String {
    let mut registry = Registry::with_prefix("nccl_preflight");
    register_run(&mut registry, snapshot, xid, ready);
    register_xids(&mut registry, xids);
    if let Some(job) = job {
        super::ras::metrics::register(&mut registry, job);
    }
    if let Some(r) = &snapshot.report {
        register_gpus(&mut registry, &r.facts);
        register_rdma(&mut registry, &r.facts);
    }
    build_info(&mut registry);
    encode_stable(&registry)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
}

/// `nccl_preflight_build_info{version, commit} 1`: which build answers (the
/// `*_build_info` convention of Prometheus' own exporters).
pub(crate) fn build_info(registry: &mut Registry) {
    let family = Family::<BuildLabels, Gauge>::default();
    family
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: env!("NCCL_PREFLIGHT_COMMIT").into(),
        })
        .set(1);
    registry.register(
        "build_info",
        "The version and commit of this nccl-preflight",
        family,
    );
}

/// The registry as text, each family's series in one order at every scrape:
/// prometheus-client keeps a family's label sets in a HashMap, so they came out in a
/// different order each time. Gauge and counter samples are sorted within their family
/// (by metric name, then labels); other types keep prometheus-client's order, which a
/// histogram's buckets depend on.
pub(crate) fn encode_stable(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, registry);
    let mut out = String::with_capacity(text.len());
    let mut samples: Vec<&str> = Vec::new();
    let mut sortable = false;
    let flush = |samples: &mut Vec<&str>, sortable: bool, out: &mut String| {
        if sortable {
            samples.sort_unstable();
        }
        for s in samples.drain(..) {
            out.push_str(s);
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut samples, sortable, &mut out);
            if let Some(kind) = line.strip_prefix("# TYPE ") {
                sortable = kind.ends_with(" gauge") || kind.ends_with(" counter");
            }
            out.push_str(line);
            out.push('\n');
        } else {
            samples.push(line);
        }
    }
    flush(&mut samples, sortable, &mut out);
    out
}

/// The checks' statuses, readiness and the runs themselves.
fn register_run(
    registry: &mut Registry,
    snapshot: &super::Snapshot,
    xid: &crate::finding::Finding,
    ready: bool,
) {
    let checks = Family::<CheckLabels, Gauge>::default();
    if let Some(r) = &snapshot.report {
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
        registry,
        "ready",
        "1 when /readyz answers ready: no failed check, no XID that needs a reset",
        i64::from(ready),
    );
    float_gauge(
        registry,
        "last_run_duration_seconds",
        "How long the last run of all checks took",
        snapshot.took.as_secs_f64(),
    );
    float_gauge(
        registry,
        "last_run_timestamp_seconds",
        "When the last run finished, Unix time",
        snapshot
            .at
            .unwrap_or(SystemTime::UNIX_EPOCH)
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64(),
    );
    counter(
        registry,
        "runs",
        "Runs of the checks since this server started",
        snapshot.runs,
    );
    int_gauge(
        registry,
        "driver_hung",
        "1 when a driver call did not return and checks stopped",
        i64::from(snapshot.halted.is_some()),
    );
}

/// The XID watch and the events it counted.
fn register_xids(registry: &mut Registry, xids: &super::xid::Xids) {
    int_gauge(
        registry,
        "xid_watch",
        "1 while NVML's critical XID events are watched",
        i64::from(xids.watching),
    );
    let events = Family::<XidLabels, Counter>::default();
    for ((gpu, code), n) in &xids.counts {
        events
            .get_or_create(&XidLabels {
                gpu: label_value(&gpu.to_string()),
                xid: code.to_string(),
            })
            .inc_by(*n);
    }
    registry.register(
        "gpu_xid_events",
        "Critical XID events NVML reported since this server started, per GPU and XID",
        events,
    );
}

/// GPUs, NVLinks and the health NVML reports per GPU.
fn register_gpus(registry: &mut Registry, facts: &crate::facts::Facts) {
    let gpu_list = facts
        .gpus
        .nvml
        .loaded()
        .map(|n| n.gpus.as_slice())
        .unwrap_or_default();
    int_gauge(
        registry,
        "gpus",
        "GPUs NVML lists in this container",
        i64::try_from(gpu_list.len()).unwrap_or(i64::MAX),
    );
    let links = gpu_list.iter().flat_map(|g| &g.nvlinks);
    active_present(
        registry,
        "nvlinks",
        "NVLinks over all GPUs, active and present",
        links.clone().filter(|l| l.active).count(),
        links.count(),
    );
    register_gpu_health(registry, gpu_list);
    register_nvlink_errors(registry, gpu_list);
}

/// The health NVML reports per GPU: ECC, row remapping, recovery action.
fn register_gpu_health(registry: &mut Registry, gpu_list: &[crate::facts::gpu::NvmlGpu]) {
    let ecc = Family::<GpuLabels, Counter>::default();
    let remap_pending = Family::<GpuLabels, Gauge>::default();
    let remap_failure = Family::<GpuLabels, Gauge>::default();
    let recovery = Family::<GpuLabels, Gauge>::default();
    for g in gpu_list {
        let label = GpuLabels {
            gpu: g.index.to_string(),
        };
        let Some(h) = &g.health else {
            continue;
        };
        if let Some(&a) = h.recovery_action.value() {
            recovery.get_or_create(&label).set(i64::from(a));
        }
        if let Some(n) = h.ecc_uncorrected_volatile.value() {
            ecc.get_or_create(&label).inc_by(*n);
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
}

/// Every GPU's non-zero NVLink error counters.
fn register_nvlink_errors(registry: &mut Registry, gpu_list: &[crate::facts::gpu::NvmlGpu]) {
    let link_errors = Family::<LinkCounterLabels, Counter>::default();
    for g in gpu_list {
        for l in &g.nvlinks {
            for (counter, value) in &l.error_counters {
                link_errors
                    .get_or_create(&LinkCounterLabels {
                        gpu: g.index.to_string(),
                        link: l.link.to_string(),
                        counter: label_value(counter),
                    })
                    .inc_by(*value);
            }
        }
    }
    registry.register(
        "nvlink_errors",
        "Non-zero NVLink error counters (replay, recovery, crc_flit, crc_data) since the driver loaded",
        link_errors,
    );
}

/// RDMA ports and their error counters.
fn register_rdma(registry: &mut Registry, facts: &crate::facts::Facts) {
    let devices = facts
        .rdma
        .devices
        .value()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let ports = devices.iter().flat_map(|d| &d.ports);
    active_present(
        registry,
        "rdma_ports",
        "RDMA ports over all devices, active and present",
        ports
            .clone()
            .filter(|p| p.state.as_deref() == Some("ACTIVE"))
            .count(),
        ports.count(),
    );
    let errors = Family::<PortCounterLabels, Counter>::default();
    for d in devices {
        for p in &d.ports {
            for (counter, value) in &p.error_counters {
                errors
                    .get_or_create(&PortCounterLabels {
                        device: label_value(&d.name),
                        port: p.port.to_string(),
                        counter: label_value(counter),
                    })
                    .inc_by(*value);
            }
        }
    }
    registry.register(
        "rdma_port_errors",
        "RDMA port error counters from sysfs (cumulative since the driver loaded)",
        errors,
    );
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
            report: Some(Report::new(
                facts.clone(),
                crate::predict::predict(&facts),
                Vec::new(),
                Vec::new(),
            )),
            ..Default::default()
        };
        let xid = Finding::pass("gpu-xid", "none");
        let text = render(&snapshot, &xid, &Default::default(), true, None);
        assert!(
            !text.lines().any(|l| l.starts_with("nccl_preflight_forged")),
            "{text}"
        );
        assert!(
            text.contains(
                r#"nccl_preflight_rdma_port_errors_total{device="mlx5_0\"} 1\nnccl_preflight_forged{x=\"\\",port="1",counter="symbol_error\"\n"} 3"#
            ),
            "{text}"
        );
        assert_eq!(label_value("a\\b\"c\nd"), r#"a\\b\"c\nd"#);
    }

    #[test]
    fn cumulative_values_are_counters_and_states_are_gauges() {
        let mut facts = test_facts::healthy();
        if let crate::facts::gpu::LibraryState::Loaded(nvml) = &mut facts.gpus.nvml.state
            && let Some(h) = nvml.gpus[1].health.as_mut()
        {
            h.ecc_uncorrected_volatile = crate::facts::Observed::Value(3);
        }
        let snapshot = super::super::Snapshot {
            runs: 7,
            report: Some(Report::new(
                facts.clone(),
                crate::predict::predict(&facts),
                Vec::new(),
                Vec::new(),
            )),
            ..Default::default()
        };
        let xids = super::super::xid::Xids {
            counts: [((0, 13), 4), ((1, 79), 1)].into_iter().collect(),
            watching: true,
            ..Default::default()
        };
        let xid = Finding::fail("gpu-xid", "GPU 1: XID 79", "reboot");
        let text = render(&snapshot, &xid, &xids, false, None);
        for line in [
            "# TYPE nccl_preflight_runs counter",
            "nccl_preflight_runs_total 7",
            "# TYPE nccl_preflight_gpu_xid_events counter",
            "nccl_preflight_gpu_xid_events_total{gpu=\"0\",xid=\"13\"} 4",
            "nccl_preflight_gpu_xid_events_total{gpu=\"1\",xid=\"79\"} 1",
            "# TYPE nccl_preflight_gpu_ecc_uncorrected counter",
            "nccl_preflight_gpu_ecc_uncorrected_total{gpu=\"1\"} 3",
            "# TYPE nccl_preflight_ready gauge",
            "nccl_preflight_ready 0",
            "nccl_preflight_driver_hung 0",
            "nccl_preflight_xid_watch 1",
            "nccl_preflight_gpus 2",
            "nccl_preflight_check_status{check=\"gpu-xid\",status=\"fail\"} 1",
            "nccl_preflight_check_status{check=\"gpu-xid\",status=\"pass\"} 0",
            "# TYPE nccl_preflight_rdma_port_errors counter",
            "# TYPE nccl_preflight_nvlink_errors counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        // No sample of a counter lacks its `_total`.
        for counter in ["runs", "gpu_xid_events", "gpu_ecc_uncorrected"] {
            let bare = format!("nccl_preflight_{counter}");
            assert!(
                !text
                    .lines()
                    .any(|l| l.starts_with(&format!("{bare} "))
                        || l.starts_with(&format!("{bare}{{"))),
                "{counter}"
            );
        }
    }

    /// Every family /metrics can expose has its row in docs/metrics.md, with the name a
    /// sample carries, its type, labels and help text as the code says them.
    #[test]
    fn docs_metrics_md_lists_every_family() {
        use super::super::ras::judge::{Outcome, Watch};
        let snapshot = super::super::Snapshot {
            runs: 1,
            report: Some(Report::new(
                test_facts::healthy(),
                crate::predict::predict(&test_facts::healthy()),
                Vec::new(),
                Vec::new(),
            )),
            ..Default::default()
        };
        let xids = super::super::xid::Xids {
            counts: [((0, 79), 1)].into_iter().collect(),
            watching: true,
            ..Default::default()
        };
        let mut watch = Watch::new(std::time::Duration::from_secs(60));
        let dead = include_str!("../../tests/data/ras/2.28.9/stopped-dead.json");
        let reply = super::super::ras::reply::parse_json(dead).unwrap();
        watch.observe(std::time::Instant::now(), Outcome::Reply(Box::new(reply)));
        let job = super::super::ras::judge_view::view(&watch, std::time::Instant::now());
        let xid = Finding::pass("gpu-xid", "none");
        let text = render(&snapshot, &xid, &xids, true, Some(&job));
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
            .unwrap();
        let mut missing = Vec::new();
        for help in text.lines().filter_map(|l| l.strip_prefix("# HELP ")) {
            let (family, meaning) = help.split_once(' ').unwrap();
            let kind = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# TYPE {family} ")))
                .unwrap();
            let name = match kind {
                "counter" => format!("{family}_total"),
                _ => family.to_string(),
            };
            // A family with no sample here (no error counted) shows no labels: any
            // labels in its row are taken.
            let labels = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{{")))
                .map(|rest| {
                    let inside = rest.split('}').next().unwrap_or("");
                    let keys: Vec<&str> = inside
                        .split(',')
                        .filter_map(|kv| kv.split('=').next())
                        .collect();
                    keys.join(", ")
                });
            let (head, tail) = (format!("| `{name}` | {kind} | "), format!(" | {meaning} |"));
            let found = docs.lines().any(|l| {
                l.strip_prefix(&head)
                    .and_then(|l| l.strip_suffix(&tail))
                    .is_some_and(|middle| labels.as_deref().is_none_or(|want| middle == want))
            });
            if !found {
                missing.push(format!("{head}{}{tail}", labels.unwrap_or_default()));
            }
        }
        assert!(missing.len() < 100, "{text}");
        assert!(
            missing.is_empty(),
            "docs/metrics.md lacks these rows:\n{}",
            missing.join("\n")
        );
    }
}
