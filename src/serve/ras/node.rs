//! The node at the moment of a hang, from what serve already watches: the XID events
//! NVML reported (xid.rs), and from the last run of the checks the NVLink states and
//! error counters (NVML) and the RDMA ports' states and error counters (sysfs). Each is
//! compared with the same reading when the job started (the first healthy reply), so
//! the report names what changed while the job ran, not what a node carried before it.
//! Pure: serve hands the readings in.

use crate::facts::Facts;
use crate::finding::{Finding, Status};
use std::collections::BTreeMap;

/// A state (`ACTIVE`, a link's up) and the error counters beside it.
pub type WithCounters<S> = (S, BTreeMap<String, u64>);

/// One reading of the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeNow {
    /// XID events per (NVML GPU index, XID code) since serve started.
    pub xids: BTreeMap<(u32, u64), u64>,
    /// Per (GPU, link): whether the link is active, and its non-zero error counters.
    pub links: BTreeMap<(u32, u32), WithCounters<bool>>,
    /// Per (RDMA device, port): its state (`ACTIVE`, `DOWN`, ...) and error counters.
    pub ports: BTreeMap<(String, u32), WithCounters<Option<String>>>,
    /// The checks that failed in the last run: id and summary.
    pub failed: Vec<(String, String)>,
}

/// A reading from the last run's facts and findings and the XID counts.
pub fn reading(
    facts: Option<&Facts>,
    checks: &[Finding],
    xids: &BTreeMap<(u32, u64), u64>,
) -> NodeNow {
    let mut now = NodeNow {
        xids: xids.clone(),
        failed: checks
            .iter()
            .filter(|c| c.status() == Status::Fail)
            .map(|c| (c.id.to_string(), c.summary.clone()))
            .collect(),
        ..NodeNow::default()
    };
    let Some(facts) = facts else { return now };
    if let Some(nvml) = facts.gpus.nvml.loaded() {
        for g in &nvml.gpus {
            for l in &g.nvlinks {
                now.links
                    .insert((g.index, l.link), (l.active, l.error_counters.clone()));
            }
        }
    }
    for d in facts
        .rdma
        .devices
        .value()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        for p in &d.ports {
            now.ports.insert(
                (d.name.clone(), p.port),
                (p.state.clone(), p.error_counters.clone()),
            );
        }
    }
    now
}

/// What rose between `then` and `now`: `name +N` for each counter that grew.
fn rises(then: Option<&BTreeMap<String, u64>>, now: &BTreeMap<String, u64>) -> Vec<String> {
    now.iter()
        .filter_map(|(name, &n)| {
            let before = then.and_then(|t| t.get(name)).copied().unwrap_or(0);
            (n > before).then(|| format!("{name} +{}", n - before))
        })
        .collect()
}

/// The node's lines for the report, and whether any is a fault (an XID, a link or port
/// down or whose error counters rose, a check that fails). `since` is the reading at
/// the job's start; without one, every event and non-zero counter counts.
pub fn lines(now: &NodeNow, since: Option<&NodeNow>) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    for (&(gpu, code), &n) in &now.xids {
        let before = since
            .and_then(|s| s.xids.get(&(gpu, code)))
            .copied()
            .unwrap_or(0);
        if n > before {
            let gpu = if gpu == u32::MAX {
                "?".to_string()
            } else {
                gpu.to_string()
            };
            out.push(format!(
                "GPU {gpu}: XID {code} ({} event(s) since the job started)",
                n - before
            ));
        }
    }
    for (&(gpu, link), (active, counters)) in &now.links {
        let then = since.and_then(|s| s.links.get(&(gpu, link)));
        if !active && then.is_none_or(|(was, _)| *was) {
            out.push(format!("GPU {gpu}: NVLink {link} is down"));
        }
        let rose = rises(then.map(|(_, c)| c), counters);
        if !rose.is_empty() {
            out.push(format!(
                "GPU {gpu}: NVLink {link} errors since the job started: {}",
                rose.join(", ")
            ));
        }
    }
    for ((device, port), (state, counters)) in &now.ports {
        let then = since.and_then(|s| s.ports.get(&(device.clone(), *port)));
        let state = state.as_deref().unwrap_or("unknown");
        if state != "ACTIVE" && then.is_none_or(|(was, _)| was.as_deref() == Some("ACTIVE")) {
            let device = super::reply::safe(device);
            out.push(format!("RDMA {device} port {port} is {state}"));
        }
        let rose = rises(then.map(|(_, c)| c), counters);
        if !rose.is_empty() {
            let device = super::reply::safe(device);
            out.push(format!(
                "RDMA {device} port {port} errors since the job started: {}",
                rose.join(", ")
            ));
        }
    }
    for (id, summary) in &now.failed {
        if since.is_none_or(|s| !s.failed.iter().any(|(was, _)| was == id)) {
            out.push(format!("check {id} fails: {}", super::reply::safe(summary)));
        }
    }
    let fault = !out.is_empty();
    (out, fault)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(active: bool, replay: u64) -> (bool, BTreeMap<String, u64>) {
        let counters = [("replay".to_string(), replay)]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        (active, counters)
    }

    #[test]
    fn only_what_changed_since_the_job_started_is_a_fault() {
        let start = NodeNow {
            xids: [((0, 13), 1)].into_iter().collect(),
            links: [((1, 3), link(true, 5)), ((1, 4), link(false, 0))]
                .into_iter()
                .collect(),
            ports: [(
                ("mlx5_0".into(), 1),
                (Some("ACTIVE".into()), BTreeMap::new()),
            )]
            .into_iter()
            .collect(),
            failed: Vec::new(),
        };
        assert_eq!(lines(&start, Some(&start)), (Vec::new(), false));
        let mut now = start.clone();
        now.xids.insert((1, 79), 1);
        now.links.insert((1, 3), link(false, 9));
        now.ports.insert(
            ("mlx5_0".into(), 1),
            (
                Some("DOWN".into()),
                [("link_downed".to_string(), 1)].into_iter().collect(),
            ),
        );
        let (lines, fault) = lines(&now, Some(&start));
        assert!(fault);
        assert_eq!(
            lines,
            [
                "GPU 1: XID 79 (1 event(s) since the job started)",
                "GPU 1: NVLink 3 is down",
                "GPU 1: NVLink 3 errors since the job started: replay +4",
                "RDMA mlx5_0 port 1 is DOWN",
                "RDMA mlx5_0 port 1 errors since the job started: link_downed +1",
            ]
        );
    }

    /// A link that was down before the job started did not hang it: not named again.
    #[test]
    fn a_link_down_from_the_start_is_not_news() {
        let start = NodeNow {
            links: [((0, 2), link(false, 0))].into_iter().collect(),
            ..NodeNow::default()
        };
        assert!(!lines(&start, Some(&start)).1);
        assert!(lines(&start, None).1, "without a start reading it is said");
    }
}
