#!/usr/bin/env bash
# serve --watch-nccl's memory and CPU at a job's size, measured (docs/job-watch.md,
# "Bounded at any job size"). For each size (default 2 and 16384 ranks in one
# communicator, scripts/ras_fake.py's synthesized replies, jsonWriteRankData's layout),
# a fake RAS port answers STATUS with the reply, and `serve --watch-nccl --watch-interval
# 1s` (no GPU libraries, checks every hour) polls it for SECONDS (default 30); then one
# rank of the job is put one AllReduce behind so the diagnosis and the report run too.
# Prints per size: the reply's bytes, serve's peak RSS (VmHWM) and RSS at the end, the
# CPU it used (utime+stime) over the polls, and what /job said.
# Usage: scripts/bench-ras-scale.sh [BINARY] [SECONDS] [SIZES...]
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/nccl-preflight}
secs=${2:-30}
shift $(( $# < 2 ? $# : 2 ))
sizes=("${@:-2 16384}")
read -r -a sizes <<< "${sizes[*]}"
py=${PYTHON:-python3}
[ -x "$bin" ] || { echo "bench-ras-scale: $bin is not executable (cargo build --release)" >&2; exit 2; }
work=$(mktemp -d /tmp/ras-scale.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT
hz=$(getconf CLK_TCK)
port=$((30000 + RANDOM % 10000))

for n in "${sizes[@]}"; do
    "$py" "$here/ras_fake.py" reply "$n" "$work/reply.json"
    bytes=$(stat -c %s "$work/reply.json")
    "$py" "$here/ras_fake.py" serve "$port" "$work/reply.json" & pids+=($!); fake=$!
    sleep 0.5
    NCCL_PREFLIGHT_NVML_LIB=/nonexistent/libnvidia-ml.so.1 "$bin" serve --listen 127.0.0.1:0 \
        --interval 60m --watch-nccl --ras-addr "127.0.0.1:$port" --watch-interval 1s \
        --hang-after 5s 2> "$work/serve.log" & pids+=($!); serve=$!
    sleep 2
    addr=$(sed -n 's/.* on \([0-9.:]*\) .*/\1/p' "$work/serve.log" | head -1)
    t0=$(awk '{print $14 + $15}' "/proc/$serve/stat")
    sleep "$secs"
    t1=$(awk '{print $14 + $15}' "/proc/$serve/stat")
    healthy=$(curl -s "http://$addr/job" | "$py" -c 'import json,sys; v=json.load(sys.stdin); print(v["state"], v["ranks"], "ranks")')
    "$py" "$here/ras_fake.py" reply "$n" "$work/reply.json" $((n - 1))
    sleep 8
    job=$(curl -s "http://$addr/job")
    hung=$(printf '%s' "$job" | "$py" -c 'import json,sys; v=json.load(sys.stdin); print(v["state"], "|", v["headline"][:160])')
    hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$serve/status")
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$serve/status")
    cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$secs" 'BEGIN{printf "%.2f s CPU in %d s (%.1f%% of a core, %.0f ms a poll)", (b-a)/hz, s, 100*(b-a)/hz/s, 1000*(b-a)/hz/s}')
    echo "ranks $n: reply $bytes bytes; serve VmHWM $hwm kB, VmRSS $rss kB; $cpu; /job ${#job} bytes"
    echo "  healthy: $healthy"
    echo "  one rank behind: $hung"
    kill "$serve" "$fake" 2>/dev/null; wait "$serve" "$fake" 2>/dev/null
done
