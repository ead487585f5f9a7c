#!/usr/bin/env bash
# What `init --bench` and the gates cost, beside a baseline binary, on one GPU machine in
# one call (not part of CI; reads only, changes no GPU setting; NVLink multicast stays
# off). Each run is a whole process, timed from start to exit; runs of the two binaries
# interleave, with a pause between runs so that one run's CUDA teardown does not bill
# the next. Writes under OUTDIR:
# - gate.txt: medians of RUNS runs, on every GPU and on the first two
#   (CUDA_VISIBLE_DEVICES; NVML and nvidia-smi always see every GPU):
#   `nvidia-smi topo -m; topo -p2p rw`, `check --cuda off`, `check`, `init --bench`,
#   `init --bench --bench-nccl` (the new binary), the baseline's `init --bench` (which
#   ran NCCL's all-reduce too), and both `init --bench` inside a new PID namespace, as
#   PID 1 of a container is: its exit then waits for every process of the namespace,
#   so the bench child's CUDA teardown counts.
# - trace-*.txt: one `--trace` run each: every vendor call of both processes and the
#   bench child's phases.
# - cuinit-beside.txt: scripts/cuinit_beside.py (a cold cuInit alone and beside init's
#   own gathering).
# Usage: scripts/gpu-gate-perf.sh BINARY BASELINE OUTDIR [RUNS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 base=$2 out=$3 runs=${4:-5}
mkdir -p "$out"
env_file="$out/.bench.env"
# shellcheck source=scripts/gpu_timing.sh
. "$here/gpu_timing.sh"  # ms, median, smi_pair
initb() { "$@" init --bench --env-file "$env_file"; }
initbn() { "$@" init --bench --bench-nccl --env-file "$env_file"; }
# As PID 1 of a new PID namespace (a container's entrypoint), where unshare exists.
pidns() { unshare --pid --fork --mount-proc --kill-child -- "$@"; }
have_ns=0
unshare --pid --fork --mount-proc --kill-child -- true 2>/dev/null && have_ns=1
all=$(nvidia-smi -L | wc -l)
{
  echo "== machine"; nvidia-smi -L
  nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader
  nvidia-smi topo -m
  "$bin" --version; echo "baseline: $("$base" --version | head -1)"
  echo "PID namespaces (unshare --pid): $have_ns"
  # Warm the page cache with every binary and library once.
  "$bin" check >/dev/null 2>&1; "$base" check >/dev/null 2>&1; smi_pair >/dev/null 2>&1
  for gpus in "$all" 2; do
    if [ "$gpus" = "$all" ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=0,1; fi
    unset t; declare -A t
    for _ in $(seq "$runs"); do
      if [ "$gpus" = "$all" ]; then
        t[smi]+="$(ms smi_pair) "; sleep 0.5
        t[off]+="$(ms "$bin" check --cuda off) "; sleep 0.5
        t[off_base]+="$(ms "$base" check --cuda off) "; sleep 0.5
      fi
      t[full]+="$(ms "$bin" check) "; sleep 0.8
      t[full_base]+="$(ms "$base" check) "; sleep 0.8
      t[bench]+="$(ms initb "$bin") "; sleep 1
      t[bench_base]+="$(ms initb "$base") "; sleep 1
      t[bench_nccl]+="$(ms initbn "$bin") "; sleep 1
      if [ "$have_ns" = 1 ]; then
        t[bench_ns]+="$(ms initb pidns "$bin") "; sleep 1
        t[bench_base_ns]+="$(ms initb pidns "$base") "; sleep 1
      fi
    done
    echo "== $gpus GPUs visible to CUDA: wall ms, $runs runs each (median: all)"
    for k in smi off off_base full full_base bench bench_base bench_nccl bench_ns bench_base_ns; do
      [ -n "${t[$k]:-}" ] && echo "$k: $(echo "${t[$k]}" | median): ${t[$k]}"
    done
  done
  unset CUDA_VISIBLE_DEVICES
  echo "(_base = the baseline binary; smi = nvidia-smi topo -m; nvidia-smi topo -p2p rw;"
  echo " off = check --cuda off; full = check; bench = init --bench (baseline: with NCCL's"
  echo " all-reduce); bench_nccl = init --bench --bench-nccl; _ns = as PID 1 of a new PID namespace)"
} > "$out/gate.txt" 2>&1
sleep 1
"$bin" init --bench --trace --env-file "$env_file" > /dev/null 2> "$out/trace-init-bench.txt"
sleep 1
CUDA_VISIBLE_DEVICES=0,1 "$bin" init --bench --trace --env-file "$env_file" \
  > /dev/null 2> "$out/trace-init-bench-2gpu.txt"
sleep 1
"$bin" init --bench --bench-nccl --trace --env-file "$env_file" \
  > /dev/null 2> "$out/trace-init-bench-nccl.txt"
sleep 1
"$base" init --bench --trace --env-file "$env_file" > /dev/null 2> "$out/trace-init-bench-base.txt"
if [ "$have_ns" = 1 ]; then
  sleep 1
  { echo "== init --bench as PID 1 of a new PID namespace: exit $(
      pidns "$bin" init --bench --env-file "$env_file" > "$out/.ns.out" 2>&1; echo $?)"
    tail -c 3000 "$out/.ns.out"; } > "$out/pidns.txt" 2>&1
  rm -f "$out/.ns.out"
fi
python3 "$here/cuinit_beside.py" "$bin" 3 > "$out/cuinit-beside.txt" 2>&1
rm -f "$env_file"
