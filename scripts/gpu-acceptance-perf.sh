#!/usr/bin/env bash
# Timings and memory on a machine with NVIDIA GPUs (not part of CI; reads only, changes
# no GPU setting): the median of repeated runs of `check --cuda off`, `probe` and `check`
# side by side with `nvidia-smi topo -m; nvidia-smi topo -p2p rw` and with cuInit alone;
# one traced `check --cuda off` (every vendor call's duration); the NVML field-values
# probe (scripts/nvml_fields_probe.py); the RSS of a process that only loads NVML and
# calls nvmlInit (scripts/nvml_init_rss.c) against `serve --interval 1s` sampled over
# SERVE_SECONDS, with the slope; which library loads which (LD_DEBUG=files). Keeps NVLink multicast off (NCCL_NVLS_ENABLE=0).
# Usage: scripts/gpu-acceptance-perf.sh BINARY NVML_INIT_RSS OUTDIR [RUNS] [SERVE_SECONDS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 rss_bin=$2 out=$3 runs=${4:-9} serve_s=${5:-180}
mkdir -p "$out"
# shellcheck source=scripts/gpu_timing.sh
. "$here/gpu_timing.sh"  # ms, median, smi_pair
cuinit() { python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1").cuInit(0)'; }
py_start() { python3 -c 'import ctypes'; }
{
  echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
  "$bin" --version
  # Warm-up: the first NVML user after idle pays for driver state set-up.
  "$bin" check --cuda off >/dev/null 2>&1; smi_pair >/dev/null 2>&1
  declare -A t
  for i in $(seq "$runs"); do
    t[smi]+="$(ms smi_pair) "; t[off]+="$(ms "$bin" check --cuda off) "
    t[probe]+="$(ms "$bin" probe) "; t[full]+="$(ms "$bin" check) "
    t[cuinit]+="$(ms cuinit) "; t[py]+="$(ms py_start) "
  done
  echo "== wall ms, $runs runs each (median: all)"
  for k in smi off probe full cuinit py; do
    echo "$k: $(echo ${t[$k]} | tr ' ' '\n' | median): ${t[$k]}"
  done
  echo "(smi = nvidia-smi topo -m; nvidia-smi topo -p2p rw; off = check --cuda off; full = check;"
  echo " cuinit = python3 loading libcuda and calling cuInit, py = python3 start alone)"
} > "$out/perf.txt" 2>&1
"$bin" check --cuda off --trace >/dev/null 2> "$out/trace-cuda-off.txt"
"$bin" check --trace >/dev/null 2> "$out/trace-check.txt"
"$bin" check --format json > "$out/check-facts.json" 2>/dev/null
# Which library loads which (libcuda: nvmlInit_v2 dlopens it itself).
LD_DEBUG=files "$bin" check --cuda off 2>&1 >/dev/null | grep -E 'file=.*(dynamically loaded|needed by)' \
  | sed 's/^ *[0-9]*://' | sort -u > "$out/who-loads.txt"
python3 "$here/nvml_fields_probe.py" > "$out/nvml-fields.txt" 2>&1
{
  echo "== RSS of a process that only loads NVML and calls nvmlInit_v2 (kB)"
  for i in 1 2 3; do "$rss_bin"; done
  echo "== serve --interval 1s: VmRSS (kB) every 10 s over $serve_s s"
  "$bin" serve --listen 127.0.0.1:19464 --interval 1s 2>/dev/null &
  pid=$!
  for s in $(seq 0 10 "$serve_s"); do
    [ "$s" -gt 0 ] && sleep 10
    runs_done=$(curl -s http://127.0.0.1:19464/metrics | awk '/^nccl_preflight_runs_total / {print $2}')
    echo "$s $(awk '/VmRSS/ {print $2}' /proc/$pid/status) runs=$runs_done"
  done
  grep -c libcuda /proc/$pid/maps | sed 's/^/libcuda mappings: /'
  kill -TERM $pid; wait $pid
} > "$out/serve-rss.txt" 2>&1
# Least-squares slope of RSS over time, from the 60 s mark (after the first runs settle).
awk '/^[0-9]+ [0-9]+ runs=/ && $1 >= 60 {n++; x+=$1; y+=$2; xx+=$1*$1; xy+=$1*$2}
     END {if (n > 1) printf "slope from 60 s: %.2f kB/min over %d samples\n", (n*xy - x*y) / (n*xx - x*x) * 60, n}' \
  "$out/serve-rss.txt" >> "$out/serve-rss.txt"
cat "$out/perf.txt" "$out/serve-rss.txt"; grep -E 'GPU|timings|147' "$out/nvml-fields.txt"
