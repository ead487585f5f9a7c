"""Helpers of scripts/ras-gpu.sh, reading serve's endpoints (standard library only).

  ras_probe.py wait STATE TIMEOUT [PORT]   waits until /job's state is STATE; prints the
                                           seconds waited and the headline; exit 1 on timeout
  ras_probe.py timeline FILE [PORT]        until killed: every 0.5 s, a line to FILE whenever
                                           /job's state or headline, /job/livez's or
                                           /healthz's status changes
  ras_probe.py get PATH [PORT]             prints the status and body of PATH
  ras_probe.py threadcpu PID NAME          CPU ticks (utime+stime) of PID's threads named NAME
"""

import glob
import json
import sys
import time
import urllib.error
import urllib.request


def get(path, port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, repr(e)


def job(port):
    status, body = get("/job", port)
    try:
        return json.loads(body) if status == 200 else {}
    except ValueError:
        return {}


def wait(state, timeout, port):
    started = time.time()
    while time.time() - started < timeout:
        j = job(port)
        if j.get("state") == state:
            print(f"{time.time() - started:.1f} {j.get('headline')}")
            return 0
        time.sleep(0.25)
    print(f"timeout after {timeout}s; last: {job(port).get('headline')}")
    return 1


def timeline(path, port):
    started, last = time.time(), None
    with open(path, "a") as out:
        while True:
            j = job(port)
            now = (j.get("state"), j.get("headline"), get("/job/livez", port)[0], get("/healthz", port)[0])
            if now != last:
                out.write(f"{time.time():.2f} +{time.time() - started:.1f}s state={now[0]} livez={now[2]} healthz={now[3]} {now[1]}\n")
                out.flush()
                last = now
            time.sleep(0.5)


def threadcpu(pid, name):
    ticks = 0
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            if open(f"{task}/comm").read().strip() != name:
                continue
            fields = open(f"{task}/stat").read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    print(ticks)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "wait":
        sys.exit(wait(args[0], float(args[1]), args[2] if len(args) > 2 else 9464))
    elif cmd == "timeline":
        timeline(args[0], args[1] if len(args) > 1 else 9464)
    elif cmd == "get":
        status, body = get(args[0], args[1] if len(args) > 1 else 9464)
        print(status)
        print(body)
    elif cmd == "threadcpu":
        threadcpu(args[0], args[1])
