#!/usr/bin/env bash
# Benchmarks of the gang on this machine (root: ip netns; cc for the fakes).
# Measurements, not tests: nothing here is asserted about time.
#
#   scripts/gang-bench.sh [OUTDIR] [NODES...]
#       wall time of the whole gang (`nccl-preflight gang`: join, consistency,
#       all-reduce bandwidth, pairwise send/recv rounds) on N network-namespace
#       "nodes" with the fake libnccl over TCP through a bridge
#       (tests/integration/netns.rs), N = 2, 4, 8 and 32 by default, each repeated
#       3 times; every run and the median per N.
#   scripts/gang-bench.sh --legs [OUTDIR] [NODES...]
#       every leg of issue 37 and the healthy gang at N pods (default 8 and 32), one
#       `gang-leg` line each: wall time, every rank's exit code, rank 0's verdict and
#       the last rank's (tests/integration/gang_netns.rs bench_every_leg).
#   scripts/gang-bench.sh --rendezvous [OUTDIR] [NODES...]
#       a rendezvous of N pods (default 256) with records of the largest size, no
#       NCCL, as threads on loopback: wall time, descriptors and peak memory
#       (src/gang/session/tests.rs bench_a_rendezvous_of_many_pods), 3 runs each.
#   NCCL_PREFLIGHT_GANG_BENCH_SIZES  all-reduce sizes of the whole-gang runs (default
#                                    the tests' small ones)
#   CARGO_PROFILE                    dev (default) or release
set -eu
cd "$(dirname "$0")/.."
mode=gang
case ${1:-} in
    --legs) mode=legs; shift ;;
    --rendezvous) mode=rendezvous; shift ;;
esac
out=${1:-target/gang-bench}
shift || true
profile=()
[ "${CARGO_PROFILE:-dev}" = release ] && profile=(--release)
mkdir -p "$out"
summary="$out/summary-$mode.txt"
: > "$summary"

run() { # NAME NODES -- cargo test arguments...
    local name=$1 n=$2; shift 3
    NCCL_PREFLIGHT_GANG_BENCH_NODES=$n cargo test "${profile[@]}" "$@" -- --ignored --exact --nocapture \
        > "$out/$name.txt" 2>&1 || { echo "$name failed: see $out/$name.txt" >&2; exit 1; }
}

case $mode in
    legs)
        cargo test "${profile[@]}" --test integration --no-run >/dev/null 2>&1
        for n in ${*:-8 32}; do
            run "legs-$n" "$n" -- --test integration gang_netns::bench_every_leg
            grep '^gang-leg ' "$out/legs-$n.txt" | tee -a "$summary"
        done
        ;;
    rendezvous)
        cargo test "${profile[@]}" --lib --no-run >/dev/null 2>&1
        for n in ${*:-256}; do
            for i in 1 2 3; do
                run "rendezvous-$n-$i" "$n" -- --lib gang::session::tests::bench_a_rendezvous_of_many_pods
                grep '^gang-rendezvous ' "$out/rendezvous-$n-$i.txt" | tee -a "$summary"
            done
        done
        ;;
    gang)
        # Build once, outside the timings.
        cargo test "${profile[@]}" --test integration --no-run >/dev/null 2>&1
        for n in ${*:-2 4 8 32}; do
            for i in 1 2 3; do
                run "run-$n-$i" "$n" -- --test integration gang_netns::bench_the_whole_gang
                grep '^gang-bench ' "$out/run-$n-$i.txt" | tee -a "$summary"
            done
            # Median of the three wall times.
            grep "^gang-bench nodes $n " "$summary" | sed 's/.* wall_s \([0-9.]*\).*/\1/' | sort -n \
                | sed -n 2p | xargs printf "median nodes %s wall_s %s\n" "$n" | tee -a "$summary"
        done
        ;;
esac
