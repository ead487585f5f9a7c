#!/usr/bin/env bash
# GPU acceptance of `serve --watch-nccl` across two "nodes", not part of CI: RAS spans
# hosts. Two processes in their own mount + UTS + network namespaces (hostnames node0
# and node1, a veth pair named eth0 on both sides, /32 addresses 10.10.0.1 and
# 10.10.1.1), built as scripts/gang-gpu.sh builds them; two ranks of a 4-rank PyTorch
# job (scripts/ras_allreduce.py) in each, on GPUs --gpus (default 0,1 on both nodes:
# NCCL sees two hosts by hostname and uses NET/Socket between them). `serve
# --watch-nccl` runs in node0's network namespace, as a sidecar in node0's pod would.
# Steps: healthy with 4 ranks on 2 hosts; kill -STOP rank 3 (on node1): /job names the
# hung communicator with rank 3's pid and node1's address, /job/livez 503, within
# --hang-after + --watch-interval (+ 5 s); kill -CONT: healthy again.
# Usage: scripts/ras-gpu-nodes.sh --tools DIR BINARY [OUTDIR]
#   (DIR: ip with its libraries, from scripts/gang-gpu.sh --pack-tools DIR)
#   (ras_harness.sh and the ras_*.py helpers beside it, as for scripts/ras-gpu.sh)
# Results: OUTDIR/nodes-summary.txt, nodes-timeline.txt, nodes-replies.tar.gz (the RAS
# replies seen from node0), nodes-ranks.log. Exit 0 when every step passed.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
tools=
gpus=0,1,0,1
pos=()
while [ $# -gt 0 ]; do
    case $1 in
        --tools) tools=$(cd "${2:?}" && pwd); shift ;;
        --gpus) gpus=${2:?}; shift ;;
        *) pos+=("$1") ;;
    esac
    shift
done
bin=$(cd "$(dirname "${pos[0]:?usage: ras-gpu-nodes.sh --tools DIR BINARY [OUTDIR]}")" && pwd)/$(basename "${pos[0]}")
out=${pos[1]:-${OUT:-ras-gpu-out}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
IFS=, read -r -a gpu <<< "$gpus"
# shellcheck source=scripts/ras_harness.sh
. "$here/ras_harness.sh"
ras_harness nodes nodes-
IP() { if [ -n "$tools" ]; then LD_LIBRARY_PATH="$tools/lib" "$tools/ip" "$@"; else ip "$@"; fi; }

# The two nodes (as scripts/gang-gpu.sh): a holder process per node keeps its namespaces.
printf '127.0.0.1 localhost\n10.10.0.1 node0\n10.10.1.1 node1\n' > "$work/hosts"
declare -a holder
for i in 0 1; do
    unshare --mount --uts --net --propagation private sleep 86400 &
    holder[$i]=$!; pids+=($!)
done
sleep 0.5
inns() { local i=$1; shift; nsenter -t "${holder[$i]}" -m -u -n -- "$@"; }
IPn() { local i=$1; shift; nsenter -t "${holder[$i]}" -n -- env LD_LIBRARY_PATH="${tools:+$tools/lib}" "${tools:+$tools/}ip" "$@"; }
IP link add rv0 type veth peer name rv1 || { echo "no veth" >&2; exit 2; }
IP link set rv0 netns "${holder[0]}"
IP link set rv1 netns "${holder[1]}"
for i in 0 1; do
    j=$((1 - i))
    inns "$i" sh -c "echo node$i > /proc/sys/kernel/hostname && mount --bind '$work/hosts' /etc/hosts"
    IPn "$i" link set lo up
    IPn "$i" link set "rv$i" name eth0
    IPn "$i" addr add "10.10.$i.1/32" dev eth0
    IPn "$i" link set eth0 up
    IPn "$i" route add "10.10.$j.1/32" dev eth0
    IPn "$i" route add default dev eth0
done
note "ras-gpu-nodes: $(date -u +%FT%TZ), 4 ranks on node0/node1, GPUs ${gpus}, --hang-after ${hang_after}s, --watch-interval ${interval}s"

inns 0 "$bin" serve --listen 127.0.0.1:9464 --interval 10m --watch-nccl \
    --watch-interval "${interval}s" --hang-after "${hang_after}s" 2> "$out/nodes-serve.log" &
pids+=($!)
declare -a rank
for r in 0 1 2 3; do
    i=$((r / 2))
    inns "$i" env RANK=$r WORLD_SIZE=4 MASTER_ADDR=10.10.0.1 MASTER_PORT=29518 \
        CUDA_VISIBLE_DEVICES="${gpu[$r]}" NCCL_SOCKET_IFNAME=eth0 NCCL_NVLS_ENABLE=0 \
        TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 LOCAL_RANK=0 \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,RAS PYTHONUNBUFFERED=1 \
        "$py" "$here/ras_allreduce.py" > "$work/rank$r.log" 2>&1 &
    pids+=($!)
done
probe() { inns 0 "$py" "$here/ras_probe.py" "$@"; }
record() { inns 0 "$py" "$here/ras_record.py" json "$work/replies/$1.json" >> "$work/replies/index.txt" 2>&1; }
probe timeline "$out/nodes-timeline.txt" &
pids+=($!)
for _ in $(seq 240); do
    [ "$(grep -l " start" "$work"/rank*.log 2>/dev/null | wc -l)" = 4 ] && break
    sleep 0.5
done
for r in 0 1 2 3; do
    rank[$r]=$(sed -n 's/^rank [0-9]* pid \([0-9]*\) start.*/\1/p' "$work/rank$r.log")
done
note "rank pids: ${rank[*]}"
for _ in $(seq 120); do
    probe get /job | grep -q '"ranks": 4' && break
    sleep 0.5
done
if line=$(probe wait healthy 30) && probe get /job | grep -q '"ranks": 4'; then
    pass "healthy with 4 ranks: $line"
else
    fail "healthy with 4 ranks: $line"
fi
record healthy
kill -STOP "${rank[3]}"
stop_step "stop rank 3 on node1" "rank 3" "${rank[3]}" "pid ${rank[3]} on 10.10.1.1" " from node0"
record stopped-hung
kill -CONT "${rank[3]}"
cont_step
exit $failed
