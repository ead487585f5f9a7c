#!/usr/bin/env python3
"""Generate src/nccl/variables.tsv: the environment variables each NCCL release reads.

Usage: scripts/gen-nccl-vars.py <path to an NVIDIA/nccl git dir> [output]
           [--binary VERSION=LIBNCCL ...]
(default output: src/nccl/variables.tsv next to this script's repo).

Releases whose source is not in the git dir yet (2.31, 2.32 on PyPI before their
tags reached the mirror) can be read from their binaries (--binary, e.g. the
libnccl.so.2 that scripts/nccl-wheels.sh caches): NCCL_PARAM builds each name as
one string literal ("NCCL_" env), and ncclGetEnv takes literals, so every name
NCCL reads is in the library's rodata. A binary of the newest source tag's version
is the baseline: names it holds that the source does not read (enum and macro
names, log text) are not variables. For a newer binary, a core variable of the
previous release is kept while the binary still holds its name (with its kind and
default), plugin variables (example plugins, not in libnccl) and value sets carry
over, and a name first seen in that binary is added as a `string` variable: its
kind and default are unknown, and a few of these may be constant names rather than
variables, which only means they are never called unknown.

For every release tag v2.X.Y-Z in the git dir, the script reads the tag's
sources with `git grep` and records:

  - NCCL_PARAM(Name, "ENV", default) macros: integer variables. NCCL reads them
    with strtoll(value, NULL, 0) (src/misc/param.cc), so their type is int64.
  - DEFINE_NCCL_PARAM(name, type, KEY, default, ...) (2.30's parameter registry,
    src/include/param/param.h): `bool` parameters (1/T/TRUE or 0/F/FALSE, any
    case; anything else leaves the default) and the rest as `string`.
  - string literals "NCCL_..." passed to a function whose name contains "env"
    (ncclGetEnv, getenv, getEnvFunc, ...) or to ncclGetLevel (paths.cc): the
    variables NCCL reads as text. NCCL_P2P_LEVEL and NCCL_NET_GDR_LEVEL (read
    through ncclGetLevel) are typed `level`, NCCL_ALGO and NCCL_PROTO
    `algo-list` and `proto-list`.
  - the value sets those types accept, taken from the same tag: ncclAlgoStr,
    ncclProtoStr (init.cc), topoPathTypeStr up to PATH_SYS (topo.cc, topo.h:
    ncclGetLevel compares the names up to PATH_SYS) and levelsOldToNew
    (paths.cc: what the legacy numbers 0..5 mean).

Files under src/ are NCCL itself (scope `core`); ext-*/ and plugins/ are the
example plugins NCCL ships (scope `plugin`). Python build scripts are skipped.

Consecutive tags that agree are merged into one row with the first and last
version seen, so the file stays small. The file is data for
src/nccl/catalog.rs; regenerate it rather than editing it.

Beside it the script writes src/nccl/readers.tsv: where each release reads each
variable, as `path:function` (the function around the read, from `git grep -p`):
for a string variable the function that calls ncclGetEnv/getenv with its name,
for an NCCL_PARAM (and, from 2.30, DEFINE_NCCL_PARAM) every function that calls
its ncclParam<Name>() accessor, and the file itself for DEFINE_NCCL_PARAM (whose
value the file's own code reads). A read whose value is stored into a C variable
named `*dump*` (NCCL_TOPO_DUMP_FILE in initTransportsRank) is marked
`path:function:dump`. Test code (paths with /test/) is left out. A release read
from its binary keeps the previous release's readers for the names it still
holds; a name first seen in a binary has none (where it is read is unknown).
src/nccl/roles.rs derives from these readers what a difference between pods can
change (the gang's consistency check).
"""

import re
import subprocess
import sys
from pathlib import Path

TAG = re.compile(r"^v(2)\.(\d+)\.(\d+)-\d+$")
PARAM = re.compile(r'NCCL_PARAM\(\s*\w+\s*,\s*"([A-Z0-9_]+)"\s*,\s*(.*)$')
# 2.30's parameter registry: DEFINE_NCCL_PARAM(name, type, KEY, default, flags, parser, desc).
REGISTRY = re.compile(r"DEFINE_NCCL_PARAM\(\s*\w+\s*,\s*([^,]+?)\s*,\s*(NCCL_[A-Z0-9_]+)\s*,\s*([^,]*)")
ENV_CALL = re.compile(r'\b(\w*(?:[Ee]nv|GetLevel)\w*)\s*\(([^;]*)')
LITERAL = re.compile(r'"(NCCL_[A-Z0-9_]+)"')
PATHSPECS = ["src", "ext-net", "ext-tuner", "ext-profiler", "plugins"]
# NCCL 2.30's parameter API: DEFINE_NCCL_PARAM(name, type, key, default, flags, parser, desc)
# (src/include/param/param.h), whose key is the variable's name, unquoted.
DEFINE_PARAM = re.compile(r"DEFINE_NCCL_PARAM\(\s*(\w+)\s*,\s*[^,]+,\s*(NCCL_[A-Z0-9_]+)\s*,")
PARAM_NAME = re.compile(r'NCCL_PARAM\(\s*(\w+)\s*,\s*"([A-Z0-9_]+)"')
ACCESSOR = re.compile(r"\b(ncclParam[A-Z]\w*)\s*\(")
DUMP_TARGET = re.compile(r'(\w*[Dd]ump\w*)\s*=\s*[^;]*"(NCCL_[A-Z0-9_]+)"')


def git(gitdir, *args):
    out = subprocess.run(
        ["git", "--git-dir", gitdir, *args],
        check=False,
        capture_output=True,
        text=True,
        errors="replace",
    )
    if out.returncode not in (0, 1):  # 1: git grep found nothing
        sys.exit(f"git {' '.join(args)} failed in {gitdir}: {out.stderr.strip()}")
    return out.stdout


def tags(gitdir):
    found = []
    for t in git(gitdir, "tag").split():
        m = TAG.match(t)
        if m:
            found.append((tuple(int(x) for x in m.groups()), t))
    if not found:
        sys.exit(f"{gitdir}: no NCCL release tags (v2.X.Y-Z) found")
    return sorted(found)


def scope_of(path):
    return "core" if path.startswith("src/") else "plugin"


def default_of(rest):
    """The third NCCL_PARAM argument: text up to the matching close paren."""
    depth = 0
    for i, c in enumerate(rest):
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                text = rest[:i].strip()
                return re.sub(r"\s+", " ", text) or "-"
            depth -= 1
    return "-"


def variables(gitdir, tag):
    """{(name, scope): (kind, default)} for one tag."""
    out = {}
    grep = git(gitdir, "grep", "-n", "-I", "-E", r"NCCL_PARAM\(|\"NCCL_[A-Z0-9_]+\"", tag, "--", *PATHSPECS)
    for line in grep.splitlines():
        # <tag>:<path>:<line>:<text>
        parts = line.split(":", 3)
        if len(parts) < 4:
            continue
        path, text = parts[1], parts[3]
        if path.endswith(".py") or path.endswith(".md"):
            continue
        scope = scope_of(path)
        r = REGISTRY.search(text)
        if r and "#define" not in text:
            # The registry's own parsers: bool takes 1/T/TRUE or 0/F/FALSE; the rest
            # (strict decimal integers, enums, bit sets, strings) are read as text here.
            kind = "bool" if r.group(1) == "bool" else "string"
            out[(r.group(2), scope)] = (kind, r.group(3).strip() or "-")
            continue
        m = PARAM.search(text)
        if m and "#define" not in text:
            name = "NCCL_" + m.group(1)
            out[(name, scope)] = ("int", default_of(m.group(2)))
            continue
        for call in ENV_CALL.finditer(text):
            func = call.group(1)
            if func in ("INFO", "WARN", "TRACE"):
                continue
            for lit in LITERAL.findall(call.group(2)):
                if func == "ncclGetLevel" or lit in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL"):
                    kind = "level"
                elif lit == "NCCL_ALGO":
                    kind = "algo-list"
                elif lit == "NCCL_PROTO":
                    kind = "proto-list"
                else:
                    kind = "string"
                key = (lit, scope)
                # An NCCL_PARAM of the same name wins: that is how NCCL parses it.
                if key not in out or out[key][0] == "string":
                    out[key] = (kind, "-")
    # NCCL_P2P_DISABLE is read by ncclGetLevel through a variable holding its
    # name; it appears as a literal argument, typed `level` above, but NCCL
    # parses it with strtol: an integer.
    for key in list(out):
        if key[0] == "NCCL_P2P_DISABLE" and out[key][0] == "level":
            out[key] = ("int", "-")
    return out


def function_of(header):
    """The function name in a `git grep -p` header line (`static int f(int a) {`)."""
    words = header.split("(")[0].split()
    return words[-1].lstrip("*&") if words else "-"


def readers(gitdir, tag, names):
    """{name: sorted readers} for one tag's variables `names` (see the docstring)."""
    grep = git(gitdir, "grep", "-n", "-p", "-I", "-E",
               r'NCCL_PARAM\(|"NCCL_[A-Z0-9_]+"|ncclParam[A-Z]\w*\(', tag, "--", *PATHSPECS)
    around, accessors, hits = {}, {}, []
    for line in grep.splitlines():
        # <tag>:<path>:<line>:<text> for a hit, <tag>:<path>=<line>=<text> for its function.
        m = re.match(r"^[^:]+:([^:=]+)([:=])\d+[:=](.*)$", line)
        if not m:
            continue
        path, sep, text = m.groups()
        if path.endswith((".py", ".md")) or "/test/" in path:
            continue
        if sep == "=":
            around[path] = function_of(text)
            continue
        p = PARAM_NAME.search(text)
        if p and "#define" not in text:
            accessors["ncclParam" + p.group(1)] = "NCCL_" + p.group(2)
            continue
        d = DEFINE_PARAM.search(text)
        if d and "#define" not in text:
            accessors[d.group(1)] = d.group(2)
            hits.append((path, "-", d.group(2)))
            continue
        hits.append((path, around.get(path, "-"), text))
    out = {}
    for path, func, text in hits:
        if func == "-" and text.startswith("NCCL_"):
            out.setdefault(text, set()).add(f"{path}:-")
            continue
        dumped = {m.group(2) for m in DUMP_TARGET.finditer(text)}
        for call in ENV_CALL.finditer(text):
            if call.group(1) in ("INFO", "WARN", "TRACE"):
                continue
            for lit in LITERAL.findall(call.group(2)):
                out.setdefault(lit, set()).add(f"{path}:{func}" + (":dump" if lit in dumped else ""))
        for acc in ACCESSOR.findall(text):
            if acc in accessors:
                out.setdefault(accessors[acc], set()).add(f"{path}:{func}")
    # A variable with no reader here is defined but not read (an NCCL_PARAM whose
    # accessor nobody calls): an empty reader list says so.
    return {n: ",".join(sorted(out.get(n, ()))) for n in set(names) | set(out)}


def c_string_array(source, name):
    m = re.search(re.escape(name) + r"\s*(?:\[[^\]]*\])?\s*=\s*\{([^}]*)\}", source, re.S)
    if not m:
        return None
    return re.findall(r'"([^"]*)"', m.group(1))


def show(gitdir, tag, path):
    return git(gitdir, "show", f"{tag}:{path}") if git(gitdir, "ls-tree", tag, path) else ""


def value_sets(gitdir, tag):
    """{set name: comma-joined values} for one tag."""
    sets = {}
    # The arrays moved between files over the years (tuning.cc in 2.5, init.cc later).
    init = show(gitdir, tag, "src/init.cc") + show(gitdir, tag, "src/graph/tuning.cc")
    for key, array in (("algo", "ncclAlgoStr"), ("proto", "ncclProtoStr")):
        vals = c_string_array(init, array)
        if vals:
            sets[key] = ",".join(vals)
    topo_cc = show(gitdir, tag, "src/graph/topo.cc")
    # PATH_* moved from graph/topo.h to include/graph.h in 2.30.
    topo_h = show(gitdir, tag, "src/graph/topo.h") + show(gitdir, tag, "src/include/graph.h")
    names = c_string_array(topo_cc, "topoPathTypeStr")
    defines = dict(re.findall(r"#define\s+(PATH_[A-Z0-9]+)\s+(\d+)", topo_h))
    if names and "PATH_SYS" in defines:
        sets["level"] = ",".join(names[: int(defines["PATH_SYS"]) + 1])
    paths = show(gitdir, tag, "src/graph/paths.cc")
    m = re.search(r"levelsOldToNew\[\]\s*=\s*\{([^}]*)\}", paths)
    if m:
        old = [sym[len("PATH_"):] for sym in re.findall(r"PATH_[A-Z0-9]+", m.group(1))]
        sets["old-level"] = ",".join(old)
    return sets


def ranges(per_tag, versions):
    """Merge {tag index: value} into [(first, last, value)] runs of consecutive tags."""
    rows = []
    for key in sorted({k for d in per_tag for k in d}):
        run = None
        for i, d in enumerate(per_tag):
            v = d.get(key)
            if run and v == run[2] and run[1] == i - 1:
                run[1] = i
                continue
            if run:
                rows.append((key, run[0], run[1], run[2]))
                run = None
            if v is not None:
                run = [i, i, v]
        if run:
            rows.append((key, run[0], run[1], run[2]))
    return [(k, versions[a], versions[b], v) for k, a, b, v in rows]


NAME_IN_BINARY = re.compile(rb"NCCL_[A-Z0-9_]*[A-Z0-9]")


def binary_names(path):
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    names = {m.decode() for m in NAME_IN_BINARY.findall(data)}
    if not names:
        sys.exit(f"{path}: no NCCL_ names: not a libnccl")
    return names


def binary_variables(names, previous, noise):
    """{(name, scope): (kind, default)} for a release read from its binary."""
    out = {k: v for k, v in previous.items() if k[1] == "plugin" or k[0] in names}
    known = {k[0] for k in previous}
    for name in sorted(names - known - noise):
        out[(name, "core")] = ("string", "-")
    return out


def parse_args(argv):
    positional, binaries = [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--binary" and i + 1 < len(argv):
            version, sep, path = argv[i + 1].partition("=")
            m = re.fullmatch(r"2\.(\d+)\.(\d+)", version)
            if not sep or not m:
                sys.exit(f"--binary {argv[i + 1]!r}: expected VERSION=PATH, e.g. 2.31.2=libnccl.so.2")
            binaries.append(((2, int(m.group(1)), int(m.group(2))), path))
            i += 2
        else:
            positional.append(argv[i])
            i += 1
    if len(positional) not in (1, 2):
        sys.exit(__doc__)
    return positional, sorted(binaries)


def main():
    positional, binaries = parse_args(sys.argv[1:])
    gitdir = positional[0]
    if not Path(gitdir).is_dir():
        sys.exit(f"{gitdir}: not a directory")
    output = Path(positional[1]) if len(positional) == 2 else Path(__file__).resolve().parent.parent / "src/nccl/variables.tsv"
    found = tags(gitdir)
    versions = [".".join(map(str, v)) for v, _ in found]
    per_tag_vars, per_tag_sets, per_tag_readers = [], [], []
    for _, tag in found:
        per_tag_vars.append(variables(gitdir, tag))
        per_tag_sets.append(value_sets(gitdir, tag))
        per_tag_readers.append(readers(gitdir, tag, {k[0] for k in per_tag_vars[-1]}))
    newest = found[-1][0]
    baseline = [p for v, p in binaries if v == newest]
    if not binaries:
        noise = set()
    elif baseline:
        noise = binary_names(baseline[0]) - {k[0] for k in per_tag_vars[-1]}
    else:
        sys.exit(f"--binary: give also the binary of {'.'.join(map(str, newest))}, the newest tag, as the baseline")
    read_binaries = []
    for v, path in binaries:
        if v <= newest:
            # The source of that release is read; its binary is only the baseline.
            continue
        names = binary_names(path)
        per_tag_vars.append(binary_variables(names, per_tag_vars[-1], noise))
        per_tag_sets.append(dict(per_tag_sets[-1]))
        # The names the binary holds (DEFINE_NCCL_PARAM ones included), and the example
        # plugins' variables, which carry over.
        kept = names | {k[0] for k in per_tag_vars[-1]}
        per_tag_readers.append({n: r for n, r in per_tag_readers[-1].items() if n in kept})
        versions.append(".".join(map(str, v)))
        read_binaries.append(f"v{versions[-1]}-binary")
    lines = [
        "# NCCL environment variables by version. Generated by scripts/gen-nccl-vars.py",
        "# from NVIDIA/nccl's release tags (and release binaries past them); do not edit by hand.",
        "# tags read: " + " ".join([t for _, t in found] + read_binaries),
        "# var<TAB>name<TAB>scope<TAB>kind<TAB>first<TAB>last<TAB>default",
        "# values<TAB>set<TAB>first<TAB>last<TAB>comma-separated values",
    ]
    for (name, scope), first, last, (kind, default) in ranges(per_tag_vars, versions):
        lines.append("\t".join(["var", name, scope, kind, first, last, default.replace("\t", " ")]))
    for key, first, last, vals in ranges(per_tag_sets, versions):
        lines.append("\t".join(["values", key, first, last, vals]))
    tmp = output.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(output)
    print(f"{output}: {len(lines) - 5} rows from {len(found)} tags ({versions[0]} to {versions[-1]})")
    write_readers(output.with_name("readers.tsv"), lines[2], ranges(per_tag_readers, versions))


def write_readers(path, tags_line, rows):
    lines = [
        "# Where each NCCL release reads each variable. Generated by scripts/gen-nccl-vars.py",
        "# with variables.tsv (its docstring says how); do not edit by hand.",
        tags_line,
        "# read<TAB>name<TAB>first<TAB>last<TAB>comma-separated path:function[:dump] (empty: defined, never read)",
    ]
    for name, first, last, found in rows:
        lines.append("\t".join(["read", name, first, last, found]))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    print(f"{path}: {len(lines) - 4} rows")


if __name__ == "__main__":
    main()
