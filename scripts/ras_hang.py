#!/usr/bin/env python3
"""The driver of scripts/ras-hang-gpu.sh (standard library only): a torch job per
situation under `serve --watch-nccl --hang-after 10s --watch-interval 1s
--flight-recorder DIR`, the time from the fault to the full hang report, and the report.

Situations, two jobs at a time on 4 GPUs (each job its own NCCL_RAS_ADDR port, master
port, serve port and flight recorder directory):
  wave 1  divergent  rank 1 calls all_gather where rank 0 calls all_reduce   GPUs 0,1
          sleep      rank 1 sleeps in Python outside any collective           GPUs 2,3
  wave 2  sigstop    kill -STOP rank 1                                        GPUs 0,1
          kill9      kill -9 rank 1                                           GPUs 2,3
  wave 3  nodes      4 ranks in two network namespaces ("pods" node0 and node1,
                     NET/Socket between them), a sidecar in each; rank 3 (node1)
                     calls all_gather where the others call all_reduce        GPUs 0-3
The report is full when /job says hung (or dead) and every rank of the pod has a flight
recorder answer (a dump, or why not); each pod's sidecar is polled every 0.25 s.

  ras_hang.py run OUT BINARY [--dry] [--tools DIR] [--only NAME,...]

--dry: no torch, no GPU: each rank is scripts/fr_dump.py's fake (a real FIFO and real
dumps in PyTorch's format) and each job's RAS a scripts/ras_fake.py port whose reply the
driver rewrites at the fault; for running the plumbing here. Everything lands in OUT:
OUT/<situation>/{summary.json, job.json, livez.txt, timeline.txt, reply.json, dumps/,
serve-*.log, ranks.log} and OUT/summary.txt."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
HANG_AFTER, INTERVAL = 10, 1
TARGET = 20.0
WAVE_LIMIT = 100.0
JOBS = {
    "divergent": dict(gpus=[0, 1], fault="divergent", rank=1, port=0),
    "sleep": dict(gpus=[2, 3], fault="sleep", rank=1, port=1),
    "sigstop": dict(gpus=[0, 1], fault="sigstop", rank=1, port=0),
    "kill9": dict(gpus=[2, 3], fault="kill9", rank=1, port=1),
    "nodes": dict(gpus=[0, 1, 2, 3], fault="divergent", rank=3, port=2, nodes=2),
}
WAVES = [["divergent", "sleep"], ["sigstop", "kill9"], ["nodes"]]
if os.environ.get("RAS_HANG_ONE_GPU") == "1":
    # A machine of one GPU: each rank is a "pod" of its own (namespaces with their own
    # hostnames), so NCCL sees two hosts and lets both ranks use GPU 0 (NET/Socket between
    # them); one job at a time, as the pods' veth pair has one name; the four-rank job,
    # two ranks per pod, needs two GPUs per pod and is left out.
    JOBS = {k: dict(v, gpus=[0, 0], nodes=2) for k, v in JOBS.items() if k != "nodes"}
    WAVES = [[k] for k in JOBS]


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, repr(e)


def tuned_env(binary, directory, env):
    """The flight recorder settings `init --flight-recorder DIR` writes (the tuned env)."""
    path = os.path.join(directory, "tuned.env")
    subprocess.run(
        [binary, "init", "--ignore", "all", "--env-file", path, "--flight-recorder", directory],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False,
    )
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("export TORCH_"):
                name, value = line[len("export "):].strip().split("=", 1)
                out[name] = value.strip("'")
    return out


class Job:
    def __init__(self, name, spec, args, out):
        self.name, self.spec, self.args = name, spec, args
        self.out = os.path.join(out, name)
        os.makedirs(os.path.join(self.out, "dumps"), exist_ok=True)
        self.procs, self.ranks, self.serves = [], {}, []
        self.nodes = spec.get("nodes", 1)
        self.world = len(spec["gpus"])
        k = spec["port"]
        self.ras_port, self.master_port, self.serve_port = 28101 + k, 29611 + k, 9471 + 10 * k
        self.timeline, self.summary = [], {"situation": name}
        self.fault_file = os.path.join(self.out, "fault.txt")

    def node_of(self, rank):
        return rank * self.nodes // self.world

    def prefix(self, node):
        """The command prefix that runs inside `node`'s namespaces (nodes job only)."""
        if self.nodes == 1:
            return []
        return ["nsenter", "-t", str(self.holders[node]), "-m", "-u", "-n", "--"]

    def host(self, node):
        return f"10.10.{node}.1" if self.nodes > 1 else "127.0.0.1"

    def spawn(self, cmd, log, env=None, node=0):
        p = subprocess.Popen(self.prefix(node) + cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def setup_nodes(self):
        """Two "pods" as scripts/ras-gpu-nodes.sh makes them: mount, UTS and network
        namespaces held by a sleeping process, a veth pair named eth0 on both sides."""
        ip = [os.path.join(self.args.tools, "ip")] if self.args.tools else ["ip"]
        env = dict(os.environ)
        if self.args.tools:
            env["LD_LIBRARY_PATH"] = os.path.join(self.args.tools, "lib")
        hosts = os.path.join(self.out, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n10.10.0.1 node0\n10.10.1.1 node1\n")
        self.holders = []
        for _ in range(2):
            p = subprocess.Popen(["unshare", "--mount", "--uts", "--net", "--propagation", "private",
                                  "sleep", "86400"])
            self.procs.append(p)
            self.holders.append(p.pid)
        time.sleep(0.5)
        run = lambda *c, **kw: subprocess.run(list(c), env=env, check=True, timeout=20, **kw)  # noqa: E731
        run(*ip, "link", "add", "rh0", "type", "veth", "peer", "name", "rh1")
        for i in (0, 1):
            run(*ip, "link", "set", f"rh{i}", "netns", str(self.holders[i]))
        for i in (0, 1):
            ns = ["nsenter", "-t", str(self.holders[i]), "-n", "--"] + ip
            run("nsenter", "-t", str(self.holders[i]), "-m", "-u", "--", "sh", "-c",
                f"echo node{i} > /proc/sys/kernel/hostname && mount --bind {hosts} /etc/hosts")
            run(*ns, "link", "set", "lo", "up")
            run(*ns, "link", "set", f"rh{i}", "name", "eth0")
            run(*ns, "addr", "add", f"10.10.{i}.1/32", "dev", "eth0")
            run(*ns, "link", "set", "eth0", "up")
            run(*ns, "route", "add", f"10.10.{1 - i}.1/32", "dev", "eth0")
            run(*ns, "route", "add", "default", "dev", "eth0")

    def flight_dir(self, node):
        d = os.path.join(self.out, f"fr-node{node}")
        os.makedirs(d, exist_ok=True)
        return d

    def start(self):
        if self.nodes > 1:
            self.setup_nodes()
        ras = f"localhost:{self.ras_port}"
        base_env = dict(os.environ)
        for node in range(self.nodes):
            fr = self.flight_dir(node)
            log = open(os.path.join(self.out, f"serve-node{node}.log"), "w")
            cmd = [self.args.binary, "serve", "--listen", f"127.0.0.1:{self.serve_port + node}",
                   "--interval", "10m", "--watch-nccl", "--ras-addr", ras, "--watch-interval",
                   f"{INTERVAL}s", "--hang-after", f"{HANG_AFTER}s", "--flight-recorder", fr]
            self.serves.append((self.spawn(cmd, log, base_env, node), self.serve_port + node))
            if self.args.dry:
                reply = os.path.join(self.out, "fake-reply.json")
                self.write_reply("healthy")
                self.spawn([sys.executable, os.path.join(HERE, "ras_fake.py"), "serve",
                            str(self.ras_port), reply], log, base_env, node)
        ranks_log = open(os.path.join(self.out, "ranks.log"), "w")
        for r, gpu in enumerate(self.spec["gpus"]):
            node = self.node_of(r)
            fr = self.flight_dir(node)
            if self.args.dry:
                scenario = {"divergent": "divergent", "sleep": "sleep"}.get(self.spec["fault"], "sleep")
                cmd = [sys.executable, os.path.join(HERE, "fr_dump.py"), "rank", fr, str(r), scenario,
                       str(self.spec["rank"])]
                self.ranks[r] = self.spawn(cmd, ranks_log, base_env, node)
                continue
            env = dict(base_env)
            env.update(self.args.fr_env_for(fr))
            env.update(RANK=str(r), WORLD_SIZE=str(self.world), LOCAL_RANK="0",
                       MASTER_ADDR=self.host(0), MASTER_PORT=str(self.master_port),
                       CUDA_VISIBLE_DEVICES=str(gpu), NCCL_RAS_ADDR=ras, PYTHONUNBUFFERED="1",
                       FAULT=self.spec["fault"], FAULT_RANK=str(self.spec["rank"]), FAULT_FILE=self.fault_file,
                       NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,RAS")
            if self.nodes > 1:
                env["NCCL_SOCKET_IFNAME"] = "eth0"
            cmd = [self.args.python, os.path.join(HERE, "ras_hang_train.py")]
            self.ranks[r] = self.spawn(cmd, ranks_log, env, node)

    def write_reply(self, situation):
        hosts = ",".join(self.host(self.node_of(r)) for r in range(self.world))
        subprocess.run([sys.executable, os.path.join(HERE, "ras_fake.py"), "scenario",
                        os.path.join(self.out, "fake-reply.json"), str(self.world), hosts, situation,
                        str(self.spec["rank"])], check=True, timeout=20)

    def get(self, node, port, path):
        """GET from `node`'s sidecar: in its own network namespace for the nodes job."""
        if self.nodes == 1:
            return get(port, path)
        fetch = ("import json,sys,urllib.request as u,urllib.error as e\n"
                 "try:\n r=u.urlopen(sys.argv[1],timeout=5); print(json.dumps([r.status,r.read().decode(errors='replace')]))\n"
                 "except e.HTTPError as x: print(json.dumps([x.code,x.read().decode(errors='replace')]))\n"
                 "except OSError as x: print(json.dumps([0,repr(x)]))\n")
        r = subprocess.run(["nsenter", "-t", str(self.holders[node]), "-n", "--", sys.executable, "-c", fetch,
                            f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, timeout=15,
                           check=False)
        try:
            status, body = json.loads(r.stdout)
            return status, body
        except ValueError:
            return 0, r.stderr

    def views(self):
        out = []
        for node, (_, port) in enumerate(self.serves):
            status, body = self.get(node, port, "/job")
            try:
                out.append(json.loads(body) if status == 200 else {})
            except ValueError:
                out.append({})
        return out

    def note(self, what):
        self.timeline.append(f"{time.time():.2f} {what}")

    def wait_healthy(self, deadline):
        while time.time() < deadline:
            views = self.views()
            if all(v.get("state") == "healthy" and v.get("ranks") == self.world for v in views):
                self.note(f"healthy: {views[0].get('headline')}")
                return True
            time.sleep(0.5)
        self.note(f"never healthy: {[v.get('headline') for v in self.views()]}")
        return False

    def fault(self, deadline):
        """Makes the fault happen; returns its time."""
        kind, bad = self.spec["fault"], self.ranks[self.spec["rank"]]
        if kind in ("sigstop", "kill9"):
            time.sleep(2)
            at = time.time()
            os.kill(bad.pid, signal.SIGSTOP if kind == "sigstop" else signal.SIGKILL)
            if self.args.dry:
                self.write_reply(kind)
            return at
        if self.args.dry:
            time.sleep(2)
            at = time.time()
            self.write_reply(kind)
            with open(self.fault_file, "w") as f:
                f.write(f"{at:.3f} rank {self.spec['rank']} {kind} (fake)\n")
            return at
        while time.time() < deadline and not os.path.exists(self.fault_file):
            time.sleep(0.1)
        time.sleep(0.2)
        with open(self.fault_file) as f:
            return float(f.read().split()[0])

    def complete(self, v):
        """The report is full: a verdict, and each of this pod's ranks answered."""
        if v.get("state") not in ("hung", "dead"):
            return False
        fr = (v.get("report") or {}).get("flight_recorder") or []
        return bool(fr) and not any("no dump yet" in line or line == "not asked yet" for line in fr)

    def watch(self, at, deadline):
        last, done_at = None, None
        while time.time() < deadline:
            views = self.views()
            now = (tuple(v.get("state") for v in views), tuple(v.get("headline") for v in views),
                   tuple(len((v.get("report") or {}).get("flight_recorder") or []) for v in views))
            if now != last:
                self.note(f"+{time.time() - at:.1f}s {now}")
                last = now
            if all(self.complete(v) for v in views):
                done_at = time.time()
                break
            time.sleep(0.25)
        return done_at

    def record(self, at, done_at):
        # The RAS reply the report was made from, as ncclras would read it (node0's view).
        recorder = [sys.executable, os.path.join(HERE, "ras_record.py"), "json",
                    os.path.join(self.out, "reply.json"), f"localhost:{self.ras_port}"]
        subprocess.run(self.prefix(0) + recorder, stdout=subprocess.DEVNULL, timeout=30, check=False)
        for node, (_, port) in enumerate(self.serves):
            for path, name in [("/job", f"job-node{node}.json"), ("/job/livez", f"livez-node{node}.txt"),
                               ("/metrics", f"metrics-node{node}.txt")]:
                status, body = self.get(node, port, path)
                if path == "/metrics":
                    body = "".join(line + "\n" for line in body.splitlines() if line.startswith("nccl_preflight_job_"))
                with open(os.path.join(self.out, name), "w") as f:
                    f.write(body if path != "/job/livez" else f"{status}\n{body}")
            fr = self.flight_dir(node)
            for entry in sorted(os.listdir(fr)):
                if entry.startswith("dump_"):
                    shutil.copy(os.path.join(fr, entry), os.path.join(self.out, "dumps", entry))
        views = self.views()
        elapsed = None if done_at is None else round(done_at - at, 1)
        self.summary.update(
            fault_at=at, report_seconds=elapsed, target_seconds=TARGET,
            within_target=elapsed is not None and elapsed <= TARGET,
            states=[v.get("state") for v in views], headlines=[v.get("headline") for v in views],
            blame=[(v.get("report") or {}).get("blame") for v in views],
            flight_recorder=[(v.get("report") or {}).get("flight_recorder") for v in views],
        )
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=1)
        with open(os.path.join(self.out, "timeline.txt"), "w") as f:
            f.write("\n".join(self.timeline) + "\n")

    def stop(self):
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def run(self):
        start = time.time()
        try:
            self.start()
            if not self.wait_healthy(start + 60):
                self.record(start, None)
                return
            at = self.fault(start + 80)
            self.note(f"fault {self.spec['fault']} of rank {self.spec['rank']}")
            done_at = self.watch(at, min(at + 45, start + WAVE_LIMIT))
            self.record(at, done_at)
        except Exception as e:  # noqa: BLE001 - said in the summary, the other jobs go on
            self.summary["error"] = repr(e)
            with open(os.path.join(self.out, "summary.json"), "w") as f:
                json.dump(self.summary, f, indent=1)
        finally:
            self.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cmd", choices=["run"])
    parser.add_argument("out")
    parser.add_argument("binary")
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--tools", default=None)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", default=None)
    args = parser.parse_args()
    args.binary = os.path.abspath(args.binary)
    os.makedirs(args.out, exist_ok=True)
    probe = os.path.join(args.out, "tuned")
    os.makedirs(probe, exist_ok=True)
    names = tuned_env(args.binary, probe, dict(os.environ))
    # The same names for each job's own directory.
    args.fr_env_for = lambda d: {k: v.replace(probe, d) for k, v in names.items()}
    lines = [f"tuned flight recorder environment: {sorted(names)}"]
    only = set(args.only.split(",")) if args.only else None
    started = time.time()
    for wave in WAVES:
        wave = [n for n in wave if only is None or n in only]
        if not wave:
            continue
        if time.time() - started > 330 - WAVE_LIMIT:
            lines.append(f"skipped {wave}: the 6-minute budget")
            continue
        jobs = [Job(n, JOBS[n], args, args.out) for n in wave]
        threads = [threading.Thread(target=j.run) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for j in jobs:
            s = j.summary
            lines.append(f"{j.name}: report {s.get('report_seconds')} s after the fault (target {TARGET:.0f} s), "
                         f"blame {s.get('blame')}: {s.get('headlines') or s.get('error')}")
    lines.append(f"wall {time.time() - started:.0f} s")
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = all(json.load(open(os.path.join(args.out, n, "summary.json"))).get("within_target")
             for w in WAVES for n in w if (only is None or n in only)
             and os.path.exists(os.path.join(args.out, n, "summary.json")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
