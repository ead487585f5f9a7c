#!/usr/bin/env python3
"""NVML field-values probe (runs on a machine with NVIDIA GPUs, not part of CI).

Reads every per-link and per-GPU value nccl-preflight gathers twice, once with
the per-call NVML functions and once with nvmlDeviceGetFieldValues, and prints
for each field whether the two agree, so that the gatherer batches only what a
real driver answers the same way (src/gather/gpu/nvml.rs cites the result).
Also times both paths. Reads only; changes nothing on the machine.

Usage: nvml_fields_probe.py [OUT.json]"""
import ctypes
import json
import sys
import time

NVML = ctypes.CDLL("libnvidia-ml.so.1")
MAX_LINKS = 18


class Value(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class FieldValue(ctypes.Structure):
    # nvml.h nvmlFieldValue_t
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int),
                ("nvmlReturn", ctypes.c_int), ("value", Value)]


def value_of(f):
    t = f.valueType
    return {0: f.value.dVal, 1: f.value.uiVal, 2: f.value.ulVal, 3: f.value.ullVal,
            4: f.value.sllVal, 5: f.value.siVal, 6: f.value.usVal}.get(t)


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"{what}: NVML error {rc}")


# Fields scoped to a link (scopeId = link) and fields of the whole GPU (scopeId 0).
LINK_FIELDS = {161: "DL_REPLAY", 162: "DL_RECOVERY", 163: "DL_CRC", 164: "GET_SPEED",
               165: "GET_STATE", 166: "GET_VERSION"}
GPU_FIELDS = {90: "SPEED_MBPS_COMMON", 91: "LINK_COUNT", 147: "NVSWITCH_CONNECTED_LINK_COUNT",
              230: "GPU_RECOVERY_ACTION", 142: "REMAPPED_COR", 143: "REMAPPED_UNC",
              144: "REMAPPED_PENDING", 145: "REMAPPED_FAILURE", 4: "ECC_DBE_VOL_TOTAL",
              38: "CRC_FLIT_TOTAL(legacy)", 45: "CRC_DATA_TOTAL(legacy)", 52: "REPLAY_TOTAL(legacy)",
              59: "RECOVERY_TOTAL(legacy)", 32: "CRC_FLIT_L0(legacy)", 39: "CRC_DATA_L0(legacy)",
              46: "REPLAY_L0(legacy)", 53: "RECOVERY_L0(legacy)"}


def per_call(dev):
    """What the per-call functions answer, link by link, and how long they take."""
    out = {}
    calls = 0
    t0 = time.perf_counter()
    for link in range(MAX_LINKS):
        state = ctypes.c_int()
        rc = NVML.nvmlDeviceGetNvLinkState(dev, link, ctypes.byref(state))
        calls += 1
        row = {"state_rc": rc, "state": state.value if rc == 0 else None}
        if rc != 0:
            out[link] = row
            continue
        ver = ctypes.c_uint()
        rc = NVML.nvmlDeviceGetNvLinkVersion(dev, link, ctypes.byref(ver))
        calls += 1
        row["version"] = ver.value if rc == 0 else f"rc {rc}"
        kind = ctypes.c_uint()
        rc = NVML.nvmlDeviceGetNvLinkRemoteDeviceType(dev, link, ctypes.byref(kind))
        calls += 1
        # nvml.h nvmlIntNvLinkDeviceType_t: 0 GPU, 1 IBMNPU, 2 NVSwitch.
        row["remote_type"] = kind.value if rc == 0 else f"rc {rc}"
        for counter, name in enumerate(["replay", "recovery", "crc_flit", "crc_data"]):
            v = ctypes.c_ulonglong()
            rc = NVML.nvmlDeviceGetNvLinkErrorCounter(dev, link, counter, ctypes.byref(v))
            calls += 1
            row[name] = v.value if rc == 0 else f"rc {rc}"
        out[link] = row
    took = time.perf_counter() - t0
    ecc = ctypes.c_ulonglong()
    # nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0)
    rc = NVML.nvmlDeviceGetTotalEccErrors(dev, 1, 0, ctypes.byref(ecc))
    rows = [ctypes.c_uint() for _ in range(4)]
    rc2 = NVML.nvmlDeviceGetRemappedRows(dev, *[ctypes.byref(r) for r in rows])
    return out, {"ecc_uncorrected_volatile": ecc.value if rc == 0 else f"rc {rc}",
                 "remapped_rows": [r.value for r in rows] if rc2 == 0 else f"rc {rc2}"}, calls, took


def batched(dev):
    entries = [(f, l) for l in range(MAX_LINKS) for f in LINK_FIELDS] + [(f, 0) for f in GPU_FIELDS]
    arr = (FieldValue * len(entries))()
    for i, (f, s) in enumerate(entries):
        arr[i].fieldId, arr[i].scopeId = f, s
    t0 = time.perf_counter()
    rc = NVML.nvmlDeviceGetFieldValues(dev, len(entries), arr)
    took = time.perf_counter() - t0
    check(rc, "nvmlDeviceGetFieldValues")
    links = {}
    gpu = {}
    for i, (f, s) in enumerate(entries):
        v = arr[i]
        cell = value_of(v) if v.nvmlReturn == 0 else f"rc {v.nvmlReturn}"
        if f in LINK_FIELDS:
            links.setdefault(s, {})[LINK_FIELDS[f]] = cell
        else:
            gpu[GPU_FIELDS[f]] = cell
    return links, gpu, len(entries), took


def main():
    check(NVML.nvmlInit_v2(), "nvmlInit_v2")
    n = ctypes.c_uint()
    check(NVML.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount_v2")
    report = {"gpus": []}
    for i in range(n.value):
        dev = ctypes.c_void_p()
        check(NVML.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev)), "handle")
        before, gpu_before, calls, t_calls = per_call(dev)
        links, gpu, entries, t_batch = batched(dev)
        after, _, _, _ = per_call(dev)
        # Field-by-field comparison, per link: does the batched value equal the per-call one
        # (read before and after, so a counter that moved in between is seen as such)?
        pairs = {"DL_REPLAY": "replay", "DL_RECOVERY": "recovery", "DL_CRC": "crc_data", "GET_STATE": "state",
                 "GET_VERSION": "version"}
        verdict = {}
        for field, call in pairs.items():
            same = moved = differ = 0
            for link in range(MAX_LINKS):
                b = links.get(link, {}).get(field)
                p0, p1 = before[link].get(call), after[link].get(call)
                if p0 is None and isinstance(b, str):
                    same += 1  # both say the link is absent
                elif b == p0 == p1:
                    same += 1
                elif isinstance(b, int) and isinstance(p0, int) and isinstance(p1, int) and p0 <= b <= p1:
                    moved += 1
                else:
                    differ += 1
            verdict[field] = {"same": same, "moved_between_reads": moved, "differ": differ}
        crc_flit_vs_dl_crc = [(before[l].get("crc_flit"), before[l].get("crc_data"), links.get(l, {}).get("DL_CRC"))
                              for l in range(MAX_LINKS)]
        report["gpus"].append({
            "index": i, "per_call": before, "per_call_after": after, "per_call_gpu": gpu_before,
            "batched_links": links, "batched_gpu": gpu, "verdict": verdict,
            "crc_flit_crc_data_vs_DL_CRC": crc_flit_vs_dl_crc,
            "per_call_calls": calls, "per_call_ms": round(t_calls * 1e3, 2),
            "batched_entries": entries, "batched_ms": round(t_batch * 1e3, 2),
        })
        print(f"GPU {i}: {calls} per-call reads in {t_calls * 1e3:.1f} ms; one field-values call of "
              f"{entries} entries in {t_batch * 1e3:.1f} ms")
        for field, v in verdict.items():
            print(f"  {field:12} {v}")
        switch_links = sum(1 for l in range(MAX_LINKS) if before[l].get("remote_type") == 2)
        print(f"  per-call remote type NVSwitch on {switch_links} link(s); field 147 NVSWITCH_CONNECTED_LINK_COUNT:",
              gpu.get("NVSWITCH_CONNECTED_LINK_COUNT"))
        print("  per-GPU fields:", json.dumps(gpu))
        print("  per-call ECC/remap:", json.dumps(gpu_before))
        print("  (crc_flit, crc_data, DL_CRC) per link:", crc_flit_vs_dl_crc)
        print("  link 0 per-call:", before[0], "batched:", links.get(0))
    # Repeat timings: the median of 5 batched calls against 5 per-call sweeps, all GPUs.
    for rep in range(5):
        tb = tc = 0.0
        for i in range(n.value):
            dev = ctypes.c_void_p()
            NVML.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev))
            tc += per_call(dev)[3]
            tb += batched(dev)[3]
        report.setdefault("timings", []).append({"per_call_ms": round(tc * 1e3, 2), "batched_ms": round(tb * 1e3, 2)})
    print("timings, all GPUs (per-call sweep vs one field-values call each):", report["timings"])
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
