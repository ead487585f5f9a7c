#!/usr/bin/env python3
"""Turn scripts/gpu-nccl-truth.sh's tarball into the capture tests/integration/nccl_truth.rs replays.

Usage: scripts/nccl-truth-import.py TARBALL DEST   (DEST e.g. tests/data/h200x4/nccl-truth)

DEST gets manifest.json, summary.tsv (expected, predicted at capture time, observed) and
rows/<id>/ for every row that ran: row.txt (the table's line), row.env (the variables
the ranks and the tool had), facts.json (what `facts` gathered in rank 0's situation,
compact JSON), rank<r>.json (each rank's step results) and rank<r>.log holding only the
NCCL lines the replay reads (`via` channel lines, `Bootstrap`, `NET/`, `WARN`, the
version line and init's end) plus the last 40 lines. Skipped rows are listed in
skipped.txt. DEST is replaced as a whole; nothing is written until the tarball has been
read and checked (every row has row.txt, facts.json and its ranks' JSON).
"""

import io
import json
import os
import re
import shutil
import sys
import tarfile

KEEP = re.compile(r" via |Bootstrap|NET/|WARN|NCCL version|Init COMPLETE|initialization|error", re.I)


def members(tar):
    out = {}
    for m in tar.getmembers():
        if m.isfile():
            out[m.name.lstrip("./")] = tar.extractfile(m).read()
    return out


def trim_log(text):
    lines = text.splitlines()
    kept = [l for l in lines if KEEP.search(l)]
    tail = [l for l in lines[-40:] if l not in kept]
    return "\n".join(kept + tail) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: nccl-truth-import.py TARBALL DEST")
    tarball, dest = sys.argv[1], sys.argv[2]
    try:
        with tarfile.open(tarball) as tar:
            files = members(tar)
    except (OSError, tarfile.TarError) as e:
        sys.exit(f"{tarball}: not a readable tarball: {e}")
    for need in ("manifest.json", "rows.tsv", "summary.tsv"):
        if need not in files:
            sys.exit(f"{tarball}: no {need} (not a gpu-nccl-truth.sh result)")
    rows, skipped = {}, []
    for line in files["rows.tsv"].decode().splitlines():
        rid = line.split("|")[0]
        prefix = f"rows/{rid}/"
        if prefix + "skipped" in files:
            skipped.append(f"{rid}\t{files[prefix + 'skipped'].decode().strip()}")
            continue
        nranks = int(line.split("|")[1])
        need = ["row.txt", "row.env", "facts.json"] + [f"rank{r}.json" for r in range(nranks)]
        missing = [n for n in need if prefix + n not in files]
        if missing:
            skipped.append(f"{rid}\tincomplete: no {', '.join(missing)}")
            continue
        out = {n: files[prefix + n] for n in ("row.txt", "row.env")}
        facts = json.loads(files[prefix + "facts.json"])
        out["facts.json"] = (json.dumps(facts, separators=(",", ":"), sort_keys=True) + "\n").encode()
        for r in range(nranks):
            out[f"rank{r}.json"] = files[prefix + f"rank{r}.json"]
            log = files.get(prefix + f"rank{r}.log", b"").decode(errors="replace")
            out[f"rank{r}.log"] = trim_log(log).encode()
        rows[rid] = out
    if not rows:
        sys.exit(f"{tarball}: no row ran to the end")
    tmp = dest.rstrip("/") + ".importing"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "rows"))
    for name in ("manifest.json", "summary.tsv", "rows.tsv"):
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(files[name])
    with open(os.path.join(tmp, "skipped.txt"), "w") as f:
        f.write("".join(s + "\n" for s in skipped))
    for rid, out in rows.items():
        os.makedirs(os.path.join(tmp, "rows", rid))
        for name, data in out.items():
            with open(os.path.join(tmp, "rows", rid, name), "wb") as f:
                f.write(data)
    keep = os.path.join(dest, "disagreements.tsv")
    if os.path.exists(keep):
        shutil.copy(keep, os.path.join(tmp, "disagreements.tsv"))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    print(f"{dest}: {len(rows)} rows, {len(skipped)} skipped")


if __name__ == "__main__":
    main()
