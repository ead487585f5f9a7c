//! The text STATUS reply of NCCL 2.24 to 2.28.6 (and of any version not asked for JSON),
//! parsed line by line into the same model as the JSON. The lines are the
//! `rasOutAppend` formats of NVIDIA/nccl src/ras/client_support.cc (rasClientRunComms,
//! rasClientBreakDownErrors) at v2.24.3-1 and v2.28.9-1; the samples are ras.rst's.
//! Only what the judgement needs is read: the version, the summary table's status, the
//! `DEAD` and `INCOMPLETE` processes, and per communicator its missing ranks, count
//! groups, status groups and errors. Anything else is skipped, never an error. The text
//! names only the outliers of each operation's counts (rasCountIsOutlier): the ranks'
//! count vectors are put back together from those per-operation groups (`regroup`).

use super::reply::{
    Comm, Group, JobStatus, Malformed, Member, Missing, RankError, push_capped, safe,
};
use std::collections::BTreeMap;
use std::io::BufRead;

/// Ranks of one communicator that launched the same number of one operation, as the
/// text lists them (`26 ranks have launched up to operation 6650`, then the outliers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct OpGroup {
    op: String,
    count: u64,
    ranks: u32,
    members: Vec<Member>,
}

/// Which block of the Errors/Warnings sections the lines belong to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    None,
    Dead,
    Unreachable,
    Comm,
}

/// Where an indented `Rank ...` line goes inside a communicator's block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    None,
    Missing,
    Counts,
    /// `Communicator ranks have different status`, with the status of the group named.
    Status,
    Errors,
}

struct Parser {
    status: JobStatus,
    block: Block,
    context: Context,
    op: String,
    /// The status of the `N ranks have status X` group being listed.
    status_of_group: String,
    /// Per communicator (by hash), its per-operation groups.
    op_groups: BTreeMap<String, Vec<OpGroup>>,
    /// The previous line was `Warnings` (the next, `========`, proves the section).
    warnings_title: bool,
    warnings: bool,
}

/// The longest line the text reader takes: NCCL's lines are a few dozen bytes.
const MAX_TEXT_LINE: u64 = 64 * 1024;

/// A text reply held in memory (tests, recorded replies).
#[cfg(test)]
pub fn parse_text(text: &str) -> Result<JobStatus, Malformed> {
    parse_text_from(text.as_bytes())
}

/// A text reply, parsed line by line as it streams. An empty or versionless reply is
/// malformed (NCCL always starts with `NCCL version`), and so is one without the
/// Warnings section, sent after the rest (client_support.cc rasClientRunComms).
pub fn parse_text_from(mut reader: impl BufRead) -> Result<JobStatus, Malformed> {
    let mut p = Parser {
        status: JobStatus {
            format: "text",
            ..JobStatus::default()
        },
        block: Block::None,
        context: Context::None,
        op: "collective".into(),
        status_of_group: String::new(),
        op_groups: BTreeMap::new(),
        warnings_title: false,
        warnings: false,
    };
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let n = std::io::Read::take(&mut reader, MAX_TEXT_LINE + 1)
            .read_until(b'\n', &mut raw)
            .map_err(|e| Malformed(e.to_string()))?;
        if n == 0 {
            break;
        }
        if n as u64 > MAX_TEXT_LINE {
            return Err(Malformed("RAS text reply: a line over 64 KiB".into()));
        }
        let line = String::from_utf8_lossy(&raw);
        p.line(line.trim_end_matches(['\n', '\r']));
    }
    if p.status.version.is_none() {
        return Err(Malformed(
            "RAS text reply: no \"NCCL version\" line (cut short, or not RAS)".into(),
        ));
    }
    if !p.warnings {
        return Err(Malformed(
            "RAS text reply: cut short (no Warnings section)".into(),
        ));
    }
    for c in &mut p.status.comms {
        if let Some(groups) = p.op_groups.remove(&c.hash) {
            regroup(c, groups);
        }
    }
    p.status.initializing |= p.status.comms.iter().any(|c| c.initializing);
    Ok(p.status)
}

/// The ranks' count vectors from the per-operation groups: every rank RAS named gets
/// its named count for each operation and the most common count elsewhere; the ranks it
/// did not name are the most common counts of every operation, less the groups it left
/// unnamed (counted, each with its own count on its operation).
fn regroup(c: &mut Comm, op_groups: Vec<OpGroup>) {
    for g in &op_groups {
        if !c.ops.contains(&g.op) {
            c.ops.push(g.op.clone());
        }
    }
    let op_index = |op: &str| c.ops.iter().position(|o| o == op).unwrap_or(0);
    // Per operation: its most common count (listed first: most frequent first) and size.
    let mut common = vec![0u64; c.ops.len()];
    let mut total = 0u32;
    for (i, op) in c.ops.iter().enumerate() {
        let of_op = op_groups.iter().filter(|g| &g.op == op);
        if let Some(first) = of_op.clone().max_by_key(|g| g.ranks) {
            common[i] = first.count;
        }
        total = total.max(of_op.map(|g| g.ranks).sum());
    }
    let mut named: BTreeMap<Option<u32>, (Member, Vec<u64>)> = BTreeMap::new();
    let mut anonymous = Vec::new();
    for g in &op_groups {
        let i = op_index(&g.op);
        if g.members.is_empty() && g.count != common[i] {
            let mut counts = common.clone();
            counts[i] = g.count;
            anonymous.push(Group {
                counts,
                ranks: g.ranks,
                members: Vec::new(),
            });
        }
        for m in &g.members {
            let entry = named
                .entry(m.rank)
                .or_insert_with(|| (m.clone(), common.clone()));
            entry.1[i] = g.count;
        }
    }
    let unnamed: u32 = anonymous.iter().map(|g| g.ranks).sum();
    let mut groups = vec![Group {
        counts: common.clone(),
        ranks: total.saturating_sub(named.len() as u32 + unnamed),
        members: Vec::new(),
    }];
    groups.extend(anonymous);
    for (_, (member, counts)) in named {
        match groups.iter_mut().find(|g| g.counts == counts) {
            Some(g) => {
                g.ranks += 1;
                g.members.push(member);
            }
            None => groups.push(Group {
                counts,
                ranks: 1,
                members: vec![member],
            }),
        }
    }
    groups.retain(|g| g.ranks > 0);
    c.groups = groups;
}

impl Parser {
    fn comm(&mut self) -> Option<&mut Comm> {
        match self.block {
            Block::Comm => self.status.comms.last_mut(),
            _ => None,
        }
    }

    fn line(&mut self, line: &str) {
        self.warnings |= self.warnings_title && line.starts_with("========");
        self.warnings_title = line == "Warnings";
        if let Some(v) = line.strip_prefix("NCCL version ") {
            let v = v.split_whitespace().next().unwrap_or_default();
            self.status.version = Some(safe(v));
            return;
        }
        // ` Warning: encountered N communication timeouts` (while gathering) and the
        // TIMEOUT block's `  Encountered N communication timeouts` say the same.
        let trimmed = line.trim();
        if let Some(rest) = trimmed
            .strip_prefix("Warning: encountered ")
            .or(trimmed.strip_prefix("Encountered "))
        {
            let n = leading_number(rest).unwrap_or(0);
            self.status.timeouts = self.status.timeouts.max(n);
        }
        if !line.starts_with(' ') {
            self.header(line);
            return;
        }
        let body = line.trim();
        match self.block {
            Block::Dead | Block::Unreachable => {
                if let Some(m) = process_of(body) {
                    match self.block {
                        Block::Dead => self.status.dead.push(m),
                        _ => self.status.unreachable.push(m),
                    }
                }
            }
            Block::Comm => self.comm_line(body),
            Block::None => self.summary_row(body),
        }
    }

    /// An unindented line: a block header, a section title, or the summary table.
    fn header(&mut self, line: &str) {
        self.context = Context::None;
        self.status_of_group.clear();
        let word = line.split_whitespace().next().unwrap_or_default();
        self.block = match word {
            "DEAD" => Block::Dead,
            "INCOMPLETE" => Block::Unreachable,
            w if w.starts_with('#') => {
                let hash = line
                    .split_once('(')
                    .and_then(|(_, r)| r.split_once(')'))
                    .map(|(h, _)| h)
                    .unwrap_or_default();
                let hash = super::reply::comm_hash_of(hash);
                if !self.status.comms.iter().any(|c| c.hash == hash) {
                    self.status.comms.push(Comm {
                        hash: hash.clone(),
                        ..Comm::default()
                    });
                }
                // Blocks of one communicator (INCOMPLETE, then MISMATCH) share its entry.
                let at = self.status.comms.iter().position(|c| c.hash == hash);
                if let Some(at) = at {
                    let c = self.status.comms.remove(at);
                    self.status.comms.push(c);
                }
                Block::Comm
            }
            _ => Block::None,
        };
        if self.block == Block::None {
            self.summary_row(line);
        }
    }

    /// `    0         1         1         2         2         2   RUNNING      OK`
    fn summary_row(&mut self, line: &str) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // Group, Comms in group, Nodes per comm, Ranks per node (`7-8` when it varies),
        // Ranks per comm, Ranks in group, Status, Errors.
        let number = |i: usize| cols.get(i).and_then(|c| c.parse::<u64>().ok());
        if let (8, Some(_), Some(comms), Some(ranks)) =
            (cols.len(), number(0), number(1), number(5))
        {
            self.status.initializing |= cols[6] == "INIT";
            self.status.communicators += comms;
            self.status.ranks_in_table = self.status.ranks_in_table.max(ranks);
        }
    }

    fn comm_line(&mut self, body: &str) {
        if body.starts_with("Missing communicator data from") {
            self.context = Context::Missing;
        } else if let Some(rest) = body.strip_prefix("Communicator ranks have different ") {
            self.context = Context::Counts;
            self.op = match rest.strip_suffix(" operation counts") {
                Some(op) => safe(op),
                None if rest == "status" => {
                    self.context = Context::Status;
                    return;
                }
                None => "collective".into(),
            };
        } else if body.contains(" error") && body.contains(" on ") && !body.starts_with("Rank") {
            self.context = Context::Errors;
            self.status_of_group.clear();
        } else if let Some(list) = body
            .strip_prefix("The missing ranks: ")
            .or(body.strip_prefix("The missing rank: "))
        {
            self.missing_list(list);
        } else if let Some((_, what)) = body.split_once(" ranks reported ") {
            self.status_of_group = what.trim().to_string();
        } else if let Some((_, status)) = body.split_once(" ranks have status ") {
            self.status_of_group = status.trim().to_string();
            if status.trim() == "INIT"
                && let Some(c) = self.comm()
            {
                c.initializing = true;
            }
        } else if let Some((n, count)) = count_group(body) {
            let (op, hash) = (self.op.clone(), self.comm().map(|c| c.hash.clone()));
            if let Some(hash) = hash {
                self.op_groups.entry(hash).or_default().push(OpGroup {
                    op,
                    count,
                    ranks: n,
                    members: Vec::new(),
                });
            }
        } else if body.starts_with("Rank ") {
            self.rank_line(body);
        }
    }

    fn missing_list(&mut self, list: &str) {
        let ranks: Vec<u32> = list
            .split(',')
            .filter_map(|r| r.trim().parse().ok())
            .collect();
        if let Some(c) = self.comm() {
            for rank in ranks {
                c.missing.push(Missing {
                    member: Member {
                        rank: Some(rank),
                        ..Member::default()
                    },
                    unresponsive: true,
                    dead: false,
                });
            }
        }
    }

    /// `Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213`, and the
    /// `Rank R has launched up to operation N -- ...` / `Rank R reported X -- ...` forms.
    fn rank_line(&mut self, body: &str) {
        let (head, tail) = body.split_once(" -- ").unwrap_or((body, ""));
        let rank = head
            .strip_prefix("Rank ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|r| r.parse().ok());
        let member = Member {
            rank,
            ..rank_process(tail)
        };
        let context = self.context;
        if context == Context::Counts {
            return self.count_line(head, member);
        }
        // `Rank R has status FINALIZE -- ...` / `Rank R reported System error -- ...`, or a
        // line of an `N ranks have status X` / `N ranks reported X` group.
        let status = head
            .split_once(" has status ")
            .or(head.split_once(" reported "))
            .map(|(_, s)| s.trim().to_string())
            .unwrap_or_else(|| self.status_of_group.clone());
        let Some(c) = self.comm() else { return };
        match context {
            Context::Missing => c.missing.push(Missing {
                member,
                unresponsive: true,
                dead: false,
            }),
            Context::Status => match status.as_str() {
                "FINALIZE" => push_capped(&mut c.finalized, &mut c.finalized_more, member),
                "INIT" => c.initializing = true,
                "ABORT" => push_capped(
                    &mut c.errors,
                    &mut c.errors_more,
                    RankError {
                        what: "communicator aborted".into(),
                        member,
                        code: 0,
                    },
                ),
                _ => {}
            },
            Context::Errors => {
                let what = if status.is_empty() {
                    "an error"
                } else {
                    &status
                };
                push_capped(
                    &mut c.errors,
                    &mut c.errors_more,
                    RankError {
                        code: result_code(what),
                        what: safe(what),
                        member,
                    },
                );
            }
            Context::Counts | Context::None => {}
        }
    }

    /// A rank line under `Communicator ranks have different X operation counts`: a
    /// group of one (`Rank R has launched up to operation N -- ...`) or a member of the
    /// group whose count line came before.
    fn count_line(&mut self, head: &str, member: Member) {
        let single = head
            .split_once("launched up to operation ")
            .and_then(|(_, n)| n.trim().parse().ok())
            .or(head.contains("not launched any").then_some(0));
        let op = self.op.clone();
        let Some(hash) = self.comm().map(|c| c.hash.clone()) else {
            return;
        };
        let groups = self.op_groups.entry(hash).or_default();
        match single {
            Some(count) => groups.push(OpGroup {
                op,
                count,
                ranks: 1,
                members: vec![member],
            }),
            None => {
                if let Some(g) = groups.last_mut() {
                    g.members.push(member);
                }
            }
        }
    }
}

/// The ncclResult_t of an error line's text, as rasClientBreakDownErrors prints it
/// through ncclErrorToString (client_support.cc, v2.24.3-1 to v2.30.7-1).
fn result_code(text: &str) -> i64 {
    let t = text.to_ascii_lowercase();
    [
        ("unhandled cuda error", 1),
        ("system error", 2),
        ("internal error", 3),
        ("invalid argument", 4),
        ("invalid usage", 5),
        ("remote process", 6),
        ("remote error", 6),
    ]
    .iter()
    .find(|(words, _)| t.contains(words))
    .map_or(0, |(_, code)| *code)
}

/// `26 ranks have launched up to operation 6650` / `6 ranks have not launched any operations`.
fn count_group(body: &str) -> Option<(u32, u64)> {
    let n: u32 = body.split_whitespace().next()?.parse().ok()?;
    let rest = body.split_once(' ')?.1;
    if let Some(count) = rest.strip_prefix("ranks have launched up to operation ") {
        return Some((n, count.trim().parse().ok()?));
    }
    rest.starts_with("ranks have not launched any")
        .then_some((n, 0))
}

fn leading_number(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The first number of a GPU list (`5`, `0,1`, `1 (NVML 3)`).
fn gpu_of(text: &str) -> Option<i64> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `GPU 5 managed by process 3487984 on node 172.16.64.213`.
fn rank_process(text: &str) -> Member {
    let gpu = text.strip_prefix("GPU ").and_then(gpu_of);
    let pid = text
        .split_once("managed by process ")
        .and_then(|(_, r)| leading_number(r))
        .and_then(|p| i64::try_from(p).ok());
    let host = text.split_once(" on node ").map(|(_, h)| safe(h.trim()));
    Member {
        rank: None,
        host,
        pid,
        gpu,
        pod: None,
    }
}

/// `Process 3487984 on node 172.16.64.213 managing GPU 5` (or `GPUs 0,1`).
pub(super) fn process_of(text: &str) -> Option<Member> {
    let rest = text.strip_prefix("Process ")?;
    let pid = leading_number(rest).and_then(|p| i64::try_from(p).ok());
    let (_, after) = rest.split_once(" on node ")?;
    let (host, gpus) = after.split_once(" managing GPU").unwrap_or((after, ""));
    let gpus = gpus.trim_start_matches('s').trim();
    Some(Member {
        rank: None,
        host: Some(safe(host.trim())),
        pid,
        gpu: gpu_of(gpus),
        pod: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEALTHY: &str = include_str!("../../../tests/data/ras/2.28.9/healthy.txt");
    const MISMATCH: &str = include_str!("../../../tests/data/ras/2.26/mismatch.txt");
    const DEAD: &str = include_str!("../../../tests/data/ras/2.26/dead.txt");

    #[test]
    fn a_healthy_text_reply_has_its_version_and_nothing_wrong() {
        let s = parse_text(HEALTHY).unwrap();
        assert_eq!((s.version.as_deref(), s.format), (Some("2.28.9"), "text"));
        assert!(s.comms.is_empty() && s.dead.is_empty() && !s.initializing);
        assert_eq!((s.communicators, s.ranks_in_table), (1, 2));
    }

    #[test]
    fn a_mismatch_names_the_groups_and_the_outlier_ranks() {
        let s = parse_text(MISMATCH).unwrap();
        assert_eq!(s.comms.len(), 1);
        let c = &s.comms[0];
        assert_eq!(c.hash, "0x27a079b828ff1a75");
        assert_eq!(c.ops, ["AllReduce"]);
        let groups: Vec<(u64, u32, usize)> = c
            .groups
            .iter()
            .map(|g| (g.count(0), g.ranks, g.members.len()))
            .collect();
        assert_eq!(groups, vec![(6650, 30, 0), (6649, 2, 2)]);
        assert_eq!(
            c.groups[1].members[1].to_string(),
            "rank 7 (pid 483079 on 172.16.64.210, GPU 7)"
        );
        assert_eq!(c.group_of(&c.groups[1].members[0]), Some(&c.groups[1]));
    }

    /// The per-operation outliers of a divergent job put back into count vectors:
    /// rank 1 is behind on AllReduce and ahead on AllGather (written from
    /// rasClientRunComms' MISMATCH lines at v2.30.7-1: a group of one rank is always an
    /// outlier, `Rank R has launched up to operation N -- ...`).
    #[test]
    fn two_operations_named_apart_make_two_vectors() {
        let text = "NCCL version 2.26.6 compiled with CUDA 12.8\n\nWarnings\n========\n\n#0-0 (00000000000000ab) MISMATCH\n  Communicator ranks have different AllGather operation counts\n  Rank 1 has launched up to operation 1 -- GPU 1 managed by process 12 on node n1\n  Rank 0 has not launched any operations -- GPU 0 managed by process 11 on node n1\n  Communicator ranks have different AllReduce operation counts\n  Rank 0 has launched up to operation 692 -- GPU 0 managed by process 11 on node n1\n  Rank 1 has launched up to operation 691 -- GPU 1 managed by process 12 on node n1\n";
        let c = &parse_text(text).unwrap().comms[0];
        assert_eq!(c.ops, ["AllGather", "AllReduce"]);
        let mut vectors: Vec<(Vec<u64>, Option<u32>)> = c
            .groups
            .iter()
            .map(|g| ((0..2).map(|i| g.count(i)).collect(), g.members[0].rank))
            .collect();
        vectors.sort();
        assert_eq!(
            vectors,
            vec![(vec![0, 692], Some(0)), (vec![1, 691], Some(1))]
        );
    }

    #[test]
    fn dead_and_missing_processes_are_named() {
        let s = parse_text(DEAD).unwrap();
        assert_eq!(s.dead.len(), 1);
        assert_eq!(
            s.dead[0].to_string(),
            "process pid 3487984 on 172.16.64.213, GPU 5"
        );
        let c = &s.comms[0];
        assert_eq!(c.hash, "0xcf264af53edbe986");
        assert_eq!(c.missing.len(), 1);
        assert_eq!(c.missing[0].member.rank, Some(21));
        assert_eq!(s.timeouts, 2);
    }

    #[test]
    fn init_and_async_errors_are_read() {
        let text = "NCCL version 2.26.2 compiled with CUDA 12.8\n\nGroup     Comms\n    0         1         4         1         4         4      INIT      OK\n\nErrors\n======\n\n#0-0 (00000000000000ab) ERROR\n  Asynchronous errors on 3 ranks\n  Rank 3 reported Remote process error -- GPU 3 managed by process 11 on node n1\n  2 ranks reported System error\n  Rank 4 -- GPU 4 managed by process 12 on node n1\n\nWarnings\n========\n\n";
        let s = parse_text(text).unwrap();
        assert!(s.initializing);
        let errors: Vec<(String, i64)> = s.comms[0]
            .errors
            .iter()
            .map(|e| (e.to_string(), e.code))
            .collect();
        assert_eq!(
            errors,
            vec![
                (
                    "rank 3 (pid 11 on n1, GPU 3): Remote process error".into(),
                    6
                ),
                ("rank 4 (pid 12 on n1, GPU 4): System error".into(), 2)
            ]
        );
        assert!(parse_text("").is_err());
        // Cut before the Warnings section that closes every reply.
        let cut = &HEALTHY[..HEALTHY.find("Warnings").unwrap()];
        assert!(parse_text(cut).unwrap_err().0.contains("cut short"));
        assert!(parse_text("Job summary\n").is_err());
    }
}
