#!/usr/bin/env bash
# Benchmark: wall time and peak RSS of `nccl-preflight check` against a shell
# script doing the manual equivalent, in the same run. Whole-process runs;
# medians over N runs (default 200). Not a test: prints numbers for the notes.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-200}"
bin="${NCCL_PREFLIGHT_BIN:-dist/nccl-preflight}"
[ -x "$bin" ] || { cargo build --release --quiet; bin=target/release/nccl-preflight; }
manual=$(mktemp)
cat >"$manual" <<'SH'
ulimit -l; df /dev/shm; readlink /proc/self/ns/ipc; ip -br addr; ip route
SH
trap 'rm -f "$manual"' EXIT

median_ms() { # command... -> median wall milliseconds over $runs runs
  local t
  for _ in $(seq "$runs"); do
    t=$(date +%s%N); "$@" >/dev/null 2>&1 || true; echo $(( ($(date +%s%N) - t) / 1000 ))
  done | sort -n | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]/1000}'
}
peak_rss_kib() { # command... -> median peak RSS (KiB) over 21 runs
  for _ in $(seq 21); do /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

echo "machine: $(nproc) cores, $(uname -r); binary: $bin; runs: $runs"
printf '%-34s %10s %14s\n' "command" "median ms" "peak RSS KiB"
printf '%-34s %10s %14s\n' "nccl-preflight check" "$(median_ms "$bin" check)" "$(peak_rss_kib "$bin" check)"
printf '%-34s %10s %14s\n' "nccl-preflight check --format json" "$(median_ms "$bin" check --format json)" "$(peak_rss_kib "$bin" check --format json)"
printf '%-34s %10s %14s\n' "shell equivalent (sh + 5 tools)" "$(median_ms sh "$manual")" "$(peak_rss_kib sh "$manual")"
if command -v hyperfine >/dev/null 2>&1; then
  hyperfine -N --warmup 20 --runs "$runs" "$bin check" "sh $manual" 2>/dev/null | grep -E 'Time|±|faster' || true
fi
