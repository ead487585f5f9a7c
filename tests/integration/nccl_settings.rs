//! NCCL's settings files against real NCCL (every cached PyPI build, no GPU): in a mount
//! namespace of its own, with /etc a copy whose passwd gives uid 0 a home of the test's,
//! that home, `$HOME`, `/etc/nccl.conf` and an NCCL_CONF_FILE each set
//! NCCL_SOCKET_IFNAME to a value of their own, and real
//! NCCL's ncclGetUniqueId prints which one it read (`NCCL_SOCKET_IFNAME set by
//! environment to X`, src/misc/socket.cc ncclFindInterfaces). `nccl-preflight facts
//! --nccl-lib` with that build, in the same namespace and environment, must give the
//! same value, from the same file. The expected winner per release range is written
//! from src/misc/param.cc (and src/include/param.h before 2.12) before either ran.

use super::bounded::output_within;
use super::nccl_oracle::{nccl_builds, oracle_driver};
use super::support::*;
use nccl_preflight::nccl::Version;
use std::path::Path;
use std::process::Command;

/// Which source NCCL takes NCCL_SOCKET_IFNAME from, by release.
#[derive(Debug, Clone, Copy)]
struct Expect {
    /// 2.13 - 2.22: ~/.nccl.conf is the passwd home's, NCCL_CONF_FILE unread.
    before_2_23: Option<&'static str>,
    /// 2.23 - 2.29: NCCL_CONF_FILE replaces ~/.nccl.conf; CR kept.
    before_2_30: Option<&'static str>,
    /// 2.30 and later: ~/.nccl.conf is $HOME's; CR cut.
    newest: Option<&'static str>,
}

struct Case {
    name: &'static str,
    /// `/root/.nccl.conf`, `$HOME/.nccl.conf`, `/etc/nccl.conf`, the NCCL_CONF_FILE file.
    passwd: &'static str,
    home: &'static str,
    etc: &'static str,
    conf: Option<&'static str>,
    env: Option<&'static str>,
    expect: Expect,
}

const fn all(v: Option<&'static str>) -> Expect {
    Expect {
        before_2_23: v,
        before_2_30: v,
        newest: v,
    }
}

const LINE: &str = "NCCL_SOCKET_IFNAME=";

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "homes and /etc",
            passwd: "NCCL_SOCKET_IFNAME=pwd0\n",
            home: "NCCL_SOCKET_IFNAME=home0\n",
            etc: "NCCL_SOCKET_IFNAME=etc0\n",
            conf: None,
            env: None,
            expect: Expect {
                before_2_23: Some("pwd0"),
                before_2_30: Some("pwd0"),
                newest: Some("home0"),
            },
        },
        Case {
            name: "NCCL_CONF_FILE",
            passwd: "NCCL_SOCKET_IFNAME=pwd0\n",
            home: "NCCL_SOCKET_IFNAME=home0\n",
            etc: "NCCL_SOCKET_IFNAME=etc0\n",
            conf: Some("NCCL_SOCKET_IFNAME=conf0\n"),
            env: None,
            expect: Expect {
                before_2_23: Some("pwd0"),
                before_2_30: Some("conf0"),
                newest: Some("conf0"),
            },
        },
        Case {
            name: "the environment wins",
            passwd: "NCCL_SOCKET_IFNAME=pwd0\n",
            home: "",
            etc: "NCCL_SOCKET_IFNAME=etc0\n",
            conf: Some("NCCL_SOCKET_IFNAME=conf0\n"),
            env: Some("envx0"),
            expect: all(Some("envx0")),
        },
        Case {
            name: "only /etc/nccl.conf",
            passwd: "NCCL_DEBUG_SUBSYS=INIT,ENV\n",
            home: "",
            etc: "NCCL_SOCKET_IFNAME=etc0\n",
            conf: None,
            env: None,
            expect: all(Some("etc0")),
        },
        Case {
            name: "a Windows line end",
            passwd: "NCCL_SOCKET_IFNAME=pwd0\r\n",
            home: "NCCL_SOCKET_IFNAME=home0\r\n",
            etc: "",
            conf: None,
            env: None,
            expect: Expect {
                before_2_23: Some("pwd0\r"),
                before_2_30: Some("pwd0\r"),
                newest: Some("home0"),
            },
        },
        Case {
            name: "comments, blanks, quotes, repeats",
            passwd: "#NCCL_SOCKET_IFNAME=cmt0\nNCCL_SOCKET_IFNAME = blank0\nNCCL_SOCKET_IFNAME=\"pwd0\"\nNCCL_SOCKET_IFNAME=again0\n",
            home: "#NCCL_SOCKET_IFNAME=cmt0\nNCCL_SOCKET_IFNAME = blank0\nNCCL_SOCKET_IFNAME='home0'\nNCCL_SOCKET_IFNAME=again0\n",
            etc: "",
            conf: None,
            env: None,
            expect: Expect {
                before_2_23: Some("\"pwd0\""),
                before_2_30: Some("\"pwd0\""),
                newest: Some("'home0'"),
            },
        },
        Case {
            name: "blanks only: not set",
            passwd: "NCCL_SOCKET_IFNAME = blank0\n",
            home: "export NCCL_SOCKET_IFNAME=blank0\n",
            etc: "",
            conf: None,
            env: None,
            expect: all(None),
        },
        Case {
            name: "NCCL_CONF_FILE names no file",
            passwd: "NCCL_SOCKET_IFNAME=pwd0\n",
            home: "NCCL_SOCKET_IFNAME=home0\n",
            etc: "NCCL_SOCKET_IFNAME=etc0\n",
            conf: Some(""),
            env: None,
            expect: Expect {
                before_2_23: Some("pwd0"),
                before_2_30: Some("etc0"),
                newest: Some("etc0"),
            },
        },
    ]
}

fn expected(case: &Case, v: Version) -> Option<&'static str> {
    if v < Version::new(2, 23, 0) {
        case.expect.before_2_23
    } else if v < Version::new(2, 30, 0) {
        case.expect.before_2_30
    } else {
        case.expect.newest
    }
}

/// `cmd` run by `unshare -m` with `etc` (the copy) bound over /etc: nothing outside the
/// namespace sees it.
fn in_namespace(etc: &Path, program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "sh",
        "-c",
        "mount --bind \"$ETC\" /etc && exec \"$@\"",
        "sh",
    ])
    .arg(program)
    .args(args)
    .env_clear()
    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    .env("ETC", etc);
    cmd
}

/// The case's files: the passwd home's and $HOME's .nccl.conf, /etc/nccl.conf in the copy.
fn write_case(dir: &Path, etc: &Path, pwhome: &Path, case: &Case) {
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::write(pwhome.join(".nccl.conf"), case.passwd).unwrap();
    std::fs::write(dir.join("home/.nccl.conf"), case.home).unwrap();
    std::fs::write(etc.join("nccl.conf"), case.etc).unwrap();
    if let Some(conf) = case.conf.filter(|c| !c.is_empty()) {
        std::fs::write(dir.join("job.conf"), conf).unwrap();
    }
}

/// The case's variables: HOME, NCCL_CONF_FILE (a missing file when the case's is empty).
fn case_env(dir: &Path, case: &Case) -> Vec<(String, String)> {
    let mut env = vec![("HOME".to_string(), dir.join("home").display().to_string())];
    if let Some(conf) = case.conf {
        let name = if conf.is_empty() {
            "absent.conf"
        } else {
            "job.conf"
        };
        env.push((
            "NCCL_CONF_FILE".into(),
            dir.join(name).display().to_string(),
        ));
    }
    if let Some(v) = case.env {
        env.push(("NCCL_SOCKET_IFNAME".into(), v.into()));
    }
    env
}

/// The value NCCL printed for NCCL_SOCKET_IFNAME (the line up to `\n`, a `\r` kept).
fn nccl_read(lib: &Path, dir: &Path, etc: &Path, env: &[(String, String)]) -> Option<String> {
    let cases = dir.join("oracle-cases");
    std::fs::write(&cases, "--\n").unwrap();
    let lib = lib.display().to_string();
    let cases = cases.display().to_string();
    let mut cmd = in_namespace(etc, oracle_driver(), &[&lib, &cases]);
    // 2.13 keeps NCCL_ENV lines out of its default subsystems.
    cmd.env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "ALL")
        .envs(env.iter().cloned());
    let out = output_within(&mut cmd, "nccl_oracle in a mount namespace");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let marker = "NCCL_SOCKET_IFNAME set by environment to ";
    text.split('\n')
        .find_map(|l| l.split_once(marker).map(|(_, v)| v.to_string()))
}

/// The value and source `nccl-preflight facts` gives NCCL_SOCKET_IFNAME there.
fn tool_read(
    lib: &Path,
    etc: &Path,
    env: &[(String, String)],
) -> (Option<String>, serde_json::Value) {
    let lib = lib.display().to_string();
    let args = ["facts", "--cuda", "off", "--nccl-lib", &lib];
    let mut cmd = in_namespace(etc, Path::new(BIN), &args);
    cmd.envs(NO_GPU_LIBS).envs(env.iter().cloned());
    let out = output_within(&mut cmd, "nccl-preflight facts in a mount namespace");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let v = &facts["nccl_env"]["NCCL_SOCKET_IFNAME"];
    (v["value"].as_str().map(str::to_string), v["from"].clone())
}

#[test]
fn settings_files_are_read_where_and_as_each_real_nccl_reads_them() {
    let test = "settings_files_are_read_where_and_as_each_real_nccl_reads_them";
    if !require_root(test) || !require_tools(test, &["unshare", "mount"]) {
        return;
    }
    let Some(builds) = nccl_builds(test) else {
        return;
    };
    let scratch = scratch("nccl-settings-oracle");
    let etc = scratch.join("etc");
    let copied = Command::new("cp")
        .args(["-a", "/etc"])
        .arg(&etc)
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", stderr(&copied));
    // uid 0's home (getpwuid, what NCCL before 2.30 reads) becomes the test's.
    let pwhome = scratch.join("pwhome");
    std::fs::create_dir_all(&pwhome).unwrap();
    let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
    let passwd: Vec<String> = passwd
        .lines()
        .map(|l| {
            let mut f: Vec<&str> = l.split(':').collect();
            let home = pwhome.display().to_string();
            if f.len() >= 6 && f[2] == "0" {
                f[5] = &home;
                return f.join(":");
            }
            l.to_string()
        })
        .collect();
    std::fs::write(etc.join("passwd"), passwd.join("\n") + "\n").unwrap();
    let pwconf = pwhome.join(".nccl.conf").display().to_string();
    let mut checked = 0;
    for (k, case) in cases().iter().enumerate() {
        let dir = scratch.join(format!("case-{k}"));
        write_case(&dir, &etc, &pwhome, case);
        let env = case_env(&dir, case);
        for (version, lib) in &builds {
            let want = expected(case, *version).map(str::to_string);
            let nccl = nccl_read(lib, &dir, &etc, &env);
            assert_eq!(nccl, want, "{} on NCCL {version:?}: NCCL read", case.name);
            let (tool, from) = tool_read(lib, &etc, &env);
            assert_eq!(
                tool, nccl,
                "{} on NCCL {version:?}: the tool read {from}",
                case.name
            );
            // A value from a file names the file and the line that hold it.
            if let (Some(v), Some(path)) = (&tool, from["path"].as_str()) {
                let text = match path {
                    "/etc/nccl.conf" => case.etc,
                    p if p == pwconf => case.passwd,
                    p if p.ends_with("/home/.nccl.conf") => case.home,
                    _ => case.conf.unwrap_or(""),
                };
                let line = from["line"].as_u64().unwrap() as usize;
                let held = text.split('\n').nth(line - 1).unwrap_or("");
                // 2.30 cuts the line's carriage return: the value then lacks it.
                assert_eq!(
                    held.trim_end_matches('\r'),
                    format!("{LINE}{}", v.trim_end_matches('\r')),
                    "{}: {from}",
                    case.name
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, cases().len() * builds.len());
    std::fs::remove_dir_all(&scratch).unwrap();
}
