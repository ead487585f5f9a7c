#!/usr/bin/env python3
"""Judges one leg of scripts/gang-gpu.sh from the files it left in the leg's
directory (rankI.out = the rank's report with --format json, rankI.rc = its exit
code, wall_s, nccl.rankI.log = NCCL's INFO log). Prints one line with the numbers;
exits 0 when the leg shows what it must, 1 otherwise.

What is relied on: the report/v1 JSON (`checks`: id, status, summary, evidence),
the gang-* check ids, the exit codes (0 pass/warn, 1 job fault, 3 node fault, 2 could not run) and a
`gang` object whose bandwidth rows carry a size in bytes and a busbw; the names of
those fields are looked up loosely (a key holding "busbw", a key holding "bytes"
or "size") so that the judge does not pin the gang object's layout.

Modes:
  join-pass DIR R0 R1                  every rank exits 0, gang-join and
                                       gang-consistency pass, busbw reported
  consistency-fail DIR R0 R1 VAR       every rank exits 1, gang-consistency fails
                                       naming VAR
  join-fail DIR R0 BOUND MISSING...    rank R0 exits 1 within BOUND seconds (the
                                       name wait + the join timeout, + 15 s slack),
                                       gang-join fails naming a MISSING rank/host
  slow-link DIR R0 R1 ADIR NODE        busbw at least 2x below leg a's (ADIR), and
                                       whether gang-bandwidth or the straggler names
                                       NODE (with two nodes the median cannot single
                                       one out: reported, not required)
  torch DIR [ADIR]                     torchrun's all-reduce ran across the two
                                       namespaces over NET/Socket; with ADIR, its
                                       busbw against the gang's, per size (5%)
"""
import json
import pathlib
import re
import sys


def read(path, default=None):
    try:
        return pathlib.Path(path).read_text()
    except OSError:
        return default


def rc(d, r):
    text = read(f"{d}/rank{r}.rc")
    return int(text) if text and text.strip().lstrip("-").isdigit() else None


def report(d, r):
    text = read(f"{d}/rank{r}.out", "")
    try:
        return json.loads(text)
    except ValueError:
        # A rank may print more than one JSON document or log lines: take the last object.
        for line in reversed(text.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def check(rep, cid):
    for c in (rep or {}).get("checks") or []:
        if c.get("id") == cid:
            return c
    return None


def text_of(c):
    if not c:
        return ""
    return " ".join([str(c.get("summary") or "")] + [str(e) for e in c.get("evidence") or []])


def busbw(rep):
    """{bytes: busbw} from the gang object's bandwidth rows, found by key names."""
    found = {}

    def walk(v):
        if isinstance(v, dict):
            bw = next((v[k] for k in v if "busbw" in k.lower() and isinstance(v[k], (int, float))), None)
            size = next((v[k] for k in v if ("bytes" in k.lower() or k.lower() == "size")
                         and isinstance(v[k], int)), None)
            if bw is not None and size is not None:
                found[size] = float(bw)
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)

    walk((rep or {}).get("gang"))
    return found


def transports(d, ranks):
    """The transports NCCL chose: the gang's own account (`gang.transports`) and the
    `via NET/...` lines of an NCCL log the leg kept."""
    seen = set()
    for r in ranks:
        seen.update(((report(d, r) or {}).get("gang") or {}).get("transports") or {})
        for m in re.finditer(r"via (NET/[\w/]+|P2P/[\w/]+|SHM/[\w/]+)", read(f"{d}/nccl.rank{r}.log", "")):
            seen.add(m.group(1))
    return sorted(seen)


def fmt_bw(bw):
    return ", ".join(f"{b >> 20} MiB {v:.3g} GB/s" for b, v in sorted(bw.items())) or "none"


def statuses(rep, ids=("gang-join", "gang-consistency", "gang-bandwidth")):
    return ", ".join(f"{i} {(check(rep, i) or {}).get('status', 'absent')}" for i in ids)


def main(argv):
    mode, d = argv[1], argv[2]
    if mode == "join-pass":
        ranks = argv[3:]
        reps = {r: report(d, r) for r in ranks}
        codes = {r: rc(d, r) for r in ranks}
        bw = busbw(reps[ranks[0]])
        ok = (all(c == 0 for c in codes.values())
              and all((check(reps[r], "gang-join") or {}).get("status") == "pass" for r in ranks)
              and all((check(reps[r], "gang-consistency") or {}).get("status") in ("pass", "warn") for r in ranks)
              and bool(bw))
        print(f"exit {codes}; rank {ranks[0]}: {statuses(reps[ranks[0]])}; busbw {fmt_bw(bw)}; "
              f"transport {transports(d, ranks)}")
        return 0 if ok else 1
    if mode == "consistency-fail":
        ranks, var = argv[3:-1], argv[-1]
        reps = {r: report(d, r) for r in ranks}
        codes = {r: rc(d, r) for r in ranks}
        c = check(reps[ranks[0]], "gang-consistency")
        ok = (all(code == 1 for code in codes.values()) and (c or {}).get("status") == "fail"
              and var in text_of(c))
        print(f"exit {codes}; rank {ranks[0]}: gang-consistency {(c or {}).get('status', 'absent')}: "
              f"{(c or {}).get('summary', '')!s}")
        return 0 if ok else 1
    if mode == "join-fail":
        r, timeout, missing = argv[3], float(argv[4]), argv[5:]
        rep, code = report(d, r), rc(d, r)
        c = check(rep, "gang-join")
        wall = float(read(f"{d}/wall_s", "inf"))
        named = [m for m in missing if re.search(rf"\b{re.escape(m)}\b", text_of(c))]
        # 15 s of slack for process start and the report.
        ok = code == 3 and (c or {}).get("status") == "fail" and bool(named) and wall <= timeout + 15
        print(f"exit {code}; gang-join {(c or {}).get('status', 'absent')} after {wall:.1f} s "
              f"(bound {timeout:.0f} s), names {named or 'none of ' + str(missing)}: "
              f"{(c or {}).get('summary', '')!s}")
        return 0 if ok else 1
    if mode == "slow-link":
        ranks, adir, node = argv[3:5], argv[5], argv[6]
        reps = {r: report(d, r) for r in ranks}
        codes = {r: rc(d, r) for r in ranks}
        slow, free = busbw(reps[ranks[0]]), busbw(report(adir, ranks[0]))
        c = check(reps[ranks[0]], "gang-bandwidth")
        common = sorted(set(slow) & set(free))
        ok = bool(common) and all(slow[b] * 2 <= free[b] for b in common)
        straggler = ((reps[ranks[0]] or {}).get("gang") or {}).get("straggler")
        named = node in text_of(c) or node in json.dumps(straggler)
        print(f"exit {codes}; busbw limited {fmt_bw(slow)} vs free {fmt_bw(free)}; gang-bandwidth "
              f"{(c or {}).get('status', 'absent')}: {(c or {}).get('summary', '')!s}; "
              f"{node} {'named' if named else 'not named'}")
        return 0 if ok else 1
    if mode == "torch":
        codes = {r: rc(d, r) for r in (0, 1)}
        result = json.loads(read(f"{d}/torch.json", "null") or "null")
        via = transports(d, (0, 1))
        rows = {row["bytes"]: row["busbw_gbs"] for row in (result or {}).get("sizes", [])}
        ok = result is not None and all(c == 0 for c in codes.values()) and any(
            t.startswith("NET/Socket") for t in via)
        line = (f"exit {codes}; torch {(result or {}).get('torch')} NCCL {(result or {}).get('nccl')}, "
                f"{(result or {}).get('ranks')} ranks; busbw {fmt_bw(rows)}; transport {via}")
        if len(argv) > 3:
            gang = busbw(report(argv[3], 0))
            diffs = {b: (gang[b] - rows[b]) / rows[b] * 100 for b in sorted(set(gang) & set(rows))}
            line += "; gang vs torch " + (", ".join(f"{b >> 20} MiB {p:+.1f}%" for b, p in diffs.items())
                                          or "no common size")
            ok = ok and bool(diffs) and all(abs(p) <= 5 for p in diffs.values())
        print(line)
        return 0 if ok else 1
    print(f"unknown mode {mode}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
