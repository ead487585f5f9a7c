//! What a difference in one NCCL variable between the pods of a job can change,
//! derived from where NCCL reads it (`readers.tsv`, generated with variables.tsv by
//! `scripts/gen-nccl-vars.py`: every `path:function` of each release that reads the
//! variable). The judgement is made per reader, from NCCL's own code: a reader in
//! NCCL's logger, its RAS monitor, the profiler and NVTX hooks or a dump writer only
//! observes; a reader that describes this rank or its host to its peers reads
//! something each pod has of its own; every other reader feeds what NCCL decides
//! (algorithms, protocols, transports, channels, buffers, plugins, interfaces), and
//! ranks that decide differently hang or fail. A variable is as strict as its
//! strictest reader, so one decision reader makes it a decision.

use super::Version;
use super::catalog::Catalog;

const TABLE: &str = include_str!("readers.tsv");

/// What a difference in a variable between pods can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// It feeds a decision every rank must make alike: differing values fail the job.
    Decision,
    /// Only logging, tracing or monitoring reads it (`reader` says where): a note.
    Observe { reader: String },
    /// It describes the pod or its host, so it differs by nature (`reader`): not compared.
    PerPod { reader: String },
    /// This NCCL defines or knows the name but does not read it: nothing changes.
    Unread,
    /// Where it is read is not known (not NCCL's, a release newer than the table, or
    /// a name first seen in a release binary).
    Unknown,
}

/// Readers that only observe: NCCL's logger and thread names (src/debug.cc
/// `ncclDebugInit`, `ncclSetThreadName`), RAS, which watches the communicator from
/// outside it (src/ras/, on by default since 2.24), the profiler plugin's loader and
/// the profilers NCCL ships (src/plugin/profiler.cc, ext-profiler/, plugins/profiler/:
/// a profiler receives events, it decides nothing), NVTX ranges (src/init_nvtx.cc,
/// src/include/nvtx.h).
const OBSERVERS: &[&str] = &[
    "src/debug.cc:",
    "src/ras/",
    "src/plugin/profiler",
    "ext-profiler/",
    "plugins/profiler/",
    "src/init_nvtx.cc:",
    "src/include/nvtx.h:",
];

/// Readers of what a pod has of its own: `fillInfo` (src/init.cc) fills this rank's
/// peer info, which every rank sends to the others as its own description (MNNVL
/// fabric UUID and clique); `getHostHash` (src/misc/utils.cc) the host's identity
/// (NCCL_HOSTID); the proxy thread's CPU set (src/proxy.cc `proxyCpusetOnceFunc`) and
/// the CPU affinity (src/graph/topo.cc `ncclTopoGetCpuAffinity`), in this node's CPU
/// numbering; the size of this process's thread stacks (src/init.cc, later
/// src/os/linux.cc, `setCpuStackSize`).
const PER_POD: &[&str] = &[
    "src/init.cc:fillInfo",
    "src/misc/utils.cc:getHostHash",
    "src/proxy.cc:proxyCpuset",
    "src/graph/topo.cc:ncclTopoGetCpuAffinity",
    "src/init.cc:setCpuStackSize",
    "src/os/linux.cc:setCpuStackSize",
];

/// One row: `name` is read by `readers` from `first` to `last`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadRow {
    name: String,
    first: Version,
    last: Version,
    readers: Vec<String>,
}

/// The readers of every variable, as the table compiled in says.
pub struct Readers(Vec<ReadRow>);

impl Readers {
    pub fn embedded() -> Readers {
        Readers(parse(TABLE))
    }
}

/// The table's rows; a malformed line is skipped (a test holds that there are none).
fn parse(text: &str) -> Vec<ReadRow> {
    let version = |s: &str| Version::parse(s);
    text.lines()
        .filter(|l| l.starts_with("read\t"))
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            Some(ReadRow {
                name: f.get(1)?.to_string(),
                first: version(f.get(2)?)?,
                last: version(f.get(3)?)?,
                readers: f
                    .get(4)?
                    .split(',')
                    .filter(|r| !r.is_empty())
                    .map(String::from)
                    .collect(),
            })
        })
        .collect()
}

/// What one reader does with the value.
fn reader_role(reader: &str) -> Role {
    let observer = OBSERVERS.iter().any(|p| reader.starts_with(p))
        // A value stored into a dump variable, or read by a dump writer
        // (src/graph/search.cc `ncclTopoDumpGraphs`), names a file NCCL writes.
        || reader.ends_with(":dump")
        || reader.rsplit(':').next().is_some_and(|f| f.contains("Dump"));
    if observer {
        Role::Observe {
            reader: reader.to_string(),
        }
    } else if PER_POD.iter().any(|p| reader.starts_with(p)) {
        Role::PerPod {
            reader: reader.to_string(),
        }
    } else {
        Role::Decision
    }
}

/// The role of a variable its readers give: the strictest of them.
fn of_readers(readers: &[String]) -> Role {
    let roles: Vec<Role> = readers.iter().map(|r| reader_role(r)).collect();
    if roles.is_empty() {
        return Role::Unread;
    }
    if roles.contains(&Role::Decision) {
        return Role::Decision;
    }
    roles
        .iter()
        .find(|r| matches!(r, Role::PerPod { .. }))
        .or(roles.first())
        .cloned()
        .unwrap_or(Role::Unread)
}

/// What a difference in `name` between pods can do under NCCL `version` (None:
/// not known, read as the newest release). Names outside NCCL's (FI_*, OFI_NCCL_*:
/// libfabric's and the net plugin's) are unknown here.
pub fn role(readers: &Readers, catalog: &Catalog, name: &str, version: Option<Version>) -> Role {
    let v = match version {
        Some(v) if v > catalog.latest() => return Role::Unknown,
        Some(v) => v,
        None => catalog.latest(),
    };
    let known = !matches!(
        catalog.lookup(name, Some(v)),
        super::catalog::Lookup::Unknown
    );
    match readers
        .0
        .iter()
        .find(|r| r.name == name && catalog.covers(r.first, r.last, v))
    {
        Some(row) => of_readers(&row.readers),
        // In the table for this version but read nowhere we can see: a name first
        // found in a release binary.
        None if matches!(
            catalog.lookup(name, Some(v)),
            super::catalog::Lookup::Reads(_)
        ) =>
        {
            Role::Unknown
        }
        None if known || name.starts_with("NCCL_") => Role::Unread,
        None => Role::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cat() -> Catalog {
        Catalog::embedded().unwrap()
    }

    fn role(c: &Catalog, name: &str, v: Option<Version>) -> Role {
        super::role(&Readers::embedded(), c, name, v)
    }

    #[test]
    fn every_line_of_the_table_parses() {
        let lines = TABLE.lines().filter(|l| !l.starts_with('#')).count();
        let rows = Readers::embedded().0;
        assert_eq!(rows.len(), lines);
        assert!(rows.len() > 400, "{}", rows.len());
    }

    /// Expected roles written from NCCL's source (v2.28.9-1) before the table was
    /// read: the logger's variables, RAS's address and a dump file observe; the host
    /// id and the MNNVL UUID are a pod's own; what tunes, chooses transports,
    /// channels, buffers, interfaces or plugins is a decision.
    #[test]
    fn roles_follow_the_source() {
        let c = cat();
        let v = Some(Version::new(2, 28, 9));
        let observe = [
            "NCCL_DEBUG",
            "NCCL_DEBUG_SUBSYS",
            "NCCL_DEBUG_FILE",
            "NCCL_DEBUG_TIMESTAMP_FORMAT",
            "NCCL_SET_THREAD_NAME",
            "NCCL_RAS_ADDR",
            "NCCL_PROFILER_PLUGIN",
            "NCCL_TOPO_DUMP_FILE",
            "NCCL_GRAPH_DUMP_FILE",
            "NCCL_NVTX_DISABLE",
        ];
        for name in observe {
            assert!(
                matches!(role(&c, name, v), Role::Observe { .. }),
                "{name}: {:?}",
                role(&c, name, v)
            );
        }
        for name in [
            "NCCL_HOSTID",
            "NCCL_MNNVL_UUID",
            "NCCL_PROXY_CPUSET",
            "NCCL_IGNORE_CPU_AFFINITY",
        ] {
            assert!(
                matches!(role(&c, name, v), Role::PerPod { .. }),
                "{name}: {:?}",
                role(&c, name, v)
            );
        }
        for name in [
            "NCCL_ALGO",
            "NCCL_PROTO",
            "NCCL_P2P_DISABLE",
            "NCCL_SHM_DISABLE",
            "NCCL_NET",
            "NCCL_NET_PLUGIN",
            "NCCL_IB_HCA",
            "NCCL_SOCKET_IFNAME",
            "NCCL_MIN_NCHANNELS",
            "NCCL_MAX_NCHANNELS",
            "NCCL_BUFFSIZE",
            "NCCL_P2P_NET_CHUNKSIZE",
            "NCCL_NET_GDR_LEVEL",
            "NCCL_CROSS_NIC",
            "NCCL_TUNER_PLUGIN",
            "NCCL_COMM_ID",
        ] {
            assert_eq!(role(&c, name, v), Role::Decision, "{name}");
        }
        // Defined and never read at that release.
        assert_eq!(role(&c, "NCCL_GRAPH_HELPER_DISABLE", v), Role::Unread);
        // Not a name 2.28.9 reads (2.5's), nor NCCL's at all.
        assert_eq!(role(&c, "NCCL_NO_SUCH_THING", v), Role::Unread);
        assert_eq!(role(&c, "FI_PROVIDER", v), Role::Unknown);
        // Newer than the table: not guessed.
        assert_eq!(
            role(&c, "NCCL_DEBUG", Some(Version::new(2, 99, 0))),
            Role::Unknown
        );
    }

    /// Cases not used to write the rules, expected from the source first: NCCL 2.30's
    /// parameter API moved the logger's variables to DEFINE_NCCL_PARAM in
    /// src/debug.cc (still observers); WARN_ENABLE_DEBUG_INFO turns the log level up
    /// after a WARN (src/debug.cc: an observer); NCCL_SOCKET_NTHREADS sizes the socket
    /// transport's threads (src/transport/net_socket.cc: a decision).
    #[test]
    fn roles_hold_in_releases_the_rules_were_not_written_from() {
        let c = cat();
        for v in [
            Version::new(2, 30, 7),
            Version::new(2, 32, 3),
            Version::new(2, 21, 5),
        ] {
            for name in ["NCCL_DEBUG", "NCCL_WARN_ENABLE_DEBUG_INFO"] {
                assert!(
                    matches!(role(&c, name, Some(v)), Role::Observe { .. }),
                    "{name} {v:?}: {:?}",
                    role(&c, name, Some(v))
                );
            }
            assert_eq!(
                role(&c, "NCCL_SOCKET_NTHREADS", Some(v)),
                Role::Decision,
                "{v:?}"
            );
        }
    }

    /// Every variable of every release in the table has a role from its readers;
    /// only names first seen in a release binary (no source to read) are unknown.
    /// Prints the count per role for the newest release.
    #[test]
    fn every_known_variable_has_a_role() {
        let c = cat();
        for &tag in &c.tags {
            let mut counts = std::collections::BTreeMap::new();
            let mut names: Vec<&str> = c
                .vars
                .iter()
                .filter(|r| r.first <= tag && tag <= r.last)
                .map(|r| r.name.as_str())
                .collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                let r = role(&c, name, Some(tag));
                if r == Role::Unknown {
                    // Only a release read from its binary has names with no reader.
                    assert!(tag >= Version::new(2, 31, 0), "{name} at {tag:?}");
                }
                let key = match r {
                    Role::Decision => "decision",
                    Role::Observe { .. } => "observe",
                    Role::PerPod { .. } => "per-pod",
                    Role::Unread => "unread",
                    Role::Unknown => "unknown",
                };
                *counts.entry(key).or_insert(0) += 1;
            }
            if tag == c.latest() || tag == Version::new(2, 28, 9) {
                println!("roles at {tag:?}: {counts:?}");
            }
        }
    }
}
