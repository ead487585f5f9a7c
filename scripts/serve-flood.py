#!/usr/bin/env python3
"""Probe success rate of `nccl-preflight serve` under connection floods, on loopback.

usage: scripts/serve-flood.py HOST:PORT [--mix KIND=N[,KIND=N...]]... [--rate R] [--seconds S]
       scripts/serve-flood.py HOST:PORT [COUNTS...] [--kinds KIND[,KIND...]]

Kinds of flood connection, each reconnecting the moment the server closes it, as an
attacker (or a broken client in a retry loop) would:
  idle       connect and send nothing (connect-and-wait);
  slowloris  send a partial request head, then a byte every 0.2 s;
  slowread   GET /report with a 4 KiB receive buffer and read one byte every 0.2 s,
             as a client that reads slowly or never (run serve where loopback has a
             pod's 1500-byte MTU, or the kernel's buffers hold the whole report).
Each kind runs in a process of its own, so the flood does not share the probes'
interpreter lock.

With --mix (repeatable, one table row each): every kind of the mix at once for S
seconds (default 20) while /healthz probes arrive at R per second (default 100), each
a new connection with a 1 s timeout (the kubelet's default), on a thread of its own
so a slow probe does not delay the next. Prints the share answered 200 and the
median and p99 time of the answered ones.
Without --mix: for each count (default 32 256 1024) and each kind (default all
three), 100 probes one after another, one every 50 ms, as before.
Bounded: at most 1024 connections per kind, 60 s and 100 probes/s per row; loopback only.
"""
import multiprocessing
import resource
import selectors
import socket
import sys
import threading
import time

PROBE_TIMEOUT = 1.0
MAX_FLOOD = 1024
MAX_SECONDS = 60
MAX_RATE = 100
KINDS = ("idle", "slowloris", "slowread")


def probe(addr):
    """(answered 200, seconds taken)."""
    started = time.monotonic()
    try:
        with socket.create_connection(addr, timeout=PROBE_TIMEOUT) as s:
            s.settimeout(max(0.01, PROBE_TIMEOUT - (time.monotonic() - started)))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"HTTP/1.1 200"), time.monotonic() - started
    except OSError:
        return False, time.monotonic() - started


def connect(addr, kind):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if kind == "slowread":
            # A small receive window, set before connecting: /report (180-210 KB
            # on an 8-GPU, 32-EFA node) then outgrows the socket buffers.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(1.0)
        s.connect(addr)
        if kind == "slowloris":
            s.send(b"GET /healthz HTTP/1.1\r\n")
        if kind == "slowread":
            s.send(b"GET /report HTTP/1.1\r\nHost: flood\r\n\r\n")
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        return None


def flood(addr, count, kind, stop):
    """Keeps `count` connections of `kind` open until `stop`, reconnecting at once."""
    sel = selectors.DefaultSelector()
    conns = {}

    def replace(i):
        old = conns.pop(i, None)
        if old is not None:
            if kind != "slowread":
                sel.unregister(old)
            old.close()
        s = connect(addr, kind)
        if s is not None:
            conns[i] = s
            # slowread takes one byte per tick (below), and learns of the close
            # there; the others read what the server sent (an error answer) and
            # learn of the close at once.
            if kind != "slowread":
                sel.register(s, selectors.EVENT_READ, i)

    for i in range(count):
        replace(i)
    next_tick = time.monotonic()
    while not stop.is_set():
        for i in [i for i in range(count) if i not in conns]:
            replace(i)
        for key, _ in sel.select(timeout=0.05):
            i, s = key.data, key.fileobj
            try:
                if s.recv(1 << 16) == b"":
                    replace(i)
            except BlockingIOError:
                pass
            except OSError:
                replace(i)
        if time.monotonic() >= next_tick:
            next_tick += 0.2
            for i, s in list(conns.items()):
                try:
                    if kind == "slowloris":
                        s.send(b"X")
                    elif kind == "slowread" and s.recv(1) == b"":
                        replace(i)
                except BlockingIOError:
                    pass
                except OSError:
                    replace(i)
    for s in conns.values():
        s.close()


def start_flood(addr, mix):
    stop = multiprocessing.Event()
    procs = [
        multiprocessing.Process(target=flood, args=(addr, count, kind, stop))
        for kind, count in mix
    ]
    for p in procs:
        p.start()
    return stop, procs


def stop_flood(stop, procs):
    stop.set()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()


def percentile(sorted_values, q):
    if not sorted_values:
        return "-"
    return f"{sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))] * 1e3:.1f}"


def mix_row(addr, mix, rate, seconds):
    stop, procs = start_flood(addr, mix)
    time.sleep(2.0)  # let the flood build up
    results, threads = [], []
    lock = threading.Lock()

    def one():
        r = probe(addr)
        with lock:
            results.append(r)

    started = time.monotonic()
    n = int(rate * seconds)
    for k in range(n):
        delay = started + k / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    stop_flood(stop, procs)
    answered = sorted(took for ok, took in results if ok)
    name = ",".join(f"{kind}={count}" for kind, count in mix)
    print(
        f"{name:<34} {rate:>5} {len(results):>7} {len(answered) * 100 / max(1, len(results)):>8.2f}% "
        f"{percentile(answered, 0.5):>8} {percentile(answered, 0.99):>8}",
        flush=True,
    )
    time.sleep(3.0)  # let the server close the flood's connections


def parse_mix(text):
    mix = []
    for part in text.split(","):
        kind, _, count = part.partition("=")
        if kind not in KINDS or not count.isdigit():
            sys.exit(f"--mix {text!r}: KIND=N with KIND one of {', '.join(KINDS)}")
        mix.append((kind, min(int(count), MAX_FLOOD)))
    return mix


def take(args, flag, default):
    values = []
    while flag in args:
        at = args.index(flag)
        if at + 1 >= len(args):
            sys.exit(f"{flag} needs a value")
        values.append(args[at + 1])
        del args[at : at + 2]
    return values or default


def sequential_row(addr, kind, count):
    stop, procs = start_flood(addr, [(kind, count)])
    time.sleep(2.0)
    results = []
    for _ in range(100):
        results.append(probe(addr))
        time.sleep(0.05)
    stop_flood(stop, procs)
    answered = sorted(took for ok, took in results if ok)
    print(
        f"{kind:<10} {count:>11} {len(answered):>9}% {percentile(answered, 0.5):>10}",
        flush=True,
    )
    time.sleep(1.0)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    host, _, port = sys.argv[1].rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        sys.exit("IPv4 loopback addresses only")
    addr = (host, int(port))
    args = sys.argv[2:]
    mixes = [parse_mix(m) for m in take(args, "--mix", [])]
    rate = min(float(take(args, "--rate", ["100"])[0]), MAX_RATE)
    seconds = min(float(take(args, "--seconds", ["20"])[0]), MAX_SECONDS)
    kinds = take(args, "--kinds", [",".join(KINDS)])[0].split(",")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    if mixes:
        print(f"{'flood':<34} {'rate':>5} {'probes':>7} {'answered':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for mix in mixes:
            mix_row(addr, mix, rate, seconds)
        return
    counts = [min(int(c), MAX_FLOOD) for c in args] or [32, 256, 1024]
    print(f"{'flood':<10} {'connections':>11} {'probes ok':>10} {'median ms':>10}")
    for kind in kinds:
        if kind not in KINDS:
            sys.exit(f"--kinds: {kind!r} is not one of {', '.join(KINDS)}")
        for count in counts:
            sequential_row(addr, kind, count)


if __name__ == "__main__":
    main()
