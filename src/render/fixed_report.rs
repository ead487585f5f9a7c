//! One fixed report for renderer tests: a failing dev-shm, a warning, a pass,
//! one tuned and one user setting.

use crate::finding::Finding;
use crate::report::Report;
use crate::test_facts;
use crate::tune::{Setting, Source};

pub fn report() -> Report {
    let checks = vec![
        Finding::fail(
            "dev-shm",
            "/dev/shm is 64 MiB, below the 1 GiB minimum",
            "Mount a memory-backed emptyDir at /dev/shm:\n  emptyDir:\n    medium: Memory",
        )
        .evidence("size 64 MiB, free 64 MiB, required 1 GiB"),
        Finding::warn(
            "memlock",
            "memlock 8 MiB is below the required unlimited",
            "Grant CAP_IPC_LOCK",
        )
        .evidence("RLIMIT_MEMLOCK soft 8 MiB, hard 8 MiB"),
        Finding::pass("host-ipc", "host IPC namespace"),
    ];
    let settings = vec![
        Setting {
            name: "NCCL_DEBUG".into(),
            value: "INFO".into(),
            reason: "set by the user; kept as is and checked by nccl-env".into(),
            source: Source::User,
        },
        Setting {
            name: "NCCL_SOCKET_IFNAME".into(),
            value: "=eth0".into(),
            reason: "eth0 carries the default route (IPv4, metric 0)".into(),
            source: Source::Tuned,
        },
    ];
    let facts = test_facts::healthy();
    let prediction = crate::predict::predict(&facts);
    Report::new(facts, prediction, checks, settings)
}
