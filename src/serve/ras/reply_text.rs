//! The text STATUS reply of NCCL 2.24 to 2.28.6 (and of any version not asked for JSON),
//! parsed line by line into the same model as the JSON. The lines are the
//! `rasOutAppend` formats of NVIDIA/nccl src/ras/client_support.cc (rasClientRunComms,
//! rasClientBreakDownErrors) at v2.24.3-1 and v2.28.9-1; the samples are ras.rst's.
//! Only what the judgement needs is read: the version, the summary table's status, the
//! `DEAD` and `INCOMPLETE` processes, and per communicator its missing ranks, count
//! groups, status groups and errors. Anything else is skipped, never an error.

use super::reply::{Comm, CountGroup, JobStatus, Malformed, Member, Missing, safe};

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
    Errors,
}

struct Parser {
    status: JobStatus,
    block: Block,
    context: Context,
    op: String,
}

/// A text reply. An empty or versionless reply is malformed (NCCL always starts with
/// `NCCL version`).
pub fn parse_text(text: &str) -> Result<JobStatus, Malformed> {
    let mut p = Parser {
        status: JobStatus {
            format: "text",
            ..JobStatus::default()
        },
        block: Block::None,
        context: Context::None,
        op: "collective".into(),
    };
    for line in text.lines() {
        p.line(line);
    }
    if p.status.version.is_none() {
        return Err(Malformed(
            "RAS text reply: no \"NCCL version\" line (cut short, or not RAS)".into(),
        ));
    }
    // Every reply ends with the Warnings section, sent after the rest
    // (client_support.cc rasClientRunComms): without it the reply was cut short.
    if !text.contains("\nWarnings\n========") {
        return Err(Malformed(
            "RAS text reply: cut short (no Warnings section)".into(),
        ));
    }
    p.status.initializing |= p.status.comms.iter().any(|c| c.initializing);
    Ok(p.status)
}

impl Parser {
    fn comm(&mut self) -> Option<&mut Comm> {
        match self.block {
            Block::Comm => self.status.comms.last_mut(),
            _ => None,
        }
    }

    fn line(&mut self, line: &str) {
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
                    self.context = Context::None;
                    return;
                }
                None => "collective".into(),
            };
        } else if body.contains(" error") && body.contains(" on ") && !body.starts_with("Rank") {
            self.context = Context::Errors;
        } else if let Some(list) = body
            .strip_prefix("The missing ranks: ")
            .or(body.strip_prefix("The missing rank: "))
        {
            self.missing_list(list);
        } else if body.ends_with("have status INIT") || body.contains(" has status INIT") {
            if let Some(c) = self.comm() {
                c.initializing = true;
            }
        } else if let Some((n, count)) = count_group(body) {
            let op = self.op.clone();
            if let Some(c) = self.comm() {
                c.mismatch.push(CountGroup {
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
        let (context, op) = (self.context, self.op.clone());
        let Some(c) = self.comm() else { return };
        match context {
            Context::Missing => c.missing.push(Missing {
                member,
                unresponsive: true,
                dead: false,
            }),
            Context::Counts => {
                let single = head
                    .split_once("launched up to operation ")
                    .and_then(|(_, n)| n.trim().parse().ok())
                    .or(head.contains("not launched any").then_some(0));
                match single {
                    Some(count) => c.mismatch.push(CountGroup {
                        op,
                        count,
                        ranks: 1,
                        members: vec![member],
                    }),
                    None => {
                        if let Some(g) = c.mismatch.last_mut() {
                            g.members.push(member);
                        }
                    }
                }
            }
            Context::Errors => {
                let what = head.split_once(" reported ").map(|(_, w)| w);
                c.errors.push(format!(
                    "{member}: {}",
                    safe(what.unwrap_or("reported an error"))
                ));
            }
            Context::None => {}
        }
    }
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
        let groups: Vec<(&str, u64, u32, usize)> = c
            .mismatch
            .iter()
            .map(|g| (g.op.as_str(), g.count, g.ranks, g.members.len()))
            .collect();
        assert_eq!(
            groups,
            vec![("AllReduce", 6650, 30, 0), ("AllReduce", 6649, 2, 2)]
        );
        assert_eq!(
            c.mismatch[1].members[1].to_string(),
            "rank 7 (pid 483079 on 172.16.64.210, GPU 7)"
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
        let text = "NCCL version 2.26.2 compiled with CUDA 12.8\n\nGroup     Comms\n    0         1         4         1         4         4      INIT      OK\n\nErrors\n======\n\n#0-0 (00000000000000ab) ERROR\n  Asynchronous errors on 1 rank\n  Rank 3 reported remote process exited or there was a network error -- GPU 3 managed by process 11 on node n1\n\nWarnings\n========\n\n";
        let s = parse_text(text).unwrap();
        assert!(s.initializing);
        assert_eq!(
            s.comms[0].errors,
            vec![
                "rank 3 (pid 11 on n1, GPU 3): remote process exited or there was a network error"
            ]
        );
        assert!(parse_text("").is_err());
        // Cut before the Warnings section that closes every reply.
        let cut = &HEALTHY[..HEALTHY.find("Warnings").unwrap()];
        assert!(parse_text(cut).unwrap_err().0.contains("cut short"));
        assert!(parse_text("Job summary\n").is_err());
    }
}
