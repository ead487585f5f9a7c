#!/usr/bin/env python3
"""Judges one leg of `scripts/gang-gpu.sh --pods N` from the files it left in the
leg's directory (rankI.out = the rank's report with --format json, rankI.rc = its
exit code, wall_s). Prints one tab-separated row: the leg, PASS/FAIL, the wall
time, rank 0's gang verdict and a non-root rank's (each: the gang-* findings that
did not pass, "id status: summary", or "all pass"), and exits 0 when every rank
that ran exits with CODE and, where given, rank 0's and the other rank's verdict
both contain EXPECT.

Usage: gang_pods_judge.py LEG DIR CODE OTHER_RANK [EXPECT] [RANKS...]
"""
import json
import pathlib
import sys


def read(path):
    try:
        return pathlib.Path(path).read_text()
    except OSError:
        return None


def verdict(d, r):
    text = read(f"{d}/rank{r}.out") or ""
    try:
        rep = json.loads(text)
    except ValueError:
        return f"no report ({(read(f'{d}/rank{r}.err') or '').strip()[-300:]!r})"
    parts = []
    for c in rep.get("checks", []):
        if c.get("id", "").startswith("gang-") and c.get("status") != "pass":
            parts.append(f"{c['id']} {c['status']}: {c.get('summary', '')}")
    return "; ".join(parts) or "all pass"


def main():
    leg, d, code, other = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    expect = sys.argv[5] if len(sys.argv) > 5 else ""
    ranks = sys.argv[6:] or ["0", other]
    codes = {}
    for r in ranks:
        t = read(f"{d}/rank{r}.rc")
        codes[r] = int(t) if t and t.strip().lstrip("-").isdigit() else None
    v0, v1 = verdict(d, "0"), verdict(d, other)
    ok = all(c == code for c in codes.values()) and expect in v0 and expect in v1
    wall = (read(f"{d}/wall_s") or "?").strip()
    print(f"{leg}\t{'PASS' if ok else 'FAIL'}\t{wall} s\texit {codes}\trank 0: {v0}\trank {other}: {v1}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
