#!/usr/bin/env bash
# Where init --bench's time goes, and the gates' cost beside a baseline binary, on one
# GPU machine in one call (not part of CI; reads only, changes no GPU setting; NVLink
# multicast stays off). Writes under OUTDIR:
# - perf.txt: medians of RUNS whole-process runs, the new and the baseline binary
#   interleaved, on every GPU and on the first two (CUDA_VISIBLE_DEVICES; NVML and
#   nvidia-smi always see every GPU): `nvidia-smi topo -m; topo -p2p rw`,
#   `check --cuda off`, `check`, cuInit alone (python3 + ctypes, minus python3's start),
#   `init --bench`.
# - trace-init-bench.txt (and -2gpu): one `init --bench --trace` of the new binary: every
#   vendor call of both processes and the bench child's phases.
# - p2p-sizes.txt (unless P2P_SIZES is set empty): `bench p2p` at each --size, every
#   ordered pair's GB/s one way and both ways (the curve the measurement's size is
#   chosen from).
# - cuinit.txt: scripts/cuinit_overlap.py (cuInit beside other CUDA processes, and
#   primary contexts retained one after another or a thread per GPU).
# - serve-rss.txt: the NVML floor, then serve's VmRSS after SERVE_SECONDS for each
#   binary, with smaps_rollup and the largest mappings of the new one.
# Usage: scripts/gpu-perf-phases.sh BINARY BASELINE OUTDIR [RUNS] [SERVE_SECONDS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 base=$2 out=$3 runs=${4:-5} serve_s=${5:-20}
mkdir -p "$out"
# shellcheck source=scripts/gpu_timing.sh
. "$here/gpu_timing.sh"  # ms, median, smi_pair
cuinit() { python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1").cuInit(0)'; }
py_start() { python3 -c 'import ctypes'; }
initb() { "$1" init --bench --env-file "$out/.bench.env"; }
all=$(nvidia-smi -L | wc -l)
{
  echo "== machine"; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader
  nvidia-smi topo -m
  "$bin" --version; echo "baseline: $("$base" --version | head -1)"
  "$bin" check --cuda off >/dev/null 2>&1; smi_pair >/dev/null 2>&1; cuinit
  for gpus in "$all" 2; do
    if [ "$gpus" = "$all" ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=0,1; fi
    unset t; declare -A t
    for i in $(seq "$runs"); do
      if [ "$gpus" = "$all" ]; then
        t[smi]+="$(ms smi_pair) "; t[off]+="$(ms "$bin" check --cuda off) "
        t[off_base]+="$(ms "$base" check --cuda off) "
      fi
      t[full]+="$(ms "$bin" check) "; t[full_base]+="$(ms "$base" check) "
      t[cuinit]+="$(ms cuinit) "; t[py]+="$(ms py_start) "
      t[bench]+="$(ms initb "$bin") "; t[bench_base]+="$(ms initb "$base") "
    done
    echo "== $gpus GPUs visible to CUDA: wall ms, $runs runs each (median: all)"
    for k in smi off off_base full full_base cuinit py bench bench_base; do
      [ -n "${t[$k]:-}" ] && echo "$k: $(echo ${t[$k]} | median): ${t[$k]}"
    done
  done
  unset CUDA_VISIBLE_DEVICES
  echo "(_base = the baseline binary; smi = nvidia-smi topo -m; nvidia-smi topo -p2p rw;"
  echo " off = check --cuda off; full = check; cuinit = python3 loading libcuda and calling"
  echo " cuInit, py = python3 start alone; bench = init --bench)"
} > "$out/perf.txt" 2>&1
"$bin" init --bench --trace --env-file "$out/.bench.env" > /dev/null 2> "$out/trace-init-bench.txt"
CUDA_VISIBLE_DEVICES=0,1 "$bin" init --bench --trace --env-file "$out/.bench.env" \
  > /dev/null 2> "$out/trace-init-bench-2gpu.txt"
{
  echo "== bench p2p --size S (--iterations 10): GB/s per ordered pair, one way / both ways; wall ms"
  for size in ${P2P_SIZES-16MiB 32MiB 64MiB 128MiB 256MiB}; do
    for rep in 1 2; do
      s=$(date +%s%N)
      "$bin" bench p2p --format json --size "$size" > "$out/.p2p.json" 2>/dev/null
      e=$(date +%s%N)
      python3 - "$size" "$rep" $(((e - s) / 1000000)) "$out/.p2p.json" <<'EOF'
import json, sys
size, rep, wall, path = sys.argv[1:5]
r = json.load(open(path))
pairs = r.get("p2p", {}).get("pairs", [])
one = [p.get("unidirectional_gbps") or 0 for p in pairs]
both = [p.get("bidirectional_gbps") or 0 for p in pairs]
print(f"{size} run {rep}: wall {wall} ms, bench {r['wall_seconds'] * 1e3:.0f} ms; "
      f"one way min {min(one, default=0):.1f} max {max(one, default=0):.1f}; "
      f"both ways min {min(both, default=0):.1f} max {max(both, default=0):.1f}")
print("  " + " ".join(f"{p['src']}>{p['dst']}:{p.get('unidirectional_gbps') or 0:.1f}/{p.get('bidirectional_gbps') or 0:.1f}" for p in pairs))
EOF
    done
  done
} > "$out/p2p-sizes.txt" 2>&1
[ -n "${P2P_SIZES-x}" ] || rm -f "$out/p2p-sizes.txt"
python3 "$here/cuinit_overlap.py" > "$out/cuinit.txt" 2>&1
cc -O2 -o "$out/.nvml_init_rss" "$here/nvml_init_rss.c" -ldl
{
  echo "== RSS of a process that only loads NVML and calls nvmlInit_v2 (kB)"
  for i in 1 2 3; do "$out/.nvml_init_rss"; done
  for which in new base; do
    b=$bin; [ "$which" = base ] && b=$base
    "$b" serve --listen 127.0.0.1:19464 --interval 1s 2>/dev/null &
    pid=$!
    sleep "$serve_s"
    echo "== $which serve --interval 1s after $serve_s s: VmRSS $(awk '/VmRSS/ {print $2}' /proc/$pid/status) kB, threads $(awk '/Threads/ {print $2}' /proc/$pid/status), libcuda mappings $(grep -c libcuda /proc/$pid/maps)"
    if [ "$which" = new ]; then
      cat /proc/$pid/smaps_rollup
      echo "-- largest mappings by Rss (kB)"
      awk '/^[0-9a-f]+-[0-9a-f]+ / {name = ($6 == "" ? "[anon]" : $6)} /^Rss:/ {rss[name] += $2} END {for (n in rss) print rss[n], n}' /proc/$pid/smaps | sort -rn | head -25
    fi
    kill -TERM $pid; wait $pid
  done
  echo "== which object loads libcuda into serve (LD_DEBUG=files, a separate 5 s run)"
  LD_DEBUG=files LD_DEBUG_OUTPUT="$out/.ld" "$bin" serve --listen 127.0.0.1:19465 --interval 1s \
    2> "$out/.serve.err" &
  pid=$!
  sleep 5
  echo "server pid $pid: libcuda mappings $(grep -c libcuda /proc/$pid/maps)"
  kill -TERM $pid; wait $pid
  for f in "$out"/.ld.*; do
    grep -q 'file=libcuda' "$f" && { echo "-- ${f##*.ld.}"; grep -B2 -A1 'file=libcuda' "$f" | head -8; }
  done
  echo "-- serve's standard error"; head -c 2000 "$out/.serve.err"
} > "$out/serve-rss.txt" 2>&1
rm -f "$out"/.ld.* "$out/.serve.err"
rm -f "$out/.bench.env" "$out/.nvml_init_rss" "$out/.p2p.json"
