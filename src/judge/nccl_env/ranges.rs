//! The rules NCCL applies to values at init, which pass without a word in its log
//! beyond an INFO line (NVIDIA/nccl v2.28.9-1 unless said):
//!
//! - NCCL_NTHREADS, NCCL_LL128_NTHREADS (src/graph/tuning.cc getNthreads): a value that
//!   is not a multiple of 32 becomes the maximum (512; 640 for LL128), one above the
//!   maximum the maximum, one below the minimum (64; 160) the minimum.
//! - NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS and their old names NCCL_MIN_NRINGS /
//!   NCCL_MAX_NRINGS (src/graph/connect.cc ncclMinNchannels, ncclMaxNchannels): capped at
//!   MAXCHANNELS (32 before 2.25, 64 from v2.25.1-1); a maximum below 1 is 1; the new
//!   name wins over the old; a minimum above the maximum wins (copyChannels duplicates
//!   channels up to it after the maximum's cut).
//! - NCCL_MIN_CTAS / NCCL_MAX_CTAS (src/init.cc envConfigOverride, from 2.17): 0 or less
//!   is ignored, above MAXCHANNELS capped, a minimum above the maximum lowered to it.
//! - NCCL_CGA_CLUSTER_SIZE (the same, from 2.17): above 8 (NCCL_MAX_CGA_CLUSTER_SIZE)
//!   limited to 8.
//! - A product of two variables (src/init.cc computeBuffSizes, from v2.19.1-1): a P2P
//!   chunk (NCCL_P2P_NET_CHUNKSIZE across nodes, NCCL_P2P_NVL_CHUNKSIZE on an all-NVLink
//!   node, NCCL_P2P_PCI_CHUNKSIZE otherwise) times NCCL_STEPS (8) above NCCL_BUFFSIZE is
//!   cut to NCCL_BUFFSIZE / 8.
//! - Another product (src/transport/net_ib.cc ncclIbConnect, every release since
//!   v2.12): NCCL_IB_QPS_PER_CONNECTION times the devices NCCL merges into one NIC sizes
//!   the queue-pair array of a connection, `qps[NCCL_IB_MAX_QPS]` (128), and nothing
//!   checks it: above 128 NCCL writes past the array when the IB transport connects.

use super::{Problem, get};
use crate::facts::Facts;
use crate::finding::Outcome;
use crate::nccl::Version;
use crate::nccl::catalog::strtoll;
use crate::nccl::version::{CTAS_ENV, MAXCHANNELS_64, P2P_CHUNK_CLAMP};

/// WARP_SIZE (src/include/device.h).
const WARP: i64 = 32;
/// NCCL_STEPS (src/include/device.h).
const STEPS: i64 = 8;
/// DEFAULT_BUFFSIZE (src/init.cc): 4 MiB.
const DEFAULT_BUFFSIZE: i64 = 4 << 20;
/// NCCL_MAX_CGA_CLUSTER_SIZE (src/include/device.h).
const MAX_CGA: i64 = 8;
/// NCCL_IB_MAX_QPS (src/transport/net_ib.cc).
const IB_MAX_QPS: i64 = 128;

/// The value NCCL's NCCL_PARAM reads (strtoll, base 0), when set and numeric.
fn int(facts: &Facts, name: &str) -> Option<i64> {
    let v = get(facts, name).filter(|v| !v.is_empty())?;
    strtoll(v).value()
}

fn clamp_note(name: &str, value: i64, becomes: i64, why: &str, source: &str) -> Problem {
    // NCCL runs with the value it clamps to: as if the user had set that one.
    Problem::predicts(
        Outcome::Unaffected,
        format!(
            "{name}={value} {why}: NCCL uses {becomes} instead, saying so only in an INFO line ({source})"
        ),
        format!("Set {name} to {becomes} (what NCCL runs with), or unset it."),
    )
}

pub(super) fn lint_ranges(facts: &Facts) -> Vec<Problem> {
    let version = crate::nccl::version(facts);
    let mut out = Vec::new();
    out.extend(threads(facts));
    out.extend(channels(facts, version));
    out.extend(chunk_product(facts, version));
    out.extend(ib_qps(facts));
    out
}

/// getNthreads: (name, minimum, maximum).
fn threads(facts: &Facts) -> Vec<Problem> {
    let mut out = Vec::new();
    for (name, min, max) in [
        ("NCCL_NTHREADS", 2 * WARP, 512),
        ("NCCL_LL128_NTHREADS", 640 / 4, 640),
    ] {
        let Some(n) = int(facts, name).filter(|n| *n > 0) else {
            continue;
        };
        let source = "src/graph/tuning.cc getNthreads";
        let note = if n % WARP != 0 {
            Some((max, format!("is not a multiple of {WARP}")))
        } else if n > max {
            Some((max, format!("is above NCCL's maximum of {max}")))
        } else if n < min {
            Some((min, format!("is below NCCL's minimum of {min}")))
        } else {
            None
        };
        if let Some((becomes, why)) = note {
            out.push(clamp_note(name, n, becomes, &why, source));
        }
    }
    out
}

fn channels(facts: &Facts, version: Option<Version>) -> Vec<Problem> {
    let since = |at| crate::nccl::version::since(version, at);
    let max_channels: i64 = if since(MAXCHANNELS_64) { 64 } else { 32 };
    let mut out = Vec::new();
    let source = "src/graph/connect.cc ncclMaxNchannels";
    // The new name wins over the old one.
    let pick = |new: &'static str, old: &'static str| {
        int(facts, new)
            .filter(|n| *n != -2)
            .map(|n| (new, n))
            .or_else(|| int(facts, old).filter(|n| *n != -2).map(|n| (old, n)))
    };
    let min = pick("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS");
    let max = pick("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS");
    if let Some((name, n)) = max {
        if n > max_channels {
            out.push(clamp_note(
                name,
                n,
                max_channels,
                "is above the channels NCCL has (MAXCHANNELS)",
                source,
            ));
        } else if n < 1 {
            out.push(clamp_note(
                name,
                n,
                1,
                "asks for fewer than one channel",
                source,
            ));
        }
    }
    if let Some((name, n)) = min.filter(|(_, n)| *n > max_channels) {
        out.push(clamp_note(
            name,
            n,
            max_channels,
            "is above the channels NCCL has (MAXCHANNELS)",
            "src/graph/connect.cc ncclMinNchannels",
        ));
    }
    if let (Some((lo, a)), Some((hi, b))) = (min, max) {
        let (a, b) = (a.min(max_channels), b.clamp(1, max_channels));
        if a > b {
            out.push(Problem::predicts(
                Outcome::Unaffected,
                format!("{lo}={a} is above {hi}={b}: NCCL caps the channels at {b} and then copies them up to {a}, so the minimum wins (src/graph/connect.cc copyChannels)"),
                format!("Keep {lo} at or below {hi}."),
            ));
        }
    }
    if since(CTAS_ENV) {
        out.extend(ctas(facts, max_channels));
    }
    out
}

/// envConfigOverride's NCCL_MIN_CTAS, NCCL_MAX_CTAS and NCCL_CGA_CLUSTER_SIZE.
fn ctas(facts: &Facts, max_channels: i64) -> Vec<Problem> {
    let mut out = Vec::new();
    let source = "src/init.cc envConfigOverride";
    let read = |name| int(facts, name).filter(|n| *n != i64::from(i32::MIN));
    let (min, max) = (read("NCCL_MIN_CTAS"), read("NCCL_MAX_CTAS"));
    for (name, v) in [("NCCL_MIN_CTAS", min), ("NCCL_MAX_CTAS", max)] {
        match v {
            Some(n) if n <= 0 => out.push(Problem::predicts(
                Outcome::Unaffected,
                format!(
                    "{name}={n} is too low: NCCL ignores it and keeps its own value ({source})"
                ),
                format!("Set {name} to a positive number of CTAs, or unset it."),
            )),
            Some(n) if n > max_channels => {
                out.push(clamp_note(
                    name,
                    n,
                    max_channels,
                    "is above MAXCHANNELS",
                    source,
                ));
            }
            _ => {}
        }
    }
    if let (Some(a), Some(b)) = (min, max)
        && a > 0
        && b > 0
        && a.min(max_channels) > b.min(max_channels)
    {
        out.push(clamp_note(
            "NCCL_MIN_CTAS",
            a,
            b.min(max_channels),
            "is above NCCL_MAX_CTAS",
            source,
        ));
    }
    if let Some(n) = read("NCCL_CGA_CLUSTER_SIZE").filter(|n| *n > MAX_CGA) {
        out.push(clamp_note(
            "NCCL_CGA_CLUSTER_SIZE",
            n,
            MAX_CGA,
            "is above NCCL's limit",
            source,
        ));
    }
    out
}

/// computeBuffSizes: a P2P chunk times NCCL_STEPS must fit NCCL_BUFFSIZE.
fn chunk_product(facts: &Facts, version: Option<Version>) -> Vec<Problem> {
    if !crate::nccl::version::since(version, P2P_CHUNK_CLAMP) {
        return Vec::new();
    }
    let buff = int(facts, "NCCL_BUFFSIZE")
        .filter(|n| *n != -2 && *n > 0)
        .unwrap_or(DEFAULT_BUFFSIZE);
    let shown = get(facts, "NCCL_BUFFSIZE").map_or_else(
        || "the default NCCL_BUFFSIZE (4 MiB)".to_string(),
        |v| format!("NCCL_BUFFSIZE={v}"),
    );
    [
        ("NCCL_P2P_NET_CHUNKSIZE", "between nodes"),
        ("NCCL_P2P_NVL_CHUNKSIZE", "on a node whose GPUs are all NVLink-connected"),
        ("NCCL_P2P_PCI_CHUNKSIZE", "on one node otherwise"),
    ]
    .into_iter()
    .filter_map(|(name, where_)| {
        let n = int(facts, name)?;
        (n.saturating_mul(STEPS) > buff).then(|| {
            Problem::predicts(
                Outcome::Unaffected,
                format!(
                    "{name}={n} times NCCL's {STEPS} steps is more than {shown}: where NCCL uses it ({where_}) it cuts the chunk to {} (src/init.cc computeBuffSizes)",
                    buff / STEPS
                ),
                format!("Raise NCCL_BUFFSIZE to at least {} with it, or lower {name} to {}.", n.saturating_mul(STEPS), buff / STEPS),
            )
        })
    })
    .collect()
}

/// ncclIbConnect: NCCL_IB_QPS_PER_CONNECTION times the merged devices against qps[128],
/// where the IB transport can run (an InfiniBand or RoCE device, not EFA).
fn ib_qps(facts: &Facts) -> Option<Problem> {
    let n = int(facts, "NCCL_IB_QPS_PER_CONNECTION")?;
    let ib = facts
        .rdma
        .devices
        .value()
        .is_some_and(|d| d.iter().any(|d| !d.is_efa()));
    (ib && n > IB_MAX_QPS).then(|| {
        Problem::predicts(
            Outcome::init_fails("ncclIbConnect writes past its array of queue pairs (memory corruption when the IB transport connects)"),
            format!("NCCL_IB_QPS_PER_CONNECTION={n}: NCCL keeps the queue pairs of a connection in an array of {IB_MAX_QPS} (times the devices it merges into one NIC) and checks neither: it writes past the array when the IB transport connects (src/transport/net_ib.cc ncclIbConnect)"),
            format!("Set NCCL_IB_QPS_PER_CONNECTION to at most {IB_MAX_QPS} (divided by the ports NCCL merges per NIC); 1 to 4 is usual."),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_facts::{healthy, with_env};

    fn lint(pairs: &[(&str, &str)]) -> Vec<Problem> {
        lint_ranges(&with_env(healthy(), pairs))
    }

    // Expected results written from the cited sources before the tool ran.
    #[test]
    fn threads_clamp_as_get_nthreads_does() {
        assert!(lint(&[("NCCL_NTHREADS", "256")]).is_empty());
        let p = lint(&[("NCCL_NTHREADS", "100")]);
        assert!(
            p[0].summary.contains("not a multiple of 32: NCCL uses 512"),
            "{}",
            p[0].summary
        );
        assert!(
            lint(&[("NCCL_NTHREADS", "1024")])[0]
                .summary
                .contains("uses 512")
        );
        assert!(
            lint(&[("NCCL_NTHREADS", "32")])[0]
                .summary
                .contains("uses 64")
        );
        assert!(
            lint(&[("NCCL_LL128_NTHREADS", "128")])[0]
                .summary
                .contains("uses 160")
        );
    }

    #[test]
    fn channels_per_release_and_the_minimum_wins() {
        assert!(
            lint(&[("NCCL_MAX_NCHANNELS", "64")]).is_empty(),
            "64 from 2.25"
        );
        let mut f = with_env(healthy(), &[("NCCL_MAX_NCHANNELS", "64")]);
        if let crate::facts::gpu::LibraryState::Loaded(l) = &mut f.rdma.nccl.library.state {
            l.version = crate::facts::Observed::Value("2.21.5".into());
        }
        let old = lint_ranges(&f);
        assert!(old[0].summary.contains("NCCL uses 32"), "{old:?}");
        assert!(
            lint(&[("NCCL_MAX_NCHANNELS", "0")])[0]
                .summary
                .contains("uses 1")
        );
        let p = lint(&[("NCCL_MIN_NCHANNELS", "16"), ("NCCL_MAX_NCHANNELS", "8")]);
        assert!(p[0].summary.contains("the minimum wins"), "{p:?}");
        // The new name wins: the old one's value is not judged.
        assert!(lint(&[("NCCL_MAX_NRINGS", "0"), ("NCCL_MAX_NCHANNELS", "4")]).is_empty());
        let p = lint(&[
            ("NCCL_MIN_CTAS", "32"),
            ("NCCL_MAX_CTAS", "16"),
            ("NCCL_CGA_CLUSTER_SIZE", "16"),
        ]);
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn products_of_two_variables() {
        // 1 MiB x 8 > 4 MiB: cut to 512 KiB; with NCCL_BUFFSIZE=8388608 it fits.
        let p = lint(&[("NCCL_P2P_NVL_CHUNKSIZE", "1048576")]);
        assert!(p[0].summary.contains("cuts the chunk to 524288"), "{p:?}");
        assert!(
            lint(&[
                ("NCCL_P2P_NVL_CHUNKSIZE", "1048576"),
                ("NCCL_BUFFSIZE", "8388608")
            ])
            .is_empty()
        );
        // aws-ofi-nccl's p4d/p5 pair fits.
        assert!(
            lint(&[
                ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
                ("NCCL_BUFFSIZE", "8388608")
            ])
            .is_empty()
        );
        // QPs: only where the IB transport runs.
        assert!(lint(&[("NCCL_IB_QPS_PER_CONNECTION", "200")]).is_empty());
        let ib = crate::test_facts::with_rdma(
            healthy(),
            vec![crate::test_facts::rdma_device(
                "mlx5_0",
                "mlx5_core",
                "0000:17:00.0",
                "/sys/devices/x",
                "ACTIVE",
                "InfiniBand",
            )],
        );
        let f = with_env(ib, &[("NCCL_IB_QPS_PER_CONNECTION", "200")]);
        assert_eq!(lint_ranges(&f).len(), 1);
        let prediction = crate::predict::predict(&f);
        let finding = super::super::judge(&f, &prediction, &crate::policy::Policy::default());
        assert_eq!(
            finding.status(),
            crate::finding::Status::Fail,
            "{finding:?}"
        );
    }
}
