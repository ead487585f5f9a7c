#!/usr/bin/env bash
# The hang report on real GPUs (docs/job-watch.md, "The hang report"), not part of CI.
# Reads only; changes no GPU setting. On one host with 4 GPUs (4x H200, driver 580,
# PyTorch 2.11 with NCCL 2.28.9 at /opt/torch/.venv), a torch job per situation
# (scripts/ras_hang.py: ranks calling different collectives, a rank sleeping in Python,
# SIGSTOP, kill -9, a 4-process job across two network namespaces) under `serve
# --watch-nccl --hang-after 10s --watch-interval 1s --flight-recorder DIR` with the
# trainer in the environment `init --flight-recorder DIR` tunes; each situation's time
# from the fault to the full report (target 20 s) and the report. Two jobs at a time,
# three waves, within 6 minutes (each wave at most 100 s). All results in ONE tarball,
# OUTDIR/ras-hang.tar.gz (summary.txt first).
# Usage: scripts/ras-hang-gpu.sh [--dry] [--tools DIR] [--only NAME,...] BINARY [OUTDIR]
#   --dry      no torch, no GPU: fake ranks (scripts/fr_dump.py) and a fake RAS port
#              (scripts/ras_fake.py); runs here, as root (network namespaces)
#   --tools    ip with its libraries, from scripts/gang-gpu.sh --pack-tools DIR (the GPU
#              machine has no iproute2)
# On the lent machine (kind nvidia-h200-x4): carry the binary and scripts/ and the tools:
#   d=.carry-hang; mkdir -p $d && cp target/release/nccl-preflight $d/ && cp scripts/ras-hang-gpu.sh \
#     scripts/ras_hang.py scripts/ras_hang_train.py scripts/ras_fake.py scripts/fr_dump.py \
#     scripts/ras_record.py $d/ && scripts/gang-gpu.sh --pack-tools $d/tools
#   bash $d/ras-hang-gpu.sh --tools $d/tools $d/nccl-preflight "$OUT"
# Exit 0 when every situation's report came within the target, 1 otherwise, 2 on a setup error.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
args=()
py=${PYTHON:-}
while [ $# -gt 0 ]; do
    case $1 in
        --dry) args+=(--dry) ;;
        --tools) args+=(--tools "$(cd "${2:?}" && pwd)"); shift ;;
        --only) args+=(--only "${2:?}"); shift ;;
        *) break ;;
    esac
    shift
done
bin=${1:?usage: ras-hang-gpu.sh [--dry] [--tools DIR] BINARY [OUTDIR]}
out=${2:-${OUT:-ras-hang-out}}
[ -x "$bin" ] || { echo "ras-hang-gpu: $bin is not executable" >&2; exit 2; }
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
if [ -z "$py" ]; then
    if [ -x /opt/torch/.venv/bin/python ]; then py=/opt/torch/.venv/bin/python; else py=python3; fi
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=$(mktemp -d /tmp/ras-hang.XXXXXX)
nvidia-smi -L > "$work/gpus.txt" 2>&1
timeout 370 "$py" "$here/ras_hang.py" run "$work/ras-hang" "$bin" --python "$py" "${args[@]}"
rc=$?
cp "$work/gpus.txt" "$work/ras-hang/" 2>/dev/null
tar -C "$work" -czf "$out/ras-hang.tar.gz" ras-hang
echo "ras-hang-gpu: $out/ras-hang.tar.gz ($(du -h "$out/ras-hang.tar.gz" | cut -f1)), exit $rc"
rm -rf "$work"
exit "$rc"
