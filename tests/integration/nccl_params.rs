//! NCCL's parameter API (2.30 and later) on every cached wheel that has it, without a
//! GPU: `nccl-preflight facts --nccl-lib` asks it in a child (`nccl-params-child`). The
//! static variable table (src/nccl/variables.tsv) must read every key the API lists for
//! that release, typed `bool` exactly where NCCL's type is bool; a value set in
//! `~/.nccl.conf` must be NCCL's own (set_by EnvPlugin) and the tool's from that file;
//! and a value NCCL's parser refuses is reported by the nccl-env check.

use super::bounded::output_within;
use super::nccl_oracle::nccl_builds;
use super::support::*;
use nccl_preflight::nccl::Version;
use nccl_preflight::nccl::catalog::{Catalog, Kind, Lookup};

fn run_with(args: &[&str], lib: &str, home: &std::path::Path) -> std::process::Output {
    let mut all = args.to_vec();
    all.extend(["--cuda", "off", "--nccl-lib", lib]);
    let mut cmd = command(&all, &NO_GPU_LIBS);
    cmd.env("HOME", home)
        // NCCL's bool parser refuses "yes": the parameter keeps its default.
        .env("NCCL_WARN_ENABLE_DEBUG_INFO", "yes");
    output_within(&mut cmd, "nccl-preflight with a 2.30+ libnccl")
}

#[test]
fn the_parameter_api_of_every_2_30_and_later_wheel_agrees_with_the_static_table() {
    let test = "the_parameter_api_of_every_2_30_and_later_wheel_agrees_with_the_static_table";
    let Some(builds) = nccl_builds(test) else {
        return;
    };
    let catalog = Catalog::embedded().unwrap();
    let home = scratch("nccl-params-home");
    std::fs::write(home.join(".nccl.conf"), "NCCL_SET_THREAD_NAME=1\n").unwrap();
    let mut asked = 0;
    for (version, lib) in builds.iter().filter(|(v, _)| *v >= Version::new(2, 30, 0)) {
        let lib = lib.display().to_string();
        let out = run_with(&["facts"], &lib, &home);
        assert_eq!(out.status.code(), Some(0), "{version}: {}", stderr(&out));
        let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let params = facts["nccl_files"]["params"]["value"]
            .as_array()
            .unwrap_or_else(|| panic!("{version}: no parameters: {}", facts["nccl_files"]));
        assert!(params.len() >= 9, "{version}: {params:?}");
        for p in params {
            let key = p["key"].as_str().unwrap();
            let Lookup::Reads(row) = catalog.lookup(key, Some(*version)) else {
                panic!("{version}: NCCL's API lists {key}, the table does not read it");
            };
            let bool_type = p["type_name"] == "bool";
            assert_eq!(
                row.kind == Kind::Bool,
                bool_type,
                "{version}: {key} is {} to NCCL, {:?} in the table",
                p["type_name"],
                row.kind
            );
        }
        // Every bool of the table for this release is one NCCL lists as bool.
        for row in catalog
            .vars
            .iter()
            .filter(|r| r.kind == Kind::Bool && r.first <= *version && *version <= r.last)
        {
            assert!(
                params
                    .iter()
                    .any(|p| p["key"] == row.name.as_str() && p["type_name"] == "bool"),
                "{version}: the table's bool {} is not NCCL's",
                row.name
            );
        }
        // The file NCCL read is the one the tool says.
        let thread_name = params
            .iter()
            .find(|p| p["key"] == "NCCL_SET_THREAD_NAME")
            .unwrap();
        assert_eq!(thread_name["value"], "TRUE", "{version}");
        assert_eq!(thread_name["set_by"], "EnvPlugin", "{version}");
        let ours = &facts["nccl_env"]["NCCL_SET_THREAD_NAME"];
        assert_eq!(ours["value"], "1");
        assert_eq!(
            ours["from"]["path"],
            home.join(".nccl.conf").display().to_string().as_str()
        );
        // A value NCCL refused, reported from NCCL's own answer.
        let out = run_with(&["check", "--format", "json"], &lib, &home);
        let report = report(&out);
        let env = finding(&report, "nccl-env");
        let summary = env["summary"].as_str().unwrap();
        assert!(
            summary.contains("NCCL_WARN_ENABLE_DEBUG_INFO") && summary.contains("refused"),
            "{version}: {summary}"
        );
        asked += 1;
    }
    eprintln!("{test}: {asked} releases with a parameter API");
    assert!(
        asked > 0 || builds.iter().all(|(v, _)| *v < Version::new(2, 30, 0)),
        "no 2.30+ build asked"
    );
    std::fs::remove_dir_all(&home).unwrap();
}
