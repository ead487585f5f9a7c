#!/usr/bin/env python3
"""Where a GPU's field-values call spends its time: one call per field over 18 links,
the GPU-scope fields, and the whole batch, each timed 5 times on each GPU. Reads only;
not part of CI. Result: tests/data/h200x2/fast-path/nvml-field-cost.txt.

Usage: nvml_field_cost.py"""
import ctypes, time, statistics
# NVML and nvmlFieldValue_t as the field-values probe declares them (same folder).
from nvml_fields_probe import NVML as N, FieldValue as FV
assert N.nvmlInit_v2() == 0
n = ctypes.c_uint(); N.nvmlDeviceGetCount_v2(ctypes.byref(n))
hs = []
for i in range(n.value):
    h = ctypes.c_void_p(); N.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)); hs.append(h)
def call(h, req):
    arr = (FV * len(req))()
    for k, (f, s) in enumerate(req): arr[k].fieldId = f; arr[k].scopeId = s
    t = time.perf_counter(); rc = N.nvmlDeviceGetFieldValues(h, len(req), arr); dt = 1e3 * (time.perf_counter() - t)
    return dt, rc, [arr[k].nvmlReturn for k in range(len(req))]
gpu_scope = [(90,0),(147,0),(230,0),(4,0),(142,0),(143,0),(144,0),(145,0)]
groups = {f"field {f} x18 links": [(f, l) for l in range(18)] for f in (165, 166, 164, 161, 162, 163)}
groups["field 164 link 0 only"] = [(164, 0)]
groups["gpu-scope 8"] = gpu_scope
for f, _ in gpu_scope: groups[f"gpu field {f}"] = [(f, 0)]
groups["all 125"] = [(f, l) for l in range(18) for f in (165, 166, 164, 161, 162, 163)] + gpu_scope
groups["all minus speed x17"] = [(f, l) for l in range(18) for f in (165, 166, 161, 162, 163)] + [(164, 0)] + gpu_scope
for i, h in enumerate(hs):
    for name, req in groups.items():
        runs = [call(h, req) for _ in range(5)]
        print(f"GPU {i} {name}: median {statistics.median(r[0] for r in runs):.2f} ms, rc {runs[0][1]}, entry rcs {sorted(set(runs[0][2]))}")
