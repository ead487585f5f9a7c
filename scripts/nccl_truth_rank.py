#!/usr/bin/env python3
"""One rank of scripts/gpu-nccl-truth.sh: an NCCL all-reduce through ctypes, no torch.

Usage: nccl_truth_rank.py RANK NRANKS DEVICE IDFILE LIBNCCL RESULT

Loads libcuda.so.1 (the driver API: cuInit, a primary context on CUDA device DEVICE)
and LIBNCCL, takes the unique id from IDFILE (rank 0 writes it there with
ncclGetUniqueId, the others wait for it, at most 30 s), joins with ncclCommInitRank,
all-reduces 16 Mi floats (64 MiB) of value rank+1, checks that every element came
back as the sum 1+...+NRANKS, and destroys the communicator. What NCCL prints
(NCCL_DEBUG=INFO) goes to this process's standard output, which the harness keeps.
RESULT gets one JSON object: the NCCL version code, each step's ncclResult_t
(`init`, `allreduce`, `sync`), ncclGetLastError's text after a failure, whether the
sum was right, and the seconds each step took. A ctypes script rather than torch: no
framework import per rank (seconds each), and any libnccl can be loaded by path.
Signatures follow NVIDIA/nccl src/nccl.h.in (v2.28.9-1) and CUDA's cuda.h.
"""

import ctypes
import json
import os
import struct
import sys
import time

COUNT = 16 << 20
FLOAT32 = 7  # ncclFloat32
SUM = 0  # ncclSum


def main():
    rank, nranks, device = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    idfile, libnccl, result_path = sys.argv[4], sys.argv[5], sys.argv[6]
    result = {"rank": rank, "nranks": nranks, "device": device, "pid": os.getpid()}

    def done(**kw):
        result.update(kw)
        tmp = result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, result_path)
        sys.stdout.flush()

    started = time.monotonic()
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)
    if rc != 0:
        return done(error=f"cuInit {rc}")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    if cuda.cuDeviceGet(ctypes.byref(dev), device) != 0:
        return done(error=f"cuDeviceGet({device}) failed")
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or cuda.cuCtxSetCurrent(ctx) != 0:
        return done(error=f"no context on device {device}")
    nccl = ctypes.CDLL(libnccl)
    nccl.ncclGetLastError.restype = ctypes.c_char_p
    code = ctypes.c_int()
    nccl.ncclGetVersion(ctypes.byref(code))
    result["version_code"] = code.value

    uid = ctypes.create_string_buffer(128)
    if rank == 0:
        rc = nccl.ncclGetUniqueId(uid)
        if rc != 0:
            err = nccl.ncclGetLastError(None)
            open(idfile + ".failed", "w").close()
            return done(unique_id=rc, init=rc, last_error=(err or b"").decode(errors="replace"))
        with open(idfile + ".tmp", "wb") as f:
            f.write(uid.raw)
        os.replace(idfile + ".tmp", idfile)
    else:
        deadline = time.monotonic() + 30
        while not os.path.exists(idfile):
            if os.path.exists(idfile + ".failed") or time.monotonic() > deadline:
                return done(error="no unique id from rank 0")
            time.sleep(0.02)
        with open(idfile, "rb") as f:
            ctypes.memmove(uid, f.read(128), 128)

    comm = ctypes.c_void_p()
    t = time.monotonic()
    # ncclUniqueId is passed by value: a struct of 128 bytes.
    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

    uid_value = UniqueId()
    ctypes.memmove(ctypes.byref(uid_value), uid, 128)
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), nranks, uid_value, rank)
    result["init_seconds"] = round(time.monotonic() - t, 3)
    if rc != 0:
        err = nccl.ncclGetLastError(None)
        return done(init=rc, last_error=(err or b"").decode(errors="replace"))
    result["init"] = 0

    buf = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(COUNT * 4))
    if rc != 0 or not buf.value:
        return done(error=f"cuMemAlloc_v2 {rc}")
    stream = ctypes.c_void_p()
    if cuda.cuStreamCreate(ctypes.byref(stream), 0) != 0:
        return done(error="cuStreamCreate failed")
    cuda.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    bits = struct.unpack("<I", struct.pack("<f", float(rank + 1)))[0]
    cuda.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    rc = cuda.cuMemsetD32Async(buf, bits, COUNT, stream) or cuda.cuStreamSynchronize(stream)
    if rc != 0:
        return done(error=f"cuMemsetD32Async {rc}")
    t = time.monotonic()
    nccl.ncclAllReduce.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    rc = nccl.ncclAllReduce(buf, buf, COUNT, FLOAT32, SUM, comm, stream)
    result["allreduce"] = rc
    if rc != 0:
        err = nccl.ncclGetLastError(comm)
        return done(last_error=(err or b"").decode(errors="replace"))
    sync = cuda.cuStreamSynchronize(stream)
    result["sync"] = sync
    result["allreduce_seconds"] = round(time.monotonic() - t, 3)
    host = (ctypes.c_float * COUNT)()
    cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    if cuda.cuMemcpyDtoH_v2(host, buf, COUNT * 4) != 0:
        return done(error="cuMemcpyDtoH_v2 failed")
    want = nranks * (nranks + 1) / 2
    result["correct"] = host[0] == want and host[COUNT - 1] == want and host[COUNT // 2] == want
    nccl.ncclCommDestroy(comm)
    done(seconds=round(time.monotonic() - started, 3))


if __name__ == "__main__":
    main()
