#!/usr/bin/env python3
"""Scores explain-log on the labelled public logs (tests/logs/corpus): for each
NAME.log beside its NAME.json label, runs `BIN explain-log --format json` and
counts transports right (transport_counts as labelled), causes right (the
labelled cause among the findings, or no finding where the label says nothing
is wrong) and false findings (ids the label does not list). Not a test: the
corpus test checks every label; this prints the figures for a before/after.

Usage: scripts/explain-corpus-score.py BIN [NAME-PREFIX...]   (default: every log)
"""
import json
import subprocess
import sys
from pathlib import Path

def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary, only = sys.argv[1], sys.argv[2:]
    corpus = Path(__file__).resolve().parent.parent / "tests/logs/corpus"
    rows = []
    for label_path in sorted(corpus.glob("*.json")):
        name = label_path.stem
        if only and not any(name.startswith(p) for p in only):
            continue
        label = json.loads(label_path.read_text())
        out = subprocess.run([binary, "explain-log", "--format", "json", str(corpus / f"{name}.log")],
                             capture_output=True, text=True)
        try:
            got = json.loads(out.stdout)
        except json.JSONDecodeError:
            got = {"transport_counts": {}, "findings": []}
        ids = [f["id"] for f in got.get("findings", [])]
        transports = got.get("transport_counts", {}) == label.get("transport_counts", {})
        cause = label.get("cause", (label.get("findings") or [None])[0])
        cause_ok = (cause in ids) if cause else not ids
        false = [i for i in ids if i not in label.get("findings", [])]
        exit_ok = out.returncode == label.get("exit")
        rows.append((name, transports, cause_ok, false, exit_ok, out.returncode))
    for name, t, c, f, e, code in rows:
        print(f"{name:55} transports {'ok' if t else 'WRONG'}  cause {'ok' if c else 'WRONG'}  exit {code}{'' if e else ' (WRONG)'}  false {f}")
    n = len(rows)
    print(f"\n{n} logs: transports right {sum(r[1] for r in rows)}, causes right {sum(r[2] for r in rows)}, "
          f"exit right {sum(r[4] for r in rows)}, false findings {sum(len(r[3]) for r in rows)} (in {sum(1 for r in rows if r[3])} logs)")

if __name__ == "__main__":
    main()
