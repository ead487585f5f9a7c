#!/usr/bin/env bash
# GPU acceptance of `serve --watch-nccl` (docs/serve.md, "Watching the running job"), not part
# of CI. Reads only; changes no GPU setting. On one host with two GPUs:
#   a 2-process PyTorch job (scripts/ras_allreduce.py, plain processes, one GPU each)
#   loops 1 MiB all-reduces; beside it `serve --watch-nccl` (port 9464) and, for the
#   memory and CPU comparison, `serve` without watching (port 9465), same binary.
# Steps (each judged, one line in summary.txt):
#   healthy    /job says healthy with 2 ranks; the real RAS replies are recorded
#   ras-load   CPU ticks of the ranks' "NCCL RAS" threads over 20 s with the watcher
#              stopped (SIGSTOP) and 20 s with it querying every --watch-interval
#   stop       kill -STOP rank 1: /job says hung naming rank 1's pid, /job/livez 503,
#              within --hang-after + one --watch-interval (+ 5 s for the probe's poll)
#   cont       kill -CONT: healthy again
#   kill       kill -9 rank 1: hung, then dead naming rank 1's pid
#   memory     serve's RSS and CPU watching against not watching
# Usage: scripts/ras-gpu.sh BINARY [OUTDIR]   (OUTDIR defaults to $OUT or ./ras-gpu-out)
# On the lent machine (kind nvidia-h100-x2 or nvidia-h200-x2; carry the folder):
#   d=.carry-ras; mkdir -p $d && cp BINARY scripts/ras-gpu.sh scripts/ras_harness.sh scripts/ras_*.py $d
#   bash $d/ras-gpu.sh $d/nccl-preflight "$OUT"
# Results: OUTDIR/summary.txt, timeline.txt (/job's changes), serve-watch.log,
# serve-base.log, ranks.log, replies.tar.gz (the recorded RAS replies). Exit 0 when every
# step passed, 1 otherwise, 2 on a setup error.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: ras-gpu.sh BINARY [OUTDIR]}
out=${2:-${OUT:-ras-gpu-out}}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
[ -x "$bin" ] || { echo "ras-gpu: $bin is not executable" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# shellcheck source=scripts/ras_harness.sh
. "$here/ras_harness.sh"
ras_harness gpu ""
probe() { "$py" "$here/ras_probe.py" "$@"; }
record() { "$py" "$here/ras_record.py" "$1" "$work/replies/$2.$1" >> "$work/replies/index.txt" 2>&1; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

note "ras-gpu: $(date -u +%FT%TZ), --hang-after ${hang_after}s, --watch-interval ${interval}s"
nvidia-smi -L 2>&1 | tee -a "$summary"
"$bin" serve --listen 127.0.0.1:9464 --interval 10m --watch-nccl \
    --watch-interval "${interval}s" --hang-after "${hang_after}s" 2> "$out/serve-watch.log" &
watch_pid=$!; pids+=($!)
"$bin" serve --listen 127.0.0.1:9465 --interval 10m 2> "$out/serve-base.log" &
base_pid=$!; pids+=($!)
declare -a rank
for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,RAS PYTHONUNBUFFERED=1 \
        "$py" "$here/ras_allreduce.py" > "$work/rank$r.log" 2>&1 &
    rank[$r]=$!; pids+=($!)
done
probe timeline "$out/timeline.txt" &
pids+=($!)
t_start=$(date +%s)
for _ in $(seq 240); do
    grep -q " start" "$work/rank1.log" 2>/dev/null && grep -q " start" "$work/rank0.log" && break
    sleep 0.5
done
grep -h " start" "$work"/rank*.log | tee -a "$summary"
w0=$(ticks "$watch_pid"); b0=$(ticks "$base_pid")

# healthy
if line=$(probe wait healthy 60); then pass "healthy after $line"; else fail "healthy: $line"; fi
record json healthy; record text healthy

# RAS thread load: 20 s unqueried, 20 s queried every --watch-interval
kill -STOP "$watch_pid"
r0=$(( $(probe threadcpu "${rank[0]}" "NCCL RAS") + $(probe threadcpu "${rank[1]}" "NCCL RAS") ))
sleep 20
r1=$(( $(probe threadcpu "${rank[0]}" "NCCL RAS") + $(probe threadcpu "${rank[1]}" "NCCL RAS") ))
kill -CONT "$watch_pid"
sleep 20
r2=$(( $(probe threadcpu "${rank[0]}" "NCCL RAS") + $(probe threadcpu "${rank[1]}" "NCCL RAS") ))
note "ras-load: NCCL RAS threads of both ranks: $((r1 - r0)) ticks in 20 s unqueried, $((r2 - r1)) ticks in 20 s queried every ${interval}s (1 tick = 10 ms)"

# stop
kill -STOP "${rank[1]}"
(sleep 5; record json stopped-5s) &
stop_step stop "rank 1" "${rank[1]}" "pid ${rank[1]} "
record json stopped-hung

# cont
kill -CONT "${rank[1]}"
cont_step

# kill
kill -9 "${rank[1]}"
(sleep 5; record json killed-5s; record text killed-5s) &
# (timeline.txt has the hung state on the way, if it came before RAS declared the rank dead)
if line=$(probe wait dead 150); then
    if [[ $line == *"pid ${rank[1]} "* ]]; then pass "kill: dead named: $line"; else fail "kill: dead, not naming pid ${rank[1]}: $line"; fi
else
    fail "kill: $line"
fi
record json killed-dead; record text killed-dead
probe get /metrics | grep "^nccl_preflight_job_" > "$work/replies/metrics.txt"

# memory and CPU
w1=$(ticks "$watch_pid"); b1=$(ticks "$base_pid"); t=$(( $(date +%s) - t_start ))
wr=$(rss_kb "$watch_pid"); br=$(rss_kb "$base_pid")
note "memory: serve --watch-nccl RSS ${wr} kB, serve ${br} kB (difference $((wr - br)) kB); CPU over ${t} s: $((w1 - w0)) and $((b1 - b0)) ticks"
if [ $((wr - br)) -le 2048 ]; then pass "memory: watching adds $((wr - br)) kB (limit 2048)"; else fail "memory: watching adds $((wr - br)) kB (limit 2048)"; fi
exit $failed
