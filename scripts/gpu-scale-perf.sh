#!/usr/bin/env bash
# The gates' cost as the GPU count grows (not part of CI; reads only, changes no GPU
# setting; NVLink multicast stays off). On every GPU of the machine, and on the first two
# where a run can be limited to them (CUDA_VISIBLE_DEVICES: check's CUDA part, cuInit,
# init --bench; NVML and nvidia-smi always see every GPU), the median of RUNS
# whole-process runs of: `nvidia-smi topo -m; nvidia-smi topo -p2p rw`, `check --cuda off`,
# `check`, cuInit alone (python3 + ctypes, and python3's own start to subtract), and
# `init --bench`; then one traced `check --cuda off` and `check` (every vendor call with
# its duration: the per-GPU and per-pair costs of the model), and serve's RSS after
# SERVE_SECONDS beside a process that only loads NVML and calls nvmlInit_v2
# (scripts/nvml_init_rss.c).
# Usage: scripts/gpu-scale-perf.sh BINARY OUTDIR [RUNS] [SERVE_SECONDS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 out=$2 runs=${3:-7} serve_s=${4:-30}
mkdir -p "$out"
# shellcheck source=scripts/gpu_timing.sh
. "$here/gpu_timing.sh"  # ms, median, smi_pair
cuinit() { python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1").cuInit(0)'; }
py_start() { python3 -c 'import ctypes'; }
bench() { "$bin" init --bench --env-file "$out/.bench.env"; }
all=$(nvidia-smi -L | wc -l)
{
  echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  nvidia-smi topo -m
  "$bin" --version
  "$bin" check --cuda off >/dev/null 2>&1; smi_pair >/dev/null 2>&1; cuinit
  for gpus in "$all" 2; do
    if [ "$gpus" = "$all" ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=0,1; fi
    unset t; declare -A t
    for i in $(seq "$runs"); do
      [ "$gpus" = "$all" ] && t[smi]+="$(ms smi_pair) " && t[off]+="$(ms "$bin" check --cuda off) "
      t[full]+="$(ms "$bin" check) "; t[cuinit]+="$(ms cuinit) "; t[py]+="$(ms py_start) "
      t[bench]+="$(ms bench) "
    done
    echo "== $gpus GPUs visible to CUDA: wall ms, $runs runs each (median: all)"
    for k in smi off full cuinit py bench; do
      [ -n "${t[$k]:-}" ] && echo "$k: $(echo ${t[$k]} | median): ${t[$k]}"
    done
  done
  unset CUDA_VISIBLE_DEVICES
  echo "(smi = nvidia-smi topo -m; nvidia-smi topo -p2p rw; off = check --cuda off; full = check;"
  echo " cuinit = python3 loading libcuda and calling cuInit, py = python3 start alone;"
  echo " bench = init --bench)"
} > "$out/perf.txt" 2>&1
"$bin" check --cuda off --trace >/dev/null 2> "$out/trace-cuda-off.txt"
"$bin" check --trace >/dev/null 2> "$out/trace-check.txt"
"$bin" init --bench --trace --format json --env-file "$out/.bench.env" > "$out/init-bench.json" 2> "$out/trace-init-bench.txt"
cc -O2 -o "$out/.nvml_init_rss" "$here/nvml_init_rss.c" -ldl
{
  echo "== RSS of a process that only loads NVML and calls nvmlInit_v2 (kB)"
  for i in 1 2 3; do "$out/.nvml_init_rss"; done
  echo "== serve --interval 1s: VmRSS (kB) every 5 s over $serve_s s"
  "$bin" serve --listen 127.0.0.1:19464 --interval 1s 2>/dev/null &
  pid=$!
  for s in $(seq 0 5 "$serve_s"); do
    [ "$s" -gt 0 ] && sleep 5
    echo "$s $(awk '/VmRSS/ {print $2}' /proc/$pid/status)"
  done
  kill -TERM $pid; wait $pid
} > "$out/serve-rss.txt" 2>&1
rm -f "$out/.bench.env" "$out/.nvml_init_rss"
