"""Records one RAS STATUS reply as NCCL's ncclras client asks for it (src/ras/client.cc):
CLIENT PROTOCOL 2, TIMEOUT 5, SET FORMAT json (unless text), STATUS; the reply read
until NCCL closes, within 15 s. Usage: ras_record.py json|text OUTFILE [HOST:PORT]."""

import socket
import sys
import time

fmt, out = sys.argv[1], sys.argv[2]
host, port = (sys.argv[3] if len(sys.argv) > 3 else "localhost:28028").rsplit(":", 1)
started = time.time()
try:
    s = socket.create_connection((host, int(port)), timeout=2)
    s.settimeout(2)
    f = s.makefile("rwb")
    answers = []
    for cmd in ["CLIENT PROTOCOL 2", "TIMEOUT 5"] + (["SET FORMAT json"] if fmt == "json" else []):
        f.write((cmd + "\n").encode())
        f.flush()
        answers.append(f.readline().decode().strip())
    f.write(b"STATUS\n")
    f.flush()
    s.settimeout(15)
    reply = f.read().decode(errors="replace")
    head = f"# {fmt} at {started:.1f}: {answers} in {time.time() - started:.2f}s\n"
except Exception as e:  # noqa: BLE001 - the error is the record
    head, reply = f"# {fmt} at {started:.1f}: ERROR {e!r} after {time.time() - started:.2f}s\n", ""
with open(out, "w") as o:
    o.write(head + reply)
print(head.strip())
