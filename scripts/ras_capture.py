"""Records what NCCL's RAS port answers to any commands, as NCCL's ncclras client
speaks (src/ras/client.cc): CLIENT PROTOCOL 2, then SET FORMAT json (unless text), then
each COMMAND; everything received is written to OUTFILE as it arrives, until NCCL
closes the connection or SECONDS pass. OUTFILE.times gets one line per received chunk
(seconds since connect, bytes) so that MONITOR events keep their timing.
Usage: ras_capture.py OUTFILE text|json SECONDS COMMAND... [--addr HOST:PORT]"""

import socket
import sys
import time

args = sys.argv[1:]
addr = "localhost:28028"
if "--addr" in args:
    i = args.index("--addr")
    addr = args[i + 1]
    del args[i : i + 2]
out, fmt, seconds, commands = args[0], args[1], float(args[2]), args[3:]
host, port = addr.rsplit(":", 1)
started = time.time()
sent = ["CLIENT PROTOCOL 2"] + (["SET FORMAT json"] if fmt == "json" else []) + commands
with open(out, "wb") as o, open(out + ".times", "w") as t:
    try:
        s = socket.create_connection((host, int(port)), timeout=2)
        for c in sent:
            s.sendall((c + "\n").encode())
        while time.time() - started < seconds:
            s.settimeout(max(0.05, seconds - (time.time() - started)))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                t.write(f"{time.time() - started:.3f} closed\n")
                break
            o.write(chunk)
            o.flush()
            t.write(f"{time.time() - started:.3f} {len(chunk)}\n")
            t.flush()
    except OSError as e:
        t.write(f"{time.time() - started:.3f} ERROR {e!r}\n")
    t.write(f"# sent {sent}\n")
print(f"{out}: {open(out + '.times').read().splitlines()[-2:]}")
