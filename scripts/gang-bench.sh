#!/usr/bin/env bash
# Wall time of the whole gang (`nccl-preflight gang`: join, consistency,
# all-reduce bandwidth, pairwise send/recv rounds) on N network-namespace
# "nodes" of this machine, with the fake libnccl over TCP through a bridge
# (tests/integration/netns.rs), N = 2, 4 and 8 by default, each repeated 3
# times; prints every run and the median per N. Needs root (ip netns) and cc.
# A measurement, not a test: nothing here is asserted about time.
# Usage: scripts/gang-bench.sh [OUTDIR] [NODES...]
#   NCCL_PREFLIGHT_GANG_BENCH_SIZES  all-reduce sizes (default the test's small ones)
#   CARGO_PROFILE                    dev (default) or release
set -eu
cd "$(dirname "$0")/.."
out=${1:-target/gang-bench}
shift || true
nodes=${*:-2 4 8}
mkdir -p "$out"
profile=()
[ "${CARGO_PROFILE:-dev}" = release ] && profile=(--release)
# Build once, outside the timings.
cargo test "${profile[@]}" --test integration --no-run >/dev/null 2>&1
summary="$out/summary.txt"
: > "$summary"
for n in $nodes; do
  for i in 1 2 3; do
    NCCL_PREFLIGHT_GANG_BENCH_NODES=$n cargo test "${profile[@]}" --test integration \
      gang_netns::bench_the_whole_gang -- --ignored --exact --nocapture \
      > "$out/run-$n-$i.txt" 2>&1 || { echo "nodes $n run $i failed: see $out/run-$n-$i.txt" >&2; exit 1; }
    line=$(grep '^gang-bench ' "$out/run-$n-$i.txt")
    echo "$line" | tee -a "$summary"
  done
  # Median of the three wall times.
  grep "^gang-bench nodes $n " "$summary" | sed 's/.* wall_s \([0-9.]*\).*/\1/' | sort -n \
    | sed -n 2p | xargs printf "median nodes %s wall_s %s\n" "$n" | tee -a "$summary"
done
