#!/usr/bin/env python3
"""Does NVML answer two GPUs' queries concurrently? Times the per-GPU field-values
call (nccl-preflight's 125 entries), the handles and the P2P status, one GPU after
the other and from one thread per GPU. Reads only; not part of CI. The gather in
src/gather/gpu/nvml.rs stays serial on what this found (tests/data/h200x2/fast-path).

Usage: nvml_concurrency_probe.py            (first handles serial, then both ways)
       PAR_FIRST=1 nvml_concurrency_probe.py  (the first handles and fields from threads)"""
import ctypes, threading, time, statistics
# NVML and nvmlFieldValue_t as the field-values probe declares them (same folder).
from nvml_fields_probe import NVML as N, FieldValue as FV
t = time.perf_counter(); assert N.nvmlInit_v2() == 0; print(f"init {1e3*(time.perf_counter()-t):.1f} ms")
n = ctypes.c_uint(); N.nvmlDeviceGetCount_v2(ctypes.byref(n))
def handle(i):
    h = ctypes.c_void_p(); assert N.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0; return h
req = [(f, l) for l in range(18) for f in (165, 166, 164, 161, 162, 163)] + [(90,0),(147,0),(230,0),(4,0),(142,0),(143,0),(144,0),(145,0)]
def fields(h):
    arr = (FV * len(req))()
    for k, (f, s) in enumerate(req): arr[k].fieldId = f; arr[k].scopeId = s
    assert N.nvmlDeviceGetFieldValues(h, len(req), arr) == 0
def p2p(a, b):
    st = ctypes.c_int()
    for cap in (0, 1): N.nvmlDeviceGetP2PStatus(a, b, cap, ctypes.byref(st))
def serial(fn, items):
    t = time.perf_counter(); [fn(*x) for x in items]; return 1e3*(time.perf_counter()-t)
def parallel(fn, items):
    th = [threading.Thread(target=fn, args=x) for x in items]
    t = time.perf_counter(); [x.start() for x in th]; [x.join() for x in th]; return 1e3*(time.perf_counter()-t)
import os
if os.environ.get("PAR_FIRST"):
    hs = [None] * n.value
    def h_into(i): hs[i] = handle(i)
    print(f"handles (first, threads) {parallel(h_into, [(i,) for i in range(n.value)]):.1f} ms")
    ff = [parallel(fields, [(h,) for h in hs])]
    print(f"fields (first, threads) {ff[0]:.1f} ms")
else:
    t = time.perf_counter(); hs = [handle(i) for i in range(n.value)]; print(f"handles (first, serial) {1e3*(time.perf_counter()-t):.1f} ms")
    print(f"fields (first, serial) {serial(fields, [(h,) for h in hs]):.1f} ms")
for name, fn, items in [("fields", fields, [(h,) for h in hs]), ("handles", handle, [(i,) for i in range(n.value)]),
                        ("p2p r+w", p2p, [(hs[0], hs[1]), (hs[1], hs[0])])]:
    s = [serial(fn, items) for _ in range(7)]; p = [parallel(fn, items) for _ in range(7)]
    print(f"{name}: serial median {statistics.median(s):.1f} ms {['%.1f'%x for x in s]}; threads median {statistics.median(p):.1f} ms {['%.1f'%x for x in p]}")
