//! The configuration file every mode reads (`--config FILE`, `NCCL_PREFLIGHT_CONFIG`):
//! in Kubernetes one ConfigMap, mounted into the jobs' checks, the node DaemonSet, the
//! NPD plugin and the webhook, so a requirement such as `require = gpus=8` is written
//! once.
//!
//! Its lines are `key = value`, where the key is a flag's long name without `--` and the
//! value is written as on the command line; `#` starts a comment line; `[mode]` starts
//! a section whose keys apply to that mode only (`[serve]`, `[init]`, ...), while keys
//! before any section apply to every mode that has the flag and are ignored by the
//! others. Precedence, highest first: the command line, the flag's `NCCL_PREFLIGHT_*`
//! variable, the file's section for the mode, the file's top, the built-in default.
//! The file only supplies defaults (clap's own `default_value`), so clap's order of
//! command line over variable over default is the order above, and a flag set by the
//! file is never "given" for `cli::unread`.
//!
//! A key no mode has, a section no mode is named, or a value the flag's own parser
//! refuses is an error naming the file and line: a typo must not silently drop a
//! requirement.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest configuration file read.
const MAX_CONFIG: u64 = 256 * 1024;

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    line: usize,
    section: Option<String>,
    key: String,
    value: String,
}

/// A parsed configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    path: PathBuf,
    entries: Vec<Entry>,
}

/// Parses the text of a configuration file (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<Config, String> {
    let mut entries = Vec::new();
    let mut section = None;
    for (i, raw) in text.lines().enumerate() {
        let at = || format!("{}:{}", path.display(), i + 1);
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim().to_string());
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!(
                "{}: not `key = value`: {}",
                at(),
                crate::diagnostic::visible(line)
            ));
        };
        let key = key.trim().trim_start_matches("--").to_string();
        if key.is_empty() {
            return Err(format!("{}: a line with no key", at()));
        }
        entries.push(Entry {
            line: i + 1,
            section: section.clone(),
            key,
            value: value.trim().to_string(),
        });
    }
    Ok(Config {
        path: path.to_path_buf(),
        entries,
    })
}

/// Reads and parses the file at `path`.
pub fn read(path: &Path) -> Result<Config, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_CONFIG + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_CONFIG {
        return Err(format!("{}: larger than 256 KiB", path.display()));
    }
    parse(path, &text)
}

impl Config {
    /// The values for `mode`: its section's over the top's, by flag name.
    pub fn for_mode(&self, mode: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for e in self.entries.iter().filter(|e| e.section.is_none()) {
            out.insert(e.key.clone(), e.value.clone());
        }
        for e in self
            .entries
            .iter()
            .filter(|e| e.section.as_deref() == Some(mode))
        {
            out.insert(e.key.clone(), e.value.clone());
        }
        out
    }

    /// Checks every line against `command` (keys, sections, values), then makes each
    /// subcommand take its values from the file as defaults.
    pub fn apply(&self, command: clap::Command) -> Result<clap::Command, String> {
        self.check(&command)?;
        Ok(command.mut_subcommands(|sub| {
            let values = self.for_mode(sub.get_name());
            sub.mut_args(|arg| match arg.get_long().and_then(|l| values.get(l)) {
                Some(v) => arg.default_value(v.clone()),
                None => arg,
            })
        }))
    }

    fn check(&self, command: &clap::Command) -> Result<(), String> {
        for e in &self.entries {
            let at = format!("{}:{}", self.path.display(), e.line);
            let modes: Vec<&clap::Command> = command
                .get_subcommands()
                .filter(|s| e.section.as_deref().is_none_or(|m| s.get_name() == m))
                .collect();
            if modes.is_empty() {
                return Err(format!(
                    "{at}: [{}]: no mode has this name",
                    crate::diagnostic::visible(e.section.as_deref().unwrap_or_default())
                ));
            }
            if e.key == "config" {
                return Err(format!(
                    "{at}: `config` names this file; it cannot be set in it"
                ));
            }
            let found = modes.iter().find_map(|m| {
                m.get_arguments()
                    .find(|a| a.get_long() == Some(e.key.as_str()))
            });
            let Some(arg) = found else {
                return Err(format!(
                    "{at}: unknown key `{}`: no mode{} has a flag --{0}",
                    crate::diagnostic::visible(&e.key),
                    e.section
                        .as_deref()
                        .map(|m| format!(" `{m}`"))
                        .unwrap_or_default()
                ));
            };
            valid_value(arg, &e.value).map_err(|why| format!("{at}: --{}: {why}", e.key))?;
        }
        Ok(())
    }
}

/// Whether the flag's own parser takes `value` (each piece of a comma-list flag): a
/// one-flag command with the same parser parses it, as clap would the default.
fn valid_value(arg: &clap::Arg, value: &str) -> Result<(), String> {
    let mut probe = clap::Arg::new("value")
        .long("value")
        .action(clap::ArgAction::Append)
        .value_parser(arg.get_value_parser().clone());
    if let Some(d) = arg.get_value_delimiter() {
        probe = probe.value_delimiter(d);
    }
    clap::Command::new("config")
        .no_binary_name(true)
        .arg(probe)
        .try_get_matches_from(["--value", value])
        .map(|_| ())
        .map_err(|e| {
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ");
            let first = first
                .replace(" for '--value <value>'", "")
                .replace(" for '--value <value>...'", "");
            crate::diagnostic::visible(&first).into_owned()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        parse(Path::new("c.conf"), text).unwrap()
    }

    /// `serve`'s --interval under `c` and `argv` (the variables' place in the order is
    /// tested on the binary: tests/integration/cli.rs).
    fn serve_interval(c: &Config, argv: &[&str]) -> std::time::Duration {
        let m = c
            .apply(crate::cli::command())
            .unwrap()
            .try_get_matches_from(["nccl-preflight", "serve"].iter().chain(argv))
            .unwrap();
        let (_, sub) = m.subcommand().unwrap();
        *sub.get_one::<std::time::Duration>("interval").unwrap()
    }

    #[test]
    fn the_mode_section_beats_the_top_and_the_command_line_beats_both() {
        let c = config(
            "# cluster\ninterval = 30s\nrequire = gpus=8\n[serve]\ninterval = 20s\n[init]\nmin-shm = 2GiB\n",
        );
        assert_eq!(serve_interval(&c, &[]), std::time::Duration::from_secs(20));
        assert_eq!(
            serve_interval(&c, &["--interval=7s"]),
            std::time::Duration::from_secs(7)
        );
        let top = config("interval = 30s\n");
        assert_eq!(
            serve_interval(&top, &[]),
            std::time::Duration::from_secs(30)
        );
        assert_eq!(
            serve_interval(&config(""), &[]),
            std::time::Duration::from_secs(60)
        );
        assert_eq!(
            c.for_mode("check").get("require").map(String::as_str),
            Some("gpus=8")
        );
        assert_eq!(
            c.for_mode("init").get("min-shm").map(String::as_str),
            Some("2GiB")
        );
        assert_eq!(c.for_mode("serve").get("min-shm"), None);
    }

    #[test]
    fn a_typo_a_bad_value_or_an_unknown_section_names_the_file_and_line() {
        for (text, says) in [
            ("requre = gpus=8\n", "c.conf:1: unknown key `requre`"),
            (
                "\n[serve]\nenv-file = /x\n",
                "c.conf:3: unknown key `env-file`: no mode `serve`",
            ),
            (
                "interval = soon\n",
                "c.conf:1: --interval: invalid value 'soon'",
            ),
            (
                "[serv]\ninterval = 1s\n",
                "c.conf:2: [serv]: no mode has this name",
            ),
            ("config = /etc/x\n", "c.conf:1: `config` names this file"),
            (
                "xid-ignore = 31,x\n",
                "c.conf:1: --xid-ignore: invalid value 'x'",
            ),
        ] {
            let err = config(text).apply(crate::cli::command()).unwrap_err();
            assert!(err.starts_with(says), "{text:?}: {err}");
        }
        let err = parse(Path::new("c.conf"), "just words\n").unwrap_err();
        assert!(err.starts_with("c.conf:1: not `key = value`"), "{err}");
    }
}
