//! The files NCCL reads besides the environment: its settings files (every one some
//! NCCL release would open here: `$NCCL_CONF_FILE`, `~/.nccl.conf` by `$HOME` and by
//! the passwd entry, `/etc/nccl.conf`; src/misc/param.cc initEnv) and the XML files its
//! variables name (NCCL_TOPO_FILE, else NCCL's default topology file; NCCL_GRAPH_FILE).
//! The settings files are applied to `nccl_env` as the loaded NCCL applies them
//! (`crate::nccl::conf_file`), so every check reads a variable where NCCL would; the
//! named files are looked up after that, since a settings file may set the variable.

use super::environment::named_file_path;
use super::host::Host;
use crate::facts::{Facts, ImageRole, NamedFile, NcclFiles, Observed, ReadFile};
use crate::nccl::conf_file::{self, ETC_CONF, Homes};
use std::path::Path;

/// The topology NCCL loads when NCCL_TOPO_FILE is unset (src/graph/topo.cc
/// ncclTopoGetSystem, v2.28.9-1): read only when it exists.
const DEFAULT_TOPO_FILE: &str = "/var/run/nvidia-topologyd/virtualTopology.xml";

fn read(host: &Host, path: &str) -> ReadFile {
    let (text, not_utf8) = match host.read_bytes(path) {
        Ok(None) => (Observed::Value(None), false),
        Ok(Some(bytes)) => match String::from_utf8(bytes) {
            Ok(t) => (Observed::Value(Some(t)), false),
            Err(e) => (
                Observed::Value(Some(String::from_utf8_lossy(e.as_bytes()).into_owned())),
                true,
            ),
        },
        Err(e) => (Observed::Error(e), false),
    };
    ReadFile {
        path: path.to_string(),
        text,
        not_utf8,
    }
}

/// The home directory of the real uid in `/etc/passwd` (NSS sources beyond the file are
/// not consulted); `None` when the uid has no entry or no passwd file exists.
fn passwd_home(host: &Host) -> Observed<Option<String>> {
    let uid = host.parse_required("/proc/self/status", |text| {
        text.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|f| f.split_whitespace().next()?.parse::<u32>().ok())
            .ok_or_else(|| "no Uid line".to_string())
    });
    let uid = match uid {
        Observed::Value(u) => u,
        Observed::Error(e) => return Observed::Error(e),
    };
    match host.read("/etc/passwd") {
        Ok(text) => Observed::Value(text.and_then(|t| {
            t.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 6 && f[2].parse() == Ok(uid)).then(|| f[5].to_string())
            })
        })),
        Err(e) => Observed::Error(e),
    }
}

/// Reads the settings files and applies them to `facts.nccl_env` for the NCCL the
/// facts say the trainer loads (the newest rules when none was found), then reads the
/// files the variables name. `home`: this process's `$HOME`. In nccl-preflight's own
/// image the files are not the trainer's and nothing is read.
pub fn gather(host: &Host, facts: &mut Facts, home: Option<&str>, working_dir: &Path) {
    if facts.image == ImageRole::Own {
        return;
    }
    let passwd = passwd_home(host);
    let passwd = passwd.value().and_then(|h| h.as_deref());
    let conf_var = facts
        .nccl_env
        .get("NCCL_CONF_FILE")
        .filter(|v| !v.value.is_empty())
        .map(|v| named_file_path(&v.value, working_dir));
    let homes = [home, passwd].map(|h| h.map(|dir| format!("{dir}/.nccl.conf")));
    let mut conf: Vec<ReadFile> = conf_var.iter().map(|p| read(host, p)).collect();
    for path in homes.iter().flatten().chain([&ETC_CONF.to_string()]) {
        if conf.iter().any(|f| &f.path == path) {
            continue;
        }
        let file = read(host, path);
        if file.text != Observed::Value(None) {
            conf.push(file);
        }
    }
    let found = |h: &Option<String>| {
        h.as_ref()
            .is_some_and(|p| conf.iter().any(|f| &f.path == p))
    };
    let rules = conf_file::rules(crate::nccl::version(facts));
    let opened = conf_file::files_read(conf_var.as_deref(), &Homes { env: home, passwd }, rules);
    let files: Vec<conf_file::ReadFile> = opened
        .iter()
        .filter_map(|p| conf.iter().find(|f| &f.path == p))
        .map(|f| conf_file::ReadFile {
            path: &f.path,
            text: f.text.value().and_then(|t| t.as_deref()),
        })
        .collect();
    facts.nccl_env = conf_file::effective(
        &facts.nccl_env,
        &files,
        rules,
        super::environment::is_fabric_var,
    );
    let named = named_files(host, facts, working_dir);
    facts.nccl_files = NcclFiles {
        home: home.filter(|_| found(&homes[0])).map(str::to_string),
        passwd_home: passwd.filter(|_| found(&homes[1])).map(str::to_string),
        conf,
        named,
        params: None,
    };
}

/// NCCL_TOPO_FILE (or the default topology file, when it exists) and NCCL_GRAPH_FILE.
fn named_files(host: &Host, facts: &Facts, working_dir: &Path) -> Vec<NamedFile> {
    let mut out = Vec::new();
    for variable in ["NCCL_TOPO_FILE", "NCCL_GRAPH_FILE"] {
        if let Some(v) = facts.nccl_env.get(variable) {
            out.push(NamedFile {
                variable: Some(variable.to_string()),
                value: v.value.clone(),
                file: read(host, &named_file_path(&v.value, working_dir)),
            });
        } else if variable == "NCCL_TOPO_FILE" {
            let file = read(host, DEFAULT_TOPO_FILE);
            if file.text != Observed::Value(None) {
                out.push(NamedFile {
                    variable: None,
                    value: DEFAULT_TOPO_FILE.to_string(),
                    file,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::EnvValue;
    use crate::test_facts::healthy;
    use std::fs;

    fn root(files: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nccl-files-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path.trim_start_matches('/'));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn files_are_applied_for_the_loaded_nccl_and_named_files_read_after() {
        let dir = root(&[
            (
                "/proc/self/status",
                "Name:\tx\nUid:\t1000\t1000\t1000\t1000\n",
            ),
            (
                "/etc/passwd",
                "root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\n",
            ),
            ("/home/u/.nccl.conf", "NCCL_ALGO=Ring\n"),
            ("/home/env/.nccl.conf", "NCCL_ALGO=Tree\n"),
            ("/job/n.conf", "NCCL_TOPO_FILE=/job/topo.xml\n"),
            (
                "/etc/nccl.conf",
                "NCCL_PROTO=Simple\nNCCL_SOCKET_IFNAME=eth9\n",
            ),
            ("/job/topo.xml", "<system version=\"1\"></system>\n"),
        ]);
        let host = Host::new(&dir);
        let mut f = crate::test_facts::with_env(healthy(), &[("NCCL_SOCKET_IFNAME", "=eth0")]);
        // healthy() loads NCCL 2.28.9: the passwd home, not $HOME.
        gather(&host, &mut f, Some("/home/env"), Path::new("/"));
        assert_eq!(f.nccl_env["NCCL_ALGO"].value, "Ring");
        assert_eq!(
            f.nccl_env["NCCL_ALGO"].source(),
            "/home/u/.nccl.conf line 1"
        );
        assert_eq!(f.nccl_env["NCCL_SOCKET_IFNAME"], EnvValue::text("=eth0"));
        assert_eq!(f.nccl_env["NCCL_PROTO"].value, "Simple");
        assert_eq!(
            f.nccl_files
                .conf
                .iter()
                .map(|c| c.path.as_str())
                .collect::<Vec<_>>(),
            [
                "/home/env/.nccl.conf",
                "/home/u/.nccl.conf",
                "/etc/nccl.conf"
            ]
        );
        // NCCL_CONF_FILE (2.23 and later) replaces ~/.nccl.conf and may set NCCL_TOPO_FILE.
        let mut f = crate::test_facts::with_env(healthy(), &[("NCCL_CONF_FILE", "n.conf")]);
        gather(&host, &mut f, Some("/home/env"), Path::new("/job"));
        assert!(!f.nccl_env.contains_key("NCCL_ALGO"));
        assert_eq!(f.nccl_env["NCCL_TOPO_FILE"].value, "/job/topo.xml");
        let topo = &f.nccl_files.named[0];
        assert_eq!(topo.variable.as_deref(), Some("NCCL_TOPO_FILE"));
        assert!(
            topo.file
                .text
                .value()
                .unwrap()
                .as_deref()
                .unwrap()
                .starts_with("<system")
        );
        // The own image reads nothing.
        let mut own = healthy();
        own.image = ImageRole::Own;
        gather(&host, &mut own, Some("/home/env"), Path::new("/"));
        assert!(own.nccl_files.is_empty());
        // Nothing there: nothing recorded.
        let empty = root(&[]);
        let mut none = healthy();
        gather(
            &Host::new(&empty),
            &mut none,
            Some("/home/env"),
            Path::new("/"),
        );
        assert!(none.nccl_files.is_empty(), "{:?}", none.nccl_files);
        let _ = fs::remove_dir_all(&dir);
    }
}
