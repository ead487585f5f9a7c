//! What each message means: `meanings.txt`, the one table of causes and fixes
//! (its header documents the format). A row of the message table names its
//! meaning (the generator matched it); a line in no row (a plugin's, a vendor
//! build's, a newer NCCL's, a framework's copy of NCCL's last error) is matched
//! here by its words, the same blocks in the same order. Parsed per run from
//! the embedded text.

use super::catalog::{Message, Severity};

const TABLE: &str = include_str!("meanings.txt");

/// Where a message stands in a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Can be the verdict.
    Cause,
    /// NCCL prints it after an earlier failure: context of the first cause.
    Echo,
    /// NCCL prints it on a healthy path: context, never a failure.
    Benign,
}

/// One block of meanings.txt.
#[derive(Debug, Clone)]
pub struct Meaning {
    pub id: String,
    /// `warn`, `info`, `any` or `code`.
    kind: String,
    pub finding: String,
    pub role: Role,
    pub remote: bool,
    pub severity: Option<Severity>,
    files: Vec<String>,
    words: Vec<String>,
    /// The decoder of the code the message carries (codes.tsv's kind).
    pub decode: Option<String>,
    /// Decoded code names, and the meaning that speaks for them.
    on: Vec<(Vec<String>, String)>,
    pub cause: String,
    pub fix: String,
    pub source: String,
}

fn alternatives(value: &str) -> Vec<String> {
    value
        .split('|')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

impl Meaning {
    fn new(id: &str) -> Meaning {
        Meaning {
            id: id.to_string(),
            kind: "warn".to_string(),
            finding: String::new(),
            role: Role::Cause,
            remote: false,
            severity: None,
            files: Vec::new(),
            words: Vec::new(),
            decode: None,
            on: Vec::new(),
            cause: String::new(),
            fix: String::new(),
            source: String::new(),
        }
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "kind" => self.kind = value.to_string(),
            "finding" => self.finding = value.to_string(),
            "role" => {
                self.role = match value {
                    "cause" => Role::Cause,
                    "echo" => Role::Echo,
                    "benign" => Role::Benign,
                    _ => return Err(format!("role {value:?} is not cause, echo or benign")),
                }
            }
            "remote" => self.remote = value == "yes",
            "severity" => {
                self.severity = Some(match value {
                    "abort" => Severity::Abort,
                    "continues" => Severity::Continues,
                    _ => return Err(format!("severity {value:?} is not abort or continues")),
                })
            }
            "files" => self.files = alternatives(value),
            "words" => self.words = alternatives(value),
            "decode" => self.decode = Some(value.to_string()),
            "cause" => self.cause = value.to_string(),
            // The fixes the checks give too (src/remediation.rs), by name.
            "fix" => {
                self.fix = match value {
                    "remediation::DEV_SHM" => crate::remediation::DEV_SHM.to_string(),
                    "remediation::MEMLOCK" => crate::remediation::MEMLOCK.to_string(),
                    v if v.starts_with("remediation::") => {
                        return Err(format!("no shared fix {v}"));
                    }
                    v => v.to_string(),
                }
            }
            "source" => self.source = value.to_string(),
            _ => match key.strip_prefix("on ") {
                Some(codes) => self.on.push((
                    codes.split_whitespace().map(String::from).collect(),
                    value.to_string(),
                )),
                None => return Err(format!("unknown key {key:?}")),
            },
        }
        Ok(())
    }

    fn kind_ok(&self, warn: bool) -> bool {
        match self.kind.as_str() {
            "any" => true,
            "warn" => warn,
            "info" => !warn,
            _ => false,
        }
    }

    /// True when this block matches a message of `kind` (`warn`, `info`) from
    /// `file` whose format (or printed text) is `text`: a WARN by its file or
    /// its words, an INFO line only by its words.
    fn covers(&self, warn: bool, file: Option<&str>, text: &str) -> bool {
        self.kind_ok(warn)
            && ((warn && file.is_some_and(|f| self.files.iter().any(|p| f.contains(p.as_str()))))
                || self.words.iter().any(|w| text.contains(w.as_str())))
    }

    /// True when a word of this block is in the printed text and not in the
    /// format that printed it: text the program filled in (strerror's
    /// `Connection reset by peer`, a plugin's name) that says more than the format.
    fn filled_in(&self, warn: bool, format: &str, text: &str) -> bool {
        self.kind_ok(warn)
            && self
                .words
                .iter()
                .any(|w| text.contains(w.as_str()) && !format.contains(w.as_str()))
    }

    /// The meaning that speaks for a decoded code (`ENOMEM`), if any.
    pub fn redirect(&self, code_names: &[&str]) -> Option<&str> {
        self.on
            .iter()
            .find(|(codes, _)| codes.iter().any(|c| code_names.contains(&c.as_str())))
            .map(|(_, id)| id.as_str())
    }
}

/// The meanings, in the file's order.
#[derive(Debug, Clone)]
pub struct Meanings {
    blocks: Vec<Meaning>,
}

impl Meanings {
    pub fn embedded() -> Result<Meanings, String> {
        Meanings::parse(TABLE)
    }

    pub fn parse(text: &str) -> Result<Meanings, String> {
        let mut blocks: Vec<Meaning> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |why: String| format!("src/explain/meanings.txt line {}: {why}", i + 1);
            if let Some(id) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                blocks.push(Meaning::new(id));
                continue;
            }
            let (Some((key, value)), Some(block)) = (line.split_once(':'), blocks.last_mut())
            else {
                return Err(err("expected `key: value` inside a [block]".to_string()));
            };
            block.set(key.trim(), value.trim()).map_err(err)?;
        }
        let meanings = Meanings { blocks };
        meanings.check()?;
        Ok(meanings)
    }

    /// Every block names a finding, a cause and a fix, and every `on` target exists.
    fn check(&self) -> Result<(), String> {
        for b in &self.blocks {
            if b.finding.is_empty() || b.cause.is_empty() || b.fix.is_empty() {
                return Err(format!("meaning [{}] lacks a finding, cause or fix", b.id));
            }
            for (_, target) in &b.on {
                if self.get(target).is_none() {
                    return Err(format!(
                        "meaning [{}] sends a code to unknown [{target}]",
                        b.id
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<&Meaning> {
        self.blocks.iter().find(|b| b.id == id)
    }

    /// The meaning of a message: its row's, or the block the printed text's
    /// words match when that one comes first (is more specific): strerror's
    /// `Connection reset by peer` is not in the format that printed it.
    pub fn of(&self, row: Option<&Message>, warn: bool, text: &str) -> Option<&Meaning> {
        let Some(row) = row else {
            return self.blocks.iter().find(|b| b.covers(warn, None, text));
        };
        let by_row = self.position(row.meaning);
        let filled = self
            .blocks
            .iter()
            .position(|b| b.filled_in(warn, &row.format, text));
        let at = match (by_row, filled) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        self.blocks.get(at)
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.blocks.iter().position(|b| b.id == id)
    }

    /// The first block that matches a message of this kind, file and text.
    #[cfg(test)]
    pub fn by_text(&self, warn: bool, file: Option<&str>, text: &str) -> Option<&Meaning> {
        self.blocks.iter().find(|b| b.covers(warn, file, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::catalog::Catalog;

    #[test]
    fn the_table_reads_and_every_code_target_exists() {
        let m = Meanings::embedded().unwrap();
        assert!(m.blocks.len() > 40, "{}", m.blocks.len());
        let qp = m.get("ib-modify-qp").unwrap();
        assert_eq!(qp.redirect(&["EINVAL"]), Some("ib-modify-qp-einval"));
        assert_eq!(qp.redirect(&["EPERM"]), None);
        assert!(Meanings::parse("[x]\nfinding: log-x\ncause: c\n").is_err());
        assert!(Meanings::parse("[x]\nfinding: log-x\ncause: c\nfix: f\non E: y\n").is_err());
        assert!(Meanings::parse("stray: line\n").is_err());
    }

    /// The generator (scripts/gen-nccl-messages.py) and this module match rows to
    /// meanings the same way: every row's meaning is the one its file and format
    /// give here, so a meaning added to meanings.txt reaches the table through
    /// `--remap` and lines in no row alike.
    #[test]
    fn every_row_has_the_meaning_its_words_give() {
        let meanings = Meanings::embedded().unwrap();
        let catalog = Catalog::embedded().unwrap();
        let stale: Vec<String> = catalog
            .rows()
            .filter(|r| r.severity != Severity::Call)
            .filter(|r| {
                let expect = meanings
                    .by_text(r.warn, Some(r.file), &r.format)
                    .map_or("-", |b| b.id.as_str());
                r.meaning != expect
            })
            .map(|r| format!("{} {}: {}", r.source(), r.meaning, r.format))
            .take(10)
            .collect();
        assert!(
            stale.is_empty(),
            "rows whose meaning is stale (run scripts/gen-nccl-messages.py --remap):\n{}",
            stale.join("\n")
        );
    }

    /// Issue 26, issue 38: every WARN the newest release prints has a meaning.
    #[test]
    fn every_warn_of_the_newest_release_has_a_meaning() {
        let catalog = Catalog::embedded().unwrap();
        let missing: Vec<String> = catalog
            .at(catalog.newest)
            .filter(|m| m.warn && m.meaning == "-")
            .map(|m| format!("{}: {}", m.source(), m.format))
            .collect();
        assert!(
            missing.is_empty(),
            "{} WARN(s) without a meaning:\n{}",
            missing.len(),
            missing.join("\n")
        );
    }
}
