#!/usr/bin/env python3
"""GPU acceptance: compare nccl-preflight's GPU matrices with nvidia-smi's on a
machine with NVIDIA GPUs, pair by pair, and time the full check against
`nvidia-smi topo -m` followed by `nvidia-smi topo -p2p rw`.

Usage: gpu_acceptance.py BINARY [OUTDIR]
Exits 1 on any mismatch. Changes nothing on the machine (reads only)."""
import json
import os
import re
import subprocess
import sys
import time


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def smi_matrix(args):
    """Parses an nvidia-smi topo matrix into {(row, col): cell} for GPU rows and columns,
    and {row: [fields after the matrix]} (CPU Affinity, NUMA Affinity, GPU NUMA ID)."""
    out = run(["nvidia-smi", "topo"] + args)
    if out.returncode != 0:
        raise SystemExit(f"nvidia-smi topo {' '.join(args)} failed: {out.stderr}")
    lines = [ANSI.sub("", l) for l in out.stdout.splitlines()]
    header = None
    columns = 0
    cells = {}
    extras = {}
    for line in lines:
        fields = line.split()
        if not fields:
            if header:
                break
            continue
        if header is None and fields[0].startswith("GPU"):
            header = [f for f in fields if re.fullmatch(r"GPU\d+", f)]
            columns = len([f for f in fields if re.fullmatch(r"(GPU|NIC)\d+", f)])
            continue
        if header and re.fullmatch(r"GPU\d+", fields[0]):
            row = int(fields[0][3:])
            for col_name, cell in zip(header, fields[1:]):
                cells[(row, int(col_name[3:]))] = cell
            extras[row] = fields[1 + columns:]
    return out.stdout, cells, extras


def main():
    binary = sys.argv[1]
    outdir = sys.argv[2] if len(sys.argv) > 2 else "."
    doctor = run([binary, "doctor", "--format", "json"])
    with open(os.path.join(outdir, "doctor.json"), "w") as f:
        f.write(doctor.stdout)
    human = run([binary, "doctor"])
    with open(os.path.join(outdir, "doctor.txt"), "w") as f:
        f.write(human.stdout + human.stderr)
    report = json.loads(doctor.stdout)
    m = report.get("gpu_matrices")
    if not m:
        print("nccl-preflight found no GPU matrices:", report["checks"])
        return 1
    index = m["gpus"]
    ours = {
        "-m": m["topology"], "-p2p r": m["p2p_read"], "-p2p w": m["p2p_write"],
        "-p2p n": m["p2p_nvlink"], "-p2p a": m["p2p_atomics"], "-p2p rw": m["p2p_read_write"],
    }
    mismatches = 0
    compared = 0
    smi_text = []
    affinity = None
    for flag, matrix in ours.items():
        text, smi, extras = smi_matrix(flag.split())
        if flag == "-m":
            affinity = extras
        smi_text.append(f"$ nvidia-smi topo {flag}\n{text}")
        for i, a in enumerate(index):
            for j, b in enumerate(index):
                theirs = smi.get((a, b))
                mine = matrix[i][j]
                compared += 1
                ok = theirs == mine
                mismatches += not ok
                print(f"{flag:8} GPU{a}->GPU{b}: nvidia-smi {theirs!s:6} nccl-preflight {mine:6} {'ok' if ok else 'MISMATCH'}")
    with open(os.path.join(outdir, "nvidia-smi.txt"), "w") as f:
        f.write("\n".join(smi_text))
    # CPU Affinity and NUMA Affinity, the columns after the matrix in topo -m.
    gpus = report["facts"]["gpus"]["nvml"]["state"]["loaded"]["gpus"]
    for g in gpus:
        theirs = (affinity or {}).get(g["index"], [])
        for k, (name, key) in enumerate([("CPU Affinity", "cpu_affinity"), ("NUMA Affinity", "numa_affinity")]):
            mine = g.get(key, {}).get("value")
            smi_value = theirs[k] if k < len(theirs) else None
            compared += 1
            ok = smi_value == mine
            mismatches += not ok
            print(f"{name:13} GPU{g['index']}: nvidia-smi {smi_value!s:8} nccl-preflight {mine!s:8} {'ok' if ok else 'MISMATCH'}")

    # Timing: whole processes, median of 9 each, interleaved.
    def once(cmds):
        t = time.perf_counter()
        for c in cmds:
            run(c)
        return time.perf_counter() - t
    ours_t, nocuda_t, smi_t = [], [], []
    for _ in range(9):
        ours_t.append(once([[binary, "check"]]))
        nocuda_t.append(once([[binary, "check", "--cuda", "off"]]))
        smi_t.append(once([["nvidia-smi", "topo", "-m"], ["nvidia-smi", "topo", "-p2p", "rw"]]))
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"\ntiming (median of 9 whole-process runs): nccl-preflight check {med(ours_t) * 1000:.0f} ms; "
          f"check --cuda off {med(nocuda_t) * 1000:.0f} ms; "
          f"nvidia-smi topo -m + topo -p2p rw {med(smi_t) * 1000:.0f} ms")
    verdict = [c for c in report["checks"] if c["id"] in ("gpu-devices", "gpu-p2p", "nvlink", "pod-placement")]
    for c in verdict:
        print(f"check {c['id']}: {c['status']}: {c['summary']}")
    print(f"\n{compared} cells compared, {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
