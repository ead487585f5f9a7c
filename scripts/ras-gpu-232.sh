#!/usr/bin/env bash
# GPU capture of NCCL 2.32.3's RAS (diagnostics, progress counters, MONITOR), not part of
# CI. The GPU image carries only NCCL 2.28.9 (PyTorch's wheel), so the PyPI 2.32.3
# libnccl.so.2, slimmed to sm_90 by scripts/nccl-slim.py and xz-compressed to fit the
# carry limit, is LD_PRELOADed into the ranks (torch 2.11's libtorch_cuda.so finds
# libnccl through DT_RPATH, so LD_LIBRARY_PATH would not win). Reads only; changes no
# GPU setting. A 2-process job (scripts/ras_allreduce.py) with NCCL_RUN_RAS_DIAGNOSTICS=1
# and NCCL_PROGRESS_COUNTERS=1, `serve --watch-nccl` beside it, and:
#   healthy   STATUS (json, text, VERBOSE), DIAGNOSTICS (text, json) recorded; MONITOR
#             (json "all" and text) recorded for the whole run
#   stop      kill -STOP rank 1: serve names the hang; STATUS and DIAGNOSTICS recorded
#   cont      kill -CONT: healthy again
#   kill      kill -9 rank 1: STATUS at 5 s and once dead; serve names the dead rank
# Usage: scripts/ras-gpu-232.sh CARRYDIR OUTDIR, CARRYDIR holding libnccl.so.2.xz,
# nccl-preflight.xz and scripts/ras_{allreduce,capture,probe}.py. Results: OUTDIR/summary.txt
# and OUTDIR/captures.tar.gz (RAS replies, MONITOR streams, rank logs, serve's log, /job).
# Preparing CARRYDIR (here, not on the GPU machine; 41 MB in all):
#   python3 scripts/nccl-slim.py ~/.cache/nccl-preflight/nccl/2.32.3/libnccl.so.2 /tmp/l 90
#   xz -T2 -6 -c /tmp/l > D/libnccl.so.2.xz                 # 473 MB -> 40 MB
#   strip -o /tmp/b target/debug/nccl-preflight && xz -c /tmp/b > D/nccl-preflight.xz
#   cp scripts/ras-gpu-232.sh scripts/ras_allreduce.py scripts/ras_capture.py scripts/ras_probe.py D/
set -uo pipefail
d=$(cd "${1:?usage: ras-gpu-232.sh CARRYDIR OUTDIR}" && pwd)
out=${2:?usage}
mkdir -p "$out" && out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=python3
w=/tmp/ras232; rm -rf "$w"; mkdir -p "$w/cap" /tmp/nccl232
summary=$out/summary.txt; : > "$summary"
note() { echo "$(date -u +%T) $*" | tee -a "$summary"; }
pids=()
finish() {
    local p
    for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    cp "$w"/rank*.log "$w"/serve.log "$w"/timeline.txt "$w/cap/" 2>/dev/null
    tar -C "$w" -czf "$out/captures.tar.gz" cap
}
trap finish EXIT
cap() { "$py" "$d/ras_capture.py" "$w/cap/$1" "${@:2}" >> "$w/cap/index.txt" 2>&1; }
# Background work is started as python itself (not a shell function in a subshell), so
# that the kill in finish() reaches it and nothing keeps the caller's stdout open.
capbg() { "$py" "$d/ras_capture.py" "$w/cap/$1" "${@:2}" >> "$w/cap/index.txt" 2>&1 & pids+=($!); }
probe() { "$py" "$d/ras_probe.py" "$@"; }
job() { probe get /job > "$w/cap/job-$1.json"; }

"$py" - "$d" <<'PY'
import lzma, shutil, sys
d = sys.argv[1]
for src, dst in [("libnccl.so.2.xz", "/tmp/nccl232/libnccl.so.2"), ("nccl-preflight.xz", "/tmp/nccl232/nccl-preflight")]:
    with lzma.open(f"{d}/{src}") as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 24)
PY
chmod +x /tmp/nccl232/nccl-preflight
bin=/tmp/nccl232/nccl-preflight
note "decompressed: $(ls -l /tmp/nccl232 | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' ')"
nvidia-smi -L | tee -a "$summary"
export LD_PRELOAD=/tmp/nccl232/libnccl.so.2
note "torch sees NCCL $("$py" -c 'import torch; print(torch.cuda.nccl.version())' 2>&1 | tail -1)"
unset LD_PRELOAD

"$bin" serve --listen 127.0.0.1:9464 --interval 10m --watch-nccl --watch-interval 1s \
    --hang-after 10s 2> "$w/serve.log" &
pids+=($!)
declare -a rank
for r in 0 1; do
    dbg=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,RAS)
    [ "$r" = 1 ] && dbg=(NCCL_DEBUG_UNSET=1)   # rank 1: DIAG lines without NCCL_DEBUG?
    env LD_PRELOAD=/tmp/nccl232/libnccl.so.2 RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 "${dbg[@]}" NCCL_RUN_RAS_DIAGNOSTICS=1 \
        NCCL_PROGRESS_COUNTERS=1 PYTHONUNBUFFERED=1 \
        "$py" "$d/ras_allreduce.py" > "$w/rank$r.log" 2>&1 &
    rank[$r]=$!; pids+=($!)
done
"$py" "$d/ras_probe.py" timeline "$w/timeline.txt" < /dev/null > /dev/null 2>&1 & pids+=($!)
for _ in $(seq 240); do
    grep -q " start" "$w/rank1.log" 2>/dev/null && grep -q " start" "$w/rank0.log" && break
    sleep 0.5
done
grep -h " start" "$w"/rank*.log | tee -a "$summary"
capbg monitor-all.json json 300 "MONITOR all"
capbg monitor.text text 300 "MONITOR"
note "healthy: $(probe wait healthy 40)"; job healthy
cap healthy.json json 15 STATUS
cap healthy.text text 15 STATUS
cap healthy-verbose.text text 15 "VERBOSE STATUS"
cap healthy-verbose.json json 15 "VERBOSE STATUS"
cap diagnostics.text text 30 DIAGNOSTICS
cap diagnostics.json json 30 DIAGNOSTICS
cap diagnostics-arg.text text 10 "DIAGNOSTICS all"
note "diagnostics replies: $(wc -c "$w"/cap/diagnostics* | tr '\n' ' ')"

kill -STOP "${rank[1]}"; note "stop rank 1 (pid ${rank[1]})"
(sleep 5; cap stopped-5s.json json 15 STATUS) > /dev/null 2>&1 &
note "stop: $(probe wait hung 40)"; job stopped-hung
cap stopped-hung.json json 15 STATUS
cap stopped-hung-verbose.text text 15 "VERBOSE STATUS"
cap stopped-diagnostics.text text 20 DIAGNOSTICS
kill -CONT "${rank[1]}"; note "cont"
note "cont: $(probe wait healthy 40)"; job cont

kill -9 "${rank[1]}"; note "kill -9 rank 1"
(sleep 5; cap killed-5s.json json 15 STATUS) > /dev/null 2>&1 &
note "kill: $(probe wait dead 100)"; job killed-dead
cap killed-dead.json json 15 STATUS
cap killed-dead.text text 15 STATUS
cap killed-diagnostics.text text 20 DIAGNOSTICS
probe get /metrics | grep "^nccl_preflight_job_" > "$w/cap/metrics.txt"
grep -h "NCCL DIAG" "$w"/rank*.log | head -40 | tee -a "$summary"
note "done"
