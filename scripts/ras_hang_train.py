"""The trainer of scripts/ras-hang-gpu.sh: one process per GPU looping 1 MiB all-reduces
20 ms apart (plain processes: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and
at iteration FAULT_ITER the rank FAULT_RANK does what FAULT says, writing the time it did
so to FAULT_FILE first:
  divergent  calls all_gather_into_tensor (line 37) where the others call all_reduce (42)
  sleep      sleeps for an hour in Python, outside any collective (line 40)
  (none)     nothing: the harness stops or kills the process itself
The line numbers are what the hang report must name (tests/data/ras/README.md)."""

import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
local = int(os.environ.get("LOCAL_RANK", 0))
world = int(os.environ["WORLD_SIZE"])
fault = os.environ.get("FAULT", "none")
fault_rank = int(os.environ.get("FAULT_RANK", "-1"))
fault_iter = int(os.environ.get("FAULT_ITER", "250"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
x = torch.ones(256 * 1024, device="cuda")
y = torch.empty(256 * 1024 * world, device="cuda")
print(f"rank {rank} pid {os.getpid()} start, NCCL {torch.cuda.nccl.version()}", flush=True)


def mark():
    with open(os.environ["FAULT_FILE"], "w") as f:
        f.write(f"{time.time():.3f} rank {rank} {fault} at iteration {fault_iter}\n")


def step(i):
    if i == fault_iter and rank == fault_rank and fault == "divergent":
        mark()
        dist.all_gather_into_tensor(y, x)
    elif i == fault_iter and rank == fault_rank and fault == "sleep":
        mark()
        time.sleep(3600)
    else:
        dist.all_reduce(x)


i = 0
while True:
    i += 1
    step(i)
    torch.cuda.synchronize()
    time.sleep(0.02)
