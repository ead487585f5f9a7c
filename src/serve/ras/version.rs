//! What each NCCL version's RAS can be asked, and what it must not be asked: read from
//! NVIDIA/nccl's src/ras/client_support.cc (`rasClientEventLoop`, the command parser)
//! and docs/.../troubleshooting/ras.rst at each tag, and from NCCL's issue tracker.

pub use crate::nccl::Version;

/// RAS first shipped in 2.24 (docs troubleshooting/ras.rst: "Since NCCL 2.24").
const FIRST_RAS: Version = Version::new(2, 24, 0);
/// `SET FORMAT json` is parsed from v2.28.7-1 (client_support.cc, "set format ").
const FIRST_JSON: Version = Version::new(2, 28, 7);
/// `MONITOR` is parsed from v2.29.2-1 (client_support.cc, "monitor"); ras.rst says 2.29.
const FIRST_MONITOR: Version = Version::new(2, 29, 0);
/// nccl#1669: a STATUS while a communicator is initialising can crash the process
/// (filed on 2.26.2). The fix, rasCollCommsInit skipping communicators whose
/// `peerInfoValid` is not yet set, is in v2.27.3-1's src/ras/collectives.cc.
const INIT_QUERY_SAFE: Version = Version::new(2, 27, 3);
/// nccl#1762: the status walk over communicators skipped the missing-rank records
/// (`comm + 1 + nRanks`, without `nMissingRanks`) from v2.26 (when missing ranks were
/// added) until v2.29.2-1 ("the fix was included in NCCL 2.29.2"); reported crashing
/// `VERBOSE STATUS` on 2.27.3.
const VERBOSE_UNSAFE_FROM: Version = Version::new(2, 26, 0);
const VERBOSE_SAFE_AGAIN: Version = Version::new(2, 29, 2);

/// The plan for a version not known yet: JSON asked for, and where refused, plain STATUS
/// under the init guard.
pub fn careful() -> Plan {
    Plan {
        json: true,
        monitor: false,
        verbose: false,
        init_guard: true,
        warnings: Vec::new(),
    }
}

/// What this watcher does with a given RAS server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Ask for JSON (`SET FORMAT json`), else parse the text reply. Where the server
    /// refuses it, the text reply is parsed.
    pub json: bool,
    /// Keep a `MONITOR` connection open for pushed peer events.
    pub monitor: bool,
    /// `VERBOSE STATUS` lists every outlier rank of a mismatch; only where it cannot crash.
    pub verbose: bool,
    /// Wait this long after RAS first answers before the first STATUS, and again after a
    /// reply showing a communicator still initialising (nccl#1669). Only where the
    /// server also refused JSON (every version with the crash is older than JSON).
    pub init_guard: bool,
    /// Hazards of this version that watching cannot avoid, for /job and the log.
    pub warnings: Vec<String>,
}

/// The plan for `version`, or why it cannot be watched. `None` (version not known yet):
/// ask for JSON anyway (a version before 2.28.7 answers `ERROR: Unknown command`, which
/// costs nothing), and where JSON is refused keep the init guard and plain STATUS; the
/// first reply names the version.
pub fn plan(version: Option<Version>) -> Result<Plan, String> {
    let Some(v) = version else {
        return Ok(careful());
    };
    if v < FIRST_RAS {
        return Err(format!(
            "NCCL {v} has no RAS (it came in 2.24): the running job cannot be watched; NCCL 2.28.7 or later is best (JSON replies)"
        ));
    }
    let mut warnings = Vec::new();
    if v < INIT_QUERY_SAFE {
        warnings.push(format!(
            "NCCL {v}: a RAS query while a communicator initialises can crash the process (nccl#1669, fixed in 2.27.3); queries wait until RAS has been up a while and no communicator is initialising"
        ));
    }
    if v == Version::new(2, 27, 7) {
        warnings.push(
            "NCCL 2.27.7: RAS itself can segfault the trainer without any query (nccl#1996); upgrade, or set NCCL_RAS_ENABLE=0 in the trainer and do not watch".into(),
        );
    }
    if (Version::new(2, 29, 0)..Version::new(2, 30, 0)).contains(&v) {
        warnings.push(format!(
            "NCCL {v}: RAS can segfault formatting a communicator that is still initialising on large jobs (nccl#2346, open)"
        ));
    }
    Ok(Plan {
        json: v >= FIRST_JSON,
        monitor: v >= FIRST_MONITOR,
        verbose: v < VERBOSE_UNSAFE_FROM || v >= VERBOSE_SAFE_AGAIN,
        init_guard: v < INIT_QUERY_SAFE,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_gets_the_commands_it_parses_and_none_that_crash_it() {
        let p = |s: &str| plan(Version::parse(s));
        assert!(p("2.23.4").unwrap_err().contains("no RAS"));
        let old = p("2.24.3").unwrap();
        assert_eq!(
            (old.json, old.monitor, old.verbose, old.init_guard),
            (false, false, true, true)
        );
        // nccl#1669 on 2.26.2 and nccl#1762 from 2.26 to 2.29.1.
        let crashy = p("2.26.2").unwrap();
        assert_eq!(
            (crashy.json, crashy.verbose, crashy.init_guard),
            (false, false, true)
        );
        assert!(crashy.warnings[0].contains("nccl#1669"));
        let v2273 = p("2.27.3").unwrap();
        assert_eq!((v2273.verbose, v2273.init_guard), (false, false));
        assert!(p("2.27.7").unwrap().warnings[0].contains("nccl#1996"));
        let json = p("2.28.9").unwrap();
        assert_eq!(
            (json.json, json.monitor, json.verbose),
            (true, false, false)
        );
        let monitor = p("2.29.2").unwrap();
        assert_eq!(
            (monitor.json, monitor.monitor, monitor.verbose),
            (true, true, true)
        );
        assert!(monitor.warnings[0].contains("nccl#2346"));
        assert!(p("2.30.7").unwrap().warnings.is_empty());
        // Unknown: the careful plan.
        let unknown = plan(None).unwrap();
        assert_eq!(
            (
                unknown.json,
                unknown.monitor,
                unknown.verbose,
                unknown.init_guard
            ),
            (true, false, false, true)
        );
    }
}
