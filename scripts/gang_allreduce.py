#!/usr/bin/env python3
"""All-reduce bus bandwidth through PyTorch and NCCL, one process per GPU under
torchrun, for the busbw comparison in scripts/gang-gpu.sh (leg e).

Timed as nccl-tests and the gang time it: warm-up iterations, then ITERS
all-reduces of a float32 buffer of each size, the time per op being the MAX over
ranks (the gang reports the slowest rank's view; nccl-tests' default is the mean,
NVIDIA/nccl-tests src/common.cu). busbw = bytes / time * 2(n-1)/n
(NVIDIA/nccl-tests src/all_reduce.cu, n = all ranks). Before timing, one
all-reduce of rank+1 is checked against n(n+1)/2 so a wrong sum fails the run.

Usage: torchrun ... gang_allreduce.py --sizes 64MiB,256MiB [--iters 20]
       [--warmup 5] --out FILE   (rank 0 writes FILE as JSON)
"""
import argparse
import json
import os
import re
import sys
import time

import torch
import torch.distributed as dist

UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
         "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text):
    """'64MiB' -> 67108864; a bare number is bytes. Same spelling as nccl-preflight's."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B?|B)?\s*", text)
    if not m or (m.group(2) or "") not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64MiB)")
    return int(m.group(1)) * UNITS[m.group(2) or ""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", required=True, type=lambda s: [size(x) for x in s.split(",")])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    rank, n = dist.get_rank(), dist.get_world_size()

    check = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(check)
    torch.cuda.synchronize()
    want = n * (n + 1) / 2
    if not bool((check == want).all()):
        print(f"rank {rank}: all-reduce sum {check[0].item()} != {want}", file=sys.stderr)
        sys.exit(1)

    rows = []
    for nbytes in args.sizes:
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        per_op = torch.tensor([(time.perf_counter() - t0) / args.iters], device=device)
        dist.all_reduce(per_op, op=dist.ReduceOp.MAX)
        sec = per_op.item()
        algbw = nbytes / 1e9 / sec
        rows.append({"bytes": nbytes, "time_s": sec, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (n - 1) / n})
    if rank == 0:
        result = {"ranks": n, "torch": torch.__version__,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                  "iters": args.iters, "sizes": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
