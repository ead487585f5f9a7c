//! The README is a guide and the reference lives in docs/: every link between them
//! resolves to a file and a heading, no table cell outgrows a table, and the README
//! still opens with the two commands CI runs (.ci/run runs the test one).

use super::support::repo;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// docs/ files other parts of the project add (failure policy, deployment per platform,
/// performance, RAS watch, NCCL prediction): a link to one is checked once it exists.
const EXPECTED_LATER: &[&str] = &[
    "docs/kubernetes.md",
    "docs/failure-policy.md",
    "docs/performance.md",
    "docs/job-watch.md",
    "docs/nccl-prediction.md",
];

/// The longest table cell the documents may have: longer text is prose under a heading.
const MAX_CELL: usize = 300;

fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "SECURITY.md"]
        .iter()
        .map(|f| repo().join(f))
        .filter(|p| p.exists())
        .collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

/// The document's lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_`
/// dropped, spaces made hyphens; a repeated one gets `-1`, `-2`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(text) {
        let Some(title) = line.strip_prefix('#').map(|t| t.trim_start_matches('#')) else {
            continue;
        };
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// Every `[text](target)` of the document's prose, code spans left out.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        // Code spans (`[x](y)` inside backticks) are not links.
        let outside: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = outside.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap().display().to_string()
}

#[test]
fn every_link_resolves_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            let Ok(target) = target.canonicalize() else {
                let named = repo().join(file);
                let wanted = doc.parent().unwrap().join(file);
                let later = EXPECTED_LATER
                    .iter()
                    .any(|f| repo().join(f) == wanted || named.ends_with(f));
                if !later {
                    broken.push(format!("{}: {link}: no such file", relative(&doc)));
                }
                continue;
            };
            checked += 1;
            if anchor.is_empty() {
                continue;
            }
            let headings = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
            if !headings.contains(anchor) {
                broken.push(format!("{}: {link}: no heading #{anchor}", relative(&doc)));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    assert!(checked > 40, "{checked}");
}

#[test]
fn no_table_cell_is_longer_than_a_table_holds() {
    let mut long = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| l.starts_with('|')) {
            // `\|` is a pipe inside a cell.
            for cell in line.replace("\\|", "").split('|') {
                if cell.chars().count() > MAX_CELL {
                    long.push(format!(
                        "{}:{}: {}",
                        relative(&doc),
                        n + 1,
                        cell.chars().count()
                    ));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "cells over {MAX_CELL} characters:\n{}",
        long.join("\n")
    );
}

/// The README opens with the two commands (check this machine; set up and run the
/// tests), and CI runs the second.
#[test]
fn the_readme_opens_with_the_two_commands() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let first_block: Vec<&str> = readme
        .split("```")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        first_block[0].starts_with("scripts/dev.sh check "),
        "{first_block:?}"
    );
    assert!(
        first_block[1].starts_with("scripts/dev.sh test "),
        "{first_block:?}"
    );
    assert!(readme.find("```").unwrap() < 100);
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l == "scripts/dev.sh test"), "{ci}");
}

#[test]
fn anchors_follow_github() {
    let got = anchors(
        "# A `b` c\n## What NCCL will do\n## What NCCL will do\n### `NCCL_PROTO` on EFA\n```\n# not a heading\n```\n",
    );
    let want: BTreeSet<String> = [
        "a-b-c",
        "what-nccl-will-do",
        "what-nccl-will-do-1",
        "nccl_proto-on-efa",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(got, want);
}
