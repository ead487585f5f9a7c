//! Command-line flags. Every flag also reads `NCCL_PREFLIGHT_<FLAG>` so a
//! manifest can set it under `env:`. Parsing only; validation into a `Policy`
//! happens in policy.rs.
//!
//! Boolean flags read their variable as people write it: 1/0, true/false,
//! yes/no, on/off (clap's BoolishValueParser; its default takes only true/false,
//! so `NCCL_PREFLIGHT_TRACE=1` used to exit 2).

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `--version`: the release, the commit and the commit's date (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NCCL_PREFLIGHT_COMMIT"),
    ", ",
    env!("NCCL_PREFLIGHT_COMMIT_DATE"),
    ")"
);

/// Help headings: what to check first, then how to report, library paths last.
const CHECK: &str = "What to check";
const REPORT: &str = "How to report";
const MEASURE: &str = "What to measure";
const SERVING: &str = "Serving";
const WATCH: &str = "Watching the running job (--watch-nccl turns it on)";
const GANG: &str = "The gang (across the job's pods)";
const GANG_SWITCHED: &str = "The gang (with --gang)";
const MEASURE_SWITCHED: &str = "What to measure (with --bench)";
const VARIABLES: &str = "Every flag also reads NCCL_PREFLIGHT_<FLAG> (--min-shm: \
NCCL_PREFLIGHT_MIN_SHM) for a manifest's env: list; --help names each.";
const LIBRARIES: &str = "Where the host and its libraries are";

/// The command line as the binary reads its values: every flag with its variable (and
/// the configuration file's defaults, config.rs); `-h` gives each flag's first sentence
/// (`--help` all). It refuses no flag for another's sake: `parse` checks that on the
/// command line alone.
pub fn command() -> clap::Command {
    use clap::builder::Resettable::Reset;
    declared().mut_subcommands(|sub| {
        let groups: Vec<String> = sub.get_groups().map(|g| g.get_id().to_string()).collect();
        let sub = groups.iter().fold(sub, |sub, id| {
            sub.mut_group(id, |g| g.requires(Reset).conflicts_with(Reset))
        });
        sub.mut_args(|arg| arg.requires(Reset).conflicts_with(Reset))
    })
}

/// Parses `argv` (the program name first) as the binary does. Each mode has only the
/// flags it reads (`--cuda` is not `probe`'s), so clap refuses any other; it refuses too
/// a flag that a switch of the mode turns on given without it (`init --gang-timeout`
/// without `--gang`) and one that only gathering reads given beside `--facts`. Those
/// refusals hold for the command line alone: a variable (`NCCL_PREFLIGHT_*`) never makes
/// a command line wrong, since one `env:` list often feeds several containers of a pod.
/// So the values are parsed first (`command`), then the command line is checked with the
/// variables of the flags that take a value left out (a switch's variable still counts).
pub fn parse(argv: &[std::ffi::OsString]) -> Result<clap::ArgMatches, clap::Error> {
    use clap::builder::Resettable::Reset;
    let matches = command().try_get_matches_from(argv)?;
    declared()
        .mut_subcommands(|sub| {
            sub.mut_args(|arg| match arg.get_action().takes_values() {
                true => arg.env(Reset),
                false => arg,
            })
        })
        .try_get_matches_from(argv)?;
    Ok(matches)
}

/// Every mode's flags as declared, with the mode's headings and short help, and the
/// refusals between flags of one mode.
fn declared() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().mut_subcommands(|sub| {
        let mode = sub.get_name().to_string();
        let has = |id: &str| sub.get_arguments().any(|a| a.get_id() == id);
        // With saved facts nothing is gathered: CheckArgs refuses the gathering flags
        // beside `--facts`; `--cuda` too, where the mode has it (`probe` and `serve` lack it).
        let cuda_unread = has("facts") && has("cuda");
        let variables = sub.get_arguments().any(|a| a.get_env().is_some());
        let mut sub = sub.mut_args(|arg| short_help(heading_in(&mode, arg)));
        if cuda_unread {
            sub = sub.mut_arg("cuda", |arg| arg.conflicts_with("facts"));
        }
        if variables {
            sub = sub.after_help(VARIABLES);
        }
        sub
    })
}

/// A heading as it reads in `mode`: where a switch turns a group on, the heading names
/// it and clap refuses the group's flags without it (`init`'s gang knobs need `--gang`);
/// bench's call deadline bounds what it measures.
fn heading_in(mode: &str, arg: clap::Arg) -> clap::Arg {
    let heading = arg.get_help_heading().map(str::to_string);
    match (mode, heading.as_deref()) {
        ("bench", Some(CHECK)) => arg.help_heading(MEASURE),
        ("init" | "exec", Some(GANG)) => arg.help_heading(GANG_SWITCHED).requires("gang"),
        ("init", Some(MEASURE)) => arg.help_heading(MEASURE_SWITCHED).requires("bench"),
        _ => arg,
    }
}

/// `-h`: the first sentence of a flag's help, without its variable (the mode's help
/// says every flag has one); `--help` keeps the whole text and names the variable.
fn short_help(arg: clap::Arg) -> clap::Arg {
    let Some(full) = arg.get_help().map(|h| h.to_string()) else {
        return arg;
    };
    if arg.get_long_help().is_some() {
        return arg;
    }
    let long = match arg.get_env() {
        Some(var) => format!("{full} [env: {}]", var.to_string_lossy()),
        None => full.clone(),
    };
    let first = first_sentence(&full).to_string();
    arg.hide_env(true).help(first).long_help(long)
}

/// The text up to the first `.`, `;` or `:` that ends a clause (followed by a space,
/// outside parentheses and brackets, not an abbreviation such as `e.g.`).
fn first_sentence(text: &str) -> &str {
    let bytes = text.as_bytes();
    let mut depth = 0i32;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'.' | b';' | b':' if depth == 0 && bytes.get(i + 1) == Some(&b' ') => {
                let before = &text[..i];
                // "Also measure: run ..." goes on: a short head before `:` says too little.
                let too_short = b != b'.' && before.len() < 40;
                let abbreviation =
                    before.ends_with("e.g") || before.ends_with("i.e") || before.ends_with(" vs");
                if !too_short && !abbreviation {
                    return before;
                }
            }
            _ => {}
        }
    }
    text
}

#[derive(Debug, Parser)]
#[command(
    name = "nccl-preflight",
    version = VERSION,
    about = "Checks a GPU node or pod for what breaks or slows NCCL, and writes tuned NCCL settings.",
    after_help = "Exit codes: 0 no check failed (warnings allowed); 1 a check failed and a failure lies with the job (fix the job); 2 the tool could not do its job; 3 every failure lies with this node (retry elsewhere)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// The configuration file every mode reads (`key = value` lines, `[mode]` sections):
    /// its values are defaults that a flag or its variable overrides (docs/configuration.md).
    #[arg(
        long,
        global = true,
        env = "NCCL_PREFLIGHT_CONFIG",
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check this node and print the report.
    Check(ReportArgs),
    /// One-shot check for Kubernetes exec probes: exit code and one line, CUDA left out for speed.
    Probe(ProbeArgs),
    /// Check, then write the tuned settings and the report where told (for initContainers).
    Init(InitArgs),
    /// In the training container: check, tune, and replace this process with CMD in the tuned
    /// environment (your own variables win). Exits 1 (job fault) or 3 (node fault) with the report when a check fails.
    Exec(ExecArgs),
    /// Everything for a person debugging a node: GPU topology and P2P matrices, CUDA's view, and the checks.
    Doctor(ReportArgs),
    /// Print the gathered facts as JSON, for replay with --facts.
    Facts(FactsArgs),
    /// Read an NCCL_DEBUG=INFO log and say which transports ran and what is wrong.
    ExplainLog(ExplainArgs),
    /// Measure GPU peer bandwidth and NCCL all-reduce, judged against what the links should give.
    Bench(BenchArgs),
    /// Run the checks on an interval and serve /healthz, /readyz, /metrics and /report (a sidecar).
    Serve(ServeArgs),
    /// The whole job across its pods, on NCCL: every pod joins one communicator, the pods'
    /// stacks are compared, all-reduce and node-to-node bandwidth measured, the slow node named.
    /// One process per pod; every pod exits with the job's verdict.
    Gang(GangArgs),
    /// The gang's NCCL child (internal; its request and reply: `crate::child`).
    #[command(hide = true)]
    GangWorker,
    /// serve's gathering child (internal; its request and reply: `crate::child`).
    #[command(hide = true)]
    FactsChild,
    /// The NCCL parameter API's child (internal): the libnccl path on standard input,
    /// every registered parameter as the reply of the child protocol.
    #[command(hide = true)]
    NcclParamsChild,
    /// init's bench child (internal; its request and reply: `crate::child`).
    #[command(hide = true)]
    BenchChild,
    /// Copy this binary into DIR (a volume shared with the training container) atomically,
    /// so the trainer can run `DIR/nccl-preflight exec -- ...` without the tool in its image.
    Install(InstallArgs),
    /// A mutating admission webhook: injects the check into GPU pods of the namespaces that
    /// opt in (HTTPS POST /mutate; /metrics on plain HTTP).
    Webhook(WebhookArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InjectMode {
    /// An init container in the trainer's image runs `init`; the trainer gets NCCL_CONF_FILE.
    Init,
    /// The trainer's command becomes `nccl-preflight exec -- COMMAND` (where the pod names it).
    Exec,
}

#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Address of the HTTPS endpoint the API server calls (POST /mutate).
    #[arg(long, env = "NCCL_PREFLIGHT_LISTEN", default_value = "0.0.0.0:8443", value_name = "ADDR", help_heading = SERVING)]
    pub listen: String,
    /// Address of the plain HTTP endpoint for /metrics, /healthz and /readyz.
    #[arg(long, env = "NCCL_PREFLIGHT_METRICS_LISTEN", default_value = "0.0.0.0:9464", value_name = "ADDR", help_heading = SERVING)]
    pub metrics_listen: String,
    /// The serving certificate chain (PEM; cert-manager's tls.crt), read again when it changes.
    #[arg(long, env = "NCCL_PREFLIGHT_TLS_CERT", default_value = "/tls/tls.crt", value_name = "FILE", help_heading = SERVING)]
    pub tls_cert: PathBuf,
    /// The certificate's private key (PEM; cert-manager's tls.key).
    #[arg(long, env = "NCCL_PREFLIGHT_TLS_KEY", default_value = "/tls/tls.key", value_name = "FILE", help_heading = SERVING)]
    pub tls_key: PathBuf,
    /// nccl-preflight's image, for the init container that installs the binary in the pod
    /// (required; the shipped Deployment sets it to its own image).
    #[arg(long, env = "NCCL_PREFLIGHT_INJECT_IMAGE", value_name = "IMAGE", help_heading = CHECK)]
    pub inject_image: Option<String>,
    /// How the check runs where the pod does not say (annotation nccl-preflight.io/mode).
    #[arg(long, env = "NCCL_PREFLIGHT_INJECT_MODE", value_enum, default_value_t = InjectMode::Init, help_heading = CHECK)]
    pub inject_mode: InjectMode,
    /// The service account's directory (ca.crt, token), for reading MPIJobs' worker counts.
    #[arg(long, hide = true, default_value = crate::kube::client::SERVICE_ACCOUNT, value_name = "DIR")]
    pub service_account: PathBuf,
}

/// `serve --taint-node`: the node DaemonSet keeps new pods off its own node while a node
/// fault holds (docs/kubernetes.md, "Acting on a node fault"); its flags need the switch.
#[derive(Debug, Clone, Args)]
#[group(requires = "taint_node")]
pub struct TaintArgs {
    /// Taint this node `nccl-preflight.io/node-fault:NoSchedule` once a node fault (exit 3:
    /// every failed check the node's) holds for --taint-after runs, and remove the taint
    /// after as many healthy runs. Needs --node-name and RBAC to patch the Node.
    #[arg(long, env = "NCCL_PREFLIGHT_TAINT_NODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = SERVING)]
    pub taint_node: bool,
    /// Consecutive runs a node fault (or health) must hold before the taint is set (or removed).
    #[arg(long, env = "NCCL_PREFLIGHT_TAINT_AFTER", default_value_t = 3, value_name = "RUNS",
          value_parser = clap::value_parser!(u32).range(1..=1000), help_heading = SERVING)]
    pub taint_after: u32,
    /// This pod's node (the downward API's spec.nodeName).
    #[arg(long, env = "NCCL_PREFLIGHT_NODE_NAME", value_name = "NODE", help_heading = SERVING)]
    pub node_name: Option<String>,
    /// The service account's directory (ca.crt, token).
    #[arg(long, hide = true, default_value = crate::kube::client::SERVICE_ACCOUNT, value_name = "DIR")]
    pub service_account: PathBuf,
}

/// `probe`: the checks' flags, and node-problem-detector's plugin contract on demand.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub check: CheckArgs,
    /// Answer as a node-problem-detector custom plugin: exit 0 (OK), 1 (NonOK: a check
    /// failed) or 2 (Unknown: the tool could not run), and one line of at most
    /// --max-output bytes naming the failed checks first.
    #[arg(long, help_heading = REPORT)]
    pub npd: bool,
    /// With --npd: the longest line to print, NPD's max_output_length [default: 80].
    #[arg(long, value_name = "BYTES", requires = "npd", help_heading = REPORT,
          value_parser = clap::value_parser!(u16).range(16..))]
    pub max_output: Option<u16>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on. Kubelet probes connect to the pod IP, so bind 0.0.0.0
    /// (or [::]) in a pod, not 127.0.0.1.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_LISTEN",
        default_value = "0.0.0.0:9464",
        value_name = "ADDR",
        help_heading = SERVING,
    )]
    pub listen: String,
    /// Time between runs of the checks.
    #[arg(long, env = "NCCL_PREFLIGHT_INTERVAL", default_value = "60s", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = SERVING,)]
    pub interval: std::time::Duration,
    /// /healthz fails when the last run finished longer ago than this
    /// [default: 3 x --interval + 2 x --timeout].
    #[arg(long, env = "NCCL_PREFLIGHT_STALE_AFTER", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = SERVING,)]
    pub stale_after: Option<std::time::Duration>,
    /// XID codes that fail readiness besides those whose immediate action in NVIDIA's
    /// Xid catalog is a GPU reset or a reboot (46, 62, 64, 79, 95, 109, 110, 119, 120,
    /// 136, 140, 143, 151, 155, 156, 158).
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_XID_NOT_READY",
        value_name = "XID[,XID...]",
        value_delimiter = ',',
        help_heading = CHECK,
    )]
    pub xid_not_ready: Vec<u64>,
    /// XID codes that never fail readiness (still counted in /metrics).
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_XID_IGNORE",
        value_name = "XID[,XID...]",
        value_delimiter = ',',
        help_heading = CHECK,
    )]
    pub xid_ignore: Vec<u64>,
    #[command(flatten)]
    pub watch: WatchArgs,
    #[command(flatten)]
    pub taint: TaintArgs,
    #[command(flatten)]
    pub check: CheckArgs,
    #[command(flatten)]
    pub tune: TuneArg,
}

/// `serve --watch-nccl`: the running job through NCCL's RAS (its flags need the switch).
#[derive(Debug, Clone, Args)]
#[group(requires = "watch_nccl")]
pub struct WatchArgs {
    /// Watch the running job through NCCL's RAS (the trainer's NCCL_RAS_ADDR): name a hung
    /// collective, a dead rank, an NCCL error on /job, /metrics and /report, and answer
    /// 503 on /job/livez for the trainer container's livenessProbe. Off by default.
    #[arg(long, env = "NCCL_PREFLIGHT_WATCH_NCCL", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = WATCH)]
    pub watch_nccl: bool,
    /// Where the trainer's NCCL RAS listens: its NCCL_RAS_ADDR (the sidecar shares the
    /// pod's network namespace, so localhost is the trainer's).
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_RAS_ADDR",
        default_value = "localhost:28028",
        value_name = "HOST:PORT",
        help_heading = WATCH,
    )]
    pub ras_addr: String,
    /// Time between RAS queries (sooner after an NCCL 2.29+ MONITOR event).
    #[arg(long, env = "NCCL_PREFLIGHT_WATCH_INTERVAL", default_value = "15s", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = WATCH,)]
    pub watch_interval: std::time::Duration,
    /// A communicator whose ranks' collective counts disagree (or that misses a rank) and
    /// do not move for this long is hung. Set it above the longest time ranks legitimately
    /// wait on one another (a checkpoint written by one rank); below PyTorch's NCCL
    /// timeout (10 minutes by default) to act before it.
    #[arg(long, env = "NCCL_PREFLIGHT_HANG_AFTER", default_value = "5m", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = WATCH,)]
    pub hang_after: std::time::Duration,
    /// NCCL before 2.27.3 only (nccl#1669: a query during communicator init can crash
    /// the trainer): how long RAS must have been up, and since a reply last showed a
    /// communicator initialising, before a query.
    #[arg(long, env = "NCCL_PREFLIGHT_WATCH_INIT_GRACE", default_value = "60s", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = WATCH,)]
    pub watch_init_grace: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct GangArgs {
    #[command(flatten)]
    pub gang: GangOpts,
    #[command(flatten)]
    pub check: CheckArgs,
    #[command(flatten)]
    pub tune: TuneArg,
    #[command(flatten)]
    pub cuda: CudaArg,
    #[command(flatten)]
    pub output: FormatArg,
}

/// The gang's knobs (`gang`, `exec --gang`, `init --gang`).
#[derive(Debug, Clone, Args)]
pub struct GangOpts {
    /// Time the join, and then every collective phase, may take (seconds, or 500ms, 2m).
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_TIMEOUT", default_value = "30", value_name = "SECS",
          value_parser = crate::units::parse_duration,
          help_heading = GANG,)]
    pub gang_timeout: std::time::Duration,
    /// Bounded wait, before the join, until the root's and the peers' names resolve
    /// (absorbs pod start and image-pull skew); the join timeout starts after it.
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_WAIT", default_value = "300", value_name = "SECS",
          value_parser = crate::units::parse_duration,
          help_heading = GANG,)]
    pub gang_wait: std::time::Duration,
    /// The port rank 0's NCCL root binds [default: MASTER_PORT or PET_MASTER_PORT + 1, else 29501].
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_PORT", value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..),
          help_heading = GANG,)]
    pub gang_port: Option<u16>,
    /// The rank-0 pod's host name or address [default: MASTER_ADDR, PET_MASTER_ADDR].
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_ROOT", value_name = "HOST", help_heading = GANG)]
    pub gang_root: Option<String>,
    /// This pod's rank [default: PET_NODE_RANK, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, JOB_COMPLETION_INDEX].
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_RANK", value_name = "N", help_heading = GANG)]
    pub gang_rank: Option<u64>,
    /// How many pods [default: PET_NNODES, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE]; alias of
    /// --nodes (when both are given they must agree).
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_NODES", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..),
          help_heading = GANG,)]
    pub gang_nodes: Option<u64>,
    /// Every pod's host name in rank order, where the launcher's naming is not known
    /// (a missing pod is named from these) [default: derived from the root's name].
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_GANG_PEERS",
        value_name = "HOST[,HOST...]",
        value_delimiter = ',',
        help_heading = GANG,
    )]
    pub gang_peers: Vec<String>,
    /// This attempt of the job, the same in every pod and new on every retry (from the
    /// downward API, e.g. the pod label batch.kubernetes.io/controller-uid or
    /// jobset.sigs.k8s.io/restart-attempt): the rendezvous refuses a pod of another attempt.
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_ATTEMPT", value_name = "TEXT", help_heading = GANG)]
    pub gang_attempt: Option<String>,
    /// All-reduce sizes (comma list); the smallest is also the node-to-node send size.
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_SIZES", default_value = "64MiB,256MiB",
          value_name = "SIZE[,SIZE...]", value_delimiter = ',', value_parser = crate::units::parse_bytes,
          help_heading = GANG,)]
    pub gang_sizes: Vec<u64>,
    /// Timed repetitions per measurement, after one warm-up.
    #[arg(long, env = "NCCL_PREFLIGHT_GANG_ITERATIONS", default_value_t = 5, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000),
          help_heading = GANG,)]
    pub gang_iterations: u32,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The directory to copy into (an emptyDir mounted by both containers).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The file name inside DIR.
    #[arg(long, default_value = "nccl-preflight", value_name = "NAME")]
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum BenchKind {
    /// Peer copies between every pair of GPUs through the CUDA driver.
    P2p,
    /// All-reduce over every visible GPU through libnccl.so.2.
    Nccl,
    /// Both.
    All,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum, default_value_t = BenchKind::All)]
    pub what: BenchKind,
    /// Bytes copied per peer copy.
    #[arg(long, env = "NCCL_PREFLIGHT_BENCH_SIZE", default_value = "256MiB", value_name = "SIZE",
          value_parser = crate::units::parse_bytes,
          help_heading = MEASURE,)]
    pub size: u64,
    /// All-reduce sizes (comma list).
    #[arg(long, env = "NCCL_PREFLIGHT_NCCL_SIZES", default_value = "16MiB,256MiB,1GiB",
          value_name = "SIZE[,SIZE...]", value_delimiter = ',', value_parser = crate::units::parse_bytes,
          help_heading = MEASURE,)]
    pub nccl_sizes: Vec<u64>,
    /// Timed repetitions per measurement, after a warm-up.
    #[arg(long, env = "NCCL_PREFLIGHT_BENCH_ITERATIONS", default_value_t = 10, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=10000),
          help_heading = MEASURE,)]
    pub iterations: u32,
    #[command(flatten)]
    pub limits: BenchLimits,
    #[command(flatten)]
    pub output: FormatArg,
    #[command(flatten)]
    pub gather: LibraryArgs,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// After the local checks, run the gang across the job's pods; CMD starts only if the
    /// job's verdict allows.
    #[arg(long = "gang", env = "NCCL_PREFLIGHT_GANG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = CHECK)]
    pub gang: bool,
    #[command(flatten)]
    pub gang_opts: GangOpts,
    /// Print the report, the variables that would be set and the command; run nothing.
    #[arg(long, env = "NCCL_PREFLIGHT_DRY_RUN", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = REPORT)]
    pub dry_run: bool,
    #[command(flatten)]
    pub check: CheckArgs,
    #[command(flatten)]
    pub tune: TuneArg,
    #[command(flatten)]
    pub cuda: CudaArg,
    #[command(flatten)]
    pub output: FormatArg,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The log file; `-` or nothing reads standard input.
    #[arg(value_name = "FILE|-", default_value = "-")]
    pub input: PathBuf,
    #[command(flatten)]
    pub output: FormatArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Switch {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum ImageArg {
    Trainer,
    Own,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Format {
    Human,
    Json,
}

/// Where NVML, the CUDA driver and NCCL are and how long their calls may take: what
/// every mode that loads them reads (`bench` too).
// Plain comments on the flag structs: clap would take a doc comment for a mode's help.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct LibraryArgs {
    /// Deadline for each NVML and CUDA call (e.g. 500ms, 10s): a hung driver fails the check instead of the pod.
    #[arg(long, env = "NCCL_PREFLIGHT_TIMEOUT", default_value = "10s", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = CHECK,)]
    pub timeout: std::time::Duration,
    /// Print each NVML and CUDA call with its duration to standard error.
    #[arg(long, env = "NCCL_PREFLIGHT_TRACE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = REPORT)]
    pub trace: bool,

    /// The directory that stands for / when reading /proc, /sys, /dev and /etc.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_HOST_ROOT",
        default_value = "/",
        value_name = "DIR",
        help_heading = LIBRARIES,
    )]
    pub host_root: PathBuf,
    /// The NVML library to load.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_NVML_LIB",
        default_value = "libnvidia-ml.so.1",
        value_name = "PATH",
        help_heading = LIBRARIES,
    )]
    pub nvml_lib: String,
    /// The CUDA driver library to load.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_CUDA_LIB",
        default_value = "libcuda.so.1",
        value_name = "PATH",
        help_heading = LIBRARIES,
    )]
    pub cuda_lib: String,
    /// The NCCL library to load [default: libnccl.so.2, then the nvidia-nccl Python wheels' copy].
    #[arg(long, env = "NCCL_PREFLIGHT_NCCL_LIB", value_name = "PATH", help_heading = LIBRARIES)]
    pub nccl_lib: Option<String>,
}

// What gathering the host reads beyond the GPU libraries (not `bench`).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct HostArgs {
    /// Memory registered with ibv_reg_mr on each RDMA device to prove memlock and pinning
    /// (default 128MiB: above containerd's 8 MiB and Docker's 64 MiB memlock defaults).
    #[arg(long, env = "NCCL_PREFLIGHT_MEMREG_SIZE", default_value = "128MiB", value_name = "SIZE",
          value_parser = crate::units::parse_bytes,
          help_heading = CHECK,)]
    pub memreg_size: u64,
    /// The libibverbs library to load.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_VERBS_LIB",
        default_value = "libibverbs.so.1",
        value_name = "PATH",
        help_heading = LIBRARIES,
    )]
    pub verbs_lib: String,
    /// The libfabric library to load [default: /opt/amazon/efa/lib{,64}/libfabric.so.1, then libfabric.so.1].
    #[arg(long, env = "NCCL_PREFLIGHT_FABRIC_LIB", value_name = "PATH", help_heading = LIBRARIES)]
    pub fabric_lib: Option<String>,
    /// The CUDA runtime to date against the driver [default: libcudart.so.13/.12/.11.0
    /// through the loader, then the nvidia-cuda-runtime wheel under PYTHONPATH, the
    /// virtualenv or conda environment, and the system's Python].
    #[arg(long, env = "NCCL_PREFLIGHT_CUDART_LIB", value_name = "PATH", help_heading = LIBRARIES)]
    pub cudart_lib: Option<String>,
}

// Every gathering flag: `facts` and the modes that judge this node; serialized whole
// into the request of `facts-child` (`crate::child`).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct GatherArgs {
    #[command(flatten)]
    pub libs: LibraryArgs,
    #[command(flatten)]
    pub host: HostArgs,
    /// The image this runs in: `trainer` judges the RDMA and NCCL libraries found here as the
    /// ones training will load; `own` (set by nccl-preflight's own image) skips those checks,
    /// since the trainer's image has its own libraries.
    #[arg(long, env = "NCCL_PREFLIGHT_IMAGE", value_enum, default_value_t = ImageArg::Trainer, help_heading = CHECK)]
    pub image: ImageArg,
    /// Answer syscalls from a recording instead of the kernel (fixture host trees).
    #[arg(long, hide = true, value_name = "FILE")]
    pub replay_kernel: Option<PathBuf>,
    /// Read the facts no check judges: NVLink CRC data counters, NUMA affinity (not a
    /// flag: `doctor`, `facts` and `serve` read them; the gates leave them out for speed).
    #[arg(skip = false)]
    pub unjudged: bool,
}

// `--cuda`: the modes that may load the CUDA driver (`probe` and `serve` never do).
#[derive(Debug, Clone, Args)]
pub struct CudaArg {
    /// Probe the CUDA driver too (cuInit, peer access); `off` saves ~0.4 s (a stopped
    /// fabric manager still shows through NVML). `probe` and `serve` never load it.
    #[arg(long, env = "NCCL_PREFLIGHT_CUDA", value_enum, default_value_t = Switch::On, help_heading = CHECK)]
    pub cuda: Switch,
}

// `--format`: the modes that print a report.
#[derive(Debug, Clone, Args)]
pub struct FormatArg {
    /// Report format on standard output.
    #[arg(long, env = "NCCL_PREFLIGHT_FORMAT", value_enum, default_value_t = Format::Human, help_heading = REPORT)]
    pub format: Format,
}

/// `facts`: every gathering flag.
#[derive(Debug, Clone, Args)]
pub struct FactsArgs {
    #[command(flatten)]
    pub gather: GatherArgs,
    #[command(flatten)]
    pub cuda: CudaArg,
}

/// What every mode that judges this node reads.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Judge facts saved by `nccl-preflight facts` (or a JSON report) instead of this host.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_FACTS",
        value_name = "FILE",
        // With saved facts nothing is gathered (`--image` still says whose libraries they are).
        conflicts_with_all = ["LibraryArgs", "HostArgs", "replay_kernel"],
        help_heading = CHECK,
    )]
    pub facts: Option<PathBuf>,
    /// Check ids whose failures become warnings (comma list, repeatable, or `all`).
    #[arg(long, env = "NCCL_PREFLIGHT_IGNORE", value_name = "ID[,ID...]", help_heading = CHECK)]
    pub ignore: Vec<String>,
    /// Extra requirements (comma list, repeatable): host-ipc, gpus=N, nvlink, rdma[=N], efa[=N]
    /// (`efa` alone: as many EFA devices as the instance type gives the pod's GPUs).
    #[arg(long, env = "NCCL_PREFLIGHT_REQUIRE", value_name = "REQ[,REQ...]", help_heading = CHECK)]
    pub require: Vec<String>,
    /// Minimum /dev/shm size (e.g. 1GiB, 512Mi); below it dev-shm fails. Default 1GiB.
    #[arg(long, env = "NCCL_PREFLIGHT_MIN_SHM", value_name = "SIZE", help_heading = CHECK)]
    pub min_shm: Option<String>,
    /// Minimum locked-memory limit (a size or `unlimited`); below it memlock fails. Default unlimited,
    /// enforced as a failure only where RDMA devices exist unless given explicitly.
    #[arg(
        long,
        env = "NCCL_PREFLIGHT_MIN_MEMLOCK",
        value_name = "SIZE|unlimited",
        help_heading = CHECK,
    )]
    pub min_memlock: Option<String>,
    /// How many nodes the job spans, where the launcher's variables (PET_NNODES,
    /// WORLD_SIZE/LOCAL_WORLD_SIZE) are not in this container's environment (an
    /// initContainer): RDMA problems fail multi-node jobs and only warn single-node ones.
    #[arg(long, env = "NCCL_PREFLIGHT_NODES", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..),
          help_heading = CHECK,)]
    pub nodes: Option<u64>,
    #[command(flatten)]
    pub gather: GatherArgs,
}

/// The modes that tune the trainer's settings or watch it (not `probe`).
#[derive(Debug, Clone, Args)]
pub struct TuneArg {
    /// A directory the trainer and the sidecar share (an emptyDir) for PyTorch's flight
    /// recorder: the tuned settings turn it on with its dump pipe and dumps there, and
    /// `serve --watch-nccl` asks every rank of the pod for a dump on a hang and reports
    /// each rank's collective and line of Python.
    #[arg(long, env = "NCCL_PREFLIGHT_FLIGHT_RECORDER", value_name = "DIR", help_heading = REPORT)]
    pub flight_recorder: Option<PathBuf>,
}

/// `check` and `doctor`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub check: CheckArgs,
    #[command(flatten)]
    pub tune: TuneArg,
    #[command(flatten)]
    pub cuda: CudaArg,
    #[command(flatten)]
    pub output: FormatArg,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Also measure every GPU pair's peer copies against its link and add gpu-bandwidth
    /// to the checks (NCCL_PREFLIGHT_BENCH_* set its knobs). Not with --facts.
    // Checked in `init`, not by clap's conflicts_with, which counts the variable set
    // to a false value (NCCL_PREFLIGHT_BENCH=0) as the flag given.
    #[arg(long, env = "NCCL_PREFLIGHT_BENCH",
          action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(),
          help_heading = CHECK,)]
    pub bench: bool,
    /// With --bench: also run NCCL's all-reduce with the tuned settings in its environment
    /// and add nccl-allreduce (about 1 s more at 4 GPUs: NCCL's own set-up).
    #[arg(long, env = "NCCL_PREFLIGHT_BENCH_NCCL", requires = "bench",
          action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(),
          help_heading = CHECK,)]
    pub bench_nccl: bool,
    /// Also run the gang across the job's pods (JobSet/TrainJob, whose Service publishes
    /// pods that are still initialising); its findings join the report.
    #[arg(long = "gang", env = "NCCL_PREFLIGHT_GANG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new(), help_heading = CHECK)]
    pub gang: bool,
    /// Write the tuned settings as a POSIX sh env file.
    #[arg(long, env = "NCCL_PREFLIGHT_ENV_FILE", value_name = "PATH", help_heading = REPORT)]
    pub env_file: Option<PathBuf>,
    /// Write the tuned settings as an nccl.conf for NCCL_CONF_FILE.
    #[arg(long, env = "NCCL_PREFLIGHT_NCCL_CONF", value_name = "PATH", help_heading = REPORT)]
    pub nccl_conf: Option<PathBuf>,
    /// Write the JSON report.
    #[arg(long, env = "NCCL_PREFLIGHT_REPORT", value_name = "PATH", help_heading = REPORT)]
    pub report: Option<PathBuf>,
    /// Write the termination summary here [default: /dev/termination-log when it exists].
    #[arg(long, env = "NCCL_PREFLIGHT_TERMINATION_LOG", value_name = "PATH", help_heading = REPORT)]
    pub termination_log: Option<PathBuf>,
    #[command(flatten)]
    pub bench_limits: BenchLimits,
    #[command(flatten)]
    pub gang_opts: GangOpts,
    #[command(flatten)]
    pub check: CheckArgs,
    #[command(flatten)]
    pub tune: TuneArg,
    #[command(flatten)]
    pub cuda: CudaArg,
    #[command(flatten)]
    pub output: FormatArg,
}

/// How long a bench may run and what it must reach (`bench`, `init --bench`).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct BenchLimits {
    /// Time the whole bench may take (cuInit and NCCL's set-up included); what is left
    /// unmeasured when it runs out fails.
    #[arg(long, env = "NCCL_PREFLIGHT_BENCH_SECONDS", default_value = "10s", value_name = "DURATION",
          value_parser = crate::units::parse_duration,
          help_heading = MEASURE,)]
    pub bench_seconds: std::time::Duration,
    /// Below this fraction of the link's figure a measurement fails.
    #[arg(long, env = "NCCL_PREFLIGHT_MIN_BANDWIDTH_FRACTION", default_value_t = 0.5,
          value_name = "FRACTION", value_parser = crate::units::parse_fraction,
          help_heading = MEASURE,)]
    pub min_bandwidth_fraction: f64,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The flags of the modes that judge this node, and of every gather.
    const CHECKS: &str = "facts ignore require min_shm min_memlock nodes";
    const GATHER: &str = "timeout trace host_root nvml_lib cuda_lib nccl_lib memreg_size \
                          verbs_lib fabric_lib cudart_lib image replay_kernel";
    const GANG: &str = "gang_timeout gang_wait gang_port gang_root gang_rank gang_nodes \
                        gang_peers gang_attempt gang_sizes gang_iterations";

    /// Each mode's flags, written out from the code that reads them (not from the
    /// structs): `probe` and `serve` never load CUDA and print no report, `bench` loads
    /// only NVML, CUDA and NCCL, `facts` judges nothing (`--nodes` is the judge's).
    fn reads(mode: &str) -> String {
        let printed = format!("{CHECKS} {GATHER} cuda format");
        match mode {
            "check" | "doctor" => format!("{printed} flight_recorder"),
            "probe" => format!("{CHECKS} {GATHER} npd max_output"),
            "init" => format!(
                "{printed} {GANG} flight_recorder bench bench_nccl gang env_file nccl_conf report \
                 termination_log bench_seconds min_bandwidth_fraction"
            ),
            "exec" => format!("{printed} {GANG} flight_recorder gang dry_run"),
            "gang" => format!("{printed} {GANG} flight_recorder"),
            "serve" => format!(
                "{CHECKS} {GATHER} flight_recorder listen interval stale_after xid_not_ready xid_ignore \
                 watch_nccl ras_addr watch_interval hang_after watch_init_grace taint_node \
                 taint_after node_name service_account"
            ),
            "facts" => format!("{GATHER} cuda"),
            "bench" => "size nccl_sizes iterations bench_seconds min_bandwidth_fraction format \
                        timeout trace host_root nvml_lib cuda_lib nccl_lib"
                .into(),
            "explain-log" => "format".into(),
            "install" => "name".into(),
            "webhook" => "listen metrics_listen tls_cert tls_key inject_image inject_mode \
                          service_account"
                .into(),
            other => panic!("mode {other} is not written out here"),
        }
    }

    /// Every mode has exactly the flags it reads, so clap refuses any other.
    #[test]
    fn each_mode_has_the_flags_it_reads_and_no_other() {
        let command = super::command();
        for mode in command.get_subcommands().filter(|m| !m.is_hide_set()) {
            let defined: BTreeSet<&str> = mode
                .get_arguments()
                .filter(|a| !a.is_positional() && a.get_long().is_some())
                .map(|a| a.get_id().as_str())
                .filter(|id| !["help", "version", "config"].contains(id))
                .collect();
            let expected = reads(mode.get_name());
            let expected: BTreeSet<&str> = expected.split_whitespace().collect();
            assert_eq!(defined, expected, "{}", mode.get_name());
        }
    }

    fn parse(args: &[&str]) -> Result<(), String> {
        let argv: Vec<std::ffi::OsString> = std::iter::once("nccl-preflight")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        super::parse(&argv).map(|_| ()).map_err(|e| e.to_string())
    }

    /// A flag is refused where its mode lacks it, and where the mode reads it only under
    /// a switch or without `--facts`; the error names the flag.
    #[test]
    fn a_flag_is_refused_where_its_mode_does_not_read_it() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["probe", "--cuda", "on"], Some("--cuda")),
            (&["serve", "--format", "json"], Some("--format")),
            (&["bench", "--memreg-size", "1MiB"], Some("--memreg-size")),
            (&["facts", "--nodes", "2"], Some("--nodes")),
            (&["init", "--gang-timeout", "5s"], Some("--gang-timeout")),
            (&["init", "--gang", "--gang-timeout", "5s"], None),
            (
                &["init", "--bench", "--gang-peers", "a"],
                Some("--gang-peers"),
            ),
            (
                &["exec", "--gang-peers", "a", "--", "true"],
                Some("--gang-peers"),
            ),
            (&["exec", "--gang", "--gang-peers", "a", "--", "true"], None),
            (&["gang", "--gang-peers", "a"], None),
            (&["init", "--bench-seconds", "5s"], Some("--bench-seconds")),
            (&["init", "--bench-nccl"], Some("--bench-nccl")),
            (
                &["init", "--bench", "--bench-nccl", "--bench-seconds", "5s"],
                None,
            ),
            (&["serve", "--ras-addr", "h:1"], Some("--ras-addr")),
            (&["serve", "--watch-nccl", "--hang-after", "1m"], None),
            (&["serve", "--node-name", "n"], Some("--node-name")),
            (&["serve", "--taint-node", "--node-name", "n"], None),
            (&["probe", "--max-output", "80"], Some("--max-output")),
            (
                &["check", "--facts", "f", "--host-root", "/"],
                Some("--host-root"),
            ),
            (&["check", "--facts", "f", "--cuda", "off"], Some("--cuda")),
            (
                &["doctor", "--facts", "f", "--nvml-lib", "x"],
                Some("--nvml-lib"),
            ),
            (
                &["init", "--facts", "f", "--verbs-lib", "x"],
                Some("--verbs-lib"),
            ),
            (
                &["serve", "--facts", "f", "--memreg-size", "1MiB"],
                Some("--memreg-size"),
            ),
            (
                &["check", "--facts", "f", "--nodes", "2", "--image", "own"],
                None,
            ),
            (&["init", "--facts", "f", "--report", "r"], None),
            (&["check", "--host-root", "/", "--cuda", "off"], None),
        ];
        for (args, refused) in cases {
            match (parse(args), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(flag)) => assert!(e.contains(flag), "{args:?}: {e}"),
                (got, _) => panic!("{args:?}: {got:?}"),
            }
        }
    }
}
