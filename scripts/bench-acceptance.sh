#!/usr/bin/env bash
# On a machine with 2+ NVIDIA GPUs, PyTorch and torchrun (not part of CI): runs
# `nccl-preflight bench` side by side with the figures it should match, in one go:
#  - nvidia-smi's view of the links (topo -m, nvlink -s);
#  - `bench` (p2p and nccl), wall time included, three times;
#  - a PyTorch device-to-device copy of the same size, per direction and both at once;
#  - a PyTorch all-reduce through torchrun at 256 MiB and 1 GiB;
#  - nccl-tests' all_reduce_perf, when its source is given and nvcc and nccl.h exist.
# Usage: scripts/bench-acceptance.sh BINARY OUTDIR [NCCL_TESTS_SRC]
set -u
bin=$1 out=$2 nccl_tests=${3:-}
mkdir -p "$out"
# NVLink multicast (NVLS) stays off on shared machines.
export NCCL_NVLS_ENABLE=0
nproc=$(nvidia-smi -L | wc -l)
nvidia-smi topo -m > "$out/topo-m.txt" 2>&1
nvidia-smi nvlink -s > "$out/nvlink-s.txt" 2>&1

for i in 1 2 3; do
  start=$(date +%s%N)
  "$bin" bench --format json > "$out/bench-$i.json" 2> "$out/bench-$i.stderr"
  rc=$?
  end=$(date +%s%N)
  echo "bench run $i: exit $rc, wall $(( (end - start) / 1000000 )) ms" | tee -a "$out/summary.txt"
done
"$bin" bench > "$out/bench-human.txt" 2>&1
"$bin" bench p2p --size 1GiB --format json > "$out/bench-p2p-1g.json" 2>&1

cat > "$out/d2d_copy.py" <<'PY'
import sys, torch
size = int(sys.argv[1]); iters = 10
n = torch.cuda.device_count()
for a in range(n):
    for b in range(n):
        if a == b: continue
        x = torch.ones(size // 4, device=f"cuda:{a}"); y = torch.empty(size // 4, device=f"cuda:{b}")
        x2 = torch.ones(size // 4, device=f"cuda:{b}"); y2 = torch.empty(size // 4, device=f"cuda:{a}")
        for _ in range(3): y.copy_(x)
        torch.cuda.synchronize(a); torch.cuda.synchronize(b)
        with torch.cuda.device(a):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters): y.copy_(x)
            e.record(); e.synchronize()
        one = size * iters / (s.elapsed_time(e) * 1e6)
        sa = torch.cuda.Stream(device=a); sb = torch.cuda.Stream(device=b)
        torch.cuda.synchronize(a); torch.cuda.synchronize(b)
        with torch.cuda.device(a):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(sa)
        sb.wait_event(s)
        with torch.cuda.stream(sa):
            for _ in range(iters): y.copy_(x, non_blocking=True)
        with torch.cuda.stream(sb):
            for _ in range(iters): y2.copy_(x2, non_blocking=True)
        done = torch.cuda.Event(); done.record(sb); sa.wait_event(done)
        with torch.cuda.device(a):
            e.record(sa); e.synchronize()
        both = 2 * size * iters / (s.elapsed_time(e) * 1e6)
        print(f"TORCH_COPY {a}->{b} bytes={size} one_way_GBps={one:.1f} both_GBps={both:.1f}", flush=True)
PY
python3 "$out/d2d_copy.py" $((256 << 20)) > "$out/torch-copy.txt" 2>&1
python3 "$out/d2d_copy.py" $((1 << 30)) >> "$out/torch-copy.txt" 2>&1

cat > "$out/allreduce.py" <<'PY'
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
for size in (256 << 20, 1 << 30):
    x = torch.ones(size // 4, device="cuda")
    for _ in range(5): dist.all_reduce(x)
    torch.cuda.synchronize()
    n, t = 20, time.perf_counter()
    for _ in range(n): dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / n
    w = dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"TORCH_ALLREDUCE bytes={size} busbw_GBps={size / dt * 2 * (w - 1) / w / 1e9:.1f}", flush=True)
dist.destroy_process_group()
PY
torchrun --standalone --nproc_per_node="$nproc" "$out/allreduce.py" > "$out/torch-allreduce.txt" 2>&1

if [ -n "$nccl_tests" ] && command -v nvcc >/dev/null; then
  header=$(find / -xdev -name nccl.h -path '*include*' 2>/dev/null | head -1)
  if [ -n "$header" ]; then
    lib=$(find / -xdev -name 'libnccl.so.2*' 2>/dev/null | head -1)
    echo "nccl-tests: nccl.h $header, libnccl $lib" >> "$out/summary.txt"
    work=$(mktemp -d); cp -r "$nccl_tests"/. "$work"
    # NCCL_HOME as nccl-tests expects it: include/nccl.h and lib/libnccl.so.
    home=$work/nccl; mkdir -p "$home/lib"
    ln -s "$(dirname "$header")" "$home/include"; ln -s "$lib" "$home/lib/libnccl.so"
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
    if make -C "$work/src" -j16 "$work/build/all_reduce_perf" BUILDDIR="$work/build" NCCL_HOME="$home" \
         NVCC_GENCODE="-gencode=arch=compute_$cap,code=sm_$cap" \
         > "$out/nccl-tests-build.txt" 2>&1; then
      LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}" "$work/build/all_reduce_perf" \
        -b 256M -e 1G -f 4 -g "$nproc" -w 5 -n 20 > "$out/all_reduce_perf.txt" 2>&1
    else
      echo "nccl-tests: build failed (see nccl-tests-build.txt)" >> "$out/summary.txt"
    fi
  else
    echo "nccl-tests: no nccl.h found" >> "$out/summary.txt"
  fi
fi
grep -h "TORCH_" "$out"/torch-*.txt >> "$out/summary.txt"
grep -E '^ +[0-9]+ ' "$out/all_reduce_perf.txt" >> "$out/summary.txt" 2>/dev/null
cat "$out/summary.txt"
