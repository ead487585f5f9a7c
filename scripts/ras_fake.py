#!/usr/bin/env python3
"""A stand-in for NCCL's RAS port (standard library only), for scripts/bench-ras-scale.sh
and scripts/ras-hang-gpu.sh --dry. It speaks the server side of RAS's client protocol as
NVIDIA/nccl src/ras/client_support.cc rasClientEventLoop does at v2.28.9-1 to v2.30.7-1:
`CLIENT PROTOCOL n` -> `SERVER PROTOCOL 2`, `TIMEOUT n` -> `OK`, `SET FORMAT json` -> `OK`,
`STATUS` -> the reply, then close; `MONITOR ...` -> `OK`, then one line per event.

  ras_fake.py serve PORT REPLY [EVENTS]   until killed; REPLY is re-read at every STATUS
                                          (a scenario rewrites it); EVENTS, when given, is
                                          tailed and each new line pushed to MONITOR clients
  ras_fake.py reply RANKS OUT [BEHIND]    writes a JSON reply of RANKS ranks on RANKS/8
                                          hosts in one communicator (jsonWriteRankData's
                                          layout); BEHIND: that rank one AllReduce behind
  ras_fake.py scenario OUT RANKS HOSTS SITUATION [RANK]
                                          the reply of a job in SITUATION (healthy,
                                          divergent, sleep, sigstop, kill9) with RANK the
                                          faulty one; HOSTS: one address per rank, comma
                                          separated; the missing rank of sigstop and kill9
                                          in jsonWriteMissingRank's layout (v2.29.2-1 on)
"""

import os
import socket
import sys
import threading
import time


def reply(ranks, behind=None, version="2.28.9", counts=None, hosts=None, missing=None):
    """A STATUS reply; `counts` maps a rank to its (AllGather, AllReduce), else (0, 692);
    `hosts` gives each rank's address; `missing` is a rank RAS cannot reach."""
    out = [
        "{\n",
        f'  "nccl_version": "{version}",\n  "cuda_runtime_version": 13000,\n  "cuda_driver_version": 13000,\n',
        '  "timestamp": "2026-11-26 07:26:39",\n  "communicators_count": 1,\n  "communicators": [\n    {\n',
        '      "hash": "0x74e4f22091e41071",\n      "secondary_hash": "0x601beeb1fa8b2512:0x97e40a3b77a1ae4b",\n',
        f'      "size": {ranks},\n      "ranks_count": {ranks},\n      "missing_ranks_count": 0,\n      "ranks": [\n',
    ]
    answered = [r for r in range(ranks) if r != missing]
    for r in answered:
        gather, allreduce = (counts or {}).get(r, (0, 691 if r == behind else 692))
        host = hosts[r] if hosts else f"10.{r // 8 // 256}.{r // 8 % 256}.1"
        out.append(
            f'        {{\n          "rank": {r},\n          "host": "{host}",\n          "pid": {1000 + r % 8},\n'
            f'          "cuda_dev": {r % 8},\n          "nvml_dev": {r % 8},\n'
            '          "status": {\n            "init_state": 0,\n            "async_error": 0,\n'
            '            "finalize_called": false,\n            "destroy_flag": false,\n            "abort_flag": false\n          },\n'
            '          "collective_counts": {\n            "Broadcast": 0,\n            "Reduce": 0,\n'
            f'            "AllGather": {gather},\n            "ReduceScatter": 0,\n            "AllReduce": {allreduce}\n'
            f'          }}\n        }}{"," if r != answered[-1] else ""}\n'
        )
    out.append('      ],\n      "missing_ranks": [\n')
    if missing is not None:
        host = hosts[missing] if hosts else "10.0.0.1"
        out.append(
            f'        {{\n          "rank": {missing},\n          "host": "{host}",\n          "pid": {1000 + missing % 8},\n'
            f'          "cuda_dev": {missing % 8},\n          "nvml_dev": {missing % 8},\n'
            '          "status": {\n            "unresponsive": true,\n            "considered_dead": false\n          }\n        }\n'
        )
    out.append('\n      ]\n    }\n  ],\n')
    out.append('  "ras": {\n    "collection_time_sec": 0.012,\n    "timeouts_count": 0\n  }\n}\n')
    return "".join(out)


def client(conn, reply_path, events_path):
    f = conn.makefile("rb")
    try:
        for raw in f:
            cmd = raw.decode(errors="replace").strip().lower()
            if cmd.startswith("client protocol"):
                conn.sendall(b"SERVER PROTOCOL 2\n")
            elif cmd.startswith("timeout") or cmd == "set format json":
                conn.sendall(b"OK\n")
            elif cmd in ("status", "verbose status"):
                with open(reply_path, "rb") as r:
                    conn.sendall(r.read())
                return
            elif cmd.startswith("monitor") and events_path:
                conn.sendall(b"OK\n")
                seen = 0
                while True:
                    try:
                        with open(events_path, "rb") as e:
                            lines = e.read().splitlines(keepends=True)
                    except FileNotFoundError:
                        lines = []
                    for line in lines[seen:]:
                        conn.sendall(line)
                    seen = len(lines)
                    time.sleep(0.2)
            else:
                conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())
    except OSError:
        pass
    finally:
        conn.close()


def serve(port, reply_path, events_path=None):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=client, args=(conn, reply_path, events_path), daemon=True).start()


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "serve":
        serve(args[0], args[1], args[2] if len(args) > 2 else None)
    elif cmd == "scenario":
        out, ranks, hosts, situation = args[0], int(args[1]), args[2].split(","), args[3]
        bad = int(args[4]) if len(args) > 4 else ranks - 1
        kw = {"hosts": hosts, "version": "2.29.2"}
        if situation == "divergent":
            kw["counts"] = {r: ((1, 691) if r == bad else (0, 692)) for r in range(ranks)}
        elif situation == "sleep":
            kw["behind"] = bad
        elif situation in ("sigstop", "kill9"):
            kw["missing"] = bad
        text = reply(ranks, **kw)
        with open(out + ".tmp", "w") as f:
            f.write(text)
        os.replace(out + ".tmp", out)
    elif cmd == "reply":
        text = reply(int(args[0]), int(args[2]) if len(args) > 2 else None)
        tmp = args[1] + ".tmp"
        with open(tmp, "w") as out:
            out.write(text)
        os.replace(tmp, args[1])
    else:
        sys.exit(f"unknown command {cmd}")
