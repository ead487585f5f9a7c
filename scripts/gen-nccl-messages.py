#!/usr/bin/env python3
"""Generate src/explain/nccl_messages.tsv: explain-log's meaning table, the WARN
and failure-relevant INFO messages each NCCL release (and each net plugin
release) can print, where in the source, under which condition, and what each
means (its meaning in src/explain/meanings.txt).

Usage:
  scripts/gen-nccl-messages.py NCCL_GIT_DIR [--wheel VERSION=libnccl.so.2]...
      [--plugin aws-ofi-nccl=GIT_DIR] [--plugin nccl-rdma-sharp-plugins=GIT_DIR] [--out FILE]
  scripts/gen-nccl-messages.py --remap [--out FILE]

For every release tag v2.X.Y-Z from 2.4 on, the script reads every C/C++ file
under src/ (`git ls-tree`, `git cat-file --batch`; a file unchanged between
tags is parsed once) and records each call of NCCL's logging macros
(src/include/debug.h):

  - WARN(fmt, ...): every one, and every invocation of a macro whose body holds
    a WARN (CUDACHECK, CUCHECK, SYSCHECK, the IBV_*_CHECK wrappers of
    src/misc/ibvwrap.cc, ...): a row at the invocation, the format with the
    macro's string-literal arguments put in (`"Call to " name " failed"` becomes
    `Call to ibv_reg_mr failed`), and the call it checks as the condition.
  - `call` rows: each call of a function in CALL_SITES, with its caller and exact
    line (the condition column says `line N`).
  - INFO(FLAGS, fmt, ...): those whose format speaks of a failure, a fallback
    or something disabled (FAILURE_WORDS below, with `GPU Direct RDMA %s`,
    whose `%s` is Enabled or Disabled); the rest are progress lines.

The format is the call's string literals joined as the C compiler joins them;
`PRIu64`-style macros become their conversion (`lu`, `lx`, `ld`), any other
identifier or `#name` between literals becomes `%s` (text the program fills
in). A call whose format is not a literal (`WARN(msg)`) is skipped.

Per call: the function it is in, and its condition: the innermost `if (...)`
that leads to it (for a macro's row, the call the macro checks). Severity, per
tag: `abort` when the statements after the WARN, up to the end of its block or
the next WARN, return or jump with an error (`return ncclXError`, `return ret`,
`goto fail`, `ret = ncclXError`, `NCCLCHECK(ncclXError)`, abort()); else
`continues` (NCCL warns and goes on: a fallback, a slowdown). This reads the
source, not the call graph: a caller may still turn a `continues` into a
failure, and a meaning overrides the severity where the caller is known.

Releases newer than the newest tag: `--wheel 2.32.3=~/.cache/nccl-preflight/nccl/2.32.3/libnccl.so.2`
extends every row of the newest tag whose format is among that build's strings
to that version (the source of those releases is not public; their new
messages are read by their shape at run time).

Net plugins: `--plugin NAME=GIT_DIR` reads the plugin's release tags the same
way (aws-ofi-nccl: NCCL_OFI_WARN / NCCL_OFI_INFO, which print `NET/OFI ` before
the format; nccl-rdma-sharp-plugins: WARN / INFO); their rows' files are
`NAME/src/FILE` without the extension, merged across releases by format, and
their versions the plugin's.

Meanings: each row gets the id of the first block of src/explain/meanings.txt
that matches it (by file and format words, as explain-log matches a line that
is in no row). `--remap` re-reads the table already generated and only
re-assigns the meanings: adding a meaning needs no NCCL checkout.

Consecutive tags that agree on (kind, file, severity, function, condition,
format) are merged into one row with the first and last version and the
lowest and highest line number seen, so the file stays small. The file is data
for src/explain/catalog.rs; regenerate it rather than editing it.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-\d+|-aws)?$")
FIRST = (2, 4, 0)
SOURCE = re.compile(r"^src/.*\.(cc|c|cu|h|hpp|cpp)$|^include/.*\.(h|hpp)$")
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
    r"|\bRES\s*=\s*nccl(?!Success)\w+|NCCLCHECK\w*\(\s*nccl(?!Success)\w+|\babort\s*\(|\bexit\s*\(|\bthrow\b"
)
PRI = {"PRIu64": "lu", "PRIx64": "lx", "PRId64": "ld", "PRIi64": "li", "PRIX64": "lX",
       "PRIu32": "u", "PRIx32": "x", "PRId32": "d", "PRIuPTR": "lu", "PRIxPTR": "lx"}
# The logging calls of each source: (kind, call name, index of the format argument, prefix).
NCCL_CALLS = {"WARN": ("warn", 0, ""), "INFO": ("info", 1, "")}
PLUGIN_CALLS = {
    "aws-ofi-nccl": {"NCCL_OFI_WARN": ("warn", 0, "NET/OFI "), "NCCL_OFI_INFO": ("info", 1, "NET/OFI ")},
    "nccl-rdma-sharp-plugins": NCCL_CALLS,
}
MAX_CONDITION = 160
# Calls whose WARN does not say which caller failed: a `call` row per call site (its
# function, exact line) lets explain-log name the caller from NCCL's error trace
# (`transport/net_ib.cc:395 -> 2`): ncclIbRtrQp is the INIT->RTR transition.
CALL_SITES = ("wrap_ibv_modify_qp",)
HEADER = "# kind<TAB>file<TAB>first<TAB>last<TAB>first line<TAB>last line<TAB>severity<TAB>meaning<TAB>function<TAB>condition<TAB>format (C escapes)"


def git(gitdir, *args):
    out = subprocess.run(["git", "--git-dir", gitdir, *args], check=False, capture_output=True)
    if out.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed in {gitdir}: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout.decode(errors="replace")


def tags(gitdir, first):
    found = []
    for t in git(gitdir, "tag").split():
        m = TAG.match(t)
        if m:
            v = tuple(int(x) for x in m.groups())
            if v >= first:
                found.append((v, t))
    if not found:
        sys.exit(f"{gitdir}: no release tags (vX.Y.Z[-N]) found")
    # One tag per version (v1.7.4 and v1.7.4-aws): the first seen.
    seen, out = set(), []
    for v, t in sorted(found):
        if v not in seen:
            seen.add(v)
            out.append((v, t))
    return out


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


def skip_literal(text, i):
    """The offset after the string or char literal that starts at i."""
    quote, j, n = text[i], i + 1, len(text)
    while j < n and text[j] != quote:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def call_args(text, start):
    """Top-level arguments of the call whose '(' is at start, and the end offset."""
    args, depth, i, cur = [], 0, start + 1, []
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = skip_literal(text, i)
            cur.append(text[i:j])
            i = j
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


def format_of(arg, params=None):
    """The format an argument spells, or None when it holds no literal. `params`
    maps a macro's parameter names to their literal text, or None (left `%s`)."""
    parts, literal = [], False
    for tok in re.finditer(r'"((?:[^"\\]|\\.)*)"|#\s*\w+|\w+|\S', arg):
        word = tok.group(0)
        if tok.group(1) is not None:
            parts.append(unescape(tok.group(1)))
            literal = True
        elif word in PRI:
            parts.append(PRI[word])
        elif params is not None and word in params and params[word] is not None:
            parts.append(params[word])
            literal = True
        elif re.match(r"#?\s*\w+$", word):
            parts.append("%s")
    return "".join(parts) if literal else None


def literal_of(arg):
    """The text of an argument made only of string literals, else None."""
    if not re.fullmatch(r'\s*("(?:[^"\\]|\\.)*"\s*)+', arg):
        return None
    return "".join(unescape(m) for m in re.findall(r'"((?:[^"\\]|\\.)*)"', arg))


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


def compact(text, limit=MAX_CONDITION):
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Blocks:
    """The braces of a file: for an offset, the function it is in and the
    innermost `if (...)` that leads to it."""

    def __init__(self, clean):
        self.clean = clean
        self.opens = []  # (open offset, close offset, header text)
        stack, i, n, last_stmt = [], 0, len(clean), 0
        while i < n:
            c = clean[i]
            if c in "\"'":
                i = skip_literal(clean, i)
                continue
            if c == "{":
                stack.append((i, clean[last_stmt:i]))
                last_stmt = i + 1
            elif c == "}":
                if stack:
                    start, header = stack.pop()
                    self.opens.append((start, i, header))
                last_stmt = i + 1
            elif c == ";":
                last_stmt = i + 1
            i += 1
        self.opens.sort()

    def around(self, offset):
        return [b for b in self.opens if b[0] < offset < b[1]]

    def function(self, offset):
        for start, _, header in self.around(offset):
            # The declaration before the brace, without preprocessor lines.
            h = compact("\n".join(l for l in header.splitlines() if not l.lstrip().startswith("#")), 10_000)
            m = re.search(r"([A-Za-z_][\w:~]*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const|noexcept|override|\s)*$", h)
            if m and m.group(1) not in ("if", "for", "while", "switch", "do", "catch"):
                return m.group(1).split("::")[-1]
        return ""

    def condition(self, offset):
        """`if (cond)` of the innermost block holding offset, or of the braceless
        statement just before it."""
        before = self.clean[max(0, offset - 400):offset]
        stmt = re.split(r"[;{}]", before)[-1]
        m = re.search(r"\b(?:else\s+)?if\s*\((.*)\)\s*$", stmt, re.S)
        if m:
            return compact(m.group(1))
        for _, _, header in reversed(self.around(offset)):
            m = re.search(r"\bif\s*\((.*)\)\s*$", header, re.S)
            if m:
                return compact(m.group(1))
            if re.search(r"\b(else|for|while|switch|case)\b", header) is None and "(" in header:
                break
        return ""


def macro_defs(text):
    """{name: (params, [(format arg, severity)])} of the `#define NAME(params)`
    whose body logs a WARN."""
    out = {}
    joined = text.replace("\\\n", "  ")
    for m in re.finditer(r"^[ \t]*#\s*define\s+(\w+)\(([^)]*)\)(.*)$", joined, re.M):
        name, params, body = m.group(1), [p.strip() for p in m.group(2).split(",")], m.group(3)
        warns = []
        for w in re.finditer(r"\bWARN\s*\(", body):
            args, end = call_args(body, w.end() - 1)
            if args:
                warns.append((args[0], severity(body, end)))
        if warns and name not in ("WARN", "INFO"):
            out[name] = (params, warns)
    return out


def messages(text, calls, macros):
    """[(kind, line, severity, function, condition, format)] of one file's logging
    calls and WARN-macro invocations."""
    clean = blank_comments(text.replace("\\\n", " \n"))
    blocks = Blocks(clean)
    names = "|".join(map(re.escape, list(calls) + list(macros) + list(CALL_SITES)))
    found = []
    for m in re.finditer(r"\b(" + names + r")\s*\(", clean):
        line_start = clean.rfind("\n", 0, m.start()) + 1
        if clean[line_start:m.start()].lstrip().startswith("#"):
            continue
        args, end = call_args(clean, m.end() - 1)
        if not args:
            continue
        line = clean.count("\n", 0, m.start()) + 1
        func = blocks.function(m.start())
        name = m.group(1)
        if name in CALL_SITES:
            # A definition (`ncclResult_t wrap_ibv_modify_qp(...) {`) is not a call site.
            if func != name:
                found.append(("call", line, "call", func, f"line {line}", name))
            continue
        if name in calls:
            kind, at, prefix = calls[name]
            fmt = format_of(args[at]) if len(args) > at else None
            if fmt is None or not fmt.strip():
                continue
            fmt = prefix + fmt
            if kind == "info" and not FAILURE_WORDS.search(fmt):
                continue
            sev = severity(clean, end) if kind == "warn" else "info"
            found.append((kind, line, sev, func, blocks.condition(m.start()), fmt))
            continue
        params, warns = macros[name]
        bound = {p: literal_of(a) for p, a in zip(params, args)}
        # The call the macro checks: its first argument that is a call (the IBV_*
        # wrappers pass the symbol table first), else its first.
        call = next((a for a in args if re.match(r"[\w.>*&-]*\w\s*\(", a)), args[0] if args else "")
        checked = compact(f"{name}({call})")
        for fmt_arg, sev in warns:
            fmt = format_of(fmt_arg, bound)
            if fmt and fmt.strip():
                found.append(("warn", line, sev, func, checked, fmt))
    return found


def per_tag(gitdir, tag, blobs, cache, calls, prefix):
    """{(kind, file, severity, function, condition, format): (min line, max line)} for one tag."""
    files = []
    for entry in git(gitdir, "ls-tree", "-r", tag).splitlines():
        meta, path = entry.split("\t", 1)
        _, typ, oid = meta.split()
        if typ == "blob" and SOURCE.match(path):
            files.append((path, oid))
    macros = {}
    for path, oid in files:
        key = ("macros", oid)
        if key not in cache:
            cache[key] = macro_defs(blobs.read(oid))
        macros.update(cache[key])
    macro_key = tuple(sorted(macros))
    out = {}
    for path, oid in files:
        key = (oid, macro_key)
        if key not in cache:
            cache[key] = messages(blobs.read(oid), calls, macros)
        for kind, line, sev, func, cond, fmt in cache[key]:
            k = (kind, prefix + path, sev, func, cond, fmt)
            if prefix:
                # A plugin's rows merge across its releases by format: aws-ofi-nccl
                # moved from C to C++ and split its files, and its WARNs print
                # `function:line` rather than the file; the file is named without
                # its extension, the function and condition are left out.
                k = (kind, prefix + re.sub(r"\.(c|cc|cpp|h|hpp)$", "", path), sev, "", "", fmt)
            lo, hi = out.get(k, (line, line))
            out[k] = (min(lo, line), max(hi, line))
    return out


def escape(text):
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


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


def read_source(gitdir, first, calls, prefix=""):
    found = tags(gitdir, first)
    versions = [".".join(map(str, v)) for v, _ in found]
    blobs, cache = Blobs(gitdir), {}
    tables = [per_tag(gitdir, tag, blobs, cache, calls, prefix) for _, tag in found]
    return found, rows(tables, versions)


def wheel_strings(path):
    data = Path(path).expanduser().read_bytes()
    return [s.decode() for s in re.findall(rb"[\t\n\x20-\x7e]{4,}", data)]


def extend_to_wheels(table, newest, wheels):
    """Rows alive at the newest tag whose format a newer build still holds go on to it."""
    for version, path in sorted(wheels, key=lambda w: tuple(map(int, w[0].split(".")))):
        strings = wheel_strings(path)
        exact, blob = set(strings), "\0".join(strings)
        for row in table:
            fmt = row[0][5].split("\n")[0]
            if row[2] != newest or not row[0][1].startswith("src/"):
                continue
            if fmt in exact or fmt in blob:
                row[2] = version
        newest = version
    return newest


# ---- meanings (src/explain/meanings.txt), matched as src/explain/meanings.rs does ----

def load_meanings(path):
    blocks, cur = [], None
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([\w.-]+)\]", line)
        if m:
            cur = {"id": m.group(1), "files": [], "words": [], "kind": "warn"}
            blocks.append(cur)
            continue
        key, _, value = line.partition(":")
        if cur is None:
            continue
        key, value = key.strip(), value.strip()
        if key in ("files", "words"):
            cur[key] = [w.strip() for w in value.split("|") if w.strip()]
        elif key == "kind":
            cur["kind"] = value
    return blocks


def meaning_of(blocks, kind, path, fmt):
    if kind == "call":
        return "-"
    for b in blocks:
        if b["kind"] not in (kind, "any"):
            continue
        if (kind == "warn" and any(f in path for f in b["files"])) or any(w in fmt for w in b["words"]):
            return b["id"]
    return "-"


def remap(output, meanings):
    lines = output.read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("#") or not line:
            out.append(line)
            continue
        f = line.split("\t", 10)
        fmt = unescape_tsv(f[10]).split("\n")[0]
        f[7] = meaning_of(meanings, f[0], f[1], fmt)
        out.append("\t".join(f))
    write(output, out)


def unescape_tsv(text):
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), text)


def write(output, lines):
    tmp = output.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(output)


def parse_args(argv):
    opts = {"wheels": [], "plugins": [], "out": ROOT / "src/explain/nccl_messages.tsv", "remap": False, "nccl": None}
    it = iter(argv)
    for a in it:
        if a == "--wheel":
            v, _, p = next(it, "").partition("=")
            opts["wheels"].append((v, p))
        elif a == "--plugin":
            n, _, p = next(it, "").partition("=")
            if n not in PLUGIN_CALLS:
                sys.exit(f"--plugin {n}: not one of {', '.join(PLUGIN_CALLS)}")
            opts["plugins"].append((n, p))
        elif a == "--out":
            opts["out"] = Path(next(it, ""))
        elif a == "--remap":
            opts["remap"] = True
        elif opts["nccl"] is None:
            opts["nccl"] = a
        else:
            sys.exit(__doc__)
    return opts


def main():
    opts = parse_args(sys.argv[1:])
    meanings = load_meanings(ROOT / "src/explain/meanings.txt")
    output = opts["out"]
    if opts["remap"]:
        remap(output, meanings)
        print(f"{output}: meanings re-assigned")
        return
    if not opts["nccl"] or not Path(opts["nccl"]).is_dir():
        sys.exit(__doc__)
    found, table = read_source(opts["nccl"], FIRST, NCCL_CALLS)
    table = [[k, a, b, lo, hi] for k, a, b, lo, hi in table]
    newest = extend_to_wheels(table, ".".join(map(str, found[-1][0])), opts["wheels"])
    read = [t for _, t in found] + [f"wheel:{v}" for v, _ in opts["wheels"]]
    for name, gitdir in opts["plugins"]:
        ptags, prows = read_source(gitdir, (0, 0, 0), PLUGIN_CALLS[name], name + "/")
        table += [[k, a, b, lo, hi] for k, a, b, lo, hi in prows]
        read += [f"{name}:{t}" for _, t in ptags]
    lines = [
        "# explain-log's meaning table: NCCL's (and its net plugins') WARN and failure-relevant INFO",
        "# messages by version, with the function and condition that print them and their meaning in",
        "# src/explain/meanings.txt. Generated by scripts/gen-nccl-messages.py; do not edit by hand.",
        "# read: " + " ".join(read),
        HEADER,
    ]
    for (kind, path, sev, func, cond, fmt), first, last, lo, hi in table:
        meaning = meaning_of(meanings, kind, path, fmt.split("\n")[0])
        lines.append("\t".join([kind, path, first, last, str(lo), str(hi), sev, meaning,
                                escape(func) or "-", escape(cond) or "-", escape(fmt)]))
    write(output, lines)
    print(f"{output}: {len(lines) - 5} rows; NCCL {found[0][1]} to {newest}; plugins: "
          f"{', '.join(n for n, _ in opts['plugins']) or 'none'}")


if __name__ == "__main__":
    main()
