//! The finding types every stage shares, and the one registry of check ids.
//!
//! A leaf module: it depends on nothing else in the crate, so judge, bench,
//! serve, explain-log, policy and render all speak the same types without
//! depending on each other. Check ids are stable (users pass them to
//! `--ignore`; ids never change once released), and every id any part of the
//! tool reports is declared here once, with where its answer comes from.

use serde::{Deserialize, Serialize};

/// Outcome of one check, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Skip,
    Pass,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Skip => "SKIP",
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// Where the fault of a failing or warning finding lies, decided by where its fix is
/// applied (issue 28, the failure-policy contract): on the node, or in the job. A
/// judged problem states who can change it ([`Owner`]) and its blame follows from that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Blame {
    /// The node's hardware, driver, kernel, fabric manager, NIC, links or their speed, or
    /// the container runtime's configuration there: the same pod on another node can pass.
    Node,
    /// The pod spec, the environment variables, the image's libraries or the launcher:
    /// retrying elsewhere fails the same way; the job must change.
    Job,
}

impl Blame {
    pub fn label(self) -> &'static str {
        match self {
            Blame::Node => "node",
            Blame::Job => "job",
        }
    }
}

/// Who can change what a problem needs changed (issue 36): the blame follows from it by
/// one mapping ([`Owner::blame`]; docs/failure-policy.md states it). A limit, a library or
/// a variable the job can change itself is the job's even when the node's defaults set
/// it: under the failure policy a pod blamed on the node is retried on node after node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Owner {
    /// The pod spec: the resources it requests (GPUs, RDMA devices, an IMEX channel),
    /// its volumes (/dev/shm), hostIPC, how many GPUs and processes a pod holds.
    PodSpec,
    /// The image: the libraries it ships (libnccl, the net plugin, libfabric, libibverbs,
    /// the CUDA runtime).
    Image,
    /// The job's environment: NCCL_* and FI_* variables, CUDA_VISIBLE_DEVICES, the
    /// launcher's variables.
    Environment,
    /// A soft limit below the hard one: the container raises it itself (`ulimit`, or
    /// setrlimit in its entrypoint), no node change needed.
    SoftLimit,
    /// The node's driver and kernel: the NVIDIA driver, kernel modules (nvidia-peermem,
    /// efa), IOMMU and ACS settings, MIG mode.
    Driver,
    /// The NVLink fabric: the fabric manager, NVSwitches, IMEX, NVLink partitions.
    FabricManager,
    /// A hard limit the container runtime sets (memlock, stack): only the node's owner
    /// raises it.
    HardLimit,
    /// The hardware: a GPU, a NIC, a port, a link, the PCIe tree.
    Hardware,
    /// The node's kubelet: which GPUs and NICs its device plugins hand a pod, and whether
    /// its topology manager keeps them on one CPU socket.
    Kubelet,
}

impl Owner {
    /// Every owner, for the tables that list them.
    pub const ALL: [Owner; 9] = [
        Owner::PodSpec,
        Owner::Image,
        Owner::Environment,
        Owner::SoftLimit,
        Owner::Driver,
        Owner::FabricManager,
        Owner::HardLimit,
        Owner::Hardware,
        Owner::Kubelet,
    ];

    /// The blame of a problem this owner can fix: the job's owner changes the pod spec,
    /// the image, the environment and soft limits; the node's owner the rest.
    pub fn blame(self) -> Blame {
        match self {
            Owner::PodSpec | Owner::Image | Owner::Environment | Owner::SoftLimit => Blame::Job,
            Owner::Driver
            | Owner::FabricManager
            | Owner::HardLimit
            | Owner::Hardware
            | Owner::Kubelet => Blame::Node,
        }
    }

    /// Its name in reports and docs/failure-policy.md (`pod-spec`, `hard-limit`).
    pub fn label(self) -> &'static str {
        match self {
            Owner::PodSpec => "pod-spec",
            Owner::Image => "image",
            Owner::Environment => "environment",
            Owner::SoftLimit => "soft-limit",
            Owner::Driver => "driver",
            Owner::FabricManager => "fabric-manager",
            Owner::HardLimit => "hard-limit",
            Owner::Hardware => "hardware",
            Owner::Kubelet => "kubelet",
        }
    }
}

impl From<Owner> for Blame {
    fn from(owner: Owner) -> Blame {
        owner.blame()
    }
}

/// What NCCL (or the job's processes) will do because of a problem (issue 36): every
/// judged warning and failure states one, and its status follows from it by one
/// mapping ([`Outcome::severity`]; docs/failure-policy.md states it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    /// NCCL's init or its first collective fails, with the error NCCL gives (its WARN
    /// text, the ncclResult_t), or a process of the job dies (SIGBUS).
    InitFails { error: String },
    /// NCCL hangs: where (bootstrap, connection setup, a collective).
    Hangs { at: String },
    /// The job cannot start: no GPU, a driver or library that does not load, or a
    /// requirement the gate was given (`--require`, `--min-*`) not met.
    CannotStart { why: String },
    /// NCCL runs on a slower path: which path, and at what cost.
    Degraded { path: String, cost: String },
    /// What NCCL will do could not be determined: what is not known (a file that could
    /// not be read, the job's span the launcher does not state).
    Undetermined { unknown: String },
    /// NCCL runs as it would without the problem: a note, never a warning.
    Unaffected,
}

impl Outcome {
    pub fn init_fails(error: impl Into<String>) -> Outcome {
        Outcome::InitFails {
            error: error.into(),
        }
    }

    pub fn hangs(at: impl Into<String>) -> Outcome {
        Outcome::Hangs { at: at.into() }
    }

    pub fn cannot_start(why: impl Into<String>) -> Outcome {
        Outcome::CannotStart { why: why.into() }
    }

    pub fn degraded(path: impl Into<String>, cost: impl Into<String>) -> Outcome {
        Outcome::Degraded {
            path: path.into(),
            cost: cost.into(),
        }
    }

    pub fn undetermined(unknown: impl Into<String>) -> Outcome {
        Outcome::Undetermined {
            unknown: unknown.into(),
        }
    }

    /// The one mapping from outcome to status: fail for an init failure, a hang or a
    /// job that cannot start; warn for a degraded run or one that could not be
    /// determined; `None` (a pass with a note) when NCCL is unaffected.
    pub fn severity(&self) -> Option<Severity> {
        match self {
            Outcome::InitFails { .. } | Outcome::Hangs { .. } | Outcome::CannotStart { .. } => {
                Some(Severity::Fail)
            }
            Outcome::Degraded { .. } | Outcome::Undetermined { .. } => Some(Severity::Warn),
            Outcome::Unaffected => None,
        }
    }

    /// Its kind as the report writes it (`init-fails`, `degraded`), and `unaffected`.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::InitFails { .. } => "init-fails",
            Outcome::Hangs { .. } => "hangs",
            Outcome::CannotStart { .. } => "cannot-start",
            Outcome::Degraded { .. } => "degraded",
            Outcome::Undetermined { .. } => "undetermined",
            Outcome::Unaffected => "unaffected",
        }
    }

    /// One line for reports: `init fails: ...`, `degraded: NET/Socket (90x slower)`.
    pub fn describe(&self) -> String {
        match self {
            Outcome::InitFails { error } => format!("init fails: {error}"),
            Outcome::Hangs { at } => format!("hangs: {at}"),
            Outcome::CannotStart { why } => format!("cannot start: {why}"),
            Outcome::Degraded { path, cost } => format!("degraded: {path} ({cost})"),
            Outcome::Undetermined { unknown } => format!("undetermined: {unknown}"),
            Outcome::Unaffected => "unaffected".to_string(),
        }
    }
}

/// A run's fault: where its failures lie, which decides the exit code (0, 1 or 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// No check failed (warnings allowed).
    #[default]
    None,
    /// At least one failure lies with the job: fix the job (a mixed run is a job fault,
    /// since the job must change anyway).
    Job,
    /// Every failure lies with this node: retry the pod elsewhere.
    Node,
}

impl Fault {
    /// The first words of a termination message or a verdict line: what to do about it.
    pub(crate) fn advice(self) -> Option<&'static str> {
        match self {
            Fault::None => None,
            Fault::Job => Some("job fault: fix the job"),
            Fault::Node => Some("node fault: retry elsewhere"),
        }
    }
}

/// The fault of a run: `Job` when any failure blames the job, `Node` when every failure
/// blames the node, `None` when nothing failed. A failure with no blame yet counts as
/// the job's (a failure no table places must not send the pod round the nodes).
pub(crate) fn fault(findings: &[Finding]) -> Fault {
    let mut failed = findings.iter().filter(|f| f.status == Status::Fail);
    let Some(first) = failed.next() else {
        return Fault::None;
    };
    let node = |f: &Finding| f.blame == Some(Blame::Node);
    if node(first) && failed.all(node) {
        Fault::Node
    } else {
        Fault::Job
    }
}

/// How bad a problem is: the statuses that need a fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warn,
    Fail,
}

impl Severity {
    pub fn status(self) -> Status {
        match self {
            Severity::Warn => Status::Warn,
            Severity::Fail => Status::Fail,
        }
    }
}

/// One check's verdict, with what it saw and how to fix it.
///
/// The check contract is in the type: a warning or a failure is built only through
/// [`Finding::warn`], [`Finding::fail`] or [`Finding::flagged`], which take the
/// remediation; a pass or a skip has none. Status and remediation are private so no
/// code can turn a pass into a failure afterwards, and a report read back from JSON
/// is refused when a warning or failure lacks its fix. Outside this module a failure
/// without a fix does not compile:
///
/// ```compile_fail
/// use nccl_preflight::finding::{Finding, Status};
/// let mut f = Finding::pass("dev-shm", "fine");
/// f.status = Status::Fail;
/// ```
///
/// ```compile_fail
/// use nccl_preflight::finding::Finding;
/// let f = Finding::fail("dev-shm", "/dev/shm is 64 MiB");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "FindingRecord")]
pub struct Finding {
    pub id: String,
    status: Status,
    /// One line.
    pub summary: String,
    /// What was observed, one item per line.
    pub evidence: Vec<String>,
    /// What to paste to fix it: present exactly when the status is warn or fail.
    remediation: Option<String>,
    /// True when `--ignore` turned a failure into this warning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    ignored: bool,
    /// Where the fault lies: only on a warning or a failure (absent from reports of older
    /// versions). A check's judge may set it ([`Finding::blamed`]); otherwise the check
    /// table's default is stamped on when the report is built ([`Finding::blamed_by_default`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blame: Option<Blame>,
    /// What NCCL will do (issue 36): on every warning and failure a judge gives, and the
    /// status follows from it ([`Outcome::severity`]); absent from measured and runtime
    /// findings, which say what happened, and from reports of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    outcome: Option<Box<Outcome>>,
    /// True on a warning or failure that says the check could not determine what it
    /// judges (what it reads could not be read): no statement about the node. `probe
    /// --npd` answers Unknown when every finding that judged something is one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    undetermined: bool,
}

/// A finding as JSON holds it, checked against the contract before it becomes one.
#[derive(Deserialize)]
struct FindingRecord {
    id: String,
    status: Status,
    summary: String,
    evidence: Vec<String>,
    remediation: Option<String>,
    #[serde(default)]
    ignored: bool,
    #[serde(default)]
    blame: Option<Blame>,
    #[serde(default)]
    outcome: Option<Box<Outcome>>,
    #[serde(default)]
    undetermined: bool,
}

impl TryFrom<FindingRecord> for Finding {
    type Error = String;

    fn try_from(r: FindingRecord) -> Result<Self, Self::Error> {
        let needs_fix = r.status >= Status::Warn;
        if needs_fix != r.remediation.is_some() {
            return Err(format!(
                "finding {:?}: status {} {} a remediation",
                r.id,
                r.status.label(),
                if needs_fix { "needs" } else { "cannot carry" }
            ));
        }
        if r.ignored && r.status != Status::Warn {
            return Err(format!(
                "finding {:?}: only a warning can be an ignored failure",
                r.id
            ));
        }
        if r.blame.is_some() && !needs_fix {
            return Err(format!(
                "finding {:?}: status {} cannot carry a blame",
                r.id,
                r.status.label()
            ));
        }
        // The status follows from the outcome; an ignored failure is a warning.
        if let Some(o) = &r.outcome {
            let follows = match o.severity() {
                Some(s) => s.status() == r.status || (r.ignored && s == Severity::Fail),
                None => false,
            };
            if !follows {
                return Err(format!(
                    "finding {:?}: status {} does not follow from its outcome ({})",
                    r.id,
                    r.status.label(),
                    o.describe()
                ));
            }
        }
        Ok(Finding {
            id: r.id,
            status: r.status,
            summary: r.summary,
            evidence: r.evidence,
            remediation: r.remediation,
            ignored: r.ignored,
            blame: r.blame,
            outcome: r.outcome,
            undetermined: r.undetermined && needs_fix,
        })
    }
}

impl Finding {
    fn build(id: &str, status: Status, summary: String, remediation: Option<String>) -> Self {
        Finding {
            id: id.to_string(),
            status,
            summary,
            evidence: Vec::new(),
            remediation,
            ignored: false,
            blame: None,
            outcome: None,
            undetermined: false,
        }
    }

    /// Nothing wrong.
    pub fn pass(id: &str, summary: impl Into<String>) -> Self {
        Self::build(id, Status::Pass, summary.into(), None)
    }

    /// Nothing to judge here (no device, not this image, not asked for).
    pub fn skip(id: &str, summary: impl Into<String>) -> Self {
        Self::build(id, Status::Skip, summary.into(), None)
    }

    /// What NCCL will do because of a problem, with its fix: the status follows from
    /// the outcome (fail: init fails, hangs, cannot start; warn: degraded or
    /// undetermined). An unaffected NCCL is a pass, the fix kept as a note.
    pub fn predicts(
        id: &str,
        outcome: Outcome,
        summary: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        match outcome.severity() {
            Some(severity) => {
                let mut f = Self::flagged(id, severity, summary, remediation);
                // What NCCL does could not be determined: no statement about the node.
                f.undetermined = matches!(outcome, Outcome::Undetermined { .. });
                f.outcome = Some(Box::new(outcome));
                f
            }
            None => Self::pass(id, summary).evidence(note_fix(&remediation.into())),
        }
    }

    /// A problem that does not stop the job, with its fix. Judges state an outcome
    /// instead ([`Finding::predicts`]); this is for what was measured or seen.
    pub fn warn(id: &str, summary: impl Into<String>, remediation: impl Into<String>) -> Self {
        Self::flagged(id, Severity::Warn, summary, remediation)
    }

    /// A problem that fails the check, with its fix.
    pub fn fail(id: &str, summary: impl Into<String>, remediation: impl Into<String>) -> Self {
        Self::flagged(id, Severity::Fail, summary, remediation)
    }

    /// A problem of a severity decided at run time, with its fix.
    pub fn flagged(
        id: &str,
        severity: Severity,
        summary: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        Self::build(
            id,
            severity.status(),
            summary.into(),
            Some(remediation.into()),
        )
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// The fix: `Some` exactly when the status is warn or fail.
    pub fn remediation(&self) -> Option<&str> {
        self.remediation.as_deref()
    }

    /// True when `--ignore` turned a failure into this warning.
    pub fn is_ignored(&self) -> bool {
        self.ignored
    }

    /// Where the fault lies: `Some` on a warning or a failure once blamed.
    pub fn blame(&self) -> Option<Blame> {
        self.blame
    }

    /// What NCCL will do: `Some` on a judged warning or failure.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_deref()
    }

    /// This finding's own blame, where the check can fail for either reason (gpu-p2p:
    /// one GPU per pod is the job's, P2P disabled by ACS is the node's): the [`Owner`]
    /// who can change it, whose blame it is. A pass or a skip carries none.
    pub fn blamed(mut self, blame: impl Into<Blame>) -> Self {
        if self.status >= Status::Warn {
            self.blame = Some(blame.into());
        }
        self
    }

    /// Marks a warning or failure as "could not determine" (see the field); a pass or a
    /// skip stays as it is.
    pub fn undetermined(mut self) -> Self {
        self.undetermined = self.status >= Status::Warn;
        self
    }

    /// True on a warning or failure that could not determine what the check judges.
    pub fn is_undetermined(&self) -> bool {
        self.undetermined
    }

    /// The check's default blame, where the finding has none of its own.
    pub fn blamed_by_default(self, default: Blame) -> Self {
        match self.blame {
            Some(_) => self,
            None => self.blamed(default),
        }
    }

    /// `--ignore`: a failure becomes a flagged warning, keeping its fix; other statuses
    /// are left as they are.
    pub fn ignore(mut self) -> Self {
        if self.status == Status::Fail {
            self.status = Status::Warn;
            self.ignored = true;
        }
        self
    }

    /// Rewrites the fix's text (for example to quote it for a terminal); the finding
    /// keeps having one exactly when it had one.
    pub fn map_remediation(mut self, f: impl FnOnce(String) -> String) -> Self {
        self.remediation = self.remediation.map(f);
        self
    }

    pub fn evidence(mut self, line: impl Into<String>) -> Self {
        self.evidence.push(line.into());
        self
    }
}

/// The worst status among the findings, as the verdict: `pass`, `warn` or `fail`.
pub(crate) fn verdict(findings: &[Finding]) -> Status {
    findings
        .iter()
        .map(|f| f.status)
        .max()
        .unwrap_or(Status::Pass)
        .max(Status::Pass)
}

/// One problem a check found: how bad, what, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// How bad; `None` for a note (NCCL unaffected), which never raises a finding's status.
    status: Option<Severity>,
    /// What NCCL will do (a judged problem); `None` for one measured or seen at run time.
    outcome: Option<Outcome>,
    pub summary: String,
    pub evidence: Vec<String>,
    pub remediation: String,
    /// Where this problem's fault lies, where it differs from the check's default.
    pub blame: Option<Blame>,
    /// "Could not determine" (see [`Finding::undetermined`]).
    pub undetermined: bool,
}

impl Problem {
    /// A problem measured or seen at run time, of a known severity.
    pub(crate) fn new(
        status: Severity,
        summary: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        Problem {
            status: Some(status),
            outcome: None,
            summary: summary.into(),
            evidence: Vec::new(),
            remediation: remediation.into(),
            blame: None,
            undetermined: false,
        }
    }

    /// A judged problem: what NCCL will do because of it; its severity follows.
    pub(crate) fn predicts(
        outcome: Outcome,
        summary: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        Problem {
            status: outcome.severity(),
            undetermined: matches!(outcome, Outcome::Undetermined { .. }),
            outcome: Some(outcome),
            summary: summary.into(),
            evidence: Vec::new(),
            remediation: remediation.into(),
            blame: None,
        }
    }

    /// This problem's own blame (see [`Finding::blamed`]).
    pub(crate) fn blamed(mut self, blame: impl Into<Blame>) -> Self {
        self.blame = Some(blame.into());
        self
    }

    /// "Could not determine" (see [`Finding::undetermined`]).
    pub(crate) fn undetermined(mut self) -> Self {
        self.undetermined = true;
        self
    }
}

/// A note's fix as one evidence line: a pass cannot carry a remediation.
fn note_fix(remediation: &str) -> String {
    format!("to act on it: {}", remediation.replace('\n', " "))
}

/// The blame of problems judged together: the job's when any of them blames the job,
/// the node's when all of them blame the node, else the check's default (`None`), which
/// is right either way: a default of job makes a mix the job's, a default of node means
/// every problem is the node's.
fn combined_blame(problems: &[&Problem]) -> Option<Blame> {
    if problems.iter().any(|p| p.blame == Some(Blame::Job)) {
        Some(Blame::Job)
    } else if problems.iter().all(|p| p.blame == Some(Blame::Node)) {
        Some(Blame::Node)
    } else {
        None
    }
}

/// The problems in the order a finding shows them: the worst first, and among the
/// worst those that carry the finding's blame first (issue 39 row 5: the line that
/// leads names the problem the blame comes from), notes last.
fn worst_first(problems: &mut [Problem]) -> Option<Blame> {
    problems.sort_by_key(|p| std::cmp::Reverse(p.status));
    let worst = problems.first().and_then(|p| p.status);
    let worst_ones: Vec<&Problem> = problems.iter().filter(|p| p.status == worst).collect();
    let blame = combined_blame(&worst_ones);
    if let Some(b) = blame {
        problems.sort_by_key(|p| (std::cmp::Reverse(p.status), p.blame != Some(b)));
    }
    blame
}

/// One finding from a check's problems: a pass with `pass_summary` when there are
/// none (or only notes, which it mentions), else the worst status, its summary (with a
/// count when there are several), the worst problem's outcome, every problem's
/// evidence, and each distinct fix once.
pub(crate) fn combine(
    id: &str,
    pass_summary: String,
    evidence: Vec<String>,
    mut problems: Vec<Problem>,
) -> Finding {
    let blame = worst_first(&mut problems);
    let Some(worst) = problems.first().and_then(|p| p.status) else {
        return noted_pass(id, pass_summary, evidence, &problems);
    };
    let (flagged, notes): (Vec<&Problem>, Vec<&Problem>) =
        problems.iter().partition(|p| p.status.is_some());
    let summary = if flagged.len() == 1 {
        flagged[0].summary.clone()
    } else {
        format!("{} problems; worst: {}", flagged.len(), flagged[0].summary)
    };
    let mut all_evidence = evidence;
    for p in &flagged {
        if flagged.len() > 1 {
            all_evidence.push(p.summary.clone());
        }
        all_evidence.extend(p.evidence.iter().cloned());
    }
    // A note keeps its fix beside it: the finding's remediation is for what NCCL does.
    for n in &notes {
        all_evidence.push(format!("note: {}", n.summary));
        all_evidence.extend(n.evidence.iter().cloned());
        all_evidence.push(note_fix(&n.remediation));
    }
    let mut fixes: Vec<&str> = Vec::new();
    for p in &flagged {
        if !fixes.contains(&p.remediation.as_str()) {
            fixes.push(&p.remediation);
        }
    }
    let mut f = Finding::flagged(id, worst, summary, fixes.join("\n"));
    f.evidence = all_evidence;
    f.outcome = flagged[0].outcome.clone().map(Box::new);
    f.blame = blame;
    // Undetermined only when nothing the check flagged was determined.
    f.undetermined = flagged.iter().all(|p| p.undetermined);
    f
}

/// A pass whose only problems are notes (NCCL unaffected): the summary names the first,
/// the evidence holds each with its fix.
fn noted_pass(id: &str, pass_summary: String, evidence: Vec<String>, notes: &[Problem]) -> Finding {
    let summary = match notes {
        [] => pass_summary,
        [one] => format!("{pass_summary}; note: {}", one.summary),
        [first, ..] => format!(
            "{pass_summary}; {} notes, first: {}",
            notes.len(),
            first.summary
        ),
    };
    let mut f = Finding::pass(id, summary);
    f.evidence = evidence;
    for n in notes {
        f.evidence.push(format!("note: {}", n.summary));
        f.evidence.extend(n.evidence.iter().cloned());
        f.evidence.push(note_fix(&n.remediation));
    }
    f
}

/// Where a check's answer comes from, which decides where it can be judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The node and the pod: limits, mounts, namespaces, devices, GPUs through the NVIDIA
    /// runtime's injected libraries. The same in every container of the pod.
    Node,
    /// The image's own libraries (libibverbs, libfabric, libnccl, the net plugin): only the
    /// trainer's image shows the ones training will load.
    Image,
    /// The user's settings, judged against the node.
    Settings,
    /// A measurement (`bench`, `init --bench`).
    Measured,
    /// Events seen while running (`serve`).
    Runtime,
}

/// One check id with what it looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckInfo {
    pub id: &'static str,
    /// What the check looks at, for `--help` and docs/checks.md.
    pub title: &'static str,
    pub source: Source,
    /// Who changes what a failure needs changed unless the finding says otherwise, whose
    /// blame is the check's default, and why: where the fix is applied
    /// (docs/failure-policy.md lists every check's).
    pub owner: Owner,
    pub blame_why: &'static str,
}

/// The ids of the checks reported outside the judge (bench, serve), as constants, so no
/// stage spells one twice. A judged check's id is the `ID` of its own file in `judge`.
pub(crate) mod ids {
    pub(crate) const GPU_BANDWIDTH: &str = "gpu-bandwidth";
    pub(crate) const NCCL_ALLREDUCE: &str = "nccl-allreduce";
    pub(crate) const GPU_XID: &str = "gpu-xid";
    pub(crate) const GANG_JOIN: &str = "gang-join";
    pub(crate) const GANG_CONSISTENCY: &str = "gang-consistency";
    pub(crate) const GANG_BANDWIDTH: &str = "gang-bandwidth";
    pub(crate) const NCCL_CONF: &str = "nccl-conf";
    pub(crate) const NCCL_JOB: &str = "nccl-job";
    pub(crate) const NCCL_DIAGNOSTICS: &str = "nccl-diagnostics";
}

/// The checks reported outside the judge: measured by `bench`, seen while serving. The
/// judged checks are the rows of `judge::CHECKS`, one per check, beside their judges.
const REGISTRY: &[CheckInfo] = &[
    CheckInfo {
        id: ids::GPU_BANDWIDTH,
        title: "measured GPU peer-copy bandwidth against the links' figure (bench)",
        source: Source::Measured,
        owner: Owner::Hardware,
        blame_why: "a peer copy below the links' figure is a link, a switch or a GPU of this node: the fix is the node's (reseat, replace, drain)",
    },
    CheckInfo {
        id: ids::NCCL_ALLREDUCE,
        title: "measured NCCL all-reduce bandwidth and transport (bench)",
        source: Source::Measured,
        owner: Owner::Hardware,
        blame_why: "an all-reduce below what this node's links give is the node's links or GPUs; the job's variables are judged by nccl-env",
    },
    CheckInfo {
        id: ids::GPU_XID,
        title: "GPU XID events seen while serving",
        source: Source::Runtime,
        owner: Owner::Hardware,
        blame_why: "an XID is the GPU or its driver reporting a fault on this node",
    },
    CheckInfo {
        id: ids::NCCL_JOB,
        title: "the running job through NCCL's RAS: hung collectives, dead ranks, NCCL errors (serve --watch-nccl)",
        source: Source::Runtime,
        owner: Owner::Hardware,
        blame_why: "a hung collective or a dead rank is a rank whose node stopped answering; the job's settings are judged before it starts",
    },
    CheckInfo {
        id: ids::NCCL_DIAGNOSTICS,
        title: "NCCL's own RAS diagnostics (2.31+: ECC, NVLink, Xid/SXid, drivers, NCCL_* across ranks) judged (serve POST /job/diagnose, gang)",
        source: Source::Runtime,
        owner: Owner::Hardware,
        blame_why: "NCCL's diagnostics report ECC, NVLink, Xid and driver faults of the ranks' nodes; ranks that differ only in their NCCL_* settings are the job's (set per finding)",
    },
    CheckInfo {
        id: ids::GANG_JOIN,
        title: "every pod of the job joined one NCCL communicator in time (gang)",
        source: Source::Measured,
        owner: Owner::Hardware,
        blame_why: "a pod that never came or that NCCL could not join is named by the gang: its node or its links; a duplicate rank, a refused or stale pod or a port held in the pod are the job's (set per finding)",
    },
    CheckInfo {
        id: ids::GANG_CONSISTENCY,
        title: "the pods agree: NCCL version, driver, GPUs, NICs, plugin, NCCL/FI variables, local verdicts (gang)",
        source: Source::Measured,
        owner: Owner::Image,
        blame_why: "pods that disagree on NCCL, variables or options were built from different images or templates: the job's; a pod with fewer GPUs or RDMA devices, or whose own failures are all its node's, is the node's (set per finding)",
    },
    CheckInfo {
        id: ids::NCCL_CONF,
        title: "the nccl.conf `init --nccl-conf` writes is one the image's NCCL reads (NCCL_CONF_FILE: 2.23 and later)",
        source: Source::Image,
        owner: Owner::Image,
        blame_why: "the nccl.conf is read by the image's NCCL (2.23 and later): the image is the job's",
    },
    CheckInfo {
        id: ids::GANG_BANDWIDTH,
        title: "all-reduce busbw across the job, the transport NCCL chose, the node x node matrix and its straggler (gang)",
        source: Source::Measured,
        owner: Owner::Hardware,
        blame_why: "a slow all-reduce, a straggler or a link below its figure is a node's links; NCCL on sockets despite RDMA devices or a pod sending nonsense is the job's (set per finding)",
    },
];

/// The ids of the checks reported outside the judge.
pub(crate) fn all_ids() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|c| c.id)
}

/// The registry entry of an id.
pub(crate) fn info(id: &str) -> Option<&'static CheckInfo> {
    REGISTRY.iter().find(|c| c.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_read_back_keeps_the_contract() {
        let fail = Finding::fail("dev-shm", "small", "mount a bigger /dev/shm").evidence("64 MiB");
        let text = serde_json::to_string(&fail).unwrap();
        assert_eq!(serde_json::from_str::<Finding>(&text).unwrap(), fail);
        let ignored = fail.clone().ignore();
        assert_eq!(
            (ignored.status(), ignored.is_ignored()),
            (Status::Warn, true)
        );
        assert_eq!(ignored.remediation(), Some("mount a bigger /dev/shm"));
        let text = serde_json::to_string(&ignored).unwrap();
        assert_eq!(serde_json::from_str::<Finding>(&text).unwrap(), ignored);
        for (json, why) in [
            (
                r#"{"id":"x","status":"fail","summary":"s","evidence":[],"remediation":null}"#,
                "needs a remediation",
            ),
            (
                r#"{"id":"x","status":"warn","summary":"s","evidence":[],"remediation":null}"#,
                "needs a remediation",
            ),
            (
                r#"{"id":"x","status":"pass","summary":"s","evidence":[],"remediation":"do"}"#,
                "cannot carry a remediation",
            ),
            (
                r#"{"id":"x","status":"fail","summary":"s","evidence":[],"remediation":"do","ignored":true}"#,
                "only a warning",
            ),
        ] {
            let err = serde_json::from_str::<Finding>(json)
                .unwrap_err()
                .to_string();
            assert!(err.contains(why) && err.contains("\"x\""), "{err}");
        }
    }

    #[test]
    fn ignore_leaves_passes_and_warnings_alone() {
        let pass = Finding::pass("memlock", "fine");
        assert_eq!(pass.clone().ignore(), pass);
        let warn = Finding::warn("memlock", "low", "raise it");
        assert_eq!(warn.clone().ignore(), warn);
    }

    #[test]
    fn the_fault_is_the_jobs_when_any_failure_is_and_the_nodes_when_all_are() {
        let node = || Finding::fail("nvlink", "down", "drain").blamed(Blame::Node);
        let job = || Finding::fail("dev-shm", "small", "mount").blamed(Blame::Job);
        let warn_job = Finding::warn("nccl-env", "typo", "fix").blamed(Blame::Job);
        assert_eq!(fault(&[]), Fault::None);
        assert_eq!(fault(std::slice::from_ref(&warn_job)), Fault::None);
        assert_eq!(fault(&[node(), warn_job.clone()]), Fault::Node);
        assert_eq!(fault(&[node(), node()]), Fault::Node);
        assert_eq!(fault(&[node(), job()]), Fault::Job);
        assert_eq!(fault(&[job(), node()]), Fault::Job);
        // A failure no table placed counts as the job's, never as a reason to move on.
        assert_eq!(fault(&[node(), Finding::fail("x", "s", "fix")]), Fault::Job);
        // An ignored failure is a warning: it no longer decides the fault.
        assert_eq!(fault(&[node(), job().ignore()]), Fault::Node);
        assert_eq!(job().ignore().blame(), Some(Blame::Job));
        // A pass or a skip never carries a blame; a default never overrides the finding's own.
        assert_eq!(Finding::pass("x", "ok").blamed(Blame::Job).blame(), None);
        assert_eq!(
            node().blamed_by_default(Blame::Job).blame(),
            Some(Blame::Node)
        );
        let text = serde_json::to_string(&node()).unwrap();
        assert!(text.contains(r#""blame":"node""#), "{text}");
        assert_eq!(serde_json::from_str::<Finding>(&text).unwrap(), node());
        let err = serde_json::from_str::<Finding>(
            r#"{"id":"x","status":"pass","summary":"s","evidence":[],"remediation":null,"blame":"job"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("cannot carry a blame"), "{err}");
    }

    #[test]
    fn combined_problems_blame_the_job_if_any_of_the_worst_does() {
        let p = |s, b: Option<Blame>| {
            let p = Problem::new(s, "p", "fix");
            match b {
                Some(b) => p.blamed(b),
                None => p,
            }
        };
        let blame = |problems| combine("gang-consistency", "ok".into(), vec![], problems).blame();
        let (node, job) = (Some(Blame::Node), Some(Blame::Job));
        assert_eq!(
            blame(vec![p(Severity::Fail, node), p(Severity::Fail, job)]),
            job
        );
        assert_eq!(
            blame(vec![p(Severity::Fail, node), p(Severity::Fail, node)]),
            node
        );
        // Only the worst problems decide: a job warning beside a node failure.
        assert_eq!(
            blame(vec![p(Severity::Fail, node), p(Severity::Warn, job)]),
            node
        );
        // A problem with the check's default leaves the default to decide.
        assert_eq!(
            blame(vec![p(Severity::Fail, node), p(Severity::Fail, None)]),
            None
        );
    }

    /// Issue 39 row 5: the mixed multi-node NVLink fixture said `mnnvl [job]: ... worst:
    /// GPU 2: NVLink fabric state in_progress`, the node's problem under the job's blame.
    /// Among the worst problems, the one the blame comes from leads the summary, and its
    /// outcome is the finding's, whatever order the judge found them in.
    #[test]
    fn the_line_that_leads_names_the_problem_that_carries_the_blame() {
        let node = Problem::predicts(
            Outcome::degraded("the network between trays", "slower"),
            "GPU 2: NVLink fabric state in_progress",
            "bring the fabric up",
        )
        .blamed(Owner::FabricManager);
        let job = Problem::predicts(
            Outcome::init_fails("MNNVL ... Check the IMEX channel configuration"),
            "no IMEX channel in this container",
            "request an IMEX channel",
        )
        .blamed(Owner::PodSpec);
        let fabric_fails = Problem::predicts(
            Outcome::init_fails("the fabric"),
            "GPU 2: NVLink fabric state in_progress",
            "bring the fabric up",
        )
        .blamed(Owner::FabricManager);
        for problems in [
            vec![node.clone(), job.clone()],
            vec![fabric_fails.clone(), job.clone()],
            vec![job.clone(), fabric_fails.clone()],
        ] {
            let f = combine("mnnvl", "ok".into(), vec![], problems);
            assert_eq!(f.blame(), Some(Blame::Job), "{f:?}");
            assert!(
                f.summary.contains("worst: no IMEX channel")
                    || f.summary == "no IMEX channel in this container",
                "{}",
                f.summary
            );
            assert_eq!(f.outcome().map(Outcome::kind), Some("init-fails"));
            assert!(
                matches!(f.outcome(), Some(Outcome::InitFails { error }) if error.contains("IMEX"))
            );
        }
        // All of the worst the node's: the node's problem leads, under the node's blame.
        let f = combine(
            "mnnvl",
            "ok".into(),
            vec![],
            vec![job.clone().blamed(Owner::Hardware), fabric_fails],
        );
        assert_eq!(f.blame(), Some(Blame::Node));
    }

    #[test]
    fn combine_takes_the_worst_and_every_fix_once() {
        let f = combine(
            "gpu-p2p",
            "fine".into(),
            vec!["seen".into()],
            vec![
                Problem::new(Severity::Warn, "a", "fix a"),
                Problem::new(Severity::Fail, "b", "fix b"),
                Problem::new(Severity::Warn, "c", "fix a"),
            ],
        );
        assert_eq!(f.status(), Status::Fail);
        assert_eq!(f.summary, "3 problems; worst: b");
        assert_eq!(f.remediation(), Some("fix b\nfix a"));
        let pass = combine("gpu-p2p", "fine".into(), vec![], vec![]);
        assert_eq!((pass.status(), pass.remediation()), (Status::Pass, None));
    }
}
