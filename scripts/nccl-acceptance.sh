#!/usr/bin/env bash
# On a machine with NVIDIA GPUs, PyTorch and torchrun (not part of CI): proves NCCL
# picks up what nccl-preflight writes.
#  1. `init` on this machine; a 2-rank torchrun all-reduce with NCCL_CONF_FILE set to
#     the generated nccl.conf must show every key reaching NCCL ("set by environment",
#     or, for keys NCCL only reads later or never prints, in the process environment).
#  2. The same with a nccl.conf replayed from other facts (FACTS_FILE, e.g. an EFA
#     node's), to cover keys this machine does not get (FI_* included).
#  3. `exec -- torchrun ...`: the tuned variables reach NCCL through the environment.
# Each log is also read back by `explain-log`. Usage:
#   scripts/nccl-acceptance.sh BINARY OUTDIR [FACTS_FILE]
set -u
bin=$1 out=$2 facts=${3:-}
mkdir -p "$out"
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0
nproc=$(nvidia-smi -L | wc -l)
cat > "$out/allreduce.py" <<'PY'
import ctypes, os, time
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(64 * 1024 * 1024, device="cuda")  # 256 MiB of float32
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
n, t = 20, time.perf_counter()
for _ in range(n):
    dist.all_reduce(x)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / n
w = dist.get_world_size()
busbw = x.numel() * 4 / dt * 2 * (w - 1) / w / 1e9
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
if dist.get_rank() == 0:
    print(f"RESULT bytes={x.numel() * 4} busbw_GBps={busbw:.1f}", flush=True)
    for k in os.environ.get("CHECK_KEYS", "").split():
        v = libc.getenv(k.encode())
        print(f"GETENV {k}={v.decode() if v else '<unset>'}", flush=True)
dist.destroy_process_group()
PY
failures=0
verify() { # conf log
  local conf=$1 log=$2 key value
  while IFS='=' read -r key value; do
    case "$key" in ''|'#'*) continue ;; esac
    if grep -q "$key set by environment to $value" "$log"; then
      echo "ok      $key=$value: NCCL printed it (set by environment)"
    elif grep -q "GETENV $key=$value\$" "$log"; then
      echo "ok      $key=$value: in the process environment after NCCL init"
    else
      echo "MISSING $key=$value"; failures=$((failures + 1))
    fi
  done < "$conf"
}
run() { # log, env..., -- then torchrun args
  local log=$1; shift
  env "$@" torchrun --standalone --nproc_per_node="$nproc" "$out/allreduce.py" > "$log" 2>&1
  echo "exit $? $(grep RESULT "$log")"
}
keys_of() { grep -v '^#' "$1" | cut -d= -f1 | tr '\n' ' '; }

echo "== 1. this machine's nccl.conf"
"$bin" init --nccl-conf "$out/nccl.conf" --env-file "$out/nccl.env" --report "$out/report.json" > "$out/init.txt"
echo "init exit $?"; cat "$out/nccl.conf"
run "$out/conf.log" NCCL_CONF_FILE="$out/nccl.conf" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET CHECK_KEYS="$(keys_of "$out/nccl.conf")"
verify "$out/nccl.conf" "$out/conf.log"

if [ -n "$facts" ]; then
  echo "== 2. a nccl.conf replayed from $facts (NCCL_TOPO_FILE left out: it names a file this machine lacks)"
  "$bin" init --facts "$facts" --nccl-conf "$out/replayed-full.conf" > /dev/null
  grep -v '^NCCL_TOPO_FILE=' "$out/replayed-full.conf" > "$out/replayed.conf"; cat "$out/replayed.conf"
  run "$out/replayed.log" NCCL_CONF_FILE="$out/replayed.conf" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET CHECK_KEYS="$(keys_of "$out/replayed.conf")"
  verify "$out/replayed.conf" "$out/replayed.log"
fi

echo "== 3. exec -- torchrun"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET CHECK_KEYS="$(keys_of "$out/nccl.conf")" \
  "$bin" exec -- torchrun --standalone --nproc_per_node="$nproc" "$out/allreduce.py" > "$out/exec.log" 2>&1
echo "exec exit $? $(grep RESULT "$out/exec.log")"
verify "$out/nccl.conf" "$out/exec.log"

for log in conf replayed exec; do
  [ -f "$out/$log.log" ] || continue
  "$bin" explain-log --format json "$out/$log.log" > "$out/$log.explain.json"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], d['transport_counts'], [f['id'] for f in d['findings']])" "$out/$log.explain.json"
done
echo "failures: $failures"
[ "$failures" -eq 0 ]
