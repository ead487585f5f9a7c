"""What a cold cuInit costs beside the other work of `init --bench` (reads only; not part
of CI). Usage: python3 scripts/cuinit_beside.py NCCL_PREFLIGHT_BINARY [REPS]

Prints, per repetition, the wall ms of cuInit in a fresh python3 process (ctypes):
- alone;
- beside a process that has called nvmlInit_v2 and taken every GPU's handle, then idles;
- beside `nccl-preflight check --cuda off` started at the same moment (what init's own
  gathering does while the bench's child initialises CUDA);
- beside a process that holds CUDA initialised (cuInit only, no context).
A pause of 1.5 s between cases lets each process's teardown finish first.
"""
import subprocess
import sys
import time

BIN = sys.argv[1]
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3

CUINIT = "import ctypes,time,sys; c=ctypes.CDLL('libcuda.so.1'); t=time.time(); c.cuInit(0); " \
         "print(round((time.time()-t)*1e3)); sys.stdout.flush(); time.sleep(float(sys.argv[1]))"
NVML_HOLD = """
import ctypes, sys, time
n = ctypes.CDLL('libnvidia-ml.so.1'); n.nvmlInit_v2()
count = ctypes.c_uint(); n.nvmlDeviceGetCount_v2(ctypes.byref(count))
for i in range(count.value):
    h = ctypes.c_void_p(); n.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
print('ready'); sys.stdout.flush(); time.sleep(4)
"""


def cuinit(hold=0.0):
    return subprocess.Popen([sys.executable, "-c", CUINIT, str(hold)], stdout=subprocess.PIPE, text=True)


def ms(p):
    return int(p.stdout.readline().strip() or -1)


def case_alone():
    p = cuinit()
    v = ms(p)
    p.wait()
    return v


def case_nvml_holder():
    h = subprocess.Popen([sys.executable, "-c", NVML_HOLD], stdout=subprocess.PIPE, text=True)
    h.stdout.readline()
    v = case_alone()
    h.kill()
    h.wait()
    return v


def case_beside_check():
    c = subprocess.Popen([BIN, "check", "--cuda", "off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    v = case_alone()
    c.wait()
    return v


def case_cuda_holder():
    h = cuinit(3.0)
    ms(h)
    v = case_alone()
    h.wait()
    return v


for rep in range(REPS):
    row = []
    for name, case in [("alone", case_alone), ("beside an idle NVML holder", case_nvml_holder),
                       ("beside check --cuda off", case_beside_check),
                       ("beside a process holding CUDA", case_cuda_holder)]:
        time.sleep(1.5)
        row.append(f"{name} {case()}")
    print(f"run {rep}: cuInit ms: " + "; ".join(row), flush=True)
