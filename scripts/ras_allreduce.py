"""The trainer of scripts/ras-gpu.sh: one process per GPU looping 1 MiB all-reduces,
20 ms apart, until killed. Started as plain processes (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), not under torchrun, so that when one rank is killed the
others stay in their all-reduce as a multi-node job's ranks do (torchrun's agent ends
the whole local group at once: ../shared/data/ras-2.28.9/kill.txt)."""

import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
local = int(os.environ.get("LOCAL_RANK", rank))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
x = torch.ones(256 * 1024, device="cuda")
print(f"rank {rank} pid {os.getpid()} start, NCCL {torch.cuda.nccl.version()}", flush=True)
i = 0
while True:
    dist.all_reduce(x)
    torch.cuda.synchronize()
    i += 1
    if i % 1000 == 0:
        print(f"rank {rank} iteration {i}", flush=True)
    time.sleep(0.02)
