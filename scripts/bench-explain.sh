#!/usr/bin/env bash
# Benchmark: explain-log throughput on a large log (the real H200 logs from
# ../shared/data repeated to SIZE_MB, default 1024) against `grep -c via` on
# the same file, in the same run; peak RSS of both. Not a test: prints numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mb="${1:-1024}"
bin="${NCCL_PREFLIGHT_BIN:-dist/nccl-preflight}"
[ -x "$bin" ] || { cargo build --release --quiet; bin=target/release/nccl-preflight; }
src=../shared/data/h200x2
[ -d "$src" ] || { echo "needs ../shared/data/h200x2 beside the repository" >&2; exit 2; }
log=$(mktemp --suffix=.log)
trap 'rm -f "$log" "$log.seed" "$log.out" "$log.rss"' EXIT
cat "$src"/nccl-allreduce-default.log "$src"/nccl-allreduce-p2p-disabled.log > "$log.seed"
while [ "$(stat -c %s "$log")" -lt $((size_mb << 20)) ]; do
  cat "$log.seed" "$log.seed" "$log.seed" "$log.seed" "$log.seed" "$log.seed" "$log.seed" "$log.seed" >> "$log"
done
bytes=$(stat -c %s "$log")
cat "$log" > /dev/null # page cache
timed() { # label command... -> prints seconds, MB/s, peak RSS
  local label=$1; shift
  local best=999999 rss=0 t0 t1 ms
  for _ in 1 2 3; do
    t0=$(date +%s%N)
    # Output to a real file: GNU grep stops at the first match when stdout is /dev/null.
    /usr/bin/time -o "$log.rss" -f %M "$@" >"$log.out"
    rss=$(tail -1 "$log.rss")
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    [ "$ms" -lt "$best" ] && best=$ms
  done
  awk -v l="$label" -v ms="$best" -v b="$bytes" -v r="$rss" 'BEGIN { printf "%-30s %8.2f s %9.0f MB/s %10d KiB peak RSS\n", l, ms/1000, b/1e6/(ms/1000), r }'
}
echo "machine: $(nproc) cores; input: $((bytes >> 20)) MiB ($(wc -l < "$log") lines); best of 3"
timed "grep -c via" grep -c via "$log"
timed "nccl-preflight explain-log" "$bin" explain-log "$log"
timed "nccl-preflight explain-log json" "$bin" explain-log --format json "$log"
"$bin" explain-log --format json "$log" | grep -A3 '"transport_counts"'
