//! NCCL's settings files, read the way each NCCL release reads them (NVIDIA/nccl
//! src/misc/param.cc `initEnv`/`setEnvFile`; src/include/param.h before v2.12.10-1):
//!
//! | releases    | files, in order                                             | home from            | `#` lines | CR   |
//! |-------------|-------------------------------------------------------------|----------------------|-----------|------|
//! | 2.3 - 2.22  | `~/.nccl.conf`, `/etc/nccl.conf`                            | getpwuid(getuid())   | settings  | kept |
//! | 2.23 - 2.25 | `$NCCL_CONF_FILE` if set and not empty, else `~/.nccl.conf`; then `/etc/nccl.conf` | getpwuid | settings | kept |
//! | 2.26 - 2.29 | the same                                                    | getpwuid             | skipped   | kept |
//! | 2.30 -      | the same                                                    | `$HOME`              | skipped   | cut  |
//!
//! Each line is split at its first `=`, nothing is trimmed or unquoted, a name and a
//! value keep at most 1023 bytes, and each pair is applied with setenv(..., 0): a
//! variable already in the environment (even empty) keeps its value, and the first
//! file to set a name wins over the later ones. 2.30 reads lines with fgets into 4096
//! bytes, so a longer line continues as the next one. `NCCL_CONF_FILE` itself is read
//! from the environment before any file, so a file cannot name another.
//!
//! Also here: the warning `init --nccl-conf` gives when the loaded NCCL would not read
//! the file it writes.

use crate::facts::{EnvValue, FileLine};
use crate::finding::{Finding, ids};
use crate::nccl::Version;
use crate::nccl::version::{CONF_FILE, CONF_FILE_COMMENTS, HOME_FROM_ENV};
use std::collections::BTreeMap;

/// NCCL keeps at most this many bytes of a name and of a value (`char envVar[1024]`).
pub(crate) const MAX_FIELD: usize = 1023;
/// fgets(line, 4096, file) keeps 4095 bytes a call from 2.30.
const FGETS_BYTES: usize = 4095;
/// The file every release reads last.
pub const ETC_CONF: &str = "/etc/nccl.conf";

/// How one NCCL release reads its settings files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// NCCL_CONF_FILE replaces `~/.nccl.conf`.
    pub conf_file_var: bool,
    /// Lines starting with `#` are skipped (before, such a line with `=` sets a variable
    /// whose name starts with `#`, which nothing reads).
    pub comments: bool,
    /// `~/` is `$HOME` (and CR is cut, lines split at 4095 bytes); before, the passwd
    /// entry of the real uid.
    home_from_env: bool,
}

/// The rules of `version`; an unknown version reads as the newest.
pub fn rules(version: Option<Version>) -> Rules {
    let since = |at: Version| version.is_none_or(|v| v >= at);
    Rules {
        conf_file_var: since(CONF_FILE),
        comments: since(CONF_FILE_COMMENTS),
        home_from_env: since(HOME_FROM_ENV),
    }
}

/// Where NCCL looks for `~/.nccl.conf`: `$HOME` from 2.30, the passwd entry before.
pub struct Homes<'a> {
    pub env: Option<&'a str>,
    pub passwd: Option<&'a str>,
}

/// The files NCCL opens, in order: `$NCCL_CONF_FILE` (from 2.23, when set and not
/// empty) or `~/.nccl.conf`, then `/etc/nccl.conf`. `conf_file` is the path the
/// environment's NCCL_CONF_FILE names (already resolved against the working directory).
pub fn files_read(conf_file: Option<&str>, homes: &Homes, rules: Rules) -> Vec<String> {
    let mut out = Vec::new();
    match conf_file.filter(|p| rules.conf_file_var && !p.is_empty()) {
        Some(path) => out.push(path.to_string()),
        None => {
            let home = if rules.home_from_env {
                homes.env
            } else {
                homes.passwd
            };
            // snprintf("%s/.nccl.conf", home): an empty HOME gives /.nccl.conf.
            if let Some(home) = home {
                out.push(format!("{home}/.nccl.conf"));
            }
        }
    }
    out.push(ETC_CONF.to_string());
    out
}

/// A line NCCL reads differently from what its author likely meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misread {
    /// Blanks around the name (`NCCL_X = 1`, `export NCCL_X=1`): NCCL sets a variable of
    /// that exact name, which nothing reads. `meant`: the name without them.
    Name { meant: String },
    /// The value is in quotes: NCCL keeps them as part of the value.
    Quoted,
    /// A `#` after the value: NCCL keeps it and what follows as part of the value.
    TrailingComment,
    /// A carriage return ends the value (a file written on Windows): kept before 2.30.
    CarriageReturn,
    /// The name or the value is longer than 1023 bytes: NCCL keeps the first 1023.
    Truncated,
    /// An earlier line of the same file set the same name: this one is ignored.
    Repeated { first: usize },
}

/// One `NAME=value` pair as NCCL applies it, with what it may have misread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// 1-based line number in the file.
    pub line: usize,
    pub name: String,
    pub value: String,
    pub misread: Vec<Misread>,
}

/// The pairs NCCL applies from `text`, in order, with the rules of one release.
pub fn parse(text: &str, rules: Rules) -> Vec<Pair> {
    let mut out: Vec<Pair> = Vec::new();
    for (index, raw) in physical_lines(text, rules).into_iter().enumerate() {
        // C string functions stop at a NUL.
        let raw = raw.split('\0').next().unwrap_or("");
        let mut misread = Vec::new();
        let line = if rules.home_from_env {
            raw.strip_suffix('\r').unwrap_or(raw)
        } else {
            if raw.ends_with('\r') {
                misread.push(Misread::CarriageReturn);
            }
            raw
        };
        if rules.comments && line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        // setenv("", ...) fails with EINVAL: nothing is set.
        if name.is_empty() {
            continue;
        }
        let meant = name.trim().trim_start_matches("export ").trim();
        if meant != name && !meant.is_empty() {
            misread.push(Misread::Name {
                meant: meant.to_string(),
            });
        }
        let shown = value.trim_end_matches('\r').trim();
        if shown.len() >= 2
            && ((shown.starts_with('"') && shown.ends_with('"'))
                || (shown.starts_with('\'') && shown.ends_with('\'')))
        {
            misread.push(Misread::Quoted);
        }
        if value.contains(" #") || value.contains("\t#") {
            misread.push(Misread::TrailingComment);
        }
        if name.len() > MAX_FIELD || value.len() > MAX_FIELD {
            misread.push(Misread::Truncated);
        }
        let name = cut(name);
        if let Some(first) = out.iter().find(|p| p.name == name).map(|p| p.line) {
            misread.push(Misread::Repeated { first });
        }
        out.push(Pair {
            line: index + 1,
            name,
            value: cut(value),
            misread,
        });
    }
    out
}

/// The file's lines as NCCL's reads return them, without their newline: getline(3)
/// before 2.30, fgets into 4096 bytes from 2.30 (a longer line continues as the next).
fn physical_lines(text: &str, rules: Rules) -> Vec<&str> {
    let mut out = Vec::new();
    for line in text.split_inclusive('\n') {
        let line = line.strip_suffix('\n').unwrap_or(line);
        if !rules.home_from_env || line.len() < FGETS_BYTES {
            out.push(line);
            continue;
        }
        let mut rest = line;
        while rest.len() >= FGETS_BYTES {
            let at = floor_char_boundary(rest, FGETS_BYTES);
            let (head, tail) = rest.split_at(at.max(1));
            out.push(head);
            rest = tail;
        }
        out.push(rest);
    }
    out
}

/// The largest char boundary at or below `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    (0..=at.min(s.len()))
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0)
}

/// The first 1023 bytes (strncpy into 1024 with the last one NUL).
fn cut(s: &str) -> String {
    s[..floor_char_boundary(s, MAX_FIELD)].to_string()
}

/// One settings file as gather read it: its path and text (`None`: absent or unreadable).
pub struct ReadFile<'a> {
    pub path: &'a str,
    pub text: Option<&'a str>,
}

/// What NCCL's getenv sees: `env` (the process environment), then each file NCCL
/// reads in order (`files`, only those `files_read` names), each pair applied without
/// overwriting. A value from a file says where it came from. Only variables `keep`
/// accepts are added (NCCL_*, FI_*, OFI_NCCL_*: the ones NCCL, libfabric and the net
/// plugin read after NCCL applied the files).
pub fn effective(
    env: &BTreeMap<String, EnvValue>,
    files: &[ReadFile],
    rules: Rules,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<String, EnvValue> {
    let mut out = env.clone();
    for file in files {
        let Some(text) = file.text else { continue };
        for pair in parse(text, rules) {
            if !keep(&pair.name) || out.contains_key(&pair.name) {
                continue;
            }
            out.insert(
                pair.name,
                EnvValue {
                    value: pair.value,
                    not_utf8: false,
                    from: Some(FileLine {
                        path: file.path.to_string(),
                        line: pair.line,
                    }),
                },
            );
        }
    }
    out
}

/// The warning that replaces the conf file when the loaded NCCL `version` would not read
/// it; `None` when it would, or when the version is unknown (no libnccl in this image:
/// the trainer's may be new enough). `env_file`: whether `--env-file` was given. The
/// paths stay out of the text, which goes into reports compared across runs.
pub fn unread(version: Option<Version>, env_file: bool) -> Option<Finding> {
    let v = version.filter(|v| *v < CONF_FILE)?;
    let (settings, remediation) = if env_file {
        (
            "the tuned settings are in the --env-file only",
            "source the --env-file in the trainer's command (`. FILE && exec ...`), or run the trainer under `nccl-preflight exec`; or use NCCL 2.23 or later",
        )
    } else {
        (
            "pass --env-file to hand the tuned settings to the trainer",
            "add --env-file FILE and source it in the trainer's command, or run the trainer under `nccl-preflight exec`; or use NCCL 2.23 or later",
        )
    };
    Some(
        Finding::warn(
            ids::NCCL_CONF,
            format!(
                "NCCL {} does not read NCCL_CONF_FILE (2.23 and later do): --nccl-conf not written; {settings}",
                v
            ),
            remediation,
        )
        .evidence(format!("libnccl version {v}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Status;

    const V2_21: Option<Version> = Some(Version::new(2, 21, 5));
    const V2_23: Option<Version> = Some(Version::new(2, 23, 4));
    const V2_28: Option<Version> = Some(Version::new(2, 28, 9));
    const V2_30: Option<Version> = Some(Version::new(2, 30, 7));

    fn pairs(text: &str, v: Option<Version>) -> Vec<(String, String)> {
        parse(text, rules(v))
            .into_iter()
            .map(|p| (p.name, p.value))
            .collect()
    }

    fn pair(n: &str, v: &str) -> (String, String) {
        (n.to_string(), v.to_string())
    }

    #[test]
    fn files_follow_each_release() {
        let homes = Homes {
            env: Some("/home/env"),
            passwd: Some("/home/pw"),
        };
        let conf = Some("/job/nccl.conf");
        // 2.21: NCCL_CONF_FILE unknown, home from passwd.
        assert_eq!(
            files_read(conf, &homes, rules(V2_21)),
            ["/home/pw/.nccl.conf", "/etc/nccl.conf"]
        );
        // 2.23: NCCL_CONF_FILE replaces ~/.nccl.conf.
        assert_eq!(
            files_read(conf, &homes, rules(V2_23)),
            ["/job/nccl.conf", "/etc/nccl.conf"]
        );
        // An empty NCCL_CONF_FILE is unset to NCCL (strlen > 0).
        assert_eq!(
            files_read(Some(""), &homes, rules(V2_28)),
            ["/home/pw/.nccl.conf", "/etc/nccl.conf"]
        );
        // 2.30: $HOME.
        assert_eq!(
            files_read(None, &homes, rules(V2_30)),
            ["/home/env/.nccl.conf", "/etc/nccl.conf"]
        );
        let no_home = Homes {
            env: None,
            passwd: None,
        };
        assert_eq!(files_read(None, &no_home, rules(None)), ["/etc/nccl.conf"]);
    }

    #[test]
    fn lines_split_at_the_first_equals_sign_and_keep_everything_else() {
        let text = "NCCL_SOCKET_IFNAME==eth0\nNCCL_A=x=y\nno equals\n\n=orphan\nNCCL_B=\n";
        assert_eq!(
            pairs(text, V2_28),
            [
                pair("NCCL_SOCKET_IFNAME", "=eth0"),
                pair("NCCL_A", "x=y"),
                pair("NCCL_B", "")
            ]
        );
        // No trailing newline on the last line.
        assert_eq!(pairs("NCCL_C=1", V2_28), [pair("NCCL_C", "1")]);
    }

    #[test]
    fn comments_are_skipped_from_2_26_only() {
        let text = "#NCCL_DEBUG=INFO\n# note\n";
        assert_eq!(pairs(text, V2_28), []);
        // 2.23 sets a variable named "#NCCL_DEBUG" (nothing reads it).
        assert_eq!(pairs(text, V2_23), [pair("#NCCL_DEBUG", "INFO")]);
        assert!(
            parse(text, rules(V2_23))[0].misread.is_empty(),
            "a comment is not a misread name"
        );
    }

    #[test]
    fn carriage_returns_stay_before_2_30() {
        let text = "NCCL_SOCKET_IFNAME=eth0\r\n";
        let old = parse(text, rules(V2_28));
        assert_eq!(old[0].value, "eth0\r");
        assert_eq!(old[0].misread, [Misread::CarriageReturn]);
        let new = parse(text, rules(V2_30));
        assert_eq!(new[0].value, "eth0");
        assert!(new[0].misread.is_empty());
    }

    #[test]
    fn what_authors_mean_and_nccl_does_not_read() {
        let text = "NCCL_DEBUG = INFO\nexport NCCL_ALGO=Ring\nNCCL_SOCKET_IFNAME=\"eth0\"\nNCCL_PROTO=Simple # LL128 off\nNCCL_ALGO=Tree\n";
        let p = parse(text, rules(V2_28));
        assert_eq!(p[0].name, "NCCL_DEBUG ");
        assert_eq!(p[0].value, " INFO");
        assert_eq!(
            p[0].misread,
            [Misread::Name {
                meant: "NCCL_DEBUG".into()
            }]
        );
        assert_eq!(p[1].name, "export NCCL_ALGO");
        assert_eq!(
            p[1].misread,
            [Misread::Name {
                meant: "NCCL_ALGO".into()
            }]
        );
        assert_eq!(p[2].value, "\"eth0\"");
        assert_eq!(p[2].misread, [Misread::Quoted]);
        assert_eq!(p[3].value, "Simple # LL128 off");
        assert_eq!(p[3].misread, [Misread::TrailingComment]);
        // A second NCCL_ALGO (the first was under another name): not repeated.
        assert!(p[4].misread.is_empty());
        let twice = parse("NCCL_ALGO=Ring\nNCCL_ALGO=Tree\n", rules(V2_28));
        assert_eq!(twice[1].misread, [Misread::Repeated { first: 1 }]);
    }

    #[test]
    fn long_fields_are_cut_at_1023_bytes_and_long_lines_split_from_2_30() {
        let value = "x".repeat(5000);
        let text = format!("NCCL_LONG={value}\n");
        let old = parse(&text, rules(V2_28));
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].value.len(), MAX_FIELD);
        assert_eq!(old[0].misread, [Misread::Truncated]);
        // 2.30: fgets cuts at 4095 bytes; the rest has no '=' and is skipped.
        let new = parse(&text, rules(V2_30));
        assert_eq!(new.len(), 1);
        let tail = format!("NCCL_LONG={}=z\n", "y".repeat(4090));
        let split = parse(&tail, rules(V2_30));
        assert_eq!(
            split.len(),
            2,
            "{:?}",
            split.iter().map(|p| &p.name).collect::<Vec<_>>()
        );
        assert_eq!(split[1].value, "z");
    }

    #[test]
    fn the_environment_wins_then_the_first_file() {
        let env = BTreeMap::from([
            ("NCCL_BUFFSIZE".to_string(), EnvValue::text("4194304")),
            ("NCCL_EMPTY".to_string(), EnvValue::text("")),
        ]);
        let home = "NCCL_BUFFSIZE=8388608\nNCCL_ALGO=Ring\nNCCL_EMPTY=1\nPATH=/x\n";
        let etc = "NCCL_ALGO=Tree\nNCCL_PROTO=Simple\nFI_EFA_FORK_SAFE=1\n";
        let files = [
            ReadFile {
                path: "/root/.nccl.conf",
                text: Some(home),
            },
            ReadFile {
                path: "/etc/nccl.conf",
                text: Some(etc),
            },
        ];
        let keep = |n: &str| n.starts_with("NCCL_") || n.starts_with("FI_");
        let e = effective(&env, &files, rules(V2_28), keep);
        assert_eq!(e["NCCL_BUFFSIZE"], EnvValue::text("4194304"));
        assert_eq!(e["NCCL_EMPTY"], EnvValue::text(""));
        assert_eq!(e["NCCL_ALGO"].value, "Ring");
        assert_eq!(
            e["NCCL_ALGO"].from,
            Some(FileLine {
                path: "/root/.nccl.conf".into(),
                line: 2
            })
        );
        assert_eq!(e["NCCL_PROTO"].from.as_ref().unwrap().line, 2);
        assert!(e.contains_key("FI_EFA_FORK_SAFE"));
        assert!(!e.contains_key("PATH"));
    }

    #[test]
    fn only_releases_before_2_23_are_warned_about() {
        assert!(unread(Some(Version::new(2, 23, 4)), true).is_none());
        assert!(unread(None, true).is_none());
        let w = unread(Some(Version::new(2, 21, 5)), true).unwrap();
        assert_eq!((w.id.as_str(), w.status()), ("nccl-conf", Status::Warn));
        assert!(
            w.summary.contains("2.21.5") && w.summary.contains("--env-file only"),
            "{}",
            w.summary
        );
        let without = unread(Some(Version::new(2, 22, 3)), false).unwrap();
        assert!(
            without.summary.contains("pass --env-file"),
            "{}",
            without.summary
        );
    }
}
