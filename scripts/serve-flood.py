#!/usr/bin/env python3
"""Probe success rate of `nccl-preflight serve` under connection floods, on loopback.

usage: scripts/serve-flood.py HOST:PORT [COUNTS...]

For each count (default 32 256 1024) and each kind of flood (idle: connect and send
nothing; slowloris: send a partial request head, then a byte every 0.2 s; slowread:
GET /report with a 4 KiB receive buffer and read one byte every 0.2 s, as a client that
reads slowly or never; all reconnect when the server closes them, as an attacker
would), sends 100 /healthz probes with a 1 s timeout (the kubelet's default) and prints
the share answered 200. `--kinds slowread` (a comma list) runs only those kinds.
Bounded: at most 1024 flood connections, 100 probes, about 40 s per row; loopback only.
"""
import resource
import socket
import sys
import threading
import time

PROBES = 100
PROBE_TIMEOUT = 1.0
MAX_FLOOD = 1024


def probe(addr):
    try:
        with socket.create_connection(addr, timeout=PROBE_TIMEOUT) as s:
            s.settimeout(PROBE_TIMEOUT)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def flood(addr, count, kind, stop):
    conns = [None] * count

    def connect():
        try:
            if kind == "slowread":
                # A small receive window, set before connecting: /report (180-210 KB
                # on an 8-GPU, 32-EFA node) then outgrows the socket buffers.
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(1.0)
                s.connect(addr)
            else:
                s = socket.create_connection(addr, timeout=1.0)
            s.setblocking(False)
            if kind == "slowloris":
                s.send(b"GET /healthz HTTP/1.1\r\n")
            if kind == "slowread":
                s.send(b"GET /report HTTP/1.1\r\nHost: flood\r\n\r\n")
            return s
        except OSError:
            return None

    while not stop.is_set():
        for i in range(count):
            s = conns[i]
            alive = s is not None
            if alive:
                try:
                    # A closed connection reads b"" (or an error): reconnect it.
                    if s.recv(1 if kind == "slowread" else 1 << 16) == b"":
                        alive = False
                except BlockingIOError:
                    pass
                except OSError:
                    alive = False
            if alive and kind == "slowloris":
                try:
                    s.send(b"X")
                except OSError:
                    alive = False
            if not alive:
                if s is not None:
                    s.close()
                conns[i] = connect()
        stop.wait(0.2)
    for s in conns:
        if s is not None:
            s.close()


def main():
    host, _, port = sys.argv[1].rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        sys.exit("loopback addresses only")
    addr = (host.strip("[]"), int(port))
    args = sys.argv[2:]
    kinds = ["idle", "slowloris", "slowread"]
    if "--kinds" in args:
        at = args.index("--kinds")
        kinds = args[at + 1].split(",")
        del args[at : at + 2]
    counts = [min(int(c), MAX_FLOOD) for c in args] or [32, 256, 1024]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    print(f"{'flood':<10} {'connections':>11} {'probes ok':>10} {'median ms':>10}")
    for kind in kinds:
        for count in counts:
            stop = threading.Event()
            t = threading.Thread(target=flood, args=(addr, count, kind, stop))
            t.start()
            time.sleep(2.0)  # let the flood build up
            ok, times = 0, []
            for _ in range(PROBES):
                started = time.monotonic()
                if probe(addr):
                    ok += 1
                    times.append((time.monotonic() - started) * 1e3)
                time.sleep(0.05)
            stop.set()
            t.join()
            times.sort()
            median = f"{times[len(times) // 2]:.1f}" if times else "-"
            print(f"{kind:<10} {count:>11} {ok * 100 // PROBES:>9}% {median:>10}", flush=True)
            time.sleep(1.0)


if __name__ == "__main__":
    main()
