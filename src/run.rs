//! The run pipeline every command shares: gather (or load saved facts), judge, tune,
//! into a `Report`, with the exit code it means. `check`, `init`, `exec`, `probe`,
//! `doctor`, `serve` and `bench` all go through here, so no command re-implements a
//! step and none depends on another.

use crate::cli::{CheckArgs, CudaArg, Format, GatherArgs, Switch};
use crate::facts::{FACTS_SCHEMA, Facts};
use crate::finding::Fault;
use crate::gather::gpu::{CudaProbe, GpuOptions, HungCall};
use crate::gather::rdma::RdmaOptions;
use crate::gather::{self, host::Host, kernel::Kernel, kernel::LiveKernel, replay};
use crate::judge;
use crate::policy::{self, Policy};
use crate::render;
use crate::report::{REPORT_SCHEMA, Report};
use crate::tune;
use anyhow::{Context, Result, anyhow, bail};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::Path;

pub(crate) const EXIT_OK: u8 = 0;
/// A check failed and at least one failure lies with the job's configuration.
pub(crate) const EXIT_FAILED: u8 = 1;
/// The tool could not do its job (bad flags, unreadable input, unwritable output).
pub const EXIT_TOOL_ERROR: u8 = 2;
/// A check failed and every failure lies with this node: retry the pod elsewhere.
pub(crate) const EXIT_NODE_FAULT: u8 = 3;

/// A command's exit: its code, and whether a vendor call hung, in which case the
/// process must leave with `_exit` rather than run library destructors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: u8,
    pub hung: bool,
}

impl Exit {
    pub fn new(code: u8, hung: HungCall) -> Exit {
        Exit { code, hung: hung.0 }
    }
}

/// How a run gathers and judges, beyond its flags; `Evaluation::default()` is what
/// `check` does: the policy built from the flags, every library loaded anew, CUDA read here.
#[derive(Default)]
pub(crate) struct Evaluation<'a> {
    /// Load every vendor library even where no device needs it (`doctor`; the policy's
    /// `--require rdma|efa` asks for it too).
    pub probe_all: bool,
    /// The policy, where the caller built it from the same flags already.
    pub policy: Option<&'a Policy>,
    /// The image's RDMA, NCCL and CUDA runtime facts of an earlier run, used instead of
    /// loading those libraries again (`serve`, see [`gather::Probed`]).
    pub probed: Option<&'a gather::Probed>,
    /// Where the CUDA driver's facts come from: here, nowhere (`--cuda off`; `probe` and
    /// `serve` never load it), or another process that initialises CUDA anyway (`init
    /// --bench`'s bench): one cuInit serves both.
    pub cuda: CudaProbe,
    /// `--flight-recorder`: the tuned settings turn PyTorch's flight recorder on there.
    pub flight_recorder: Option<&'a std::path::Path>,
}

impl<'a> Evaluation<'a> {
    /// The defaults, under a policy already built.
    pub(crate) fn under(policy: &'a Policy) -> Evaluation<'a> {
        Evaluation {
            policy: Some(policy),
            ..Evaluation::default()
        }
    }

    /// These, reading CUDA's facts as `--cuda` says.
    pub(crate) fn cuda(self, arg: &CudaArg) -> Evaluation<'a> {
        match arg.cuda {
            Switch::Off => Evaluation {
                cuda: CudaProbe::Off,
                ..self
            },
            Switch::On => self,
        }
    }

    /// These, tuning as `--flight-recorder` says.
    pub(crate) fn tune(self, arg: &'a crate::cli::TuneArg) -> Evaluation<'a> {
        Evaluation {
            flight_recorder: arg.flight_recorder.as_deref(),
            ..self
        }
    }
}

/// Gathers this host's facts as `args` and `how` say (`how.policy` is not read).
pub(crate) fn gather_facts(
    args: &GatherArgs,
    env: &[(OsString, OsString)],
    how: Evaluation<'_>,
) -> Result<(Facts, HungCall)> {
    let Evaluation {
        probe_all,
        probed,
        cuda,
        ..
    } = how;
    let (libs, host) = (&args.libs, &args.host);
    // File reads get the vendor calls' deadline: a hung driver can block them too.
    let root = Host::with_deadline(&libs.host_root, libs.timeout);
    let kernel: Box<dyn Kernel> = match &args.replay_kernel {
        None => Box::new(LiveKernel),
        Some(path) => {
            let text = read_whole(&format!("--replay-kernel {}", path.display()), path)?;
            let recording: replay::Recording = serde_json::from_str(&text).with_context(|| {
                format!("--replay-kernel {}: not a kernel recording", path.display())
            })?;
            Box::new(replay::ReplayKernel::new(recording, &libs.host_root))
        }
    };
    let env_var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.to_str())
            .map(String::from)
    };
    let vendor = gather::VendorOptions {
        gpu: GpuOptions {
            nvml_library: libs.nvml_lib.clone(),
            cuda_library: libs.cuda_lib.clone(),
            call_timeout: libs.timeout,
            trace: libs.trace,
            cuda,
            unjudged: args.unjudged,
            cudart: if args.image == crate::cli::ImageArg::Own {
                Err(crate::facts::ImageRole::OWN_REASON.to_string())
            } else {
                Ok(gather::gpu::cudart::locations(
                    host.cudart_lib.as_deref(),
                    env,
                ))
            },
            cudart_probed: probed.and_then(|p| p.cuda_runtime.clone()),
        },
        rdma: RdmaOptions {
            verbs_library: host.verbs_lib.clone(),
            fabric_libraries: match &host.fabric_lib {
                Some(l) => vec![l.clone()],
                None => gather::rdma::fabric::LOCATIONS
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            },
            nccl_libraries: gather::rdma::nccl::locations(libs.nccl_lib.as_deref(), env),
            net_plugin_env: env_var("NCCL_NET_PLUGIN"),
            memreg_bytes: host.memreg_size,
            call_timeout: libs.timeout,
            trace: libs.trace,
            probe_all,
            own_image: args.image == crate::cli::ImageArg::Own,
            probed: probed.map(|p| p.rdma.clone()),
        },
        image: image_role(args.image),
    };
    let (mut facts, hung) = gather::gather(&root, kernel.as_ref(), env, &vendor);
    if !hung.0 {
        facts.nccl_files.params = nccl_params(&facts, env, args.libs.timeout);
    }
    Ok((facts, hung))
}

/// What the trainer's NCCL holds, where it has a parameter API (2.30 and later): asked
/// in a child process (`nccl-params-child`) with this environment, since NCCL applies
/// its settings files to the process environment first; NCCL_PARAM_DUMP_ALL=1 lists
/// its private parameters too. `None`: not asked (another image, an older or no NCCL).
fn nccl_params(
    facts: &Facts,
    env: &[(OsString, OsString)],
    timeout: std::time::Duration,
) -> Option<crate::facts::Observed<Vec<crate::facts::NcclParam>>> {
    use crate::child::Ended;
    use crate::facts::{FactError, FailureKind, Observed};
    if facts.image != crate::facts::ImageRole::Trainer
        || crate::nccl::version(facts)? < crate::nccl::version::PARAM_API
    {
        return None;
    }
    let library = facts.rdma.nccl.library.loaded()?.path.clone()?;
    let source = "ncclParamGetAllParameterKeys";
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Some(Observed::Error(FactError::new(source, e))),
    };
    let mut child_env: Vec<(OsString, OsString)> = env
        .iter()
        .filter(|(k, _)| k != "NCCL_PARAM_DUMP_ALL")
        .cloned()
        .collect();
    child_env.push(("NCCL_PARAM_DUMP_ALL".into(), "1".into()));
    let limit = timeout + std::time::Duration::from_secs(10);
    let ended = crate::child::call(&exe, "nccl-params-child", &library, child_env, limit);
    let error = |message: String| Some(Observed::Error(FactError::new(source, message)));
    match ended {
        Ended::Replied { reply, .. } => {
            match serde_json::from_slice::<Result<Option<Vec<_>>, String>>(&reply) {
                Ok(Ok(params)) => params.map(Observed::Value),
                Ok(Err(e)) => error(e),
                Err(e) => error(format!("the child's reply: {e}")),
            }
        }
        Ended::Silent { status, stderr } => error(format!(
            "the child ended ({status}) without a reply: {}",
            stderr.trim()
        )),
        Ended::Killed { after } => Some(Observed::Error(
            FactError::new(source, format!("no answer within {} s", after.as_secs()))
                .with_kind(FailureKind::Timeout),
        )),
        Ended::Failed(e) => error(e),
    }
}

fn image_role(arg: crate::cli::ImageArg) -> crate::facts::ImageRole {
    match arg {
        crate::cli::ImageArg::Trainer => crate::facts::ImageRole::Trainer,
        crate::cli::ImageArg::Own => crate::facts::ImageRole::Own,
    }
}

/// The most a file read whole (`--facts`, `--replay-kernel`) may hold. A facts
/// document of a 2,000-GPU, 100k-interface machine is under 64 MiB; more is not one
/// (`--facts /dev/zero` grew to 8.8 GB before anything stopped it).
const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Reads a whole input file as UTF-8, at most `MAX_INPUT_BYTES` of it. Pipes and
/// process substitution (`--facts <(ssh node nccl-preflight facts)`) are fine.
/// Opens an input the user named (`--facts`, `--replay-kernel`, explain-log's FILE).
/// A named FIFO that nobody writes to would block open(2) forever: it is opened
/// without blocking, then read blocking as usual. With no writer a FIFO reads as
/// empty, which the callers refuse like any empty input.
pub(crate) fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    fcntl(&file, FcntlArg::F_SETFL(OFlag::empty()))?;
    Ok(file)
}

fn read_whole(flag: &str, path: &Path) -> Result<String> {
    let file = open_input(path).with_context(|| flag.to_string())?;
    read_opened(flag, file)
}

/// `read_whole` of a file already opened with `open_input`.
fn read_opened(flag: &str, file: std::fs::File) -> Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    file.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| flag.to_string())?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        bail!(
            "{flag}: larger than {} (the most this tool reads); not a facts or recording file",
            crate::units::format_bytes(MAX_INPUT_BYTES)
        );
    }
    if bytes.is_empty() {
        bail!("{flag}: empty (a FIFO or pipe that nobody writes to reads as empty)");
    }
    String::from_utf8(bytes).map_err(|_| anyhow!("{flag}: not UTF-8 text"))
}

/// Where a facts document is parsed from: a regular file, read again from its start
/// for each pass (memory holds only what is kept), or the bytes of a pipe, read whole
/// (at most `MAX_INPUT_BYTES`; a pipe cannot be read twice).
enum FactsSource {
    File(std::fs::File),
    Bytes(Vec<u8>),
}

impl FactsSource {
    fn open(flag: &str, path: &Path) -> Result<FactsSource> {
        let file = open_input(path).with_context(|| flag.to_string())?;
        let meta = file.metadata().with_context(|| flag.to_string())?;
        if !meta.is_file() {
            return Ok(FactsSource::Bytes(read_opened(flag, file)?.into_bytes()));
        }
        if meta.len() > MAX_INPUT_BYTES {
            bail!(
                "{flag}: larger than {} (the most this tool reads); not a facts or recording file",
                crate::units::format_bytes(MAX_INPUT_BYTES)
            );
        }
        if meta.len() == 0 {
            bail!("{flag}: empty (a FIFO or pipe that nobody writes to reads as empty)");
        }
        Ok(FactsSource::File(file))
    }

    /// One pass over the whole document into `T`, streaming: the fields `T` does not
    /// name are skipped without being kept (serde's `IgnoredAny`).
    fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        use std::io::{Read, Seek};
        match self {
            FactsSource::Bytes(bytes) => parse_json(&mut bytes.as_slice()),
            FactsSource::File(file) => {
                let mut file = file;
                file.rewind().map_err(|e| e.to_string())?;
                let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
                let mut bytes = [0u8; 3];
                // serde_json reads UTF-8 but does not check strings it skips: refuse
                // a file that does not start as text, as the whole-file read did.
                let n = reader.read(&mut bytes).map_err(|e| e.to_string())?;
                if std::str::from_utf8(&bytes[..n]).is_err_and(|e| e.error_len().is_some()) {
                    return Err("not UTF-8 text".into());
                }
                file.rewind().map_err(|e| e.to_string())?;
                parse_json(&mut file.take(MAX_INPUT_BYTES))
            }
        }
    }
}

/// Parses the JSON document `reader` gives into `T`, as it streams. Every caller goes
/// through this one reader type (a buffered `dyn Read`), so the binary carries one
/// deserializer of the facts tree, not one per input kind (each is ~450 KB of code:
/// `serve::probe` reads the child's facts through it too).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    reader: &mut dyn std::io::Read,
) -> Result<T, String> {
    serde_json::from_reader(std::io::BufReader::with_capacity(1 << 16, reader))
        .map_err(|e| e.to_string())
}

/// The `schema` of a JSON object and nothing else: every other value is skipped as
/// it streams past, so a 64 MiB unknown field costs no memory (issue 31 row 5).
struct SchemaOnly(Option<String>);

impl<'de> serde::Deserialize<'de> for SchemaOnly {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct Document;
        impl<'de> Visitor<'de> for Document {
            type Value = SchemaOnly;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SchemaOnly, A::Error> {
                let mut schema = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "schema" {
                        schema = map.next_value::<TextOrNot>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(SchemaOnly(schema))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SchemaOnly, A::Error> {
                // Read through (the parser's depth limit applies), then refuse.
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Err(serde::de::Error::invalid_type(
                    serde::de::Unexpected::Seq,
                    &self,
                ))
            }
        }
        d.deserialize_any(Document)
    }
}

/// A string, or `None` for any other value (skipped, not kept).
struct TextOrNot(Option<String>);

impl<'de> serde::Deserialize<'de> for TextOrNot {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess};
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = TextOrNot;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E>(self, v: &str) -> Result<TextOrNot, E> {
                Ok(TextOrNot(Some(v.to_string())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TextOrNot, E> {
                Ok(TextOrNot(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TextOrNot, E> {
                Ok(TextOrNot(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<TextOrNot, E> {
                Ok(TextOrNot(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TextOrNot, E> {
                Ok(TextOrNot(None))
            }
            fn visit_unit<E>(self) -> Result<TextOrNot, E> {
                Ok(TextOrNot(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextOrNot, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(TextOrNot(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextOrNot, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(TextOrNot(None))
            }
        }
        d.deserialize_any(Text)
    }
}

/// A report's facts; its other fields are skipped unread.
#[derive(serde::Deserialize)]
struct ReportFacts {
    facts: Option<Facts>,
}

/// Loads saved facts: a facts document, or a report (its `facts`). A document
/// from another schema version is refused rather than misread. Parsed in two streaming
/// passes (the schema, then the typed facts), never into a generic JSON value: a 64 MiB
/// facts file padded with an unknown field took 5.8 GB that way (issue 31 row 5).
pub(crate) fn load_facts(path: &Path) -> Result<Facts> {
    let flag = format!("--facts {}", path.display());
    let source = FactsSource::open(&flag, path)?;
    let SchemaOnly(schema) = source
        .parse()
        .map_err(|e| anyhow!("{flag}: not valid JSON: {e}"))?;
    let schema = schema.unwrap_or_default();
    let mut facts: Facts = if schema == FACTS_SCHEMA {
        source.parse().map_err(|e| anyhow!("{flag}: {e}"))?
    } else if schema == REPORT_SCHEMA {
        let report: ReportFacts = source.parse().map_err(|e| anyhow!("{flag}: {e}"))?;
        report
            .facts
            .ok_or_else(|| anyhow!("{flag}: report has no facts"))?
    } else if schema == crate::explain::SCHEMA {
        bail!(
            "{flag}: this is an explain-log report ({schema}), not facts: give --facts the output of `nccl-preflight facts` or a report from check --format json or init --report"
        )
    } else if schema.starts_with("nccl-preflight/") {
        bail!(
            "{flag}: schema {schema:?} is not one this version reads ({FACTS_SCHEMA} or {REPORT_SCHEMA}); it was written by another nccl-preflight version"
        )
    } else {
        bail!("{flag}: not an nccl-preflight facts document (no \"schema\": {FACTS_SCHEMA:?})")
    };
    if facts.schema != FACTS_SCHEMA {
        bail!(
            "{flag}: facts schema {:?} is not {FACTS_SCHEMA}",
            facts.schema
        );
    }
    crate::layout::adopt_saved_nodes(&mut facts);
    Ok(facts)
}

pub(crate) fn build_policy(args: &CheckArgs) -> Result<Policy> {
    let policy = policy::build(
        &args.ignore,
        &args.require,
        args.min_shm.as_deref(),
        args.min_memlock.as_deref(),
    )
    .map_err(|e| anyhow!(e))?;
    for id in &policy.ignore {
        if !judge::check_ids().any(|known| known == id) {
            crate::diagnostic::line(format_args!(
                "nccl-preflight: note: --ignore {id}: no check has this id in this version (known: {})",
                judge::check_ids().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Ok(policy)
}

/// Gathers (or loads `--facts`), judges and tunes, as `args` and `how` say. Flags are
/// validated into the policy before anything is gathered: a typo costs nothing.
pub(crate) fn evaluate(
    args: &CheckArgs,
    env: &[(OsString, OsString)],
    how: Evaluation<'_>,
) -> Result<(Report, HungCall)> {
    let built;
    let policy = match how.policy {
        Some(policy) => policy,
        None => {
            built = build_policy(args)?;
            &built
        }
    };
    let (facts, hung) = match &args.facts {
        Some(path) => (load_facts(path)?, HungCall(false)),
        None => {
            let probe_all = how.probe_all || policy.require.any_rdma();
            gather_facts(&args.gather, env, Evaluation { probe_all, ..how })?
        }
    };
    let mut report = judge_gathered(args, facts, policy, how.flight_recorder);
    report.generated = Some(generated(env, &report.facts));
    Ok((report, hung))
}

/// When and on which node this report is made: now, and the node the downward API
/// gives (`NCCL_PREFLIGHT_NODE_NAME`), else the host name gathered.
pub(crate) fn generated(env: &[(OsString, OsString)], facts: &Facts) -> crate::report::Generated {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let node = env
        .iter()
        .find(|(k, _)| k == "NCCL_PREFLIGHT_NODE_NAME")
        .and_then(|(_, v)| v.to_str())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .or_else(|| facts.namespaces.hostname.value().cloned());
    crate::report::Generated::at_unix(unix, node)
}

/// Judges and tunes `facts` gathered (or saved) for `args`.
pub(crate) fn judge_gathered(
    args: &CheckArgs,
    mut facts: Facts,
    policy: &Policy,
    flight_recorder: Option<&std::path::Path>,
) -> Report {
    // What the command line says about the job wins over what was gathered or saved.
    if args.nodes.is_some() {
        facts.nodes = args.nodes;
    }
    if args.facts.is_some() && args.gather.image == crate::cli::ImageArg::Own {
        facts.image = crate::facts::ImageRole::Own;
    }
    let mut report = Report::judge(facts, policy);
    if let Some(dir) = flight_recorder {
        report.settings.extend(tune::flight_recorder::settings(dir));
        report.settings.sort_by(|a, b| a.name.cmp(&b.name));
    }
    report
}

/// The environment the trainer gets: this process's, plus every tuned setting whose
/// variable is not already set (a user's value always wins).
pub(crate) fn exec_environment(
    env: &[(OsString, OsString)],
    settings: &[tune::Setting],
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = env.to_vec();
    for s in settings.iter().filter(|s| s.source == tune::Source::Tuned) {
        if !out.iter().any(|(k, _)| k.as_os_str() == s.name.as_str()) {
            out.push((OsString::from(&s.name), OsString::from(&s.value)));
        }
    }
    out
}

pub(crate) fn use_color(env: &[(OsString, OsString)]) -> bool {
    // https://no-color.org: any non-empty NO_COLOR disables colour.
    let no_color = env.iter().any(|(k, v)| k == "NO_COLOR" && !v.is_empty());
    !no_color && std::io::stdout().is_terminal()
}

/// Writes `text` to standard output. A reader that went away (`check | head`)
/// is not an error: the rest of the output is dropped quietly and the command
/// still exits with its verdict's code, as the pipeline's status should say what
/// the check found. `print!` would panic there (Rust ignores SIGPIPE, so the
/// write returns EPIPE).
pub(crate) fn emit(text: &str) -> Result<()> {
    emit_to(&mut std::io::stdout().lock(), text).context("writing to standard output")
}

/// `emit` for standard error (the report of `exec`, whose standard output is CMD's).
pub(crate) fn emit_err(text: &str) -> Result<()> {
    emit_to(&mut std::io::stderr().lock(), text).context("writing to standard error")
}

fn emit_to(out: &mut dyn std::io::Write, text: &str) -> std::io::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

pub(crate) fn print(report: &Report, format: Format, env: &[(OsString, OsString)]) -> Result<()> {
    match format {
        Format::Human => emit(&render::human::render(report, use_color(env))),
        Format::Json => emit(&render::json::render(report)),
    }
}

pub(crate) fn exit_code(report: &Report) -> u8 {
    fault_exit(report.fault)
}

/// The exit code of a fault (the failure-policy contract, docs/failure-policy.md): 0 no
/// check failed, 1 a failure lies with the job, 3 every failure lies with this node. 2,
/// the tool could not do its job, is main's.
pub(crate) fn fault_exit(fault: Fault) -> u8 {
    match fault {
        Fault::None => EXIT_OK,
        Fault::Job => EXIT_FAILED,
        Fault::Node => EXIT_NODE_FAULT,
    }
}

/// `args` with the facts no check judges (NVLink CRC data counters, NUMA affinity):
/// `doctor`, `facts` and `serve` show them; the gates (`check`, `init`, `exec`,
/// `probe`) leave out their ~50 ms of per-call NVML reads on a 2x H200.
pub(crate) fn describing(args: &GatherArgs) -> GatherArgs {
    GatherArgs {
        unjudged: true,
        ..args.clone()
    }
}

#[cfg(test)]
mod host_tree_fuzz {
    use crate::gather::gpu::{CudaProbe, GpuOptions};
    use crate::gather::replay::{Recording, ReplayKernel};
    use crate::gather::{VendorOptions, host::Host, rdma::RdmaOptions};
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                files(&entry.path(), out);
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }

    /// A bounded, seeded fuzz of the procfs and sysfs parsers: the files of fixture
    /// host trees, mutated (bytes flipped, lines cut, repeated or emptied, numbers
    /// made huge), are gathered, judged, tuned and rendered, and nothing panics.
    #[test]
    fn fuzz_procfs_and_sysfs_parsers_with_seeded_mutations() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let vendor = VendorOptions {
            gpu: GpuOptions {
                nvml_library: "absent/libnvidia-ml.so.1".into(),
                cuda_library: "absent/libcuda.so.1".into(),
                call_timeout: Duration::from_secs(5),
                trace: false,
                cuda: CudaProbe::Off,
                unjudged: true,
                cudart: Ok(vec![]),
                cudart_probed: None,
            },
            rdma: RdmaOptions {
                verbs_library: "absent/libibverbs.so.1".into(),
                fabric_libraries: vec!["absent/libfabric.so.1".into()],
                nccl_libraries: vec![crate::gather::trainer_path::Candidate::new(
                    "--nccl-lib",
                    "absent/libnccl.so.2",
                )],
                net_plugin_env: None,
                memreg_bytes: 1 << 20,
                call_timeout: Duration::from_secs(5),
                trace: false,
                probe_all: false,
                own_image: false,
                probed: None,
            },
            image: crate::facts::ImageRole::Trainer,
        };
        let policy = crate::policy::build(&[], &[], None, None).unwrap();
        let mut rng = fastrand::Rng::with_seed(crate::test_facts::fuzz_seed(0xfeed_f00d));
        let mut next = move |n: usize| rng.usize(..n.max(1));
        for fixture in [
            "rdma-roce-multus",
            "rdma-port-down",
            "healthy-pod",
            "gpu-h100-nv18",
        ] {
            let src = repo.join("tests/fixtures").join(fixture);
            let tmp = tempfile::Builder::new()
                .prefix(&format!("fuzz-tree-{fixture}-"))
                .tempdir()
                .unwrap();
            let dir = tmp.path().to_path_buf();
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(src.join("root"))
                .arg(&dir)
                .status()
                .unwrap();
            assert!(copied.success());
            let root = dir.join("root");
            let mut paths = Vec::new();
            files(&root, &mut paths);
            paths.sort();
            let originals: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
            let recording: Recording =
                serde_json::from_str(&std::fs::read_to_string(src.join("kernel.json")).unwrap())
                    .unwrap();
            for _ in 0..crate::test_facts::fuzz_iterations(40) {
                let mut touched = Vec::new();
                for _ in 0..=next(4) {
                    let i = next(paths.len());
                    let mut bytes = originals[i].clone();
                    match next(6) {
                        0 if !bytes.is_empty() => {
                            let at = next(bytes.len());
                            bytes[at] = next(256) as u8;
                        }
                        1 => bytes.truncate(next(bytes.len() + 1)),
                        2 => bytes = bytes.repeat(1 + next(50)),
                        3 => bytes.clear(),
                        4 => bytes = b"18446744073709551616 -1 0x\n".to_vec(),
                        _ => bytes.extend_from_slice(b"\n\x1b[2J\t:\n"),
                    }
                    std::fs::write(&paths[i], &bytes).unwrap();
                    touched.push(i);
                }
                let host = Host::new(&root);
                let kernel = ReplayKernel::new(recording.clone(), &root);
                let (facts, _) = crate::gather::gather(&host, &kernel, &[], &vendor);
                let report = crate::report::Report::judge(facts, &policy);
                assert!(crate::render::human::render(&report, false).contains("Verdict: "));
                assert!(!crate::render::doctor::render(&report, false).is_empty());
                for i in touched {
                    std::fs::write(&paths[i], &originals[i]).unwrap();
                }
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
