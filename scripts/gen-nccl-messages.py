#!/usr/bin/env python3
"""Generate src/explain/nccl_messages.tsv: the WARN and failure-relevant INFO
messages each NCCL release can print, for explain-log's catalog.

Usage: scripts/gen-nccl-messages.py <path to an NVIDIA/nccl git dir> [output]
(default output: src/explain/nccl_messages.tsv in this script's repo).

For every release tag v2.X.Y-Z from 2.4 on, the script reads every C/C++ file
under src/ (`git ls-tree`, `git cat-file --batch`; a file unchanged between
tags is parsed once) and records each call of NCCL's logging macros
(src/include/debug.h):

  - WARN(fmt, ...): every one.
  - INFO(FLAGS, fmt, ...): those whose format speaks of a failure, a fallback
    or something disabled (FAILURE_WORDS below, with `GPU Direct RDMA %s`,
    whose `%s` is Enabled or Disabled); the rest are progress lines.

The format is the call's string literals joined as the C compiler joins them;
`PRIu64`-style macros become their conversion (`lu`, `lx`, `ld`), any other
identifier or `#name` between literals becomes `%s` (text the program fills
in). A call whose format is not a literal (`WARN(msg)`) is skipped.

Severity, per tag: `abort` when the statements after the WARN, up to the end
of its block or the next WARN, return or jump with an error (`return ncclXError`, `return ret`,
`goto fail`, `ret = ncclXError`, `NCCLCHECK(ncclXError)`, abort()); else
`continues` (NCCL warns and goes on: a fallback, a slowdown). This reads the
source, not the call graph: a caller may still turn a `continues` into a
failure, and explain-log's class table (src/explain/catalog.rs) overrides the
severity where the caller is known.

Consecutive tags that agree on (kind, file, severity, format) are merged into
one row with the first and last version and the lowest and highest line
number seen, so the file stays small. The file is data for
src/explain/catalog.rs; regenerate it rather than editing it.
"""

import re
import subprocess
import sys
from pathlib import Path

TAG = re.compile(r"^v(2)\.(\d+)\.(\d+)-\d+$")
FIRST = (2, 4, 0)
SOURCE = re.compile(r"^src/.*\.(cc|c|cu|h|hpp|cpp)$")
CALL = re.compile(r"\b(WARN|INFO)\s*\(")
FAILURE_WORDS = re.compile(
    r"fail|error|disabl|not supported|unsupported|unable|cannot|can't|could not|couldn't|"
    r"insufficient|too many|too few|too small|too large|exceed|mismatch|timeout|timed out|"
    r"abort|fall(ing)? ?back|not enough|no device|not found|invalid|unavailable|out of|"
    r"ignor|refus|denied|not available|downgrad|missing|giving up|retry|warning|GPU Direct RDMA %s",
    re.I,
)
ERROR_AFTER = re.compile(
    r"\breturn\s+(?!ncclSuccess\b|0\s*;|;|true\b|false\b|NULL\b|nullptr\b)"
    r"|\bgoto\s+\w+|\bret\w*\s*=\s*nccl(?!Success)\w+|\bres\s*=\s*nccl(?!Success)\w+"
    r"|NCCLCHECK\w*\(\s*nccl(?!Success)\w+|\babort\s*\(|\bexit\s*\(|\bthrow\b"
)
PRI = {"PRIu64": "lu", "PRIx64": "lx", "PRId64": "ld", "PRIi64": "li", "PRIX64": "lX",
       "PRIu32": "u", "PRIx32": "x", "PRId32": "d", "PRIuPTR": "lu", "PRIxPTR": "lx"}


def git(gitdir, *args):
    out = subprocess.run(["git", "--git-dir", gitdir, *args], check=False, capture_output=True)
    if out.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed in {gitdir}: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout.decode(errors="replace")


def tags(gitdir):
    found = []
    for t in git(gitdir, "tag").split():
        m = TAG.match(t)
        if m:
            v = tuple(int(x) for x in m.groups())
            if v >= FIRST:
                found.append((v, t))
    if not found:
        sys.exit(f"{gitdir}: no NCCL release tags (v2.X.Y-Z, 2.4 on) found")
    return sorted(found)


class Blobs:
    """Reads blobs through one `git cat-file --batch` process."""

    def __init__(self, gitdir):
        self.proc = subprocess.Popen(["git", "--git-dir", gitdir, "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self, oid):
        self.proc.stdin.write(oid.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) < 3:
            sys.exit(f"git cat-file: no blob {oid}")
        data = self.proc.stdout.read(int(header[2]))
        self.proc.stdout.read(1)
        return data.decode(errors="replace")


def blank_comments(text):
    """Comments replaced by spaces (newlines kept), so offsets and lines hold."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def call_args(text, start):
    """Top-level arguments of the call whose '(' is at start, and the end offset."""
    args, depth, i, cur = [], 0, start + 1, []
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append("".join(cur).strip())
                return args, i + 1
            depth -= 1
        elif c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return None, n


C_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r", "0": "\0"}


def unescape(body):
    return re.sub(r"\\(.)", lambda m: C_ESCAPES.get(m.group(1), m.group(1)), body)


def format_of(arg):
    """The format string an argument spells, or None when it holds no literal."""
    parts, literal = [], False
    for tok in re.finditer(r'"((?:[^"\\]|\\.)*)"|#\s*\w+|\w+|\S', arg):
        if tok.group(1) is not None:
            parts.append(unescape(tok.group(1)))
            literal = True
        elif tok.group(0) in PRI:
            parts.append(PRI[tok.group(0)])
        elif re.match(r"#?\s*\w+$", tok.group(0)):
            parts.append("%s")
    return "".join(parts) if literal else None


def severity(text, end):
    """`abort` when the rest of the WARN's block returns or jumps with an error."""
    depth, i, n = 0, end, min(len(text), end + 600)
    while i < n:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                break
            depth -= 1
        i += 1
    tail = text[end:i]
    # Up to the next WARN: what follows it is that WARN's.
    tail = tail.split("WARN(", 1)[0]
    return "abort" if ERROR_AFTER.search(tail) else "continues"


def messages(text):
    """[(kind, line, severity, format)] of one file's logging calls."""
    clean = blank_comments(text.replace("\\\n", " \n"))
    found = []
    for m in CALL.finditer(clean):
        line_start = clean.rfind("\n", 0, m.start()) + 1
        if clean[line_start:m.start()].lstrip().startswith("#define"):
            continue
        args, end = call_args(clean, m.end() - 1)
        if not args:
            continue
        kind = m.group(1).lower()
        fmt_arg = args[0] if kind == "warn" else (args[1] if len(args) > 1 else "")
        fmt = format_of(fmt_arg)
        if fmt is None or not fmt.strip():
            continue
        if kind == "info" and not FAILURE_WORDS.search(fmt):
            continue
        line = clean.count("\n", 0, m.start()) + 1
        sev = severity(clean, end) if kind == "warn" else "info"
        found.append((kind, line, sev, fmt))
    return found


def per_tag(gitdir, tag, blobs, cache):
    """{(kind, file, severity, format): (min line, max line)} for one tag."""
    out = {}
    for entry in git(gitdir, "ls-tree", "-r", tag, "src").splitlines():
        meta, path = entry.split("\t", 1)
        _, typ, oid = meta.split()
        if typ != "blob" or not SOURCE.match(path):
            continue
        if oid not in cache:
            cache[oid] = messages(blobs.read(oid))
        for kind, line, sev, fmt in cache[oid]:
            key = (kind, path, sev, fmt)
            lo, hi = out.get(key, (line, line))
            out[key] = (min(lo, line), max(hi, line))
    return out


def escape(fmt):
    return fmt.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def rows(tables, versions):
    """Runs of consecutive tags per key, with their line span."""
    out = []
    for key in sorted({k for t in tables for k in t}):
        run = None
        for i, t in enumerate(tables):
            span = t.get(key)
            if span and run and run[1] == i - 1:
                run = (run[0], i, min(run[2], span[0]), max(run[3], span[1]))
                continue
            if run:
                out.append((key, run))
                run = None
            if span:
                run = (i, i, span[0], span[1])
        if run:
            out.append((key, run))
    return [(k, versions[a], versions[b], lo, hi) for k, (a, b, lo, hi) in out]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    gitdir = sys.argv[1]
    if not Path(gitdir).is_dir():
        sys.exit(f"{gitdir}: not a directory")
    default = Path(__file__).resolve().parent.parent / "src/explain/nccl_messages.tsv"
    output = Path(sys.argv[2]) if len(sys.argv) == 3 else default
    found = tags(gitdir)
    versions = [".".join(map(str, v)) for v, _ in found]
    blobs, cache = Blobs(gitdir), {}
    tables = [per_tag(gitdir, tag, blobs, cache) for _, tag in found]
    lines = [
        "# NCCL's WARN and failure-relevant INFO messages by version. Generated by",
        "# scripts/gen-nccl-messages.py from NVIDIA/nccl's release tags; do not edit by hand.",
        "# tags read: " + " ".join(t for _, t in found),
        "# kind<TAB>file<TAB>first<TAB>last<TAB>first line<TAB>last line<TAB>severity<TAB>format (C escapes)",
    ]
    for (kind, path, sev, fmt), first, last, lo, hi in rows(tables, versions):
        lines.append("\t".join([kind, path, first, last, str(lo), str(hi), sev, escape(fmt)]))
    tmp = output.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(output)
    print(f"{output}: {len(lines) - 4} rows from {len(found)} tags ({versions[0]} to {versions[-1]})")


if __name__ == "__main__":
    main()
