#!/usr/bin/env bash
# On a machine with >= 2 NVIDIA GPUs, PyTorch and torchrun (not part of CI):
# measures what the nccl-env lint warns about, so its texts can quote a cost.
# Each case is one torchrun all-reduce (2 ranks) at 256 MiB and at 64 KiB, with
# one variable set; NVLink multicast stays off (shared machines).
# Usage: scripts/bench-nccl-env.sh OUTDIR
set -u
out=$1
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
cat > "$out/allreduce.py" <<'PY'
import os, time
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
w = dist.get_world_size()
for n_bytes, iters in ((256 << 20, 20), (64 << 10, 200)):
    x = torch.ones(n_bytes // 4, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / iters
    if dist.get_rank() == 0:
        busbw = n_bytes / dt * 2 * (w - 1) / w / 1e9
        print(f"RESULT bytes={n_bytes} time_us={dt * 1e6:.1f} busbw_GBps={busbw:.2f}", flush=True)
dist.destroy_process_group()
PY
run() {
  local name=$1; shift
  echo "== $name: $*"
  env "$@" timeout 100 torchrun --standalone --nproc-per-node 2 "$out/allreduce.py" \
    > "$out/$name.log" 2>&1
  echo "exit $?"
  grep -E "^RESULT|Error :|exitcode  :" "$out/$name.log" | sort -u | head -5
}
run default
# NCCL_BUFFSIZE ladder. Measured with NCCL 2.28.9 on 2x H200 (2026-11): 4 MiB
# (default) 299 GB/s, 1 MiB 312, 256 KiB 238, 64 KiB 104, 4 KiB 8.3, 2 KiB 4.2,
# 1 KiB 2.1; 512 bytes and less (and "4MB", which NCCL reads as 4) kill every
# rank with SIGFPE (exit code -8).
for b in 1048576 262144 65536 4096 2048 1024 512 64 4MB; do
  run "buffsize-$b" NCCL_BUFFSIZE=$b
done
run algo-ring NCCL_ALGO=Ring
run algo-tree NCCL_ALGO=Tree
run algo-nvls NCCL_ALGO=NVLS
run p2p-level-5 NCCL_P2P_LEVEL=5
run algo-unknown NCCL_ALGO=Rng
