#!/usr/bin/env bash
# serve's resident memory against the NVML floor (issue 29: within 5 MB of it), on a GPU
# machine in one call of about a minute (not part of CI; reads only, changes no GPU
# setting). Needs bash, coreutils, awk and cc (the floor process is built here from
# scripts/nvml_init_rss.c, as scripts/gpu-perf-phases.sh did; FLOOR=PATH uses one built
# elsewhere). Writes under OUTDIR:
# - summary.txt: VmRSS of the floor (a process that only loads NVML and calls
#   nvmlInit_v2) and of `serve --interval 1s` after SECONDS, the new and the baseline
#   binary side by side in each of RUNS rounds (which one starts first alternates), with
#   /healthz, /readyz and /metrics asked at 5 and 10 s as the kubelet and Prometheus
#   would; medians and the excess over the floor.
# - smaps-new.txt, smaps-base.txt, smaps-floor.txt: Rss, anonymous and clean pages per
#   mapping (grouped by file; "[anon]" is every anonymous mapping, thread stacks and
#   NVML's allocations alike) and smaps_rollup; the floor's and serve's full maps.
# - libcuda.txt: whether the floor maps libcuda, after which NVML call it appears
#   (`nvml_init_rss steps`), and in serve: `serve --trace` under LD_DEBUG=files, the
#   loader's lines and the trace's in the order they were written (one stream), around
#   the moment libnvidia-ml loads libcuda.
# Usage: scripts/gpu-serve-rss.sh BINARY BASELINE OUTDIR [RUNS] [SECONDS]
# SERVE_ARGS adds serve flags and SERVE_CWD sets its directory (with the fake NVML:
# SERVE_CWD=tests/fixtures/gpu-h100-nv18 SERVE_ARGS='--host-root root --replay-kernel
# kernel.json', FAKE_GPU_SCENARIO and LD_LIBRARY_PATH as tests/integration/support.rs sets).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 3 ] || { echo "usage: $0 BINARY BASELINE OUTDIR [RUNS] [SECONDS]" >&2; exit 2; }
bin=$(realpath "$1") base=$(realpath "$2") out=$(realpath -m "$3") runs=${4:-3} secs=${5:-15}
for b in "$bin" "$base"; do
  [ -x "$b" ] || { echo "$0: $b: not an executable" >&2; exit 2; }
done
mkdir -p "$out" || exit 2
cd "${SERVE_CWD:-.}" || exit 2
port=$((19600 + RANDOM % 300))

# shellcheck source=scripts/gpu_timing.sh
. "$here/gpu_timing.sh"  # ms, median, smi_pair
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null; }

# Per mapping group of PID: Rss, Anonymous, Private_Clean, Shared_Clean (kB), largest first.
breakdown() {
  echo "-- per mapping (kB): Rss Anonymous Private_Clean Private_Dirty Shared_Clean Shared_Dirty name"
  awk -v exe="$(readlink "/proc/$1/exe")" '
    /^[0-9a-f]+-[0-9a-f]+ / { name = ($6 == "" ? "[anon]" : $6); if (name == exe) name = name " (this binary)"; next }
    $1 == "Rss:" || $1 == "Anonymous:" || $1 ~ /^(Private|Shared)_(Clean|Dirty):$/ { kb[name, $1] += $2; seen[name] = 1 }
    END { for (n in seen) if (kb[n, "Rss:"] > 0) printf "%6d %6d %6d %6d %6d %6d %s\n", kb[n, "Rss:"], kb[n, "Anonymous:"],
      kb[n, "Private_Clean:"], kb[n, "Private_Dirty:"], kb[n, "Shared_Clean:"], kb[n, "Shared_Dirty:"], n }
  ' "/proc/$1/smaps" | sort -rn
  echo "-- smaps_rollup"; cat "/proc/$1/smaps_rollup"
  echo "-- maps"; cat "/proc/$1/maps"
}

# GET PATH from serve on PORT with bash's /dev/tcp, bounded by 5 s.
ask() {
  # shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
  timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$0 && printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3 && cat <&3 >/dev/null' "$1" "$2" 2>/dev/null
}

stop() { kill -TERM "$1" 2>/dev/null; timeout 10 tail --pid="$1" -f /dev/null; kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

floor=${FLOOR:-$out/.nvml_init_rss}
[ -n "${FLOOR:-}" ] || cc -O2 -o "$floor" "$here/nvml_init_rss.c" -ldl || echo "no cc: no floor" >&2

{
  echo "== machine"; nvidia-smi -L 2>/dev/null; uname -r
  echo "new: $("$bin" --version | head -1) ($bin)"; echo "baseline: $("$base" --version | head -1) ($base)"
  echo "== the floor: VmRSS (kB) of a process that only loads NVML and calls nvmlInit_v2"
  f_all=""
  for i in 1 2 3; do
    r=$(timeout 60 "$floor" | awk '/rss_after/ {print $2}'); f_all+="$r "; echo "floor run $i: $r"
  done
  declare -A v t
  for i in $(seq "$runs"); do
    order="new base"; [ $((i % 2)) = 0 ] && order="base new"
    declare -A pid=()
    for which in $order; do
      b=$bin; [ "$which" = base ] && b=$base
      p=$port; [ "$which" = base ] && p=$((port + 1))
      # shellcheck disable=SC2086
      "$b" serve --listen "127.0.0.1:$p" --interval 1s ${SERVE_ARGS:-} 2>>"$out/.serve-$which.err" &
      pid[$which]=$!
    done
    for _ in 1 2; do  # at 5 and 10 s
      sleep 5
      for which in new base; do
        p=$port; [ "$which" = base ] && p=$((port + 1))
        for path in /healthz /readyz /metrics; do ask "$p" "$path"; done
      done
    done
    sleep $((secs > 10 ? secs - 10 : 0))
    for which in new base; do
      kb=$(status_kb "${pid[$which]}" VmRSS); v[$which]+="$kb "; t[$which]=$(status_kb "${pid[$which]}" Threads)
      echo "round $i ($order): $which serve VmRSS $kb kB after $secs s, threads ${t[$which]}"
      [ "$i" = 1 ] && { echo "== $which serve after $secs s, round 1 ($order)"; breakdown "${pid[$which]}"; } > "$out/smaps-$which.txt"
    done
    for which in new base; do stop "${pid[$which]}"; done
  done
  fm=$(echo "$f_all" | median) nm=$(echo "${v[new]}" | median) bm=$(echo "${v[base]}" | median)
  echo "== medians (kB): floor $fm, new serve $nm, baseline serve $bm"
  if [ -n "$fm" ] && [ -n "$nm" ] && [ -n "$bm" ]; then
    echo "over the floor: new +$((${nm%.*} - ${fm%.*})) kB, baseline +$((${bm%.*} - ${fm%.*})) kB (target: within 5 MB)"
  fi
  echo "serve's standard error (new):"; head -c 1500 "$out/.serve-new.err"
} > "$out/summary.txt" 2>&1

{
  echo "== the floor, held after nvmlInit_v2"
  "$floor" hold 3 > "$out/.floor.out" &
  fp=$!
  for _ in $(seq 50); do grep -q rss_after "$out/.floor.out" 2>/dev/null && break; sleep 0.1; done
  cat "$out/.floor.out"; breakdown "$fp"
  wait "$fp"
} > "$out/smaps-floor.txt" 2>&1

{
  echo "== the floor: VmRSS and libcuda after each NVML call serve makes (nvml_init_rss steps)"
  timeout 60 "$floor" steps
  echo "== serve --trace under LD_DEBUG=files for 5 s: the loader's lines (PID-prefixed) and the"
  echo "   trace's, one stream in the order written; the probe child's (facts-child) come"
  echo "   when it ends. Around each load of libcuda:"
  # shellcheck disable=SC2086
  LD_DEBUG=files "$bin" serve --listen "127.0.0.1:$((port + 2))" --interval 1s --trace ${SERVE_ARGS:-} \
    > /dev/null 2> "$out/.ld-trace.txt" &
  sp=$!
  sleep 5
  echo "server pid $sp: libcuda mappings $(grep -c libcuda "/proc/$sp/maps")"
  stop "$sp"
  grep -n -B12 -A4 'file=libcuda\.so' "$out/.ld-trace.txt" | grep -v 'generating link map\|dynamic: \|^[0-9]*-[[:space:]]*[0-9]*:[[:space:]]*$' | head -80
  grep -q 'file=libcuda\.so' "$out/.ld-trace.txt" || echo "(libcuda was not loaded)"
  echo "-- the whole stream: serve-ld-trace.txt"
} > "$out/libcuda.txt" 2>&1
mv "$out/.ld-trace.txt" "$out/serve-ld-trace.txt"
rm -f "$out"/.serve-*.err "$out/.floor.out" "$out/.nvml_init_rss"
cat "$out/summary.txt"
