#!/usr/bin/env bash
# serve under load: /healthz and /metrics latency (p50/p99) and throughput from wrk on
# loopback, and the server's RSS over an hour's worth of check runs (60 runs at the
# default 60 s interval, compressed here to --interval 1s). Not part of CI.
# Usage: scripts/bench-serve.sh [RUNS]   (needs wrk: apt-get install wrk)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-60}
cargo build --release --quiet
port=19464
target/release/nccl-preflight serve --listen 127.0.0.1:$port --interval 1s 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
sleep 2
rss() { awk '/VmRSS/ {print $2 " kB"}' /proc/$pid/status; }
echo "RSS after the first run: $(rss)"
for path in /healthz /metrics; do
  echo "== $path"
  wrk -t2 -c16 -d15s --latency "http://127.0.0.1:$port$path" | grep -E 'Latency|50%|99%|Requests/sec|Non-2xx|errors'
done
count() { curl -s "http://127.0.0.1:$port/metrics" | awk '/^nccl_preflight_runs_total / {print $2}'; }
echo "RSS after load: $(rss) at run $(count)"
next=50
while [ "$(count)" -lt "$runs" ]; do
  sleep 5
  if [ "$(count)" -ge "$next" ]; then echo "RSS at run $(count): $(rss)"; next=$((next + 50)); fi
done
echo "RSS after $(count) runs: $(rss)"
kill -TERM $pid; wait $pid || true
