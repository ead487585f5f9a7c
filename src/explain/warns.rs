//! NCCL's WARN and ATTN lines (and the INFO lines and framework errors that
//! carry one) explained through the meaning table: each message's row in
//! nccl_messages.tsv (where NCCL's or a plugin's source prints it, under which
//! condition, in which versions) and its meaning in meanings.txt (cause, fix,
//! the code it carries decoded by codes.rs). Then the lines around NCCL:
//! PyTorch's watchdog, c10d's and XLA's NCCL errors, torchrun's and Ray's
//! failure summaries.
//!
//! Findings come in time order and the first cause is the verdict: echoes
//! (teardown, a wrapper repeating the error, a proxy or socket reporting its
//! peer) are context of the first cause, benign WARNs (printed on healthy
//! paths) are context and never fail a log, and WARNs after a collective
//! timeout are its teardown.

use super::catalog::{Catalog, Message, Severity};
use super::codes::{self, Code};
use super::framework::CollectiveTimeout;
use super::meanings::{Meaning, Meanings, Role};
use super::summary::{LogSummary, WarnEntry};
use crate::finding::{Finding, Severity as Level, Status};
use crate::nccl::Version;

/// How to find the rank a hang waits for: PyTorch's flight recorder
/// (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp; TORCH_FR_BUFFER_SIZE from
/// 2.7, TORCH_NCCL_TRACE_BUFFER_SIZE before), NCCL's RAS (2.24 on), stacks.
const FIND_THE_RANK: &str = "Find the rank that did not arrive, not the network: rerun with \
TORCH_FR_BUFFER_SIZE=2000 (TORCH_NCCL_TRACE_BUFFER_SIZE before PyTorch 2.7) and TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
(PyTorch's flight recorder): every rank dumps its last collectives, and `python -m \
torch.distributed.flight_recorder.fr_trace <dump dir>` (torchfrtrace) names the rank whose sequence number is \
behind or that called another collective. While it hangs: NCCL's RAS (`ncclras` on the node, NCCL >= 2.24) \
lists the communicators with missing ranks, and `py-spy dump --pid` on each rank shows where it waits.";

/// What the log lets a rule know about the job.
struct Context {
    catalog: Option<Catalog<'static>>,
    meanings: Option<Meanings>,
    versions: Vec<Version>,
    /// The log is NCCL_DEBUG=INFO or more: never ask for it again.
    info_log: bool,
    /// An NCCL call failed (error-return trace lines, or the framework said so).
    failed_call: bool,
}

/// A finding under construction, with where its first line is.
struct Draft {
    first_line: u64,
    /// Log lines behind it (a WARN repeated counts each time).
    lines: u64,
    role: Role,
    finding: Finding,
    /// A code was decoded from it.
    decoded: bool,
    /// Its meaning says NCCL goes on after it, whatever the source's own return.
    goes_on: bool,
}

/// One message to explain.
struct Said<'a> {
    text: &'a str,
    warn: bool,
    attn: bool,
    location: Option<&'a str>,
    trace: Option<&'a str>,
    evidence: String,
    first_line: u64,
    lines: u64,
}

impl<'a> Said<'a> {
    fn of(w: &'a WarnEntry, warn: bool) -> Said<'a> {
        Said {
            text: &w.message,
            warn,
            attn: w.attn,
            location: w.location.as_deref(),
            trace: w.trace.as_deref(),
            evidence: w.evidence_line(),
            first_line: w.first_line,
            lines: w.count,
        }
    }
}

fn versions(s: &LogSummary) -> Vec<Version> {
    s.nccl_versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .collect()
}

/// `10.0.35.1` from `... from peer 10.0.35.1<49189> ...`, `node2` from `remote
/// peer node2<42830>`, `10.0.0.2` from `Connect to 10.0.0.2<45763> failed`.
fn peer_in(message: &str) -> Option<&str> {
    let at = ["peer ", " from ", "Connect to ", "connect to "]
        .iter()
        .find_map(|k| message.find(k).map(|i| i + k.len()))?;
    let token = message[at..].split([' ', ',']).next()?;
    let host = token.split('<').next()?.trim_end_matches(':');
    (!host.is_empty() && host != "with" && host != "%s").then_some(host)
}

/// The call a message names: `Call to ibv_reg_mr failed`, `ibv_post_send() failed`,
/// or the one its row's macro checks.
fn call_in<'a>(message: &'a str, row: Option<&'a Message>) -> Option<&'a str> {
    let word = |s: &'a str| {
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        (end > 0).then(|| &s[..end])
    };
    message
        .split("Call to ")
        .nth(1)
        .and_then(word)
        .or_else(|| row.and_then(Message::checked_call))
}

/// The state change of a queue pair: from NCCL's own text (2.24 on: `curr state
/// INIT, next state RTR`), else from the function that called wrap_ibv_modify_qp
/// at the error trace's line (the table's `call` rows).
fn transition(ctx: &Context, message: &str, trace: Option<&str>) -> Option<String> {
    let state = |key: &str| {
        message
            .split(key)
            .nth(1)
            .and_then(|r| r.split([',', ' ']).next())
            .filter(|s| !s.is_empty())
    };
    if let Some(next) = state("next state ") {
        return Some(match state("curr state ") {
            Some(curr) => format!("{curr}->{next}"),
            None => format!("to {next}"),
        });
    }
    let caller = ctx
        .catalog
        .as_ref()?
        .caller("wrap_ibv_modify_qp", trace?, &ctx.versions)?;
    Some(if caller.contains("Rtr") {
        format!("INIT->RTR, in {caller}")
    } else if caller.contains("Rts") {
        format!("RTR->RTS, in {caller}")
    } else {
        format!("RESET->INIT, in {caller}")
    })
}

/// A meaning's text with its placeholders filled.
fn fill(
    text: &str,
    said: &Said<'_>,
    row: Option<&Message>,
    code: &str,
    transition: &str,
) -> String {
    text.replace("{call}", call_in(said.text, row).unwrap_or("the call"))
        .replace("{peer}", peer_in(said.text).unwrap_or("the peer"))
        .replace("{code}", code)
        .replace("{transition}", transition)
}

fn source_of(row: Option<&Message>, catalog: Option<&Catalog>) -> String {
    match (row, catalog) {
        (Some(m), _) => format!("printed by {}", m.source()),
        (None, Some(c)) => format!(
            "in no NCCL {} or net plugin source read: read by its words (a vendor build's or a newer release's line)",
            c.span()
        ),
        (None, None) => "NCCL's message table could not be read".to_string(),
    }
}

/// The code a message carries, in words, and whether one was found.
fn code_text(meaning: &Meaning, text: &str) -> (Option<Code>, String) {
    let code = meaning
        .decode
        .as_deref()
        .and_then(|k| codes::decode(k, text));
    let shown = match (&code, codes::undefined_fi(text)) {
        (Some(c), _) => c.show(),
        (None, Some(n)) if meaning.decode.as_deref() == Some("fi") => format!(
            "RC {n}, a code libfabric does not define (include/rdma/fi_errno.h): the provider's own, of that libfabric version"
        ),
        _ => "an error the message does not name".to_string(),
    };
    (code, shown)
}

/// One message explained: its meaning's finding, cause and fix, its code decoded.
fn explain(ctx: &Context, said: &Said<'_>) -> Draft {
    let row = ctx
        .catalog
        .as_ref()
        .and_then(|c| c.find(said.warn, said.text, said.location, &ctx.versions));
    let source = source_of(row, ctx.catalog.as_ref());
    let meanings = ctx.meanings.as_ref();
    let Some(first) = meanings.and_then(|m| m.of(row, said.warn, said.text)) else {
        return unknown(ctx, said, row, source);
    };
    let (code, shown) = code_text(first, said.text);
    let redirected = code
        .as_ref()
        .and_then(|c| first.redirect(&c.names()))
        .and_then(|id| meanings.and_then(|m| m.get(id)));
    let meaning = redirected.unwrap_or(first);
    let transition = transition(ctx, said.text, said.trace)
        .map(|t| format!(" ({t})"))
        .unwrap_or_default();
    let mut summary = fill(&meaning.cause, said, row, &shown, &transition);
    if let (Some(c), None) = (&code, redirected) {
        summary.push_str(&format!(": {}", c.meaning));
    }
    let aborts = !said.attn
        && match meaning.severity.or(row.map(|m| m.severity)) {
            Some(Severity::Abort) => true,
            Some(_) => false,
            None => said.trace.is_some() || ctx.failed_call,
        };
    let level = if aborts && meaning.role != Role::Benign {
        Level::Fail
    } else {
        Level::Warn
    };
    let prefix = match (said.attn, said.warn) {
        (true, _) => "NCCL ATTN",
        (false, true) => "NCCL WARN",
        (false, false) => "NCCL INFO",
    };
    let mut f = Finding::flagged(
        &meaning.finding,
        level,
        format!("{prefix}: {summary}"),
        fill(&meaning.fix, said, row, &shown, &transition),
    );
    f.evidence = vec![
        format!("{} [{source}]", said.evidence),
        format!("meaning from: {}", meaning.source),
    ];
    Draft {
        first_line: said.first_line,
        lines: said.lines,
        role: meaning.role,
        finding: f,
        decoded: code.is_some(),
        goes_on: meaning.severity == Some(Severity::Continues),
    }
}

/// A message no meaning covers: verbatim, with its source.
fn unknown(ctx: &Context, said: &Said<'_>, row: Option<&Message>, source: String) -> Draft {
    let aborts = !said.attn
        && match row.map(|m| m.severity) {
            Some(Severity::Abort) => true,
            Some(_) => false,
            None => said.trace.is_some() || ctx.failed_call,
        };
    let mut f = Finding::flagged(
        "log-nccl-warn",
        if aborts { Level::Fail } else { Level::Warn },
        "",
        "",
    );
    f.evidence = vec![format!("{} [{source}]", said.evidence)];
    Draft {
        first_line: said.first_line,
        lines: said.lines,
        role: Role::Cause,
        finding: f,
        decoded: false,
        goes_on: false,
    }
}

/// The generic finding for messages without a meaning: verbatim, with their source.
fn unclassified(ctx: &Context, mut d: Draft) -> Draft {
    let n = d.finding.evidence.len();
    let summary = format!(
        "{n} other NCCL WARN {} ({} {}); the lines before each in the same process usually name the cause",
        if n == 1 { "message" } else { "messages" },
        d.lines,
        if d.lines == 1 { "line" } else { "lines in all" }
    );
    let fix = if ctx.info_log {
        "Read the lines just before each WARN from the same host:pid (the INFO lines show what NCCL was doing); the \
         source file and versions above say which NCCL code printed it."
    } else {
        "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV and read the lines before each WARN."
    };
    let level = if d.finding.status() == Status::Fail {
        Level::Fail
    } else {
        Level::Warn
    };
    let mut f = Finding::flagged("log-nccl-warn", level, summary, fix);
    f.evidence = std::mem::take(&mut d.finding.evidence);
    d.finding = f;
    d
}

/// A WARN whose meaning says NCCL goes on after it (a net plugin that failed to
/// initialise is skipped for the next: src/plugin/net.cc) speaks for the WARN
/// the same process printed just before it, when both are that finding: one
/// event told twice, the specific line first. `drafts` are `warnings`' own, in order.
fn follow_outcomes(warnings: &[WarnEntry], drafts: &mut [Draft]) {
    let goes_on: Vec<(&str, String)> = warnings
        .iter()
        .zip(drafts.iter())
        .filter(|(_, d)| d.goes_on)
        .filter_map(|(w, d)| Some((w.after.as_deref()?, d.finding.id.clone())))
        .collect();
    for (w, d) in warnings.iter().zip(drafts.iter_mut()) {
        let before_fallback = goes_on
            .iter()
            .any(|(m, id)| *m == w.message && *id == d.finding.id);
        if before_fallback && d.finding.status() == Status::Fail {
            let evidence = std::mem::take(&mut d.finding.evidence);
            d.finding = Finding::warn(
                &d.finding.id,
                d.finding.summary.clone(),
                d.finding.remediation().unwrap_or(""),
            );
            d.finding.evidence = evidence;
        }
    }
}

/// Merges drafts of one finding: the worst status, every line; the summary of
/// the first that decoded a code (it says more).
fn merge(drafts: Vec<Draft>) -> Vec<Draft> {
    let mut out: Vec<Draft> = Vec::new();
    for d in drafts {
        match out.iter_mut().find(|o| o.finding.id == d.finding.id) {
            Some(o) => {
                // The text of the one that decoded a code (it says more), else
                // of the worse; the worse status either way.
                let status = o.finding.status().max(d.finding.status());
                let worse = d.finding.status() > o.finding.status();
                if (d.decoded && !o.decoded) || (worse && d.decoded == o.decoded) {
                    let evidence = std::mem::take(&mut o.finding.evidence);
                    o.finding = d.finding.clone();
                    o.finding.evidence = evidence;
                    o.decoded = d.decoded;
                }
                if worse {
                    o.role = d.role;
                }
                if status > o.finding.status() {
                    let evidence = std::mem::take(&mut o.finding.evidence);
                    o.finding = Finding::flagged(
                        &o.finding.id,
                        Level::Fail,
                        o.finding.summary.clone(),
                        o.finding.remediation().unwrap_or(""),
                    );
                    o.finding.evidence = evidence;
                }
                for e in d.finding.evidence {
                    if !o.finding.evidence.contains(&e) {
                        o.finding.evidence.push(e);
                    }
                }
                o.first_line = o.first_line.min(d.first_line);
                o.lines += d.lines;
            }
            None => out.push(d),
        }
    }
    out
}

/// Findings for the log's NCCL messages and framework lines, in time order
/// with the first cause first; and the lines that are context (benign, or the
/// teardown of a timeout without a finding of its own).
pub fn findings(s: &LogSummary) -> (Vec<Finding>, Vec<String>) {
    let ctx = Context {
        catalog: Catalog::embedded().ok(),
        meanings: Meanings::embedded().ok(),
        versions: versions(s),
        info_log: s.info_lines > 0,
        failed_call: s.error_returns > 0 || !s.job.nccl_errors.is_empty(),
    };
    let mut drafts: Vec<Draft> = s
        .warnings
        .iter()
        .map(|w| explain(&ctx, &Said::of(w, true)))
        .collect();
    follow_outcomes(&s.warnings, &mut drafts);
    drafts.extend(info_findings(&ctx, s));
    drafts.extend(framework_errors(&ctx, s, &drafts));
    let mut drafts = merge(drafts);
    if let Some(i) = drafts.iter().position(|d| d.finding.id == "log-nccl-warn") {
        let d = drafts.remove(i);
        drafts.insert(i, unclassified(&ctx, d));
    }
    let timeouts = timeout_findings(s);
    let (mut drafts, context) = in_time_order(drafts, timeouts);
    let launcher = launcher_findings(s, &drafts);
    drafts.extend(launcher);
    (drafts.into_iter().map(|d| d.finding).collect(), context)
}

/// c10d's and XLA's NCCL errors, explained like a WARN through NCCL's last
/// error (or the result's own words). They restate a failure: an echo when an
/// NCCL WARN already failed, the cause when the log has nothing else.
fn framework_errors(ctx: &Context, s: &LogSummary, warns: &[Draft]) -> Vec<Draft> {
    let warned = warns.iter().any(|d| d.finding.status() == Status::Fail);
    s.job
        .nccl_errors
        .iter()
        .map(|e| {
            let said = format!(
                "line {}: NCCL error reported by the framework: {}",
                e.first_line, e.reason
            );
            let text = e.last_error.as_deref().unwrap_or(&e.reason);
            let evidence = match &e.last_error {
                Some(last) => format!("NCCL's last error: {last}"),
                None => said.clone(),
            };
            let mut d = explain(
                ctx,
                &Said {
                    text,
                    warn: true,
                    attn: false,
                    location: None,
                    trace: None,
                    evidence,
                    first_line: e.first_line,
                    lines: e.count,
                },
            );
            if e.last_error.is_some() {
                d.finding.evidence.insert(0, said);
            }
            if warned {
                d.role = Role::Echo;
            }
            // The framework saw the call fail: whatever NCCL's source says, the job failed.
            if d.finding.status() < Status::Fail {
                let (id, summary) = (d.finding.id.clone(), d.finding.summary.clone());
                let fix = d.finding.remediation().unwrap_or("").to_string();
                let evidence = std::mem::take(&mut d.finding.evidence);
                d.finding = Finding::fail(&id, summary, fix);
                d.finding.evidence = evidence;
            }
            d
        })
        .collect()
}

/// INFO lines that carry a finding: a meaning of kind info or any (a slowdown
/// or a retry: warn).
fn info_findings(ctx: &Context, s: &LogSummary) -> Vec<Draft> {
    s.notable_info
        .iter()
        // The socket transport never does GPUDirect RDMA: NCCL saying so is no finding.
        .filter(|n| !n.message.starts_with("NET/Socket "))
        .filter_map(|n| {
            let d = explain(ctx, &Said::of(n, false));
            (d.finding.id != "log-nccl-warn").then_some(d)
        })
        .map(|mut d| {
            if d.finding.status() == Status::Fail {
                let evidence = std::mem::take(&mut d.finding.evidence);
                d.finding = Finding::warn(
                    &d.finding.id,
                    d.finding.summary.clone(),
                    d.finding.remediation().unwrap_or(""),
                );
                d.finding.evidence = evidence;
            }
            d
        })
        .collect()
}

/// PyTorch's watchdog: a collective that timed out, and a watchdog that hung.
fn timeout_findings(s: &LogSummary) -> Vec<Draft> {
    let mut out: Vec<Draft> = s
        .job
        .collective_timeouts
        .iter()
        .map(|t| timeout_draft(s, t))
        .collect();
    if let Some(line) = s.job.watchdog_hang_line {
        out.push(Draft {
            first_line: line,
            lines: s.job.watchdog_hangs,
            role: if out.is_empty() { Role::Cause } else { Role::Echo },
            decoded: false,
            goes_on: false,
            finding: Finding::fail(
                "log-watchdog-hang",
                "PyTorch's heartbeat monitor found the NCCL watchdog thread itself stuck (in an NCCL or CUDA call, often aborting a communicator after a hung collective)",
                format!("{FIND_THE_RANK} TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC gives the watchdog longer, but a watchdog stuck at teardown is usually the hung collective's consequence."),
            )
            .evidence(format!("line {line}: ... watchdog hang / watchdog got stuck ({} lines)", s.job.watchdog_hangs)),
        });
    }
    out
}

/// The ranks in `0..n` not in `reported`, as a list (when the world is small enough to list).
fn missing(total: Option<u32>, reported: &[u32]) -> Option<String> {
    let n = total.filter(|&n| n <= 64)?;
    let m: Vec<String> = (0..n)
        .filter(|r| !reported.contains(r))
        .map(|r| r.to_string())
        .collect();
    (!m.is_empty()).then(|| m.join(", "))
}

fn list(ranks: impl Iterator<Item = u32>) -> String {
    ranks.map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

/// What the ranks' work numbers say: a rank whose last enqueued collective is
/// below the one that timed out never issued it (PyTorch's pgStatus).
fn work_says(s: &LogSummary, t: &CollectiveTimeout) -> String {
    let (Some(seq), false) = (t.seq, s.job.work.is_empty()) else {
        return String::new();
    };
    let seq = seq as i64;
    let behind: Vec<u32> = s
        .job
        .work
        .iter()
        .filter(|w| w.enqueued < seq)
        .map(|w| w.rank)
        .collect();
    let stuck = list(
        s.job
            .work
            .iter()
            .filter(|w| w.enqueued >= seq)
            .map(|w| w.rank),
    );
    let completed = s
        .job
        .work
        .iter()
        .map(|w| w.completed)
        .min()
        .unwrap_or(seq - 1);
    if !behind.is_empty() {
        format!(
            "; rank(s) {} never enqueued it (last enqueued below {seq}): the suspects",
            list(behind.into_iter())
        )
    } else {
        format!(
            "; every rank that printed its work numbers ({stuck}) had enqueued it and completed up to {completed}: it was issued and never finished"
        )
    }
}

fn timeout_draft(s: &LogSummary, t: &CollectiveTimeout) -> Draft {
    let op = t.op.as_deref().unwrap_or("a collective");
    let ranks = if t.ranks.is_empty() {
        "?".to_string()
    } else {
        list(t.ranks.iter().copied())
    };
    let total = s.communicators.values().filter_map(|c| c.ranks_total).max();
    let missing = missing(total, &t.ranks)
        .map(|m| format!("; ranks that reported no timeout, the suspects: {m}"))
        .unwrap_or_default();
    let first = s
        .job
        .dump_signal_from
        .as_deref()
        .map(|r| format!("; the first watchdog to fire was {r}'s"))
        .unwrap_or_default();
    let summary = format!(
        "PyTorch's watchdog timed out {op}{}{} on rank(s) {ranks}: they waited for a rank that never reached it (it crashed, hung, or called another collective){missing}{}{first}. WARNs after this line are the teardown, not the cause",
        t.seq.map(|n| format!(" (SeqNum {n})")).unwrap_or_default(),
        t.timeout_ms
            .map(|ms| format!(" after {} s", ms / 1000))
            .unwrap_or_default(),
        work_says(s, t),
    );
    Draft {
        first_line: t.first_line,
        lines: t.count,
        role: Role::Cause,
        decoded: false,
        goes_on: false,
        finding: Finding::fail("log-collective-timeout", summary, FIND_THE_RANK).evidence(format!(
            "line {}: Watchdog caught collective operation timeout ({} lines)",
            t.first_line, t.count
        )),
    }
}

/// Time order: the first cause (a failing draft that is no echo, else a
/// failing echo) is the verdict and comes first; echoes fold into it; WARNs
/// after the first collective timeout are its teardown; benign drafts are
/// context. Returns the findings and the context lines.
fn in_time_order(mut drafts: Vec<Draft>, timeouts: Vec<Draft>) -> (Vec<Draft>, Vec<String>) {
    let first_timeout = timeouts.iter().map(|d| d.first_line).min();
    drafts.extend(timeouts);
    drafts.sort_by_key(|d| d.first_line);
    let fails = |d: &Draft| d.finding.status() == Status::Fail;
    let verdict = drafts
        .iter()
        .position(|d| fails(d) && d.role == Role::Cause)
        .or_else(|| drafts.iter().position(|d| fails(d) && d.role == Role::Echo));
    let mut context = Vec::new();
    let mut out: Vec<Draft> = Vec::new();
    let verdict = verdict.map(|i| drafts.remove(i));
    for d in drafts {
        let teardown = first_timeout.is_some_and(|t| d.first_line > t)
            && d.finding.id != "log-collective-timeout";
        let echo = d.role == Role::Echo && verdict.is_some();
        if d.role == Role::Benign {
            context.extend(d.finding.evidence.into_iter().map(|e| {
                format!(
                    "benign ({}: NCCL prints it on healthy runs too): {e}",
                    d.finding.id
                )
            }));
        } else if let (true, Some(v)) = (teardown || echo, verdict.as_ref()) {
            let why = if teardown {
                "teardown after the timeout"
            } else {
                "echo of the first failure"
            };
            context.extend(
                d.finding
                    .evidence
                    .into_iter()
                    .map(|e| format!("{why} ({}, after {}): {e}", d.finding.id, v.finding.id)),
            );
        } else {
            out.push(d);
        }
    }
    out.sort_by_key(|d| std::cmp::Reverse(d.finding.status()));
    if let Some(v) = verdict {
        out.insert(0, v);
    }
    (out, context)
}

/// torchrun's and Ray's failures: a finding of their own only when nothing else
/// in the log explains them; else evidence of the cause.
fn launcher_findings(s: &LogSummary, drafts: &[Draft]) -> Vec<Draft> {
    let failures = &s.job.launcher_failures;
    if failures.is_empty() || drafts.iter().any(|d| d.finding.status() == Status::Fail) {
        return Vec::new();
    }
    let lines: Vec<String> = failures
        .iter()
        .map(|f| {
            format!(
                "line {}: {}: {} exited{}{}",
                f.line,
                f.launcher,
                f.rank.as_deref().unwrap_or("a rank"),
                f.host
                    .as_deref()
                    .map(|h| format!(" on {h}"))
                    .unwrap_or_default(),
                f.exitcode
                    .as_deref()
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    let f = if failures.iter().any(|f| f.launcher == "ray") {
        ray_finding(failures)
    } else {
        launcher_finding(failures)
    };
    let mut f = f;
    f.evidence = lines;
    vec![Draft {
        first_line: 0,
        lines: 1,
        role: Role::Cause,
        decoded: false,
        goes_on: false,
        finding: f,
    }]
}

/// What a negative exit code (the signal that ended the process: Python's
/// Popen.returncode, torchrun's `exitcode: -N`) usually means for a rank.
fn signal_said(exitcode: &str) -> Option<&'static str> {
    Some(match exitcode.split_whitespace().next()? {
        // c10d's watchdog and NCCL's async error handling abort the process
        // (ProcessGroupNCCL.cpp: std::abort on a timeout or an NCCL error).
        "-6" => " (SIGABRT, exit -6: PyTorch's watchdog or NCCL aborts this way)",
        "-9" => {
            " (SIGKILL, exit -9: the kernel's OOM killer or the container's memory limit, or a kill from outside)"
        }
        // A bus error on a mapped file whose tmpfs is full: DataLoader workers'
        // and NCCL's shared memory live in /dev/shm.
        "-7" => " (SIGBUS, exit -7: often /dev/shm too small for what is mapped there)",
        "-11" => {
            " (SIGSEGV, exit -11: a crash in native code, such as a CUDA extension or a library built for another version)"
        }
        _ => return None,
    })
}

/// torchrun's agent (torch/distributed/elastic/multiprocessing/errors) or
/// DeepSpeed's launcher (deepspeed/launcher/launch.py) saw a rank fail and
/// ended the others.
fn launcher_finding(failures: &[super::framework::LauncherFailure]) -> Finding {
    // ChildFailedError's `Root Cause (first observed failure)` block names the
    // first rank that failed.
    let root = failures
        .iter()
        .rev()
        .find(|f| f.host.is_some() || f.rank.as_deref().is_some_and(|r| r.starts_with("rank")));
    let first = root.or_else(|| failures.first());
    let who = first
        .map(|f| {
            format!(
                "{}{}{}",
                f.rank.as_deref().unwrap_or("a rank"),
                f.host
                    .as_deref()
                    .map(|h| format!(" on {h}"))
                    .unwrap_or_default(),
                f.exitcode
                    .as_deref()
                    .map(|c| format!(" with exit code {c}"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "a rank".to_string());
    let signal = failures
        .iter()
        .find_map(|f| f.exitcode.as_deref().and_then(signal_said))
        .unwrap_or("");
    let deepspeed = first.is_some_and(|f| f.launcher == "DeepSpeed");
    let (launcher, keep) = if deepspeed {
        (
            "DeepSpeed's launcher",
            "deepspeed --enable_each_rank_log DIR",
        )
    } else {
        ("torchrun's agent", "torchrun --tee 3 --log-dir DIR")
    };
    let oom = if signal.contains("SIGKILL") {
        " For SIGKILL, look for the OOM killer: `dmesg | grep -i oom` on the node, `kubectl describe pod` (OOMKilled), and give the pod more memory or use less host memory (CPU offload, DataLoader workers)."
    } else {
        ""
    };
    Finding::fail(
        "log-launcher-failure",
        format!(
            "{launcher} saw {who} fail first{signal} and ended the others: the cause is in that rank's own output, which this log does not show"
        ),
        format!(
            "Read the failed rank's own output from before the launcher's lines ({keep} keeps every \
             rank's output): its first NCCL, CUDA or watchdog error is the cause; run explain-log on it.{oom}"
        ),
    )
}

fn ray_finding(failures: &[super::framework::LauncherFailure]) -> Finding {
    let f = failures.iter().find(|f| f.launcher == "ray");
    let at = f
        .map(|f| {
            format!(
                "{}{}{}",
                f.rank.as_deref().unwrap_or("a worker"),
                f.host
                    .as_deref()
                    .map(|h| format!(" at {h}"))
                    .unwrap_or_default(),
                f.exitcode
                    .as_deref()
                    .map(|c| format!(" (exit type {c})"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "a worker".to_string());
    Finding::fail(
        "log-launcher-failure",
        format!(
            "Ray reported that {at} died: the process was killed (the kernel's OOM killer, `ray stop --force`) or crashed; its own log holds the cause, this one does not"
        ),
        "Read that worker's own log on its node (Ray's session_latest/logs/worker-*.err and python-core-worker-*.log) \
         and the node's kernel log for the OOM killer (`dmesg | grep -i oom`); run explain-log on the worker's output.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<(String, Status)> {
        let s = crate::explain::summarize(text.as_bytes()).unwrap();
        crate::explain::rules::diagnose(&s)
            .0
            .into_iter()
            .map(|f| (f.id.clone(), f.status()))
            .collect()
    }

    #[test]
    fn peers_are_named() {
        assert_eq!(
            peer_in("NET/IB : Got completion from peer 10.0.35.1<49189> with error 4"),
            Some("10.0.35.1")
        );
        assert_eq!(
            peer_in("socketProgress: Connection closed by remote peer node2<42830>"),
            Some("node2")
        );
        assert_eq!(
            peer_in("Call to recv from 172.1.2.3<33759> failed : Connection reset by peer"),
            Some("172.1.2.3")
        );
        assert_eq!(
            peer_in("Connect to 10.38.10.112<21724> failed : Connection refused"),
            Some("10.38.10.112")
        );
    }

    #[test]
    fn a_completion_error_fails_names_its_status_and_folds_the_proxy() {
        let (f, context) = crate::explain::rules::diagnose(
            &crate::explain::summarize(
                "h:1:2 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.2.3<5> with status=12 opcode=0 len=0 vendor err 129 (Send)\n\
                 h:1:2 [0] NCCL INFO transport/net.cc:1302 -> 6\n\
                 h:1:2 [0] proxy.cc:1119 NCCL WARN [Proxy Service 9] Failed to execute operation Connect from rank 9, retcode 6\n"
                    .as_bytes(),
            )
            .unwrap(),
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].id.as_str(), f[0].status()),
            ("log-rdma-completion", Status::Fail)
        );
        assert!(
            f[0].summary
                .contains("IBV_WC_RETRY_EXC_ERR (12, transport retry counter exceeded)"),
            "{}",
            f[0].summary
        );
        assert!(f[0].remediation().unwrap().contains("10.1.2.3"));
        assert!(
            f[0].evidence
                .iter()
                .any(|e| e.contains("src/transport/net_ib")),
            "{:?}",
            f[0].evidence
        );
        assert!(
            context
                .iter()
                .any(|e| e.starts_with("echo of the first failure (log-proxy")),
            "{context:?}"
        );
    }

    #[test]
    fn a_timeout_with_a_teardown_after_it_is_a_timeout() {
        let got = ids(
            "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n\
             h:1:2 [0] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer b<47861>\n",
        );
        assert_eq!(got, [("log-collective-timeout".to_string(), Status::Fail)]);
    }

    /// Issue 38: a hang names its suspects: the ranks that never enqueued the
    /// collective (PyTorch's pgStatus), and those that reported no timeout when
    /// the log gives the world size.
    #[test]
    fn a_timeout_names_the_ranks_that_never_issued_it() {
        let (f, _) = crate::explain::rules::diagnose(
            &crate::explain::summarize(
                "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0\n\
                 [rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLGATHER, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n\
                 [rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLGATHER, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n\
                 [rank0]:[E ProcessGroupNCCL.cpp:1664] [PG 0 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 9, last enqueued NCCL work: 9, last completed NCCL work: 8.\n\
                 [rank2]:[E ProcessGroupNCCL.cpp:1987] [PG 0 Rank 2] Received a dump signal due to a collective timeout from rank 0 and we will try our best to dump the debug info. Last enqueued NCCL work: 8, last completed NCCL work: 8.\n"
                    .as_bytes(),
            )
            .unwrap(),
        );
        assert_eq!(f[0].id, "log-collective-timeout");
        let s = &f[0].summary;
        assert!(
            s.contains("ALLGATHER (SeqNum 9) after 600 s on rank(s) 0, 1"),
            "{s}"
        );
        assert!(
            s.contains("ranks that reported no timeout, the suspects: 2, 3"),
            "{s}"
        );
        assert!(s.contains("rank(s) 2 never enqueued it"), "{s}");
        assert!(s.contains("the first watchdog to fire was rank 0's"), "{s}");
        assert!(f[0].remediation().unwrap().contains("fr_trace"));
    }

    /// Issue 38: a WARN NCCL prints on a healthy path (GIN probing libibverbs on
    /// a node without it, NCCL 2.29) is context; the log passes.
    #[test]
    fn a_benign_warn_is_context_and_the_log_passes() {
        let (f, context) = crate::explain::rules::diagnose(
            &crate::explain::summarize(
                "[0] NCCL INFO NCCL version 2.29.7+cuda12.3\n\
                 [5] misc/ibvwrap.cc:173 NCCL WARN lib wrapper not initialized.\n\
                 [5] NCCL INFO transport/net_ib/gdr.cc:56 -> 3\n\
                 [5] NCCL INFO Failed to initialize any GIN plugin\n"
                    .as_bytes(),
            )
            .unwrap(),
        );
        assert!(f.iter().all(|f| f.status() != Status::Fail), "{f:#?}");
        assert!(
            context
                .iter()
                .any(|c| c.starts_with("benign (log-ib-setup")),
            "{context:?}"
        );
    }

    /// Issue 38: NCCL 2.32's ATTN level warns, never fails; a line of a release
    /// newer than the table is read by its words.
    #[test]
    fn attn_lines_warn_and_newer_lines_are_read_by_their_words() {
        let got = ids("h:1:1 [0] NCCL INFO NCCL version 2.33.1+cuda13.1\n\
             h:1:1 [0] plugin/net.cc:77 (ncclNetInit) NCCL ATTN NET/Plugin: brand new fallback, using internal net plugin\n");
        assert_eq!(got, [("log-net-plugin".to_string(), Status::Warn)]);
        let (f, _) = crate::explain::rules::diagnose(
            &crate::explain::summarize(
                "h:1:1 [0] NCCL INFO NCCL version 2.33.1+cuda13.1\n\
                 h:1:1 [0] transport/net_ib/newfile.cc:12 (ncclIbNew) NCCL WARN NET/IB : Got completion from peer 10.0.0.9<1> with status=transport retry counter exceeded(12) and a new field\n\
                 h:1:1 [0] NCCL INFO transport/net.cc:1302 -> 6\n"
                    .as_bytes(),
            )
            .unwrap(),
        );
        assert_eq!(
            (f[0].id.as_str(), f[0].status()),
            ("log-rdma-completion", Status::Fail)
        );
        assert!(
            f[0].summary.contains("IBV_WC_RETRY_EXC_ERR"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn unknown_warns_never_ask_an_info_log_for_info() {
        let s = crate::explain::summarize(
            "h:1:1 [0] NCCL INFO NCCL version 2.28.9\nh:1:1 [0] x.cc:1 NCCL WARN brand new problem\n".as_bytes(),
        )
        .unwrap();
        let (f, _) = crate::explain::rules::diagnose(&s);
        assert_eq!(f[0].id, "log-nccl-warn");
        assert!(!f[0].remediation().unwrap().contains("NCCL_DEBUG=INFO"));
        assert!(
            f[0].evidence[0].contains("in no NCCL"),
            "{:?}",
            f[0].evidence
        );
    }

    #[test]
    fn gdr_disabled_info_warns_and_torchrun_alone_fails() {
        assert_eq!(
            ids("h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'\n"),
            [("log-gdr".to_string(), Status::Warn)]
        );
        assert_eq!(
            ids(
                "E1106 api.py:869] failed (exitcode: -6) local_rank: 3 (pid: 26026) of binary: /bin/python\n"
            ),
            [("log-launcher-failure".to_string(), Status::Fail)]
        );
    }

    /// DeepSpeed's launcher names the rank in its command and the signal in a
    /// negative code; torchrun's exit codes read the same way. Written from
    /// deepspeed/launcher/launch.py (sigkill_handler) before the code.
    #[test]
    fn launchers_name_the_rank_and_the_signal_that_ended_it() {
        let said = |text: &str| {
            let s = crate::explain::summarize(text.as_bytes()).unwrap();
            let f = crate::explain::rules::diagnose(&s).0.remove(0);
            (
                f.id.clone(),
                f.summary.clone(),
                f.remediation().unwrap_or("").to_string(),
            )
        };
        let (id, summary, fix) = said(
            "[2024-01-01 00:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', '--local_rank=3', '--deepspeed'] exits with return code = -9\n",
        );
        assert_eq!(id, "log-launcher-failure");
        assert!(
            summary.starts_with(
                "DeepSpeed's launcher saw local rank 3 with exit code -9 fail first (SIGKILL"
            ),
            "{summary}"
        );
        assert!(
            fix.contains("--enable_each_rank_log") && fix.contains("OOMKilled"),
            "{fix}"
        );
        let (_, summary, fix) = said(
            "E1106 api.py:869] failed (exitcode: -7) local_rank: 0 (pid: 1) of binary: /bin/python\n",
        );
        assert!(
            summary.contains("torchrun's agent saw local rank 0") && summary.contains("SIGBUS"),
            "{summary}"
        );
        assert!(fix.contains("--tee 3") && !fix.contains("OOM"), "{fix}");
        // A positive code is the program's own exit: no signal is named.
        let (_, summary, _) = said(
            "[ERROR] [launch.py:321:sigkill_handler] ['python', 'x.py', '--local_rank=1'] exits with return code = 1\n",
        );
        assert!(
            summary.contains("local rank 1 with exit code 1 fail first and"),
            "{summary}"
        );
    }
}
