#!/usr/bin/env bash
# Runs on a machine with NVIDIA GPUs (not part of CI): compares the built
# binary's GPU matrices with nvidia-smi's and times it. Reads only; changes no
# GPU setting. Usage: scripts/gpu-acceptance.sh [BINARY] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-dist/nccl-preflight}"
out="${2:-${OUT:-.}}"
mkdir -p "$out"
nvidia-smi -L
"$bin" --version
"$bin" facts > "$out/facts.json"
python3 scripts/gpu_acceptance.py "$bin" "$out" | tee "$out/acceptance.txt"
