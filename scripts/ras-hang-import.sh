#!/usr/bin/env bash
# Turns what scripts/ras-hang-gpu.sh brought back into the captures the replay test reads
# (src/serve/ras/report.rs, `replay`): tests/data/ras/NAME/<situation>/ with the RAS reply
# at the report (reply.json), each rank's flight recorder dump (dumps/dump_<rank>), what
# each pod's sidecar said (job-node*.json, livez-node*.txt, metrics-node*.txt, serve logs),
# the timings (summary.json, timeline.txt) and the first 400 lines of the ranks' log. The
# FIFOs and the fake's files are left out.
# Usage: scripts/ras-hang-import.sh TARBALL NAME   (NAME: hang-h200x4-2.28.9, hang-dry)
set -euo pipefail
tarball=${1:?usage: ras-hang-import.sh TARBALL NAME}
name=${2:?usage: ras-hang-import.sh TARBALL NAME}
here=$(cd "$(dirname "$0")" && pwd)
dest=$here/../tests/data/ras/$name
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf "$tarball"
mkdir -p "$dest"
cp "$work/ras-hang/summary.txt" "$dest/"
[ -f "$work/ras-hang/gpus.txt" ] && cp "$work/ras-hang/gpus.txt" "$dest/"
for dir in "$work"/ras-hang/*/; do
    situation=$(basename "$dir")
    [ -f "$dir/summary.json" ] || continue
    mkdir -p "$dest/$situation/dumps"
    for f in reply.json summary.json timeline.txt fault.txt job-node*.json livez-node*.txt metrics-node*.txt serve-node*.log; do
        for g in "$dir"/$f; do [ -f "$g" ] && cp "$g" "$dest/$situation/"; done
    done
    for g in "$dir"/dumps/dump_*; do [ -f "$g" ] && cp "$g" "$dest/$situation/dumps/"; done
    [ -f "$dir/ranks.log" ] && head -400 "$dir/ranks.log" > "$dest/$situation/ranks.log"
done
echo "ras-hang-import: $dest"
ls -R "$dest" | head -60
