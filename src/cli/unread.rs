//! Which flags each mode reads. Several modes share flag sets (`CheckArgs`, `GatherArgs`,
//! `GangOpts`), so clap offers some flags where the mode never looks at them: `probe` and
//! `serve` never load the CUDA driver whatever `--cuda` says, `bench` registers no RDMA
//! memory, `check --facts F` gathers nothing. Such a flag given on the command line is an
//! error naming the flag and the mode, and a flag a mode never reads is left out of that
//! mode's help.
//!
//! The variable twins (`NCCL_PREFLIGHT_*`) are not refused: one `env:` list or ConfigMap
//! often feeds several containers of a pod (an initContainer running `init`, a sidecar
//! running `serve`), so a variable set for one mode is ignored by a mode that does not
//! read it, as a variable of another program would be.
//!
//! The table is derived from the code that reads the flags: `commands::probe` and
//! `serve::without_cuda` set `cuda` off; `serve` prints no report (`/report` is JSON);
//! `bench::command::bench` reads only the host root, NVML, CUDA and NCCL flags of
//! `GatherArgs`; `run::judge_gathered` reads only `--nodes` and `--image` of them with
//! `--facts`; `commands::facts` never reads `--nodes` (`run::judge_gathered` does).

use super::BenchKind;
use clap::ArgMatches;
use clap::parser::ValueSource;
use std::path::PathBuf;

/// When a rule's flags go unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// Always: the mode never reads them.
    Always,
    /// Unless this switch (a boolean flag's id) is on.
    Without(&'static str),
    /// When `--facts` names saved facts: nothing is gathered.
    WithFacts,
    /// When `bench` measures only this.
    Measuring(BenchKind),
}

/// Flags `modes` do not read `when` this holds, and why.
#[derive(Debug)]
struct Unread {
    pub modes: &'static [&'static str],
    /// Argument ids (the field names; the long flag is the id with `-` for `_`).
    pub flags: &'static [&'static str],
    pub when: When,
    pub why: &'static str,
}

/// The gather flags that only matter while gathering.
const GATHERING: &[&str] = &[
    "host_root",
    "nvml_lib",
    "cuda_lib",
    "timeout",
    "verbs_lib",
    "fabric_lib",
    "nccl_lib",
    "cudart_lib",
    "memreg_size",
    "cuda",
    "trace",
];

const GANG_OPTS: &[&str] = &[
    "gang_timeout",
    "gang_wait",
    "gang_port",
    "gang_root",
    "gang_rank",
    "gang_nodes",
    "gang_peers",
    "gang_attempt",
    "gang_sizes",
    "gang_iterations",
];

const UNREAD: &[Unread] = &[
    Unread {
        modes: &["probe"],
        flags: &["cuda"],
        when: When::Always,
        why: "probe never loads the CUDA driver (cuInit alone takes about 0.5 s of a kubelet probe's 1 s)",
    },
    Unread {
        modes: &["serve"],
        flags: &["cuda"],
        when: When::Always,
        why: "serve never loads the CUDA driver (NVML shows a stopped fabric manager)",
    },
    Unread {
        modes: &["probe"],
        flags: &["format"],
        when: When::Always,
        why: "probe answers with one line and its exit code",
    },
    Unread {
        modes: &["serve"],
        flags: &["format"],
        when: When::Always,
        why: "serve prints no report: /report answers JSON",
    },
    Unread {
        modes: &["serve"],
        flags: &[
            "ras_addr",
            "watch_interval",
            "hang_after",
            "watch_init_grace",
        ],
        when: When::Without("watch_nccl"),
        why: "only --watch-nccl reads it",
    },
    Unread {
        modes: &["serve"],
        flags: &["taint_after", "node_name", "service_account"],
        when: When::Without("taint_node"),
        why: "only --taint-node reads it",
    },
    Unread {
        modes: &["bench"],
        flags: &[
            "verbs_lib",
            "fabric_lib",
            "cudart_lib",
            "memreg_size",
            "cuda",
            "image",
            "nodes",
            "replay_kernel",
        ],
        when: When::Always,
        why: "bench loads NVML, the CUDA driver and NCCL only, and judges no check",
    },
    Unread {
        modes: &["bench"],
        flags: &["nccl_sizes", "nccl_lib"],
        when: When::Measuring(BenchKind::P2p),
        why: "`bench p2p` runs no NCCL",
    },
    Unread {
        modes: &["bench"],
        flags: &["size"],
        when: When::Measuring(BenchKind::Nccl),
        why: "`bench nccl` makes no peer copies",
    },
    Unread {
        modes: &["facts"],
        flags: &["nodes"],
        when: When::Always,
        why: "facts saves what it gathered; give --nodes where the facts are judged (check --facts FILE --nodes N)",
    },
    Unread {
        modes: &["init"],
        flags: &["bench_seconds", "min_bandwidth_fraction", "bench_nccl"],
        when: When::Without("bench"),
        why: "only --bench reads it",
    },
    Unread {
        modes: &["init", "exec"],
        flags: GANG_OPTS,
        when: When::Without("gang"),
        why: "only --gang reads it",
    },
    Unread {
        modes: &["check", "probe", "doctor", "init", "exec"],
        flags: GATHERING,
        when: When::WithFacts,
        why: "with --facts nothing is gathered: the saved facts are judged",
    },
    Unread {
        // serve's XID watcher still loads NVML under --timeout with --facts.
        modes: &["serve"],
        flags: &[
            "cuda_lib",
            "verbs_lib",
            "fabric_lib",
            "nccl_lib",
            "cudart_lib",
            "memreg_size",
        ],
        when: When::WithFacts,
        why: "with --facts nothing is gathered: the saved facts are judged",
    },
];

impl When {
    fn holds(self, matches: &ArgMatches) -> bool {
        match self {
            When::Always => true,
            When::Without(switch) => !matches!(matches.try_get_one::<bool>(switch), Ok(Some(true))),
            When::WithFacts => matches!(matches.try_get_one::<PathBuf>("facts"), Ok(Some(_))),
            When::Measuring(kind) => {
                matches!(matches.try_get_one::<BenchKind>("what"), Ok(Some(k)) if *k == kind)
            }
        }
    }
}

/// The long flag of an argument id.
pub(crate) fn long(id: &str) -> String {
    format!("--{}", id.replace('_', "-"))
}

/// Refuses a flag given on the command line that the chosen mode does not read, naming
/// the flag, the mode and why. Variables (`NCCL_PREFLIGHT_*`) are not refused (see above).
pub fn refuse(matches: &ArgMatches) -> Result<(), String> {
    let Some((mode, sub)) = matches.subcommand() else {
        return Ok(());
    };
    for rule in UNREAD.iter().filter(|r| r.modes.contains(&mode)) {
        if !rule.when.holds(sub) {
            continue;
        }
        // `ids()` lists only arguments this mode defines, so `value_source` is asked
        // about nothing clap does not know.
        let given = rule.flags.iter().find(|flag| {
            sub.ids().any(|id| id.as_str() == **flag)
                && sub.value_source(flag) == Some(ValueSource::CommandLine)
        });
        if let Some(flag) = given {
            let flag = long(flag);
            let when = match rule.when {
                When::Always => String::new(),
                When::Without(switch) => format!(" without {}", long(switch)),
                When::WithFacts => " with --facts".to_string(),
                When::Measuring(BenchKind::P2p) => " p2p".to_string(),
                When::Measuring(BenchKind::Nccl) => " nccl".to_string(),
                When::Measuring(BenchKind::All) => " all".to_string(),
            };
            return Err(format!(
                "{flag}: `{mode}{when}` does not read this flag: {}; leave it out",
                rule.why
            ));
        }
    }
    Ok(())
}

/// Whether `mode` never reads the flag `id`.
fn never_read(mode: &str, id: &str) -> bool {
    UNREAD
        .iter()
        .any(|r| r.when == When::Always && r.modes.contains(&mode) && r.flags.contains(&id))
}

/// Leaves out of each mode's help the flags it never reads.
pub(crate) fn hide_unread(command: clap::Command) -> clap::Command {
    command.mut_subcommands(|sub| {
        let mode = sub.get_name().to_string();
        sub.mut_args(|arg| {
            if never_read(&mode, arg.get_id().as_str()) {
                arg.hide(true)
            } else {
                arg
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The rules as the table docs/reference.md carries (a test holds the two equal).
    pub fn markdown() -> String {
        let mut out = String::from("| mode | flags | when | why |\n|---|---|---|---|\n");
        for rule in UNREAD {
            let modes: Vec<String> = rule.modes.iter().map(|m| format!("`{m}`")).collect();
            let flags: Vec<String> = rule
                .flags
                .iter()
                .map(|f| format!("`{}`", long(f)))
                .collect();
            let when = match rule.when {
                When::Always => "always".to_string(),
                When::Without(switch) => format!("without `{}`", long(switch)),
                When::WithFacts => "with `--facts`".to_string(),
                When::Measuring(kind) => format!("`bench {}`", format!("{kind:?}").to_lowercase()),
            };
            out.push_str(&format!(
                "| {} | {} | {when} | {} |\n",
                modes.join(", "),
                flags.join(", "),
                rule.why.replace('|', "\\|")
            ));
        }
        out
    }

    /// Every flag of every mode, by mode, split into the flags the mode reads and
    /// those it refuses, with no switch on and no --facts. Written out from reading the
    /// code, not from `UNREAD`: a new flag, or a flag added to a shared set, fails the
    /// walk below until someone decides here whether each mode reads it.
    const GATHER_READ_BY_CHECKS: &[&str] = &[
        "timeout",
        "memreg_size",
        "cuda",
        "trace",
        "image",
        "nodes",
        "host_root",
        "nvml_lib",
        "cuda_lib",
        "verbs_lib",
        "fabric_lib",
        "nccl_lib",
        "cudart_lib",
        "replay_kernel",
    ];
    const CHECK_OWN: &[&str] = &[
        "facts",
        "ignore",
        "require",
        "min_shm",
        "min_memlock",
        "format",
    ];
    const GANG: &[&str] = GANG_OPTS;
    const WATCH: &[&str] = &[
        "watch_nccl",
        "ras_addr",
        "watch_interval",
        "hang_after",
        "watch_init_grace",
    ];

    fn table() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
        let checks = || [GATHER_READ_BY_CHECKS, CHECK_OWN].concat();
        let without = |all: Vec<&'static str>, out: &[&str]| -> Vec<&'static str> {
            all.into_iter().filter(|f| !out.contains(f)).collect()
        };
        let init_own = [
            "env_file",
            "nccl_conf",
            "report",
            "termination_log",
            "bench",
            "gang",
        ];
        vec![
            ("check", checks(), vec![]),
            ("doctor", checks(), vec![]),
            (
                "probe",
                [
                    without(checks(), &["cuda", "format"]),
                    vec!["npd", "max_output"],
                ]
                .concat(),
                vec!["cuda", "format"],
            ),
            (
                "init",
                [checks(), init_own.to_vec()].concat(),
                [
                    GANG,
                    &["bench_seconds", "min_bandwidth_fraction", "bench_nccl"],
                ]
                .concat(),
            ),
            (
                "exec",
                [checks(), vec!["dry_run", "gang"]].concat(),
                GANG.to_vec(),
            ),
            ("gang", [checks(), GANG.to_vec()].concat(), vec![]),
            (
                "serve",
                [
                    without(checks(), &["cuda", "format"]),
                    vec![
                        "listen",
                        "interval",
                        "stale_after",
                        "xid_not_ready",
                        "xid_ignore",
                    ],
                    vec!["watch_nccl", "taint_node"],
                ]
                .concat(),
                [
                    vec![
                        "cuda",
                        "format",
                        "taint_after",
                        "node_name",
                        "service_account",
                    ],
                    WATCH[1..].to_vec(),
                ]
                .concat(),
            ),
            (
                "facts",
                without(GATHER_READ_BY_CHECKS.to_vec(), &["nodes"]),
                vec!["nodes"],
            ),
            (
                "bench",
                vec![
                    "size",
                    "nccl_sizes",
                    "iterations",
                    "bench_seconds",
                    "min_bandwidth_fraction",
                    "format",
                    "timeout",
                    "trace",
                    "host_root",
                    "nvml_lib",
                    "cuda_lib",
                    "nccl_lib",
                ],
                vec![
                    "verbs_lib",
                    "fabric_lib",
                    "cudart_lib",
                    "memreg_size",
                    "cuda",
                    "image",
                    "nodes",
                    "replay_kernel",
                ],
            ),
            ("explain-log", vec!["format"], vec![]),
            ("install", vec!["name"], vec![]),
            (
                "webhook",
                vec![
                    "listen",
                    "metrics_listen",
                    "tls_cert",
                    "tls_key",
                    "inject_image",
                    "inject_mode",
                    "service_account",
                ],
                vec![],
            ),
        ]
    }

    /// A value clap accepts for `arg` (its first possible value, its default, or one
    /// by the kind its value name says); `None` for a switch.
    fn sample(arg: &clap::Arg) -> Option<String> {
        if !arg.get_action().takes_values() {
            return None;
        }
        if let Some(v) = arg.get_possible_values().first() {
            return Some(v.get_name().to_string());
        }
        if let Some(v) = arg.get_default_values().first() {
            return Some(v.to_string_lossy().into_owned());
        }
        let name = arg
            .get_value_names()
            .and_then(|n| n.first())
            .map(|n| n.to_string());
        Some(
            match name.as_deref() {
                Some("N") => "2",
                Some("PORT") => "29500",
                Some("PATH" | "FILE" | "DIR") => "/tmp/x",
                Some("HOST") => "pod-0",
                Some("TEXT") => "attempt-1",
                Some("HOST[,HOST...]") => "pod-0,pod-1",
                Some("ID[,ID...]") => "dev-shm",
                Some("REQ[,REQ...]") => "host-ipc",
                Some("SIZE") => "1GiB",
                Some("SIZE|unlimited") => "unlimited",
                Some("DURATION") => "20s",
                Some("XID[,XID...]") => "79",
                Some("BYTES") => "80",
                Some("IMAGE") => "registry.example/nccl-preflight:1",
                Some("RUNS") => "3",
                Some("NODE") => "node-1",
                other => panic!("{}: no sample for value name {other:?}", arg.get_id()),
            }
            .to_string(),
        )
    }

    /// The mode's argv with `context` and then the flag, refused or not by `refuse`.
    fn verdict(mode: &clap::Command, context: &[&str], flag: &str) -> Result<(), String> {
        let arg = mode
            .get_arguments()
            .find(|a| a.get_id() == flag)
            .unwrap_or_else(|| panic!("{} has no {flag}", mode.get_name()));
        let mut argv = vec!["nccl-preflight".to_string(), mode.get_name().to_string()];
        argv.extend(context.iter().map(|s| s.to_string()));
        // A flag clap accepts only beside another (`requires`).
        if (mode.get_name(), flag) == ("probe", "max_output") {
            argv.push("--npd".into());
        }
        argv.push(long(flag));
        argv.extend(sample(arg));
        match mode.get_name() {
            "exec" => argv.extend(["--".into(), "true".into()]),
            "install" => argv.push("/tmp/dir".into()),
            _ => {}
        }
        let matches = super::super::command()
            .try_get_matches_from(&argv)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        refuse(&matches)
    }

    /// Every (mode, flag) pair clap defines is in the table, read or refused, and the
    /// binary's parse agrees: a refused flag's error names the flag and the mode.
    #[test]
    fn every_mode_and_flag_pair_is_read_or_refused() {
        let command = super::super::command();
        let table = table();
        let mut walked = 0;
        for mode in command
            .get_subcommands()
            // The internal children: they take no flags (`crate::child`).
            .filter(|m| !m.is_hide_set())
        {
            let name = mode.get_name();
            let (_, reads, refuses) = table
                .iter()
                .find(|(m, _, _)| *m == name)
                .unwrap_or_else(|| panic!("mode {name} is not in the table"));
            let defined: BTreeSet<&str> = mode
                .get_arguments()
                .filter(|a| !a.is_positional() && a.get_long().is_some())
                .map(|a| a.get_id().as_str())
                .filter(|id| !["help", "version"].contains(id))
                .collect();
            let listed: BTreeSet<&str> = reads.iter().chain(refuses).copied().collect();
            assert_eq!(
                defined, listed,
                "{name}: the flags clap defines (left) against this table (right): put a new \
                 flag in the mode's read or refused list here, and a refused one in UNREAD"
            );
            for flag in &defined {
                let arg = mode.get_arguments().find(|a| a.get_id() == *flag).unwrap();
                assert_eq!(arg.get_long().map(|l| format!("--{l}")), Some(long(flag)));
                match verdict(mode, &[], flag) {
                    Ok(()) => assert!(reads.contains(flag), "{name} {flag} was accepted"),
                    Err(e) => {
                        assert!(refuses.contains(flag), "{name} {flag} was refused: {e}");
                        assert!(e.starts_with(&format!("{}: `{name}", long(flag))), "{e}");
                    }
                }
                walked += 1;
            }
        }
        assert!(walked > 200, "{walked}");
    }

    /// The flags read only under a switch, a --facts or a bench kind.
    #[test]
    fn conditional_flags_are_read_only_where_their_condition_holds() {
        let command = super::super::command();
        let mode = |n: &str| command.find_subcommand(n).unwrap().clone();
        let cases: &[(&str, &[&str], &str, bool)] = &[
            ("init", &["--gang"], "gang_timeout", true),
            ("init", &["--bench"], "bench_seconds", true),
            ("init", &["--bench"], "gang_peers", false),
            ("exec", &["--gang"], "gang_peers", true),
            ("serve", &["--watch-nccl"], "ras_addr", true),
            ("serve", &["--watch-nccl"], "hang_after", true),
            ("bench", &["p2p"], "nccl_sizes", false),
            ("bench", &["p2p"], "nccl_lib", false),
            ("bench", &["p2p"], "size", true),
            ("bench", &["nccl"], "size", false),
            ("bench", &["nccl"], "nccl_sizes", true),
            ("check", &["--facts", "f.json"], "host_root", false),
            ("check", &["--facts", "f.json"], "cuda", false),
            ("check", &["--facts", "f.json"], "nodes", true),
            ("check", &["--facts", "f.json"], "image", true),
            ("check", &["--facts", "f.json"], "ignore", true),
            ("doctor", &["--facts", "f.json"], "nvml_lib", false),
            ("init", &["--facts", "f.json"], "verbs_lib", false),
            ("init", &["--facts", "f.json"], "report", true),
            ("serve", &["--facts", "f.json"], "verbs_lib", false),
            ("serve", &["--facts", "f.json"], "nvml_lib", true),
            ("serve", &["--facts", "f.json"], "timeout", true),
        ];
        for (name, context, flag, read) in cases {
            let got = verdict(&mode(name), context, flag);
            assert_eq!(got.is_ok(), *read, "{name} {context:?} {flag}: {got:?}");
        }
    }

    /// A flag a mode never reads is left out of its help; the others stay.
    #[test]
    fn help_leaves_out_what_a_mode_never_reads() {
        let command = super::super::command();
        let shown = |mode: &str, flag: &str| {
            let m = command.find_subcommand(mode).unwrap();
            !m.get_arguments()
                .find(|a| a.get_id() == flag)
                .unwrap()
                .is_hide_set()
        };
        assert!(!shown("probe", "cuda"));
        assert!(!shown("serve", "format"));
        assert!(!shown("bench", "memreg_size"));
        assert!(shown("check", "cuda"));
        assert!(shown("bench", "nccl_lib"));
        // Read only under --gang: still offered, under its own heading.
        assert!(shown("init", "gang_timeout"));
    }

    /// docs/reference.md lists the rules as they are.
    #[test]
    fn docs_reference_md_carries_the_table() {
        let docs =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference.md"))
                .unwrap();
        let table = markdown();
        assert!(docs.contains(&table), "docs/reference.md lacks:\n{table}");
    }
}
