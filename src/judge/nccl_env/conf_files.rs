//! NCCL's settings files as the loaded NCCL reads them (`crate::nccl::conf_file`):
//! lines it reads differently from what their author meant (blanks around the name,
//! quotes, a comment after the value, a Windows line end before 2.30, a repeated name,
//! over-long fields), and NCCL_CONF_FILE that this NCCL does not read, that names no
//! file, or that a file sets (too late: NCCL picks its file from the environment).

use super::Problem;
use crate::facts::{Facts, Observed};
use crate::finding::Outcome;
use crate::nccl::Version;
use crate::nccl::conf_file::{self, Homes, Misread};

pub(super) fn lint_conf_files(facts: &Facts) -> Vec<Problem> {
    let files = &facts.nccl_files;
    let version = crate::nccl::version(facts);
    let rules = conf_file::rules(version);
    let mut out = lint_conf_file_var(facts, rules, version);
    let conf_var = facts
        .nccl_env
        .get("NCCL_CONF_FILE")
        .filter(|v| v.from.is_none() && !v.value.is_empty());
    // The path gather resolved for NCCL_CONF_FILE is the first file it read.
    let conf_path = conf_var.and_then(|_| files.conf.first().map(|f| f.path.as_str()));
    let homes = Homes {
        env: files.home.as_deref(),
        passwd: files.passwd_home.as_deref(),
    };
    for path in conf_file::files_read(conf_path, &homes, rules) {
        let Some(text) = files
            .conf
            .iter()
            .find(|f| f.path == path)
            .and_then(|f| f.text.value())
            .and_then(|t| t.as_deref())
        else {
            continue;
        };
        for pair in conf_file::parse(text, rules) {
            for m in &pair.misread {
                out.push(misread(&path, &pair, m, version));
            }
        }
    }
    out
}

fn misread(path: &str, pair: &conf_file::Pair, m: &Misread, version: Option<Version>) -> Problem {
    let at = format!("{path} line {}", pair.line);
    let (name, value) = (&pair.name, &pair.value);
    let (summary, fix) = match m {
        Misread::Name { meant } => (
            format!(
                "{at} sets a variable named {name:?}, which nothing reads: NCCL splits the line at '=' and keeps the blanks, so {meant} is not set by it"
            ),
            format!("Write the line as {meant}=value: no blanks around the name, no `export`."),
        ),
        Misread::Quoted => (
            format!("{at}: NCCL keeps the quotes, {name}={value:?} reads as the value {value}"),
            format!(
                "Remove the quotes: {name}={}",
                value.trim().trim_matches(['"', '\''])
            ),
        ),
        Misread::TrailingComment => (
            format!(
                "{at}: the comment after the value is part of it, NCCL reads {name} as {value:?}"
            ),
            "Put comments on a line of their own that starts with #.".to_string(),
        ),
        Misread::CarriageReturn => (
            format!(
                "{at} ends in a carriage return (a Windows line end), which NCCL {} keeps in {name}'s value (2.30 and later cut it)",
                version.map_or_else(|| "before 2.30".to_string(), |v| v.to_string())
            ),
            format!("Convert the file to Unix line ends (dos2unix {path})."),
        ),
        Misread::Truncated => (
            format!("{at}: NCCL keeps only the first 1023 bytes of {name}'s name or value"),
            format!("Shorten {name}'s value to at most 1023 bytes."),
        ),
        Misread::Repeated { first } => (
            format!(
                "{at} sets {name} again: NCCL keeps line {first}'s value, the first one a file gives"
            ),
            format!("Keep one {name} line in {path}."),
        ),
    };
    Problem::predicts(
        Outcome::undetermined(format!("what NCCL does with {name} as it reads it")),
        summary,
        fix,
    )
}

/// NCCL_CONF_FILE: read from the environment only (src/misc/param.cc initEnvFunc, from
/// v2.23.4-1), and a file it cannot open is skipped without a word (setEnvFile returns
/// when fopen fails), ~/.nccl.conf not read in its place.
fn lint_conf_file_var(
    facts: &Facts,
    rules: conf_file::Rules,
    version: Option<Version>,
) -> Vec<Problem> {
    let Some(v) = facts.nccl_env.get("NCCL_CONF_FILE") else {
        return Vec::new();
    };
    if let Some(from) = &v.from {
        return vec![Problem::predicts(
            Outcome::undetermined(
                "what NCCL does without the settings of the file NCCL_CONF_FILE names",
            ),
            format!(
                "NCCL_CONF_FILE is set in {from}, too late: NCCL chooses its settings file from the environment before it reads any file"
            ),
            "Set NCCL_CONF_FILE in the trainer's environment (the pod spec's env), not in a settings file.",
        )];
    }
    if v.value.is_empty() {
        return Vec::new();
    }
    if !rules.conf_file_var {
        let shown = version.map_or_else(String::new, |v| v.to_string());
        return vec![Problem::predicts(
            Outcome::undetermined(
                "what NCCL does without the settings of the file NCCL_CONF_FILE names",
            ),
            format!(
                "NCCL {shown} does not read NCCL_CONF_FILE (2.23 and later do): the settings in {:?} are not applied",
                v.value
            ),
            "Put the settings in the environment or in ~/.nccl.conf of the trainer's user, or use NCCL 2.23 or later.",
        )];
    }
    let Some(file) = facts.nccl_files.conf.first() else {
        return Vec::new();
    };
    let why = match &file.text {
        Observed::Value(None) => "names no file in this container".to_string(),
        Observed::Error(e) => format!("could not be read ({})", e.message),
        Observed::Value(Some(_)) => return Vec::new(),
    };
    vec![Problem::predicts(
        Outcome::undetermined(
            "what NCCL does without the settings of the file NCCL_CONF_FILE names",
        ),
        format!(
            "NCCL_CONF_FILE={:?} {why}: NCCL skips it without a word, and does not read ~/.nccl.conf in its place",
            v.value
        ),
        "Point NCCL_CONF_FILE at a file the training container has (a mounted ConfigMap or the shared volume init wrote it to), or unset it.",
    )]
}
