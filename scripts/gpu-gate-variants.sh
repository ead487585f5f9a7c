#!/usr/bin/env bash
# `init --bench` of two builds side by side on one GPU machine (not part of CI; reads
# only): RUNS interleaved runs of each at every GPU and at 2, a pause between runs, then
# each as PID 1 of a new PID namespace with its own /proc (a container's entrypoint:
# its exit waits for the bench child's teardown), then one --trace run of each, and
# scripts/cuinit_beside.py. Usage: scripts/gpu-gate-variants.sh A B OUTDIR [RUNS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "$0")" && pwd)
a=$1 b=$2 out=$3 runs=${4:-7}
mkdir -p "$out"
# shellcheck source=scripts/gpu_timing.sh
. "$here/gpu_timing.sh"  # ms, median, smi_pair
initb() { "$@" init --bench --env-file "$out/.env"; }
pidns() { unshare --pid --fork --mount-proc --kill-child -- "$@"; }
{
  echo "A: $("$a" --version)"; echo "B: $("$b" --version)"
  initb "$a"; initb "$b"
  for gpus in all 2; do
    if [ "$gpus" = all ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=0,1; fi
    unset t; declare -A t
    for _ in $(seq "$runs"); do
      t[a]+="$(ms initb "$a") "; sleep 1
      t[b]+="$(ms initb "$b") "; sleep 1
      t[a_ns]+="$(ms initb pidns "$a") "; sleep 1
      t[b_ns]+="$(ms initb pidns "$b") "; sleep 1
    done
    echo "== $gpus GPUs: init --bench wall ms, $runs runs (median: all); _ns = PID 1 of a new PID namespace"
    for k in a b a_ns b_ns; do echo "$k: $(echo "${t[$k]}" | median): ${t[$k]}"; done
  done
  unset CUDA_VISIBLE_DEVICES
  echo "== one run as PID 1 of a new PID namespace: exit $(pidns "$a" init --bench --env-file "$out/.env" >/dev/null 2>&1; echo $?)"
} > "$out/variants.txt" 2>&1
sleep 1; "$a" init --bench --trace --env-file "$out/.env" >/dev/null 2> "$out/trace-a.txt"
sleep 1; "$b" init --bench --trace --env-file "$out/.env" >/dev/null 2> "$out/trace-b.txt"
sleep 1; python3 "$here/cuinit_beside.py" "$a" 4 > "$out/cuinit-beside.txt" 2>&1
rm -f "$out/.env"
