#!/usr/bin/env python3
"""The webhook under load, on loopback: REVIEWS AdmissionReviews (the PyTorchJob worker
of tests/data/webhook, each with its own uid) over CONNECTIONS kept-alive HTTPS
connections, against BINARY. Prints the answers' latency as the client saw it (p50,
p99, max), the throughput, and the server's VmRSS and VmHWM before and after.
Not part of CI. Needs python3 and the openssl command (the certificate is made here).

Usage: scripts/bench-webhook.py BINARY [REVIEWS] [CONNECTIONS]
"""
import json
import pathlib
import ssl
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def certificate(d):
    cnf = d / "ext.cnf"
    cnf.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench-ca")
    run("req", *ec, "-keyout", "tls.key", "-out", "req.csr", "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", "req.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "1", "-extfile", "ext.cnf")


def status(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return "?"


def client(addr, ca, bodies, latencies, lock):
    host, port = addr.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    import socket
    raw = socket.create_connection((host, int(port)), timeout=20)
    conn = context.wrap_socket(raw, server_hostname=host)
    reader = conn.makefile("rb")
    mine = []
    for body in bodies:
        started = time.perf_counter()
        conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        line = reader.readline()
        assert b" 200 " in line, line
        length = 0
        while True:
            h = reader.readline()
            if h in (b"\r\n", b""):
                break
            if h.lower().startswith(b"content-length:"):
                length = int(h.split(b":")[1])
        answer = json.loads(reader.read(length))
        assert answer["response"]["allowed"] is True and "patch" in answer["response"]
        mine.append(time.perf_counter() - started)
    conn.close()
    with lock:
        latencies.extend(mine)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = pathlib.Path(sys.argv[1]).resolve()
    reviews = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    connections = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    pod = json.loads((ROOT / "tests/data/webhook/pytorchjob-worker.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        certificate(d)
        server = subprocess.Popen(
            [str(binary), "webhook", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--tls-cert", str(d / "tls.crt"), "--tls-key", str(d / "tls.key"),
             "--inject-image", "ghcr.io/nccl-preflight/nccl-preflight:0.1.0"],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
        try:
            addr = None
            while addr is None:
                line = server.stderr.readline().decode()
                if not line:
                    sys.exit("the webhook exited")
                if "serving POST /mutate on https://" in line:
                    addr = line.split("https://")[1].split(",")[0]
            threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()
            before = (status(server.pid, "VmRSS"), status(server.pid, "VmHWM"))
            bodies = [json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "request": {"uid": f"u-{i}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                              "operation": "CREATE", "namespace": "ml", "object": pod}}).encode()
                      for i in range(reviews)]
            latencies, lock, threads = [], threading.Lock(), []
            started = time.perf_counter()
            for c in range(connections):
                t = threading.Thread(target=client, args=(addr, d / "ca.pem", bodies[c::connections], latencies, lock))
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            wall = time.perf_counter() - started
            after = (status(server.pid, "VmRSS"), status(server.pid, "VmHWM"))
        finally:
            server.terminate()
            server.wait(timeout=10)
    latencies.sort()
    ms = lambda q: 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    print(f"{len(latencies)} reviews over {connections} connections in {wall:.2f} s "
          f"({len(latencies) / wall:.0f}/s): p50 {ms(0.5):.2f} ms, p99 {ms(0.99):.2f} ms, max {1000 * latencies[-1]:.2f} ms")
    print(f"server VmRSS {before[0]} -> {after[0]}, VmHWM {before[1]} -> {after[1]}")


if __name__ == "__main__":
    main()
