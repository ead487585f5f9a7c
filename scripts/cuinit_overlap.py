"""How cuInit and primary-context creation behave beside other CUDA processes
(scripts/gpu-perf-phases.sh; reads only). Prints wall ms for: cuInit alone; cuInit while
another process holds CUDA initialised; two processes' cuInit at once; and the
primary contexts of every GPU retained one after another vs from one thread per GPU.
"""
import ctypes
import subprocess
import sys
import threading
import time

CODE = "import ctypes,time,sys; c=ctypes.CDLL('libcuda.so.1'); t=time.time(); c.cuInit(0); " \
       "print(round((time.time()-t)*1e3)); sys.stdout.flush(); time.sleep(float(sys.argv[1]))"


def cuinit(hold=0.0):
    return subprocess.Popen([sys.executable, "-c", CODE, str(hold)], stdout=subprocess.PIPE, text=True)


def ms(p):
    return int(p.stdout.readline().strip() or -1)


def retain(parallel):
    out = subprocess.run([sys.executable, "-c", f"""
import ctypes, threading, time
c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0)
n = ctypes.c_int(); c.cuDeviceGetCount(ctypes.byref(n))
def one(i):
    d = ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d), i)
    ctx = ctypes.c_void_p(); c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d)
t = time.time()
if {parallel}:
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n.value)]
    [x.start() for x in ts]; [x.join() for x in ts]
else:
    [one(i) for i in range(n.value)]
print(round((time.time() - t) * 1e3))
"""], capture_output=True, text=True)
    return out.stdout.strip()


for rep in range(3):
    alone = ms(cuinit())
    holder = cuinit(3.0)
    ms(holder)
    beside = ms(cuinit())
    holder.wait()
    a, b = cuinit(), cuinit()
    together = (ms(a), ms(b))
    a.wait(), b.wait()
    print(f"run {rep}: cuInit alone {alone} ms; beside a process holding CUDA {beside} ms; "
          f"two at once {together[0]} and {together[1]} ms; primary contexts of every GPU: "
          f"one after another {retain(False)} ms, a thread per GPU {retain(True)} ms", flush=True)
