//! What the launcher's variables say about the job's layout: how many nodes,
//! how many ranks on this one. torchrun sets WORLD_SIZE and LOCAL_WORLD_SIZE in
//! each worker; the Kubeflow training operator sets PET_NNODES (`N` or an
//! elastic `MIN:MAX`) and PET_NPROC_PER_NODE in the pod.

use crate::facts::Facts;

/// Launcher and container variables that say how ranks and GPUs are laid out.
pub const LAUNCHER_VARS: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "KUBERNETES_SERVICE_HOST",
    "LOCAL_WORLD_SIZE",
    "NVIDIA_VISIBLE_DEVICES",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "WORLD_SIZE",
];

/// Where `--nodes` (NCCL_PREFLIGHT_NODES) was recorded among the launcher variables
/// before it became a fact of its own (`Facts::nodes`): facts saved then still load.
const NODES_VAR: &str = "NCCL_PREFLIGHT_NODES";

/// The number of nodes the job spans, when `--nodes` or the launcher says; the
/// largest value an elastic range allows. The judges' view of [`job_nodes`].
pub fn nodes(facts: &Facts) -> Option<u64> {
    job_nodes(facts.nodes, &|name: &str| {
        facts.launcher.get(name).map(|v| v.value.clone())
    })
    .map(|(n, _)| n)
}

/// The job's node count and where it came from, one order for the judges and the
/// gang alike (issue 31 row 19): `stated` (`--nodes`), then PET_NNODES (the largest
/// value of an elastic `MIN:MAX`), then torchrun's per-process WORLD_SIZE /
/// LOCAL_WORLD_SIZE (16 / 8 is 2 nodes, never 16), then Open MPI's
/// OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE (1 when unset) and Hydra's
/// PMI_SIZE (one process per node, as the gang runs).
fn job_nodes(
    stated: Option<u64>,
    var: &dyn Fn(&str) -> Option<String>,
) -> Option<(u64, &'static str)> {
    if let Some(n) = stated.filter(|&n| n > 0) {
        return Some((n, "--nodes"));
    }
    let num = |name: &str| var(name).and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(v) = var("PET_NNODES") {
        let max = v.rsplit(':').next().unwrap_or("").trim().to_string();
        if let Ok(n) = max.parse::<u64>() {
            return Some((n, "PET_NNODES"));
        }
    }
    let per_node = |world: &'static str, local: &str, default: Option<u64>| {
        let w = num(world)?;
        let l = num(local).or(default).filter(|&l| l > 0)?;
        Some((w.div_ceil(l), world))
    };
    per_node("WORLD_SIZE", "LOCAL_WORLD_SIZE", None)
        .or_else(|| {
            per_node(
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                Some(1),
            )
        })
        .or_else(|| per_node("PMI_SIZE", "MPI_LOCALNRANKS", Some(1)))
}

/// Facts saved before `--nodes` was a fact of its own carry it as the launcher
/// variable NODES_VAR: moved to `Facts::nodes` (a positive count only), so the
/// judges see one place.
pub fn adopt_saved_nodes(facts: &mut Facts) {
    if let Some(saved) = facts.launcher.remove(NODES_VAR)
        && facts.nodes.is_none()
    {
        facts.nodes = saved.value.trim().parse::<u64>().ok().filter(|&n| n > 0);
    }
}

/// The most pods a gang takes (issue 31 row 11: a count of 1e8 allocated gigabytes
/// of peer names before anything failed): checked before anything is allocated.
const MAX_PODS: u64 = 65_536;

/// What the job's span means for RDMA: a single-node job never sends NCCL traffic
/// over EFA or InfiniBand (NVLink, PCIe and shared memory carry it), so RDMA
/// problems only warn there; a multi-node job trains at the network's speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The launcher or `--nodes` says one node.
    Single,
    /// The launcher or `--nodes` says this many nodes (more than one).
    Multi(u64),
    /// Nothing says: run by hand, or an initContainer without `--nodes`.
    Unknown,
}

/// The job's span from `--nodes` and the launcher variables.
pub fn span(facts: &Facts) -> Span {
    match nodes(facts) {
        Some(1) => Span::Single,
        Some(n) => Span::Multi(n),
        None => Span::Unknown,
    }
}

/// True when the launcher says the job spans more than one node.
pub fn is_multi_node(facts: &Facts) -> bool {
    nodes(facts).is_some_and(|n| n > 1)
}

/// What the command line says about the gang (`--gang-*` flags and their
/// NCCL_PREFLIGHT_GANG_* twins); every field left `None` comes from the launcher.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GangFlags {
    pub rank: Option<u64>,
    pub nodes: Option<u64>,
    pub root: Option<String>,
    pub port: Option<u16>,
    /// Every pod's host name in node-rank order (`--gang-peers`).
    pub peers: Vec<String>,
    /// This attempt of the job (`--gang-attempt`): pods of another attempt are refused.
    pub attempt: Option<String>,
}

/// Who this pod is in the gang and where the gang's root is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GangIdentity {
    /// The launcher the identity came from (`PyTorchJob`, `TrainJob/JobSet`, `MPI`,
    /// `Indexed Job`, `flags`).
    pub launcher: String,
    /// This pod's index, 0-based; 0 hosts the root.
    pub node_rank: u64,
    /// How many pods the gang has.
    pub nodes: u64,
    /// The rank-0 pod's host name or address.
    pub root: String,
    /// The port rank 0's NCCL root binds.
    pub port: u16,
    /// Every pod's host name in node-rank order, where the launcher's naming is known
    /// (empty otherwise): the names the gang waits for and names when one is missing.
    pub peers: Vec<String>,
    /// Which variable or flag gave each field, for the report.
    pub sources: Vec<String>,
    /// The job's attempt (`--gang-attempt`; empty when not given), part of the job key.
    pub attempt: String,
}

/// The port when the launcher names none (MPI, Indexed Job): one above torch's default
/// 29500, below the Linux ephemeral range (32768-60999), so no ephemeral bind takes it.
const DEFAULT_GANG_PORT: u16 = 29501;

/// Why no gang identity could be worked out (exit 2: the gang cannot run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityError(pub String);

impl std::fmt::Display for IdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityError {}

fn parse_count(name: &str, text: &str) -> Result<u64, IdentityError> {
    text.trim().parse::<u64>().map_err(|_| {
        IdentityError(format!(
            "{name}={text:?} is not a whole number (the gang needs a fixed pod count and rank)"
        ))
    })
}

/// The gang identity from flags first, then the launcher's variables (Kubeflow
/// training-operator v1 pkg/controller.v1/pytorch/envvar.go and master.go; Kubeflow
/// Trainer v2 pkg/runtime/framework/plugins/torch/torch.go; Open MPI's
/// OMPI_COMM_WORLD_*; Hydra's PMI_*; the Job controller's JOB_COMPLETION_INDEX).
/// `var` looks a variable up in the environment the tool runs in.
pub fn gang_identity(
    flags: &GangFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<GangIdentity, IdentityError> {
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let mut sources = Vec::new();
    let mpi = get("OMPI_COMM_WORLD_RANK").is_some() || get("PMI_RANK").is_some();
    unsupported_launch(&get)?;
    if flags.rank.is_none() {
        torchrun_worker(&get)?;
    }
    let node_rank = gang_rank(flags, &get, &mut sources)?;
    let nodes = gang_nodes(flags, &get, &mut sources)?;
    if nodes == 0 {
        return Err(IdentityError("the pod count is 0".to_string()));
    }
    if nodes > MAX_PODS {
        return Err(IdentityError(format!(
            "a gang of {nodes} pods is more than the {MAX_PODS} it takes"
        )));
    }
    if node_rank >= nodes {
        return Err(IdentityError(format!(
            "rank {node_rank} is not below the pod count {nodes}"
        )));
    }
    let root = gang_root(flags, &get, mpi, &mut sources)?;
    let port = gang_port(flags, &get, &mut sources)?;
    if port == 0 {
        return Err(IdentityError("the gang port is 0".to_string()));
    }
    let peers = if !flags.peers.is_empty() {
        if flags.peers.len() as u64 != nodes {
            return Err(IdentityError(format!(
                "--gang-peers names {} pods, the gang has {nodes}",
                flags.peers.len()
            )));
        }
        flags.peers.clone()
    } else {
        peer_names(&root, nodes)
    };
    Ok(GangIdentity {
        launcher: launcher(flags, &get, mpi).to_string(),
        node_rank,
        nodes,
        root,
        port,
        peers,
        sources,
        attempt: flags.attempt.clone().unwrap_or_default(),
    })
}

/// A set variable, with empty values counted as unset.
type Lookup<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// The first of `names` that is set, with its value.
fn first_set<'n>(names: &[&'n str], get: &Lookup<'_>) -> Option<(&'n str, String)> {
    names.iter().find_map(|n| get(n).map(|v| (*n, v)))
}

/// Launches the gang cannot run in: several MPI processes per pod, an elastic job.
fn unsupported_launch(get: &Lookup<'_>) -> Result<(), IdentityError> {
    if let Some(local) = get("OMPI_COMM_WORLD_LOCAL_SIZE")
        && local.trim() != "1"
    {
        return Err(IdentityError(format!(
            "OMPI_COMM_WORLD_LOCAL_SIZE={local}: the gang runs one process per pod, which drives every local GPU; start it with mpirun --map-by ppr:1:node"
        )));
    }
    // PET_NNODES is `N`, or `MIN:MAX` for an elastic job, which has no fixed ranks.
    if let Some(n) = get("PET_NNODES")
        && let Some((min, max)) = n.split_once(':')
        && min.trim() != max.trim()
    {
        return Err(IdentityError(format!(
            "PET_NNODES={n} is an elastic range: an elastic job has no fixed pod count or ranks, so the gang cannot run; use a fixed node count or --gang-nodes/--gang-rank"
        )));
    }
    Ok(())
}

/// torchrun gives each worker its own RANK (the process's global rank), LOCAL_RANK,
/// GROUP_RANK and LOCAL_WORLD_SIZE (torch/distributed/elastic/agent/server/
/// local_elastic_agent.py, `_start_workers`): with several workers on the pod, RANK is
/// no pod's rank (process 1 of node 0 has RANK=1) and every worker would join as a pod
/// of its own. The gang runs once per pod, before torchrun.
fn torchrun_worker(get: &Lookup<'_>) -> Result<(), IdentityError> {
    if let Some(local) = get("LOCAL_WORLD_SIZE")
        && local.trim().parse::<u64>().ok().is_none_or(|n| n > 1)
    {
        return Err(IdentityError(format!(
            "LOCAL_WORLD_SIZE={local:?}{}: this is one of a pod's torchrun workers, whose RANK is the process's, not the pod's; run the gang once per pod, before torchrun (an initContainer, or exec --gang -- torchrun ...), or give --gang-rank",
            get("LOCAL_RANK").map_or(String::new(), |r| format!(" and LOCAL_RANK={r:?}"))
        )));
    }
    Ok(())
}

/// This pod's rank: --gang-rank, else the first launcher variable set.
fn gang_rank(
    flags: &GangFlags,
    get: &Lookup<'_>,
    sources: &mut Vec<String>,
) -> Result<u64, IdentityError> {
    if let Some(r) = flags.rank {
        sources.push("rank from --gang-rank".to_string());
        return Ok(r);
    }
    let rank_vars = [
        "PET_NODE_RANK",
        "RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "JOB_COMPLETION_INDEX",
    ];
    let Some((name, value)) = first_set(&rank_vars, get) else {
        return Err(IdentityError(format!(
            "no gang rank: set --gang-rank (NCCL_PREFLIGHT_GANG_RANK); none of {} is set",
            rank_vars.join(", ")
        )));
    };
    sources.push(format!("rank from {name}"));
    parse_count(name, &value)
}

/// The pod count: --gang-nodes, else the first launcher variable set.
fn gang_nodes(
    flags: &GangFlags,
    get: &Lookup<'_>,
    sources: &mut Vec<String>,
) -> Result<u64, IdentityError> {
    if let Some(n) = flags.nodes {
        sources.push("nodes from --gang-nodes".to_string());
        return Ok(n);
    }
    if let Some((n, name)) = job_nodes(None, get) {
        sources.push(format!("nodes from {name}"));
        return Ok(n);
    }
    let node_vars = [
        "PET_NNODES",
        "WORLD_SIZE / LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
    ];
    // A variable that is set but no count (WORLD_SIZE=x) is named as such.
    if let Some((name, value)) = first_set(
        &[
            "PET_NNODES",
            "WORLD_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
        ],
        get,
    ) {
        parse_count(name, value.split(':').next().unwrap_or(""))?;
    }
    Err(IdentityError(format!(
        "no pod count: set --gang-nodes (NCCL_PREFLIGHT_GANG_NODES) or --nodes; none of {} gives one",
        node_vars.join(", ")
    )))
}

/// The rank-0 pod's host: --gang-root, else MASTER_ADDR or PET_MASTER_ADDR.
fn gang_root(
    flags: &GangFlags,
    get: &Lookup<'_>,
    mpi: bool,
    sources: &mut Vec<String>,
) -> Result<String, IdentityError> {
    if let Some(r) = &flags.root
        && !r.trim().is_empty()
    {
        sources.push("root from --gang-root".to_string());
        return Ok(r.trim().to_string());
    }
    let root_vars = ["MASTER_ADDR", "PET_MASTER_ADDR"];
    let Some((name, value)) = first_set(&root_vars, get) else {
        return Err(IdentityError(format!(
            "no root host: set --gang-root (NCCL_PREFLIGHT_GANG_ROOT) to the rank-0 pod's name{}; none of {} is set",
            if mpi {
                " (for MPI, pass it with mpirun -x NCCL_PREFLIGHT_GANG_ROOT=<first host of the hostfile>)"
            } else {
                ""
            },
            root_vars.join(", ")
        )));
    };
    sources.push(format!("root from {name}"));
    Ok(value.trim().to_string())
}

/// The gang's port: --gang-port, else the launcher's MASTER_PORT + 1, else the default.
fn gang_port(
    flags: &GangFlags,
    get: &Lookup<'_>,
    sources: &mut Vec<String>,
) -> Result<u16, IdentityError> {
    if let Some(p) = flags.port {
        sources.push("port from --gang-port".to_string());
        return Ok(p);
    }
    let Some((name, value)) = first_set(&["MASTER_PORT", "PET_MASTER_PORT"], get) else {
        sources.push(format!("port default {DEFAULT_GANG_PORT}"));
        return Ok(DEFAULT_GANG_PORT);
    };
    // MASTER_PORT=0 is no port the trainer can meet at; 0 + 1 = 1 is no gang port.
    let base: u16 = value
        .trim()
        .parse()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| IdentityError(format!("{name}={value:?} is not a port number (1-65535)")))?;
    let port = base.checked_add(1).ok_or_else(|| {
        IdentityError(format!(
            "{name}={value}: no port above it for the gang; set --gang-port"
        ))
    })?;
    sources.push(format!("port {name} + 1"));
    Ok(port)
}

/// Which launcher set the pod up, by the variables it leaves.
fn launcher(flags: &GangFlags, get: &Lookup<'_>, mpi: bool) -> &'static str {
    if flags.rank.is_some() && flags.root.is_some() {
        "flags"
    } else if get("PET_NODE_RANK").is_some() && get("MASTER_ADDR").is_some() {
        "PyTorchJob"
    } else if get("PET_NODE_RANK").is_some() || get("PET_MASTER_ADDR").is_some() {
        "TrainJob/JobSet"
    } else if mpi {
        "MPI"
    } else if get("JOB_COMPLETION_INDEX").is_some() {
        "Indexed Job"
    } else {
        "flags"
    }
}

/// The first host of an MPI hostfile: Open MPI's `host slots=N` lines, Hydra's
/// `host:N` (kubeflow/mpi-operator writes one line per worker, launcher first with
/// runLauncherAsWorker); comments and blank lines skipped.
pub fn hostfile_root(text: &str) -> Option<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .find(|l| !l.is_empty())
        .and_then(|l| l.split_whitespace().next())
        .map(|h| h.split(':').next().unwrap_or(h).to_string())
        // A DNS name is at most 253 bytes of letters, digits, `-`, `.` (`_` in some
        // clusters): anything else (NUL bytes from /dev/zero) is not a host.
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 253
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        })
}

/// Every pod's name from the rank-0 pod's name, where the launcher's naming is known:
/// PyTorchJob `<job>-master-0` -> `<job>-worker-<i-1>` (one headless Service per
/// replica, training-operator v1 pkg/controller.v1/common/service.go); Indexed Job /
/// JobSet / TrainJob `<name>-0[.<subdomain>]` -> `<name>-<i>[.<subdomain>]` (the Job's
/// pod hostname is `<job>-<index>`). Empty when the name follows neither (an address).
fn peer_names(root: &str, nodes: u64) -> Vec<String> {
    let (first, rest) = match root.split_once('.') {
        Some((f, r)) => (f, format!(".{r}")),
        None => (root, String::new()),
    };
    if root.parse::<std::net::IpAddr>().is_ok() {
        return Vec::new();
    }
    if let Some(job) = first.strip_suffix("-master-0") {
        return (0..nodes)
            .map(|i| {
                if i == 0 {
                    root.to_string()
                } else {
                    format!("{job}-worker-{}{rest}", i - 1)
                }
            })
            .collect();
    }
    if let Some(prefix) = first.strip_suffix("-0") {
        return (0..nodes).map(|i| format!("{prefix}-{i}{rest}")).collect();
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts whose launcher section holds `pairs` and no `--nodes`.
    fn env(pairs: &[(&str, &str)]) -> Facts {
        stated(None, pairs)
    }

    fn stated(nodes: Option<u64>, pairs: &[(&str, &str)]) -> Facts {
        let mut facts = crate::test_facts::healthy();
        facts.launcher = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), crate::facts::EnvValue::text(*v)))
            .collect();
        facts.nodes = nodes;
        facts
    }

    #[test]
    fn node_count_from_launchers() {
        assert_eq!(nodes(&env(&[("PET_NNODES", "4")])), Some(4));
        assert_eq!(nodes(&env(&[("PET_NNODES", "1:3")])), Some(3));
        assert_eq!(
            nodes(&env(&[("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8")])),
            Some(2)
        );
        assert_eq!(
            nodes(&env(&[("WORLD_SIZE", "8"), ("LOCAL_WORLD_SIZE", "0")])),
            None
        );
        assert_eq!(nodes(&env(&[("WORLD_SIZE", "x")])), None);
        assert!(!is_multi_node(&env(&[])));
        assert!(is_multi_node(&env(&[("PET_NNODES", "2")])));
        // --nodes wins over the launcher: the manifest knows the job, the initContainer does not.
        assert_eq!(
            span(&stated(Some(16), &[("PET_NNODES", "1")])),
            Span::Multi(16)
        );
        assert_eq!(span(&stated(Some(1), &[])), Span::Single);
        assert_eq!(span(&stated(Some(0), &[])), Span::Unknown);
        assert_eq!(span(&env(&[])), Span::Unknown);
        // The launcher variable no longer counts: only the typed fact does.
        assert_eq!(span(&env(&[(NODES_VAR, "16")])), Span::Unknown);
    }

    /// Facts saved while `--nodes` was the launcher variable NODES_VAR load with it as
    /// the typed fact, and a typed fact already there wins.
    #[test]
    fn saved_facts_with_the_nodes_variable_keep_their_span() {
        let mut old = env(&[(NODES_VAR, "16"), ("PET_NNODES", "1")]);
        adopt_saved_nodes(&mut old);
        assert_eq!((old.nodes, span(&old)), (Some(16), Span::Multi(16)));
        assert!(!old.launcher.contains_key(NODES_VAR));
        let mut both = stated(Some(2), &[(NODES_VAR, "16")]);
        adopt_saved_nodes(&mut both);
        assert_eq!(both.nodes, Some(2));
        let mut junk = env(&[(NODES_VAR, "x"), ("PET_NNODES", "3")]);
        adopt_saved_nodes(&mut junk);
        assert_eq!((junk.nodes, span(&junk)), (None, Span::Multi(3)));
    }

    fn lookup(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn gang_identity_from_each_launcher() {
        let none = GangFlags::default();
        // PyTorchJob: PET_NODE_RANK, PET_NNODES (not WORLD_SIZE), MASTER_ADDR, MASTER_PORT + 1.
        let py = gang_identity(
            &none,
            &lookup(&[
                ("MASTER_ADDR", "train-master-0"),
                ("MASTER_PORT", "23456"),
                ("PET_NNODES", "3"),
                ("PET_NODE_RANK", "2"),
                ("RANK", "2"),
                ("WORLD_SIZE", "24"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (
                py.launcher.as_str(),
                py.node_rank,
                py.nodes,
                py.root.as_str(),
                py.port
            ),
            ("PyTorchJob", 2, 3, "train-master-0", 23457)
        );
        assert_eq!(
            py.peers,
            ["train-master-0", "train-worker-0", "train-worker-1"]
        );
        // TrainJob v2: PET_* only.
        let tj = gang_identity(
            &none,
            &lookup(&[
                ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
                ("PET_MASTER_PORT", "29500"),
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (tj.launcher.as_str(), tj.node_rank, tj.nodes, tj.port),
            ("TrainJob/JobSet", 1, 2, 29501)
        );
        assert_eq!(tj.peers, ["tj-node-0-0.tj", "tj-node-0-1.tj"]);
        // MPI: ranks from Open MPI, root passed with mpirun -x, default port.
        let mpi = gang_identity(
            &none,
            &lookup(&[
                ("OMPI_COMM_WORLD_RANK", "3"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
                ("MASTER_ADDR", "job-worker-0.job.ns.svc"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (mpi.launcher.as_str(), mpi.node_rank, mpi.nodes, mpi.port),
            ("MPI", 3, 4, DEFAULT_GANG_PORT)
        );
        let hydra = gang_identity(
            &GangFlags {
                root: Some("h0".into()),
                ..GangFlags::default()
            },
            &lookup(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
        )
        .unwrap();
        assert_eq!((hydra.node_rank, hydra.nodes), (0, 2));
        // Indexed Job: the index from the Job controller, the rest from flags.
        let indexed = gang_identity(
            &GangFlags {
                nodes: Some(4),
                root: Some("job-0.svc".into()),
                ..GangFlags::default()
            },
            &lookup(&[("JOB_COMPLETION_INDEX", "1")]),
        )
        .unwrap();
        assert_eq!(
            (indexed.launcher.as_str(), indexed.node_rank, indexed.nodes),
            ("Indexed Job", 1, 4)
        );
        assert_eq!(indexed.peers[3], "job-3.svc");
    }

    #[test]
    fn hostfile_first_host() {
        assert_eq!(
            hostfile_root(
                "# workers\n\njob-worker-0.job.ns.svc slots=8\njob-worker-1.job.ns.svc slots=8\n"
            )
            .as_deref(),
            Some("job-worker-0.job.ns.svc")
        );
        assert_eq!(hostfile_root("h0:8\nh1:8").as_deref(), Some("h0"));
        assert_eq!(hostfile_root("\n# only a comment\n"), None);
        // Issue 31 row 7: NUL bytes (a hostfile that was /dev/zero) or an endless line
        // are no host name.
        assert_eq!(hostfile_root(&"\0".repeat(1 << 20)), None);
        assert_eq!(hostfile_root(&"a".repeat(254)), None);
        assert_eq!(hostfile_root("h\x1b[2J slots=1"), None);
    }

    #[test]
    fn gang_flags_override_the_launcher() {
        let flags = GangFlags {
            rank: Some(0),
            nodes: Some(2),
            root: Some("10.0.0.1".into()),
            port: Some(31000),
            peers: vec![],
            attempt: None,
        };
        let id = gang_identity(
            &flags,
            &lookup(&[
                ("PET_NODE_RANK", "1"),
                ("PET_NNODES", "8"),
                ("MASTER_ADDR", "x-master-0"),
                ("MASTER_PORT", "1234"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (
                id.node_rank,
                id.nodes,
                id.root.as_str(),
                id.port,
                id.launcher.as_str()
            ),
            (0, 2, "10.0.0.1", 31000, "flags")
        );
        // An address has no peer naming.
        assert!(id.peers.is_empty());
        let peers = GangFlags {
            peers: vec!["a".into(), "b".into()],
            ..flags.clone()
        };
        assert_eq!(
            gang_identity(&peers, &lookup(&[])).unwrap().peers,
            ["a", "b"]
        );
        let wrong = GangFlags {
            peers: vec!["a".into()],
            ..flags
        };
        assert!(gang_identity(&wrong, &lookup(&[])).is_err());
    }

    #[test]
    fn gang_identity_refusals_name_what_was_tried() {
        let none = GangFlags::default();
        let elastic = gang_identity(
            &none,
            &lookup(&[
                ("PET_NNODES", "1:4"),
                ("PET_NODE_RANK", "0"),
                ("MASTER_ADDR", "m"),
            ]),
        )
        .unwrap_err();
        assert!(
            elastic.0.contains("PET_NNODES=1:4") && elastic.0.contains("elastic"),
            "{elastic}"
        );
        // A fixed range is a count.
        let fixed = gang_identity(
            &none,
            &lookup(&[
                ("PET_NNODES", "2:2"),
                ("PET_NODE_RANK", "1"),
                ("MASTER_ADDR", "m"),
            ]),
        )
        .unwrap();
        assert_eq!(fixed.nodes, 2);
        let missing = gang_identity(&none, &lookup(&[])).unwrap_err();
        for var in [
            "--gang-rank",
            "PET_NODE_RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "JOB_COMPLETION_INDEX",
        ] {
            assert!(missing.0.contains(var), "{missing}");
        }
        let no_count = gang_identity(&none, &lookup(&[("JOB_COMPLETION_INDEX", "0")])).unwrap_err();
        assert!(
            no_count.0.contains("PET_NNODES") && no_count.0.contains("--gang-nodes"),
            "{no_count}"
        );
        let no_root = gang_identity(
            &none,
            &lookup(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]),
        )
        .unwrap_err();
        assert!(
            no_root.0.contains("MASTER_ADDR") && no_root.0.contains("mpirun -x"),
            "{no_root}"
        );
        let local = gang_identity(
            &none,
            &lookup(&[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
            ]),
        )
        .unwrap_err();
        assert!(local.0.contains("ppr:1:node"), "{local}");
        let over = gang_identity(
            &none,
            &lookup(&[
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", "2"),
                ("MASTER_ADDR", "m"),
            ]),
        )
        .unwrap_err();
        assert!(over.0.contains("rank 2"), "{over}");
        let bad = gang_identity(
            &none,
            &lookup(&[
                ("PET_NNODES", "two"),
                ("PET_NODE_RANK", "0"),
                ("MASTER_ADDR", "m"),
            ]),
        )
        .unwrap_err();
        assert!(bad.0.contains("PET_NNODES=\"two\""), "{bad}");
        let port = gang_identity(
            &none,
            &lookup(&[
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", "0"),
                ("MASTER_ADDR", "m"),
                ("MASTER_PORT", "65535"),
            ]),
        )
        .unwrap_err();
        assert!(port.0.contains("--gang-port"), "{port}");
    }

    /// Issue 39, re-run of the launcher values: in one of 8 torchrun workers of a pod
    /// (torchrun's per-process RANK=1, LOCAL_RANK=1, LOCAL_WORLD_SIZE=8, GROUP_RANK=0;
    /// MASTER_PORT its store's), RANK=1 became the pod's rank: process 1 of node 0 joined
    /// as pod 1. Expected, from torch's local_elastic_agent.py `_start_workers`: refused
    /// with the variables named, whether the rank comes from RANK or from the pod's
    /// PET_NODE_RANK (8 workers would all join as that pod); --gang-rank overrides it.
    /// Hostile values are refused with the value escaped, never used.
    #[test]
    fn a_torchrun_workers_per_process_values_are_no_pods_identity() {
        let none = GangFlags::default();
        let worker: &[(&str, &str)] = &[
            ("GROUP_RANK", "0"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "m"),
            ("MASTER_PORT", "41913"),
            ("PET_NNODES", "2"),
            ("RANK", "1"),
            ("WORLD_SIZE", "16"),
        ];
        let get = |extra: &'static [(&'static str, &'static str)]| {
            let all: Vec<(String, String)> = worker
                .iter()
                .chain(extra)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |name: &str| {
                all.iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            }
        };
        let e = gang_identity(&none, &get(&[])).unwrap_err();
        assert!(
            e.0.contains("LOCAL_WORLD_SIZE=\"8\" and LOCAL_RANK=\"1\"")
                && e.0.contains("once per pod"),
            "{e}"
        );
        let e = gang_identity(&none, &get(&[("PET_NODE_RANK", "0")])).unwrap_err();
        assert!(e.0.contains("torchrun workers"), "{e}");
        let e = gang_identity(&none, &get(&[("LOCAL_WORLD_SIZE", "x\u{1b}[2J")])).unwrap_err();
        assert!(e.0.contains("\\u{1b}[2J"), "escaped: {e}");
        let flagged = GangFlags {
            rank: Some(0),
            ..GangFlags::default()
        };
        assert_eq!(gang_identity(&flagged, &get(&[])).unwrap().node_rank, 0);
        for (port, why) in [
            ("29500;rm -rf /", "is not a port number"),
            ("-1", "is not a port number"),
            ("70000", "is not a port number"),
            ("0x7530", "is not a port number"),
            ("29500\u{1b}[2J", "\\u{1b}[2J\" is not a port number"),
            ("65535", "no port above it"),
        ] {
            let all: Vec<(&str, String)> = vec![
                ("PET_NNODES", "2".into()),
                ("PET_NODE_RANK", "0".into()),
                ("MASTER_ADDR", "m".into()),
                ("MASTER_PORT", port.to_string()),
            ];
            let lookup = |n: &str| all.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
            let e = gang_identity(&none, &lookup).unwrap_err();
            assert!(e.0.contains(why), "MASTER_PORT={port:?}: {e}");
        }
    }

    #[test]
    fn regression_pod_count_bound_port_zero_and_one_node_count() {
        let none = GangFlags::default();
        // Issue 31 row 11: a huge count is refused before anything is allocated.
        let huge = gang_identity(
            &GangFlags {
                nodes: Some(100_000_000),
                rank: Some(0),
                root: Some("m".into()),
                ..GangFlags::default()
            },
            &lookup(&[]),
        )
        .unwrap_err();
        assert!(huge.0.contains("65536"), "{huge}");
        // Issue 31 row 19: MASTER_PORT=0 is no port (it gave gang port 1).
        let zero = gang_identity(
            &none,
            &lookup(&[
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", "0"),
                ("MASTER_ADDR", "m"),
                ("MASTER_PORT", "0"),
            ]),
        )
        .unwrap_err();
        assert!(zero.0.contains("MASTER_PORT=\"0\" is not a port"), "{zero}");
        // Per-process torchrun values are 2 nodes for the judges; one worker per pod
        // is the pod, and gives the gang its identity.
        let per_process = [("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8")];
        assert_eq!(nodes(&env(&per_process)), Some(2));
        let id = gang_identity(
            &none,
            &lookup(&[
                ("WORLD_SIZE", "2"),
                ("LOCAL_WORLD_SIZE", "1"),
                ("LOCAL_RANK", "0"),
                ("RANK", "1"),
                ("MASTER_ADDR", "m"),
            ]),
        )
        .unwrap();
        assert_eq!((id.node_rank, id.nodes), (1, 2));
        assert!(
            id.sources.contains(&"nodes from WORLD_SIZE".to_string()),
            "{:?}",
            id.sources
        );
        // Open MPI with one process per node counts its world.
        assert_eq!(
            job_nodes(None, &|n: &str| (n == "OMPI_COMM_WORLD_SIZE")
                .then(|| "4".to_string())),
            Some((4, "OMPI_COMM_WORLD_SIZE"))
        );
    }
}
