//! gang-consistency (pure): every field of the pods' records compared across the
//! job. For each field the pods are grouped by value: the value most pods hold is
//! the majority and the others are named as the odd ones; two or more values held
//! by as many pods each are a split, with every side named. An NCCL variable counts
//! by what NCCL does with it (`nccl::roles`, from where each release reads it): one
//! that feeds a decision every rank makes alike fails the job, one only NCCL's
//! logging or tracing reads is a note, one that describes the pod itself is not
//! compared. The blame follows who can fix the difference: a pod's own image,
//! variables or resource request are the job's, a link's rate the node's.

use super::{list, node_name};
use crate::finding::{Blame, Fault, Finding, Problem, Severity, Status, combine, ids};
use crate::gang::fingerprint::Fingerprint;
use crate::nccl::Version;
use crate::nccl::catalog::Catalog;
use crate::nccl::roles::Role;
use serde::Serialize;

/// One compared field.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub field: String,
    /// Each node's value, in node-rank order ("missing" where a record was unreadable).
    pub values: Vec<String>,
    /// The value more nodes hold than any other (None: a split, or no record).
    majority: Option<String>,
    /// Nodes whose value is not the majority's (empty on a split: every side is named).
    pub odd: Vec<usize>,
    /// Why a differing value is not compared (an NCCL variable only logging reads, or
    /// one that describes the pod itself); None for a compared field.
    pub note: Option<String>,
}

impl Row {
    /// The pods disagree on this field.
    pub fn differs(&self) -> bool {
        !self.odd.is_empty() || (self.majority.is_none() && self.groups().len() > 1)
    }

    /// Whether a difference here is judged.
    fn compared(&self) -> bool {
        self.note.is_none()
    }

    /// The present nodes grouped by value, the largest group first (ties in the
    /// order of their first node).
    fn groups(&self) -> Vec<(&str, Vec<usize>)> {
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, v) in self.values.iter().enumerate() {
            if v == MISSING {
                continue;
            }
            match groups.iter_mut().find(|(g, _)| *g == v) {
                Some((_, nodes)) => nodes.push(i),
                None => groups.push((v, vec![i])),
            }
        }
        // A stable sort keeps first-node order among groups of one size.
        groups.sort_by_key(|(_, nodes)| std::cmp::Reverse(nodes.len()));
        groups
    }
}

/// A node whose record never came or could not be read.
const MISSING: &str = "missing";

/// Every field across the nodes' records; a node whose record is missing is
/// neither odd nor counted. Fields are the union over nodes, in the first record's
/// order. `version` is the job's NCCL version (the variables' roles depend on it).
pub fn rows(fps: &[Option<Fingerprint>], version: Option<Version>) -> Vec<Row> {
    let per_node: Vec<Option<Vec<(String, String)>>> = fps
        .iter()
        .map(|f| f.as_ref().map(Fingerprint::fields))
        .collect();
    let mut names: Vec<String> = Vec::new();
    for (k, _) in per_node.iter().flatten().flatten() {
        if !names.contains(k) {
            names.push(k.clone());
        }
    }
    let catalog = Catalog::embedded().ok();
    let readers = crate::nccl::roles::Readers::embedded();
    names
        .into_iter()
        .map(|field| {
            let values = per_node
                .iter()
                .map(|fields| match fields {
                    None => MISSING.to_string(),
                    Some(fields) => fields
                        .iter()
                        .find(|(k, _)| *k == field)
                        .map_or("unset".to_string(), |(_, v)| v.clone()),
                })
                .collect();
            let note = field
                .strip_prefix("env ")
                .and_then(|name| not_compared(&readers, catalog.as_ref(), name, version));
            row(field, values, note)
        })
        .collect()
}

/// A row with its majority and odd nodes worked out.
fn row(field: String, values: Vec<String>, note: Option<String>) -> Row {
    let mut r = Row {
        field,
        values,
        majority: None,
        odd: Vec::new(),
        note,
    };
    let groups = r.groups();
    let majority = match groups.as_slice() {
        [(v, _)] => Some(v.to_string()),
        [(v, a), (_, b), ..] if a.len() > b.len() => Some(v.to_string()),
        _ => None,
    };
    if let Some(m) = &majority {
        r.odd = groups
            .iter()
            .filter(|(v, _)| v != m)
            .flat_map(|(_, nodes)| nodes.iter().copied())
            .collect();
        r.odd.sort_unstable();
    }
    r.majority = majority;
    r
}

/// Why a difference in NCCL variable `name` is not judged, or None when it is
/// (a decision, or a name nccl-preflight cannot place: judged, as a warning).
fn not_compared(
    readers: &crate::nccl::roles::Readers,
    catalog: Option<&Catalog>,
    name: &str,
    version: Option<Version>,
) -> Option<String> {
    let catalog = catalog?;
    let shown = version.map_or("NCCL".to_string(), |v| format!("NCCL {}", v));
    match crate::nccl::roles::role(readers, catalog, name, version) {
        Role::Observe { reader } => Some(format!(
            "only logging or tracing reads it ({shown}: {reader})"
        )),
        Role::PerPod { reader } => {
            Some(format!("it describes each pod itself ({shown}: {reader})"))
        }
        Role::Unread => Some(format!("{shown} does not read it")),
        Role::Decision | Role::Unknown => None,
    }
}

/// What gang-consistency judges: the rows, the records they came from, the
/// nodes' names and the records that could not be read (`node i: why`).
pub struct TableInput<'a> {
    pub rows: &'a [Row],
    pub fps: &'a [Option<Fingerprint>],
    pub names: &'a [String],
    pub unreadable: &'a [(usize, String)],
}

/// gang-consistency from the rows: a record that cannot be read, a node whose own
/// checks failed, then each compared field that differs (failing or warning by
/// what the field is); differences NCCL does not act on are notes. Every rank
/// judges the same table, so every rank prints the same text.
pub fn consistency(input: &TableInput<'_>) -> Finding {
    let (rows, names) = (input.rows, input.names);
    let compared: Vec<&Row> = rows.iter().filter(|r| r.compared()).collect();
    let differing: Vec<&Row> = compared.iter().copied().filter(|r| r.differs()).collect();
    let agree = compared.len() - differing.len();
    let nodes = input.fps.iter().filter(|f| f.is_some()).count();
    let counted = format!(
        "{nodes} node(s) agree on {agree} of {} fields",
        compared.len()
    );
    let mut evidence = vec![counted.clone()];
    let mut problems: Vec<Problem> = input
        .unreadable
        .iter()
        .map(|(i, why)| {
            Problem::new(
                Severity::Fail,
                format!(
                    "{} sent a record this nccl-preflight cannot read: {why}",
                    node_name(*i, names)
                ),
                "Run the same nccl-preflight (one image or one init container) in every pod",
            )
        })
        .collect();
    problems.extend(failed_own_checks(input));
    problems.extend(differing.iter().filter_map(|r| row_problem(r, input)));
    // A failed check on one pod also shows as "local verdict"; the per-check rows are evidence.
    evidence.extend(
        differing
            .iter()
            .filter(|r| r.field.starts_with("check "))
            .map(|r| format!("{}: {}", r.field, r.values.join(" | "))),
    );
    let notes: Vec<&Row> = rows
        .iter()
        .filter(|r| !r.compared() && r.differs())
        .collect();
    evidence.extend(notes.iter().map(|r| note_text(r, names)));
    let pass = if agree == compared.len() {
        format!("{nodes} node(s) agree on all {} fields", compared.len())
    } else {
        format!("{counted}; the rest differ only in checks that passed or warned")
    };
    let pass = match notes.len() {
        0 => pass,
        n => format!("{pass} ({n} variable(s) NCCL does not act on differ)"),
    };
    combine(ids::GANG_CONSISTENCY, pass, evidence, problems)
}

/// "not compared: NCCL_DEBUG=INFO on node 1 (x), unset on the other 3 pod(s): only
/// logging or tracing reads it (...)".
fn note_text(r: &Row, names: &[String]) -> String {
    let field = r.field.strip_prefix("env ").unwrap_or(&r.field);
    format!(
        "not compared: {}: {}",
        described(r, names, &|v| value_text(field, v)),
        r.note.as_deref().unwrap_or("")
    )
}

/// The nodes whose own checks failed, each with its failed checks' summaries.
fn failed_own_checks(input: &TableInput<'_>) -> Vec<Problem> {
    input
        .fps
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.as_ref().map(|f| (i, f)))
        .filter(|(_, f)| f.local_verdict == Status::Fail)
        .map(|(i, f)| {
            let failed: Vec<String> = f
                .checks
                .iter()
                .filter(|(_, s)| **s == Status::Fail)
                .map(|(id, _)| match f.summaries.get(id) {
                    Some(text) => format!("{id}: {text}"),
                    None => id.clone(),
                })
                .collect();
            let p = Problem::new(
                Severity::Fail,
                format!("{} failed its own checks: {}", node_name(i, input.names), failed.join("; ")),
                "Fix what that pod's own checks name (its report has each check's fix); the whole job waits for it",
            );
            // That pod's own fault, so every pod of the gang exits as it does; a record
            // of an older version carries none, and the check's default (job) stands.
            match f.local_fault {
                Fault::Node => p.blamed(Blame::Node),
                Fault::Job => p.blamed(Blame::Job),
                Fault::None => p,
            }
        })
        .collect()
}

/// `field`'s value as a phrase: "2 GPU(s)", "NCCL_ALGO=Tree", "NCCL_ALGO unset".
fn value_text(field: &str, v: &str) -> String {
    match field {
        "gpus" => format!("{v} GPU(s)"),
        "rdma devices" => format!("{v} usable RDMA device(s)"),
        "nccl version" => format!("NCCL {v}"),
        f if f.starts_with("NCCL_") || (f.contains('_') && !f.contains(' ')) => {
            if v == "unset" {
                format!("{f} unset")
            } else {
                format!("{f}={v}")
            }
        }
        f => format!("{f} {v}"),
    }
}

/// The row's difference in words, the same on every rank: the odd nodes and their
/// values against the majority's ("node 2 (b) has 2 GPU(s) where the other 3 pod(s)
/// have 1 GPU(s)"), or every side of a split ("the pods split 2:2: ... on node 0
/// (a), node 1 (b); ... on node 2 (c), node 3 (d)").
fn described(r: &Row, names: &[String], what: &dyn Fn(&str) -> String) -> String {
    let groups = r.groups();
    let Some(majority) = &r.majority else {
        let counts: Vec<String> = groups.iter().map(|(_, n)| n.len().to_string()).collect();
        let sides: Vec<String> = groups
            .iter()
            .map(|(v, nodes)| format!("{} on {}", what(v), list(nodes, names)))
            .collect();
        return format!("the pods split {}: {}", counts.join(":"), sides.join("; "));
    };
    let odd: Vec<String> = groups
        .iter()
        .filter(|(v, _)| v != majority)
        .map(|(v, nodes)| {
            let verb = if nodes.len() == 1 { "has" } else { "have" };
            format!("{} {verb} {}", list(nodes, names), what(v))
        })
        .collect();
    let others = groups
        .iter()
        .find(|(v, _)| v == majority)
        .map_or(0, |(_, n)| n.len());
    format!(
        "{} where the other {others} pod(s) have {}",
        odd.join(", "),
        what(majority)
    )
}

/// How a differing compared field is judged: its severity, who can fix it, the fix.
struct Judgement {
    severity: Severity,
    blame: Blame,
    fix: &'static str,
}

const SAME_IMAGE: &str = "Run every pod from the same image on the same node type";

/// The judgement of a differing field, None for rows that are only evidence (a
/// per-check row; a local verdict, judged with the summaries in failed_own_checks).
fn judgement(r: &Row, input: &TableInput<'_>) -> Option<Judgement> {
    let j = |severity, blame, fix| {
        Some(Judgement {
            severity,
            blame,
            fix,
        })
    };
    match r.field.as_str() {
        "local verdict" => None,
        f if f.starts_with("check ") => None,
        "nccl version" => j(
            Severity::Fail,
            Blame::Job,
            "Build every pod from one image (one libnccl for the whole job): ranks with different NCCL versions fail NCCL's init or hang in it",
        ),
        "gang options" => j(
            Severity::Fail,
            Blame::Job,
            "Give every pod the same --gang-sizes, --gang-iterations and --gang-timeout (one pod template): pods that measure differently never line up",
        ),
        "gpus" | "rdma devices" => j(
            Severity::Fail,
            device_blame(r, input),
            "Give every pod the same GPU and RDMA resources (nvidia.com/gpu, vpc.amazonaws.com/efa, rdma/...) in one pod template; where the odd pod's own checks report devices missing or down, drain its node: NCCL's ranks are pods x GPUs and the whole job runs at its slowest pod",
        ),
        f if f.starts_with("env NCCL_") => j(
            Severity::Fail,
            Blame::Job,
            "Set NCCL variables the same in every pod (one pod template): ranks that choose different algorithms, protocols, transports, channels or buffers hang in the first collective or fail",
        ),
        f if f.starts_with("env ") => j(
            Severity::Warn,
            Blame::Job,
            "Set the variable the same in every pod (one pod template): nccl-preflight cannot tell what a difference in it does",
        ),
        "cuda driver" | "rdma rates" | "socket speed" => j(
            Severity::Warn,
            Blame::Node,
            "Check the odd node's driver and links (nvidia-smi, ibstat, ethtool): the job runs at its slowest node",
        ),
        _ => j(Severity::Warn, Blame::Job, SAME_IMAGE),
    }
}

/// Fewer or more devices than the majority: the pod's own resource request (the
/// job's), unless an odd pod's own device check reports a problem (its node's).
fn device_blame(r: &Row, input: &TableInput<'_>) -> Blame {
    let check = if r.field == "gpus" {
        "gpu-devices"
    } else {
        "rdma-devices"
    };
    let odd: Vec<usize> = if r.odd.is_empty() {
        (0..r.values.len()).collect()
    } else {
        r.odd.clone()
    };
    let node_says_so = odd.iter().any(|&i| {
        input
            .fps
            .get(i)
            .and_then(|f| f.as_ref())
            .and_then(|f| f.checks.get(check))
            .is_some_and(|s| *s != Status::Pass)
    });
    if node_says_so {
        Blame::Node
    } else {
        Blame::Job
    }
}

/// What one differing compared row means.
fn row_problem(r: &Row, input: &TableInput<'_>) -> Option<Problem> {
    let names = input.names;
    let j = judgement(r, input)?;
    let field = r.field.strip_prefix("env ").unwrap_or(&r.field);
    let summary = if r.field == "nccl version" {
        version_text(r, input)
    } else {
        described(r, names, &|v| value_text(field, v))
    };
    let shown: Vec<String> = r
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{}={v}", node_name(i, names)))
        .collect();
    let mut p = Problem::new(j.severity, summary, j.fix).blamed(j.blame);
    p.evidence
        .push(format!("{}: {}", r.field, shown.join(", ")));
    Some(p)
}

/// "node 1 (job-worker-0) loads NCCL 2.28.3 (/usr/lib/...), the other 3 pod(s) NCCL
/// 2.28.9 (...)"; a split names every side with its library.
fn version_text(r: &Row, input: &TableInput<'_>) -> String {
    let path = |i: usize| {
        input
            .fps
            .get(i)
            .and_then(|f| f.as_ref())
            .and_then(|f| f.nccl_library.as_deref())
            .map_or(String::new(), |p| format!(" ({p})"))
    };
    let groups = r.groups();
    let Some(majority) = &r.majority else {
        let sides: Vec<String> = groups
            .iter()
            .map(|(v, nodes)| format!("NCCL {v}{} on {}", path(nodes[0]), list(nodes, input.names)))
            .collect();
        return format!("the pods split on NCCL's version: {}", sides.join("; "));
    };
    let odd: Vec<String> = r
        .odd
        .iter()
        .map(|&i| {
            format!(
                "{} loads NCCL {}{}",
                node_name(i, input.names),
                r.values[i],
                path(i)
            )
        })
        .collect();
    let (others, first) = groups
        .iter()
        .find(|(v, _)| v == majority)
        .map_or((0, 0), |(_, n)| (n.len(), n[0]));
    format!(
        "{}, the other {others} pod(s) NCCL {majority}{}",
        odd.join(", "),
        path(first)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(rank: u64, nccl: &str, gpus: u32, algo: &str) -> Option<Fingerprint> {
        Some(Fingerprint {
            node_rank: rank,
            nccl_version: Some(nccl.into()),
            gpus,
            env: [("NCCL_ALGO".to_string(), algo.to_string())].into(),
            checks: [("memlock".to_string(), Status::Pass)].into(),
            local_verdict: Status::Pass,
            ..Fingerprint::default()
        })
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pod-{i}")).collect()
    }

    const V: Option<Version> = Some(Version::new(2, 28, 9));

    fn judge(fps: &[Option<Fingerprint>]) -> Finding {
        consistency(&TableInput {
            rows: &rows(fps, V),
            fps,
            names: &names(fps.len()),
            unreadable: &[],
        })
    }

    #[test]
    fn agreeing_pods_pass_with_a_count() {
        let fps = vec![fp(0, "2.28.9", 8, "Ring"), fp(1, "2.28.9", 8, "Ring")];
        let r = rows(&fps, V);
        assert!(r.iter().all(|r| !r.differs()));
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Pass);
        assert!(
            f.summary
                .contains(&format!("agree on all {} fields", r.len())),
            "{}",
            f.summary
        );
    }

    #[test]
    fn differing_version_algo_and_gpu_count_fail_naming_the_odd_pod() {
        let fps = vec![
            fp(0, "2.28.9", 8, "Ring"),
            fp(1, "2.28.9", 8, "Ring"),
            fp(2, "2.21.5", 4, "Tree"),
        ];
        let r = rows(&fps, V);
        let v = r.iter().find(|r| r.field == "nccl version").unwrap();
        assert_eq!(
            (v.majority.as_deref(), v.odd.clone()),
            (Some("2.28.9"), vec![2])
        );
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Fail);
        let text = format!("{} {}", f.summary, f.evidence.join("\n"));
        assert!(text.contains("3 problems"), "{text}");
        assert!(
            text.contains("node 2 (pod-2) loads NCCL 2.21.5, the other 2 pod(s) NCCL 2.28.9"),
            "{text}"
        );
        assert!(
            text.contains(
                "node 2 (pod-2) has NCCL_ALGO=Tree where the other 2 pod(s) have NCCL_ALGO=Ring"
            ),
            "{text}"
        );
        assert!(
            text.contains("node 2 (pod-2) has 4 GPU(s) where the other 2 pod(s) have 8 GPU(s)"),
            "{text}"
        );
    }

    /// Issue 37, from the 4-pod GPU run: one pod sees 2 GPUs where three see 1. The
    /// one is named, never the three, and the difference is its own resource request.
    #[test]
    fn regression_the_odd_pod_is_the_minority_and_its_request_is_the_jobs() {
        let fps = vec![
            fp(0, "2.28.9", 1, "Ring"),
            fp(1, "2.28.9", 1, "Ring"),
            fp(2, "2.28.9", 2, "Ring"),
            fp(3, "2.28.9", 1, "Ring"),
        ];
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "node 2 (pod-2) has 2 GPU(s) where the other 3 pod(s) have 1 GPU(s)"
        );
        assert_eq!(f.blame(), Some(Blame::Job));
        // Where the odd pod's own GPU check reports a problem, the node is blamed.
        let mut sick = fps.clone();
        sick[2]
            .as_mut()
            .unwrap()
            .checks
            .insert("gpu-devices".into(), Status::Warn);
        assert_eq!(judge(&sick).blame(), Some(Blame::Node));
    }

    /// Expected before the tool ran, from the rule: two pods on each side name both
    /// sides as a split, none as the odd one.
    #[test]
    fn a_tie_is_a_split_with_both_sides_named() {
        let fps = vec![
            fp(0, "2.28.9", 1, "Ring"),
            fp(1, "2.28.9", 1, "Tree"),
            fp(2, "2.28.9", 1, "Tree"),
            fp(3, "2.28.9", 1, "Ring"),
        ];
        let r = rows(&fps, V);
        let algo = r.iter().find(|r| r.field == "env NCCL_ALGO").unwrap();
        assert!(algo.differs() && algo.majority.is_none() && algo.odd.is_empty());
        let f = judge(&fps);
        assert_eq!(
            f.summary,
            "the pods split 2:2: NCCL_ALGO=Ring on node 0 (pod-0), node 3 (pod-3); NCCL_ALGO=Tree on node 1 (pod-1), node 2 (pod-2)"
        );
        assert_eq!(f.status(), Status::Fail);
        // Two pods of two versions: a split too, each side with its library.
        let f = judge(&[fp(0, "2.28.9", 1, "Ring"), fp(1, "2.28.3", 1, "Ring")]);
        assert_eq!(
            f.summary,
            "the pods split on NCCL's version: NCCL 2.28.9 on node 0 (pod-0); NCCL 2.28.3 on node 1 (pod-1)"
        );
    }

    /// Issue 37: extra logging on one pod failed the job. Logging and tracing
    /// variables are notes, a pod's own description is not compared, and a variable
    /// nccl-preflight cannot place warns. Expected from NCCL 2.28.9's source before the
    /// run: NCCL_DEBUG_SUBSYS (src/debug.cc) observes, NCCL_PROXY_CPUSET (src/proxy.cc
    /// proxyCpusetOnceFunc) is the pod's, NCCL_BUFFSIZE (src/init.cc computeBuffSizes)
    /// decides, FI_LOG_LEVEL is not NCCL's.
    #[test]
    fn regression_a_debug_variable_on_one_pod_is_a_note_not_a_failure() {
        let with = |rank: u64, vars: &[(&str, &str)]| {
            let mut f = fp(rank, "2.28.9", 1, "Ring");
            for (k, v) in vars {
                f.as_mut().unwrap().env.insert(k.to_string(), v.to_string());
            }
            f
        };
        let fps = vec![
            with(0, &[]),
            with(1, &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "ALL")]),
            with(2, &[("NCCL_PROXY_CPUSET", "0-3")]),
        ];
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        assert!(
            f.summary
                .ends_with("(3 variable(s) NCCL does not act on differ)"),
            "{}",
            f.summary
        );
        assert!(
            f.evidence.iter().any(|e| e.starts_with(
                "not compared: node 1 (pod-1) has NCCL_DEBUG=INFO where the other 2 pod(s) have NCCL_DEBUG unset: only logging or tracing reads it (NCCL 2.28.9: src/debug.cc:ncclDebugInit)"
            )),
            "{:#?}",
            f.evidence
        );
        assert!(
            f.evidence
                .iter()
                .any(|e| e.contains("NCCL_PROXY_CPUSET") && e.contains("describes each pod")),
            "{:#?}",
            f.evidence
        );
        let f = judge(&[with(0, &[]), with(1, &[("NCCL_BUFFSIZE", "8388608")])]);
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(f.blame(), Some(Blame::Job));
        let f = judge(&[with(0, &[]), with(1, &[("FI_LOG_LEVEL", "debug")])]);
        assert_eq!(f.status(), Status::Warn);
    }

    #[test]
    fn other_differences_warn_and_a_missing_record_is_shown() {
        let mut b = fp(1, "2.28.9", 8, "Ring");
        b.as_mut().unwrap().libfabric_version = Some("1.22".into());
        let f = judge(&[fp(0, "2.28.9", 8, "Ring"), b]);
        assert_eq!(f.status(), Status::Warn, "{f:?}");
        let r = rows(&[fp(0, "2.28.9", 8, "Ring"), None], V);
        assert_eq!(r[0].values[1], "missing");
        // A missing record is neither odd nor a fewer-GPUs node.
        assert!(r.iter().all(|r| !r.differs()), "{r:?}");
        // A pod whose own checks failed fails the job, named.
        let mut c = fp(1, "2.28.9", 8, "Ring");
        c.as_mut().unwrap().local_verdict = Status::Fail;
        c.as_mut()
            .unwrap()
            .checks
            .insert("memlock".into(), Status::Fail);
        c.as_mut()
            .unwrap()
            .summaries
            .insert("memlock".into(), "RLIMIT_MEMLOCK is 8 MiB".into());
        let f = judge(&[fp(0, "2.28.9", 8, "Ring"), c]);
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "node 1 (pod-1) failed its own checks: memlock: RLIMIT_MEMLOCK is 8 MiB"
        );
        assert!(
            f.evidence.iter().any(|e| e == "check memlock: pass | fail"),
            "{f:?}"
        );
    }

    #[test]
    fn regression_one_count_and_the_unreadable_record_first() {
        // Issue 31 row 16: "agree on all 28 fields" above "agree on 26 of 28".
        let mut b = fp(1, "2.28.9", 8, "Ring");
        b.as_mut()
            .unwrap()
            .checks
            .insert("memlock".into(), Status::Warn);
        let fps = [fp(0, "2.28.9", 8, "Ring"), b];
        let f = judge(&fps);
        assert_eq!(f.status(), Status::Pass, "{f:?}");
        let total = rows(&fps, V).len();
        assert_eq!(
            f.summary,
            format!(
                "2 node(s) agree on {} of {total} fields; the rest differ only in checks that passed or warned",
                total - 1
            )
        );
        // Issue 31 row 15: a record that does not decode is the headline.
        let fps = [fp(0, "2.28.9", 8, "Ring"), fp(1, "2.28.9", 8, "Ring"), None];
        let f = consistency(&TableInput {
            rows: &rows(&fps, V),
            fps: &fps,
            names: &names(3),
            unreadable: &[(2, "fingerprint version 1".into())],
        });
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(
            f.summary,
            "node 2 (pod-2) sent a record this nccl-preflight cannot read: fingerprint version 1"
        );
        assert!(f.remediation().unwrap().contains("same nccl-preflight"));
        // Issue 31 row 17: the gang's own options are compared.
        let mut odd = fp(1, "2.28.9", 8, "Ring");
        odd.as_mut().unwrap().gang_options = "sizes 1MiB iterations 5".into();
        let f = judge(&[fp(0, "2.28.9", 8, "Ring"), odd]);
        assert_eq!(f.status(), Status::Fail);
        assert!(f.summary.contains("gang options"), "{f:?}");
    }
}
