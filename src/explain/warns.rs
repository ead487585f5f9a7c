//! NCCL's WARN lines (and the INFO lines and framework errors that carry one)
//! explained through the catalog generated from NCCL's source: each gets its
//! class's cause and fix, its severity in the versions the log shows (a WARN
//! after which NCCL returns an error fails the job: exit 1; one NCCL goes on
//! after warns), and its source file, lines and NCCL versions. Then the lines
//! around NCCL: a collective timeout, a torchrun failure, a c10d NCCL error.
//! What follows a root cause (the proxy's errors, a peer closing its socket,
//! the teardown after a timeout) is folded into the cause's evidence, and a
//! cause on another rank names that rank's host.

use super::catalog::{CLASSES, Catalog, Class, INFO_CLASSES, Message, Severity};
use super::framework::CollectiveTimeout;
use super::summary::{LogSummary, WarnEntry};
use super::verbs;
use crate::finding::{Finding, Severity as Level, Status};
use crate::nccl::Version;

/// Classes whose WARNs usually follow an earlier failure rather than cause it.
const CONSEQUENCES: &[&str] = &[
    "log-proxy",
    "log-remote-peer",
    "log-nccl-init",
    "log-socket",
];

/// PyTorch's flight recorder, for a rank that did not arrive (pytorch/pytorch
/// torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, docs "Flight Recorder").
const FIND_THE_RANK: &str = "Find the rank that did not arrive: the ranks that timed out waited for it. Rerun with \
TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 (PyTorch's flight recorder): each rank dumps its last \
collectives on the timeout, and `torchfrtrace <dump dir>` names the rank whose last sequence number is behind or that \
called a different collective. Without it: the rank whose own log stops first or shows the first error, and \
`py-spy dump --pid` on a hung rank. `nccl-preflight gang` names an odd pod before the job starts.";

/// What the log lets a rule know about the job.
struct Context {
    catalog: Option<Catalog>,
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
    class: &'static str,
    finding: Finding,
}

/// True for the classes that usually follow a cause rather than are one.
pub fn is_consequence(id: &str) -> bool {
    CONSEQUENCES.contains(&id)
}

fn versions(s: &LogSummary) -> Vec<Version> {
    s.nccl_versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .collect()
}

fn class_by_words(classes: &'static [Class], text: &str) -> Option<&'static Class> {
    classes
        .iter()
        .find(|c| c.words.iter().any(|w| text.contains(w)))
}

/// The class of a WARN: by the words of its text as printed (strerror's
/// `Connection reset by peer` is not in the format), then by its row; a row in
/// a header (`CUDACHECK` in include/checks.h) is a macro, and the file the log
/// names (`transport/nvls.cc:254`) says where it failed.
fn class_of(row: Option<&Message>, text: &str, location: Option<&str>) -> Option<&'static Class> {
    // Only a known row: a line NCCL never printed is classed by its words alone.
    let in_macro = row.is_some_and(|m| m.file.ends_with(".h"));
    let at_file = location
        .and_then(|l| l.rsplit_once(':'))
        .map(|(f, _)| f)
        .filter(|_| in_macro)
        .and_then(|f| {
            CLASSES
                .iter()
                .find(|c| c.files.iter().any(|p| !p.ends_with(".h") && f.contains(p)))
        });
    CLASSES
        .iter()
        .find(|c| c.remote && c.words.iter().any(|w| text.contains(w)))
        .or(at_file)
        .or_else(|| row.and_then(Message::class))
        .or_else(|| class_by_words(CLASSES, text))
}

/// `10.0.35.1` from `... from peer 10.0.35.1<49189> ...`, `node2` from `remote peer node2<42830>`.
fn peer_in(message: &str) -> Option<&str> {
    let at = message
        .find("peer ")
        .map(|i| i + 5)
        .or_else(|| message.find(" from ").map(|i| i + 6))?;
    let token = message[at..].split([' ', ',']).next()?;
    let host = token.split('<').next()?.trim_end_matches(':');
    (!host.is_empty() && host != "with").then_some(host)
}

fn source_of(row: Option<&Message>, catalog: Option<&Catalog>) -> String {
    match (row, catalog) {
        (Some(m), _) => format!("printed by NCCL's {}", m.source()),
        (None, Some(c)) => format!(
            "not in NCCL's source {}: a net plugin's or a vendor build's line",
            c.span()
        ),
        (None, None) => "NCCL's message table could not be read".to_string(),
    }
}

/// One WARN or error text, explained: the finding its class gives.
fn explain_text(
    ctx: &Context,
    text: &str,
    location: Option<&str>,
    evidence: String,
    first_line: u64,
) -> Draft {
    let row = ctx
        .catalog
        .as_ref()
        .and_then(|c| c.find(true, text, location, &ctx.versions));
    let class = class_of(row, text, location);
    let aborts = match row.map(Message::effective_severity) {
        Some(Severity::Abort) => true,
        Some(_) => false,
        None => ctx.failed_call,
    };
    let source = source_of(row, ctx.catalog.as_ref());
    let Some(class) = class else {
        let mut f = Finding::flagged(
            "log-nccl-warn",
            if aborts { Level::Fail } else { Level::Warn },
            "",
            "",
        );
        f.evidence = vec![format!("{evidence} [{source}]")];
        return Draft {
            first_line,
            lines: 1,
            class: "log-nccl-warn",
            finding: f,
        };
    };
    let mut summary = format!("NCCL WARN: {}", class.cause);
    let mut fix = class.fix.to_string();
    if let Some(status) = verbs::status_in(text).filter(|_| class.id == "log-rdma-completion") {
        summary = format!(
            "NCCL WARN: an RDMA work request completed with status {} ({}, {}): the cause is {}: {}",
            status.code,
            status.name,
            status.text,
            verbs::layer_text(status.layer),
            status.meaning
        );
    }
    if let Some(peer) = peer_in(text).filter(|_| class.remote) {
        summary.push_str(&format!("; the other end is {peer}"));
        fix = format!(
            "Read the log of {peer} (its host, and the rank on it) from before this line: its first error is the cause; \
             this rank only saw the connection fail."
        );
    }
    let level = if aborts { Level::Fail } else { Level::Warn };
    let mut f = Finding::flagged(class.id, level, summary, fix);
    f.evidence = vec![format!("{evidence} [{source}]")];
    Draft {
        first_line,
        lines: 1,
        class: class.id,
        finding: f,
    }
}

/// Merges drafts of one class into one finding: the worst status, every line.
fn merge(drafts: Vec<Draft>) -> Vec<Draft> {
    let mut out: Vec<Draft> = Vec::new();
    for d in drafts {
        match out.iter_mut().find(|o| o.class == d.class) {
            Some(o) => {
                if d.finding.status() > o.finding.status() {
                    let evidence = std::mem::take(&mut o.finding.evidence);
                    o.finding = d.finding.clone();
                    o.finding.evidence = evidence;
                }
                o.finding.evidence.extend(d.finding.evidence);
                o.first_line = o.first_line.min(d.first_line);
                o.lines += d.lines;
            }
            None => out.push(d),
        }
    }
    out
}

/// The generic finding for WARNs without a class: verbatim, with their source.
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

/// Findings for the WARNs no signature of `rules` knew, the INFO lines that
/// carry one, and the framework's lines.
pub fn findings(s: &LogSummary, others: &[&WarnEntry]) -> Vec<Finding> {
    let ctx = Context {
        catalog: Catalog::embedded().ok(),
        versions: versions(s),
        info_log: s.info_lines > 0,
        failed_call: s.error_returns > 0 || !s.job.nccl_errors.is_empty(),
    };
    let mut drafts: Vec<Draft> = others
        .iter()
        .map(|w| {
            let evidence = w.evidence_line();
            let mut d = explain_text(
                &ctx,
                &w.message,
                w.location.as_deref(),
                evidence,
                w.first_line,
            );
            d.lines = w.count;
            d
        })
        .collect();
    drafts.extend(framework_errors(&ctx, s));
    drafts.extend(info_findings(&ctx, s));
    let mut drafts = merge(drafts);
    if let Some(i) = drafts.iter().position(|d| d.class == "log-nccl-warn") {
        let d = drafts.remove(i);
        drafts.insert(i, unclassified(&ctx, d));
    }
    let timeouts = timeout_findings(s);
    let mut drafts = fold_consequences(drafts, timeouts);
    drafts.extend(launcher_findings(s, &drafts));
    drafts.into_iter().map(|d| d.finding).collect()
}

/// c10d's `NCCL error in: ...` with NCCL's last error, explained like a WARN.
fn framework_errors(ctx: &Context, s: &LogSummary) -> Vec<Draft> {
    s.job
        .nccl_errors
        .iter()
        .map(|e| {
            let said = format!("line {}: PyTorch: NCCL error: {}", e.first_line, e.reason);
            let text = e.last_error.as_deref().unwrap_or(&e.reason);
            let evidence = match &e.last_error {
                Some(last) => format!("NCCL's last error: {last}"),
                None => said.clone(),
            };
            let mut d = explain_text(ctx, text, None, evidence, e.first_line);
            if e.last_error.is_some() {
                d.finding.evidence.insert(0, said);
            }
            if d.class == "log-nccl-warn" && e.reason.contains("remote process exited") {
                let mut f = Finding::fail(
                    "log-remote-peer",
                    "NCCL reported to PyTorch that a remote process exited or the network failed: the cause is on another rank",
                    "Read the other ranks' logs from before this time: the first one to fail (a crash, an OOM kill, its own NCCL error) is the cause.",
                );
                f.evidence = std::mem::take(&mut d.finding.evidence);
                d = Draft { first_line: d.first_line, lines: d.lines, class: "log-remote-peer", finding: f };
            }
            // The framework saw the call fail: whatever NCCL's source says, the job failed.
            if d.finding.status() < Status::Fail {
                let (id, summary, fix) = (d.finding.id.clone(), d.finding.summary.clone(), d.finding.remediation().unwrap_or("").to_string());
                let evidence = std::mem::take(&mut d.finding.evidence);
                d.finding = Finding::fail(&id, summary, fix);
                d.finding.evidence = evidence;
            }
            d
        })
        .collect()
}

/// INFO lines whose text the catalog's INFO classes name (a slowdown: warn).
fn info_findings(ctx: &Context, s: &LogSummary) -> Vec<Draft> {
    s.notable_info
        .iter()
        // The socket transport never does GPUDirect RDMA: NCCL saying so is no finding.
        .filter(|n| !n.message.starts_with("NET/Socket "))
        .filter_map(|n| {
            let row = ctx
                .catalog
                .as_ref()
                .and_then(|c| c.find(false, &n.message, None, &ctx.versions));
            let class = row
                .and_then(Message::class)
                .or_else(|| class_by_words(INFO_CLASSES, &n.message))?;
            let mut f = Finding::warn(class.id, format!("NCCL INFO: {}", class.cause), class.fix);
            f.evidence = vec![format!(
                "{} [{}]",
                n.evidence_line(),
                source_of(row, ctx.catalog.as_ref())
            )];
            Some(Draft {
                first_line: n.first_line,
                lines: n.count,
                class: class.id,
                finding: f,
            })
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
            lines: s.job.watchdog_hangs, class: "log-watchdog-hang",
            finding: Finding::fail(
                "log-watchdog-hang",
                "PyTorch's heartbeat monitor ended the process: its NCCL watchdog thread itself hung (stuck in an NCCL or CUDA call, often aborting a communicator after a hung collective)",
                format!("{FIND_THE_RANK} TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC gives the watchdog longer, but a watchdog stuck at teardown is usually the hung collective's consequence."),
            )
            .evidence(format!("line {line}: ... due to ProcessGroupNCCL watchdog hang ({} lines)", s.job.watchdog_hangs)),
        });
    }
    out
}

fn timeout_draft(s: &LogSummary, t: &CollectiveTimeout) -> Draft {
    let op = t.op.as_deref().unwrap_or("a collective");
    let ranks = t
        .ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let total = s.communicators.values().filter_map(|c| c.ranks_total).max();
    let missing = total
        .filter(|&n| n <= 64)
        .map(|n| {
            (0..n)
                .filter(|r| !t.ranks.contains(r))
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
        })
        .filter(|m| !m.is_empty())
        .map(|m| format!("; ranks that reported no timeout: {}", m.join(", ")))
        .unwrap_or_default();
    let summary = format!(
        "PyTorch's watchdog timed out {op}{}{} on rank(s) {}: they waited for a rank that never reached it (it crashed, hung, or called another collective){missing}. WARNs after this line are the teardown, not the cause",
        t.seq.map(|n| format!(" (SeqNum {n})")).unwrap_or_default(),
        t.timeout_ms
            .map(|ms| format!(" after {} s", ms / 1000))
            .unwrap_or_default(),
        if ranks.is_empty() {
            "?".to_string()
        } else {
            ranks
        },
    );
    Draft {
        first_line: t.first_line,
        lines: t.count,
        class: "log-collective-timeout",
        finding: Finding::fail("log-collective-timeout", summary, FIND_THE_RANK).evidence(format!(
            "line {}: Watchdog caught collective operation timeout ({} lines)",
            t.first_line, t.count
        )),
    }
}

/// Folds what follows a cause into its evidence: WARNs after a collective
/// timeout are its teardown; proxy, socket and peer errors after a failing
/// WARN of another class are that WARN's consequences.
fn fold_consequences(mut drafts: Vec<Draft>, timeouts: Vec<Draft>) -> Vec<Draft> {
    drafts.sort_by_key(|d| d.first_line);
    let mut out: Vec<Draft> = timeouts;
    let first_timeout = out.iter().map(|d| d.first_line).min();
    // The root: the first failure that is no consequence; else a peer that went
    // away, which the proxy's and sockets' errors follow.
    let root = drafts
        .iter()
        .position(|d| d.finding.status() == Status::Fail && !CONSEQUENCES.contains(&d.class))
        .or_else(|| {
            drafts
                .iter()
                .position(|d| d.finding.status() == Status::Fail && d.class == "log-remote-peer")
        });
    let root_class = root.map(|i| drafts[i].class);
    for d in drafts {
        let after_timeout = first_timeout.is_some_and(|t| d.first_line > t);
        let consequence =
            root_class.is_some_and(|r| r != d.class) && CONSEQUENCES.contains(&d.class);
        let target = if after_timeout {
            out.iter_mut()
                .find(|o| o.class == "log-collective-timeout" || o.class == "log-watchdog-hang")
        } else if consequence {
            out.iter_mut().find(|o| Some(o.class) == root_class)
        } else {
            None
        };
        match target {
            Some(t) => t.finding.evidence.extend(
                d.finding
                    .evidence
                    .into_iter()
                    .map(|e| format!("then ({}): {e}", d.class)),
            ),
            None => out.push(d),
        }
    }
    out
}

/// torchrun's failures: a finding of their own only when nothing else in the
/// log explains them; else evidence of the cause.
fn launcher_findings(s: &LogSummary, drafts: &[Draft]) -> Vec<Draft> {
    let lines: Vec<String> = s
        .job
        .launcher_failures
        .iter()
        .map(|f| {
            format!(
                "line {}: torchrun: {} exited{}{}",
                f.line,
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
        .collect();
    if lines.is_empty() || drafts.iter().any(|d| d.finding.status() == Status::Fail) {
        return Vec::new();
    }
    let signal = s
        .job
        .launcher_failures
        .iter()
        .any(|f| f.exitcode.as_deref().is_some_and(|c| c.starts_with("-6")));
    let mut f = Finding::fail(
        "log-launcher-failure",
        format!(
            "torchrun's agent saw a rank fail{} and ended the others: the cause is in that rank's own output, which this log does not show",
            if signal {
                " with SIGABRT (exit -6: PyTorch's watchdog or NCCL aborts this way)"
            } else {
                ""
            }
        ),
        "Read the failed rank's own output from before the agent's lines (torchrun --tee 3 --log-dir DIR keeps every \
         rank's output): its first NCCL, CUDA or watchdog error is the cause; run explain-log on it.",
    );
    f.evidence = lines;
    vec![Draft {
        first_line: 0,
        lines: 1,
        class: "log-launcher-failure",
        finding: f,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<(String, Status)> {
        let s = crate::explain::summarize(text.as_bytes()).unwrap();
        crate::explain::rules::diagnose(&s)
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
    }

    #[test]
    fn a_completion_error_fails_names_its_status_and_folds_the_proxy() {
        let f = crate::explain::rules::diagnose(
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
            f[0].summary.contains("transport retry counter exceeded"),
            "{}",
            f[0].summary
        );
        assert!(f[0].summary.contains("10.1.2.3"));
        assert!(
            f[0].evidence
                .iter()
                .any(|e| e.contains("src/transport/net_ib.cc")),
            "{:?}",
            f[0].evidence
        );
        assert!(
            f[0].evidence
                .iter()
                .any(|e| e.starts_with("then (log-proxy)")),
            "{:?}",
            f[0].evidence
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

    #[test]
    fn unknown_warns_never_ask_an_info_log_for_info() {
        let s = crate::explain::summarize(
            "h:1:1 [0] NCCL INFO NCCL version 2.28.9\nh:1:1 [0] x.cc:1 NCCL WARN brand new problem\n".as_bytes(),
        )
        .unwrap();
        let f = crate::explain::rules::diagnose(&s);
        assert_eq!(f[0].id, "log-nccl-warn");
        assert!(!f[0].remediation().unwrap().contains("NCCL_DEBUG=INFO"));
        assert!(
            f[0].evidence[0].contains("not in NCCL's source"),
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
}
