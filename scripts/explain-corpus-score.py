#!/usr/bin/env python3
"""Scores explain-log on the labelled public logs (tests/logs/corpus): for each
NAME.log beside its NAME.json label, runs `BIN explain-log --format json`.

Two label forms:
- the first corpus (issue 15 on): transports right (transport_counts as labelled),
  causes right (the labelled cause among the findings, or no finding where the
  label says nothing is wrong), exit right, false findings (ids the label does not
  list);
- labels with `verdict` (issue 38 on): verdict right (the exit code, and the first
  finding, which is the verdict, one of `first`; none failing where the label
  says `pass`), cause right (every `cause` group in the first finding's summary),
  fix right (every `fix` group in its remediation), false findings. A group is
  words separated by `|`, any of which may match, case-insensitive. Counted per
  label `set` (`issue-38`: built against; `issue-38-held-out`: held out until
  the tool was built).

Not a test: the corpus test checks every label; this prints the figures for a
before/after.

Usage: scripts/explain-corpus-score.py BIN [NAME-PREFIX...]   (default: every log)
"""
import json
import subprocess
import sys
from pathlib import Path


def groups_in(groups, text):
    text = (text or "").lower()
    return all(any(w.lower() in text for w in g.split("|")) for g in groups)


def run(binary, log):
    out = subprocess.run([binary, "explain-log", "--format", "json", str(log)],
                         capture_output=True, text=True)
    try:
        return out.returncode, json.loads(out.stdout)
    except json.JSONDecodeError:
        return out.returncode, {"transport_counts": {}, "findings": []}


def score_v3(label, code, got):
    findings = got.get("findings", [])
    first = findings[0] if findings else None
    failing = [f for f in findings if f.get("status") == "fail"]
    if label["verdict"] == "pass":
        verdict = code == label["exit"] and not failing
        cause = fix = verdict
    else:
        verdict = code == label["exit"] and first is not None and first["id"] in label["first"]
        cause = first is not None and groups_in(label["cause"], first.get("summary"))
        fix = first is not None and groups_in(label["fix"], first.get("remediation"))
    false = [f["id"] for f in findings if f["id"] not in label.get("findings", [])]
    return verdict, cause, fix, false


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary, only = sys.argv[1], sys.argv[2:]
    corpus = Path(__file__).resolve().parent.parent / "tests/logs/corpus"
    old, new = [], []
    for label_path in sorted(corpus.glob("*.json")):
        name = label_path.stem
        if only and not any(name.startswith(p) for p in only):
            continue
        label = json.loads(label_path.read_text())
        code, got = run(binary, corpus / f"{name}.log")
        ids = [f["id"] for f in got.get("findings", [])]
        if "verdict" in label:
            v, c, f, false = score_v3(label, code, got)
            new.append((name, v, c, f, false, code, ids[:1], label.get("set", "")))
            continue
        transports = got.get("transport_counts", {}) == label.get("transport_counts", {})
        cause = label.get("cause", (label.get("findings") or [None])[0])
        cause_ok = (cause in ids) if cause else not ids
        false = [i for i in ids if i not in label.get("findings", [])]
        exit_ok = code == label.get("exit")
        old.append((name, transports, cause_ok, false, exit_ok, code))
    ok = lambda b: "ok" if b else "WRONG"
    for name, t, c, f, e, code in old:
        print(f"{name:55} transports {ok(t)}  cause {ok(c)}  exit {code}{'' if e else ' (WRONG)'}  false {f}")
    if old:
        n = len(old)
        print(f"\n{n} logs: transports right {sum(r[1] for r in old)}, causes right {sum(r[2] for r in old)}, "
              f"exit right {sum(r[4] for r in old)}, false findings {sum(len(r[3]) for r in old)} "
              f"(in {sum(1 for r in old if r[3])} logs)\n")
    for name, v, c, f, false, code, first, _ in new:
        print(f"{name:55} verdict {ok(v)}  cause {ok(c)}  fix {ok(f)}  exit {code}  first {first}  false {false}")
    if new:
        print()
    # One line per label set: the threads the tool was built against apart from
    # those held out until it was built (`set` in each label).
    for group in sorted({r[7] for r in new}):
        rows = [r for r in new if r[7] == group]
        print(f"{group or '(no set)'}: {len(rows)} logs labelled with verdict/cause/fix: "
              f"verdict right {sum(r[1] for r in rows)}, cause right {sum(r[2] for r in rows)}, "
              f"fix right {sum(r[3] for r in rows)}, all three {sum(r[1] and r[2] and r[3] for r in rows)}, "
              f"false findings {sum(len(r[4]) for r in rows)} (in {sum(1 for r in rows if r[4])} logs)")


if __name__ == "__main__":
    main()
