#!/usr/bin/env bash
# GPU acceptance of `nccl-preflight gang` (docs/gang.md, "Multi-node: gang") on one host
# with two GPUs (nvidia-h200-x2), not part of CI. Reads only; changes no GPU setting.
#
# Two "nodes" = two processes in their own mount + UTS + network namespaces
# (hostnames node0 and node1, each its own /etc/hosts), one GPU each through
# CUDA_VISIBLE_DEVICES, joined by a veth pair named eth0 on both sides. The
# addresses are /32 with explicit routes, as pod networks give (research notes,
# NVIDIA/nccl v2.28.9-1 src/bootstrap.cc bootstrapNetInit: NCCL_COMM_ID makes a rank
# look for a local interface in the root's subnet; a shared /24 would hide that).
# Different hostnames give NCCL different host hashes, so it sees two nodes and
# uses NET/Socket across the veth.
#
# Legs (--legs, comma list, default all):
#   p  plumbing: hostnames, name resolution and TCP across the veth, a tc rate limit
#   a  gang joins, consistency passes, bandwidth and transport reported
#   b  NCCL_ALGO differs on one rank: gang-consistency fails
#   c  the second rank never starts, and (as in a PyTorchJob or MPIJob, whose Services
#      publish Ready pods only) its name does not resolve: rank 0 fails within
#      --gang-wait + --gang-timeout naming it
#   d  tc tbf rate limit on node1's side: low bandwidth / node1 named
#   e  PyTorch all-reduce under torchrun --nnodes 2 (one process per namespace),
#      same sizes as the gang, for the busbw comparison (scripts/gang_allreduce.py)
#
# With --pods N (N > 2): N "pods" on a Linux bridge instead (a veth per pod into a
# bridge in a switch namespace, /32 addresses and routes, PyTorchJob identity:
# hostnames job-master-0, job-worker-0.., MASTER_ADDR=job-master-0, MASTER_PORT=29500,
# PET_NNODES, PET_NODE_RANK), GPU i x GPUs / N for pod i (two pods per GPU on a
# 2-GPU machine), and these legs (default all; each judged by
# scripts/gang_pods_judge.py, one row per leg: rank 0's and rank 1's verdict, wall):
#   A  healthy: every pod passes
#   V  pod 1 loads the system libnccl (ldconfig's), the others the PyTorch wheel's
#      (in --dry: the fake reporting 2.28.3 whose bootstrap never completes)
#   L  pod 1's own checks fail (NCCL_SOCKET_IFNAME=eth9)
#   M  pod N-1 never starts (its name resolves)
#   P  pod 2 takes TCP connections on the gang port only (tc u32 drops other SYNs):
#      the rendezvous works, NCCL's ephemeral ports do not
#   S  pod 2's link at 1 Gbit/s (tbf both ends), the gang's default settings
#   D  pod 1 sets NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL: a note, every pod passes
#   G  pod 1 sees two GPUs (CUDA_VISIBLE_DEVICES=1,2) where the others see one: pod 1
#      is named, exit 1 on every pod
#   K  pod 2's nccl-preflight is killed (SIGKILL) 3 s after its NCCL worker started,
#      50 iterations (--dry: by the fake libnccl at its 11th communication call): every
#      other pod names it gone, with the stage and the time, exit 3
#   I  256 idle connections on the gang port (python3 in the switch namespace) before
#      the pods arrive: every pod passes
# Wall time on 4x H200 (--pods 4, every leg): about 3 minutes (M and P wait out
# --gang-timeout 30 s each; A, D, I and S measure 64 and 256 MiB). --within SECONDS
# (default 420) bounds the --pods legs together: a leg starts only while
# --gang-wait + --gang-timeout seconds are left, its ranks are killed when the
# bound runs out, and a leg left out says so (SKIP) in the summary.
#
# Usage:
#   scripts/gang-gpu.sh [--dry] [--legs LIST] [--tools DIR] [--gpus I,J] [--pods N]
#                       [--within SECONDS] [BINARY] [OUTDIR]
#   scripts/gang-gpu.sh --pack-tools DIR
# BINARY defaults to dist/nccl-preflight, OUTDIR to $OUT or ./gang-gpu-out.
# --dry runs here without a GPU: the fake libcuda, NVML and gang libnccl
# (tests/fakes, built with cc) stand in for the vendor libraries, leg e is skipped.
# --tools DIR: ip and tc carried with their libraries (made by --pack-tools on a
# machine with iproute2; the GPU machine's Ubuntu 24.04 image has none); they run
# with LD_LIBRARY_PATH=DIR/lib and the host's own glibc.
# --gpus I,J: the GPU of node0 and of node1 (default 0,1). `--gpus 0,0` runs both
# nodes on one GPU (a one-GPU machine proves the namespaces, veth, tc and torchrun;
# NCCL still sees two hosts, by hostname, and uses NET/Socket).
# On the lent machine (nothing there can be fetched, iproute2 is missing), from the
# repository root here:
#   scripts/release.sh                                  # dist/nccl-preflight, glibc 2.17
#   d=target/gang-gpu; mkdir -p $d && cp dist/nccl-preflight scripts/gang-gpu.sh \
#     scripts/gang-gpu-pods.sh scripts/gang_pods_judge.py scripts/gang_allreduce.py \
#     scripts/gang_gpu_judge.py $d && scripts/gang-gpu.sh --pack-tools $d/tools
# then run there (kind nvidia-h200-x2, carry target/gang-gpu):
#   bash target/gang-gpu/gang-gpu.sh --tools target/gang-gpu/tools target/gang-gpu/nccl-preflight "$OUT"
# or with four pods (kind nvidia-h200-x4, carry target/gang-gpu, about 3 minutes):
#   bash target/gang-gpu/gang-gpu.sh --pods 4 --tools target/gang-gpu/tools target/gang-gpu/nccl-preflight "$OUT"
# Results: OUTDIR/summary.txt (one line per leg: PASS/FAIL and the numbers) and
# OUTDIR/gang-gpu.tar.gz (every rank's report, stderr, NCCL log, and summary.txt). Exit 0 when every
# leg run passed, 1 otherwise, 2 on a setup error.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

die() { echo "gang-gpu: $*" >&2; exit 2; }

# Copies ip and tc with the shared libraries ldd lists, glibc's own excepted (the
# target's newer glibc serves them: glibc keeps old symbol versions), and prints
# the newest GLIBC_ symbol version they need.
pack_tools() {
    local dest=$1
    mkdir -p "$dest/lib"
    local bin lib
    for bin in ip tc; do
        bin=$(command -v "$bin") || die "$bin not found here (apt-get install iproute2)"
        cp -L "$bin" "$dest/"
        for lib in $(ldd "$bin" | awk '/=> \//{print $3}'); do
            case $(basename "$lib") in
                libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) ;;
                *) cp -L "$lib" "$dest/lib/" ;;
            esac
        done
    done
    # iptables (nf_tables), for --pods leg P where tc cannot drop: the multi-call
    # binary named iptables, its libraries and its extensions (XTABLES_LIBDIR).
    local multi
    if multi=$(readlink -f "$(command -v iptables)" 2>/dev/null) && [ -x "$multi" ]; then
        cp -L "$multi" "$dest/iptables"
        for lib in $(ldd "$multi" | awk '/=> \//{print $3}'); do
            case $(basename "$lib") in
                libc.so.*|ld-linux*) ;;
                *) cp -L "$lib" "$dest/lib/" ;;
            esac
        done
        cp -rL /usr/lib/x86_64-linux-gnu/xtables "$dest/xtables" 2>/dev/null || true
    fi
    local newest
    newest=$(for f in "$dest"/ip "$dest"/tc "$dest"/lib/*; do
        objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'
    done | sort -uV | tail -1)
    echo "packed ip, tc and $(ls "$dest/lib" | wc -l) libraries into $dest; newest glibc symbol: $newest"
}

dry=0
legs=
tools=
gpus=0,1
pods=2
within=420
pos=()
while [ $# -gt 0 ]; do
    case $1 in
        --dry) dry=1 ;;
        --legs) legs=${2:?--legs needs a list}; shift ;;
        --tools) tools=${2:?--tools needs a directory}; shift ;;
        --gpus) gpus=${2:?--gpus needs I,J}; shift ;;
        --pods) pods=${2:?--pods needs a count}; shift ;;
        --within) within=${2:?--within needs seconds}; shift ;;
        --pack-tools) pack_tools "${2:?--pack-tools needs a directory}"; exit 0 ;;
        -h|--help) sed -n '2,78p' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) pos+=("$1") ;;
    esac
    shift
done
bin=${pos[0]:-dist/nccl-preflight}
out=${pos[1]:-${OUT:-gang-gpu-out}}
[[ $pods =~ ^[0-9]+$ ]] && [ "$pods" -ge 2 ] && [ "$pods" -le 16 ] || die "--pods takes 2 to 16: $pods"
if [ "$pods" = 2 ]; then
    legs=${legs:-p,a,b,c,d,e}
    case ,$legs, in *[!,pabcde]*) die "--legs takes letters of p,a,b,c,d,e: $legs" ;; esac
else
    legs=${legs:-A,V,L,M,P,S,D,G,K,I}
    case ,$legs, in *[!,AVLMPSDGKI]*) die "--legs with --pods takes letters of A,V,L,M,P,S,D,G,K,I: $legs" ;; esac
fi
[[ $within =~ ^[0-9]+$ ]] && [ "$within" -ge 30 ] || die "--within takes seconds, 30 or more: $within"
[[ $gpus =~ ^[0-9]+,[0-9]+$ ]] || die "--gpus takes two GPU indices, I,J: $gpus"
gpu=("${gpus%,*}" "${gpus#*,}")
has_leg() { case ,$legs, in *,$1,*) return 0 ;; esac; return 1; }
[ "$(id -u)" = 0 ] || die "needs root (namespaces, veth, tc)"
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
if has_leg a || has_leg b || has_leg c || has_leg d || [ "$pods" -gt 2 ]; then
    [ -x "$bin" ] || die "$bin is not an executable nccl-preflight"
    bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
fi

# ip and tc: the carried ones when given, else the host's.
if [ -n "$tools" ]; then
    tools=$(cd "$tools" && pwd) || die "--tools $tools: no such directory"
    IP() { LD_LIBRARY_PATH="$tools/lib" "$tools/ip" "$@"; }
    TC() { LD_LIBRARY_PATH="$tools/lib" "$tools/tc" "$@"; }
else
    command -v ip >/dev/null || die "no ip here: pass --tools DIR (see --pack-tools)"
    IP() { command ip "$@"; }
    TC() { command tc "$@"; }
fi

work=$(mktemp -d /tmp/gang-gpu.XXXXXX)
summary=$out/summary.txt
: > "$summary"
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    cp "$summary" "$work/" 2>/dev/null || true
    tar -C "$work" -czf "$out/gang-gpu.tar.gz" . 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
note() { echo "$*" | tee -a "$summary"; }

note "gang-gpu: legs $legs, dry=$dry, $(date -u +%FT%TZ)"
note "ip: $(IP -V 2>&1 | head -1)"
note "tc: $(TC -V 2>&1 | head -1)"
note "glibc: $(ldd --version 2>&1 | head -1)"

# The vendor libraries: the real ones, or in --dry the fakes built from tests/fakes.
node_env=(NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1)
if [ $dry = 1 ]; then
    command -v cc >/dev/null || die "--dry builds the fake libraries with cc"
    fakes=$work/fakes
    mkdir -p "$fakes"
    cc -shared -fPIC -O1 -o "$fakes/libcuda.so.1" "$root/tests/fakes/fake_cuda.c" -lpthread
    cc -shared -fPIC -O1 -o "$fakes/libnvidia-ml.so.1" "$root/tests/fakes/fake_nvml.c" -lpthread
    cc -shared -fPIC -O1 -o "$fakes/libnccl.so.2" "$root/tests/fakes/fake_nccl_gang.c" -lpthread
    node_env+=(NCCL_PREFLIGHT_CUDA_LIB="$fakes/libcuda.so.1"
        NCCL_PREFLIGHT_NVML_LIB="$fakes/libnvidia-ml.so.1"
        NCCL_PREFLIGHT_NCCL_LIB="$fakes/libnccl.so.2"
        FAKE_GPU_SCENARIO="$root/tests/fixtures/gpu-h100-nv18/gpu.scenario")
    sizes=${GANG_SIZES:-1MiB,4MiB}
    timeout_s=${GANG_TIMEOUT:-10}
    wait_s=${GANG_WAIT:-5}
    iters=${GANG_ITERS:-5}
    # The fake libnccl's all-reduce of 1-4 MiB over the veth runs at 0.05-0.25 GB/s
    # here (0.4-2 Gbit/s, lower on a loaded machine): 20 Mbit/s is far below.
    rate=20mbit
else
    command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$summary"
    sizes=${GANG_SIZES:-64MiB,256MiB}
    timeout_s=${GANG_TIMEOUT:-30}
    wait_s=${GANG_WAIT:-20}
    iters=${GANG_ITERS:-20}
    # NET/Socket over the veth carried 3.4 GB/s busbw on 2x H200 and 0.1 under 1 Gbit/s (FACTS.md).
    rate=1gbit
fi
note "sizes: $sizes, $iters iterations, --gang-wait $wait_s, --gang-timeout $timeout_s, tc rate $rate, GPUs: node0 ${gpu[0]}, node1 ${gpu[1]}"

if [ "$pods" -gt 2 ]; then
    # shellcheck source=scripts/gang-gpu-pods.sh
    . "$here/gang-gpu-pods.sh"
    run_pods
    note "gang-gpu: $( [ $result = 0 ] && echo all legs run passed || echo some legs failed )${skipped:+; left out for time:$skipped}"
    exit $result
fi

# --- the two nodes -------------------------------------------------------------
# Node i: a process holding new mount, UTS and network namespaces; hostname nodeI,
# address 10.10.I.1/32 on eth0, a /32 route to the other node and a default route.
hosts_all() { printf '127.0.0.1 localhost\n10.10.0.1 node0\n10.10.1.1 node1\n'; }
hosts_all > "$work/hosts0"
hosts_all > "$work/hosts1"
declare -a holder
for i in 0 1; do
    unshare --mount --uts --net --propagation private sleep 86400 &
    holder[$i]=$!
    pids+=($!)
done
for i in 0 1; do
    for _ in $(seq 50); do
        [ "$(readlink "/proc/${holder[$i]}/ns/net")" != "$(readlink /proc/self/ns/net)" ] && break
        sleep 0.1
    done
    [ "$(readlink "/proc/${holder[$i]}/ns/net")" != "$(readlink /proc/self/ns/net)" ] \
        || die "node$i: no network namespace after 5 s"
done
# Runs a command in node I's namespaces (ip/tc through the functions above).
inns() { local i=$1; shift; nsenter -t "${holder[$i]}" -m -u -n -- "$@"; }
in_net() { local i=$1; shift; nsenter -t "${holder[$i]}" -n -- "$@"; }
IPn() { local i=$1; shift; if [ -n "$tools" ]; then in_net "$i" env LD_LIBRARY_PATH="$tools/lib" "$tools/ip" "$@"; else in_net "$i" ip "$@"; fi; }
TCn() { local i=$1; shift; if [ -n "$tools" ]; then in_net "$i" env LD_LIBRARY_PATH="$tools/lib" "$tools/tc" "$@"; else in_net "$i" tc "$@"; fi; }

IP link add gv0 type veth peer name gv1
IP link set gv0 netns "${holder[0]}"
IP link set gv1 netns "${holder[1]}"
for i in 0 1; do
    j=$((1 - i))
    inns "$i" sh -c "echo node$i > /proc/sys/kernel/hostname && mount --bind '$work/hosts$i' /etc/hosts"
    IPn "$i" link set lo up
    IPn "$i" link set "gv$i" name eth0
    IPn "$i" addr add "10.10.$i.1/32" dev eth0
    IPn "$i" link set eth0 up
    IPn "$i" route add "10.10.$j.1/32" dev eth0
    IPn "$i" route add default dev eth0
done
IPn 0 -brief addr > "$work/node0-addr.txt"
IPn 1 -brief addr > "$work/node1-addr.txt"

# Runs node I's command in the background, bounded by LIMIT seconds: its stdout,
# stderr and exit code go under DIR, its pid onto `waits`.
waits=()
start_rank() {
    local i=$1 dir=$2 limit=$3; shift 3
    ( set +e
      inns "$i" env "${node_env[@]}" CUDA_VISIBLE_DEVICES="${gpu[$i]}" timeout -k 5 "$limit" "$@" \
          > "$dir/rank$i.out" 2> "$dir/rank$i.err"
      echo $? > "$dir/rank$i.rc" ) &
    waits+=($!)
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }
result=0
pass() { note "PASS $*"; }
fail() { note "FAIL $*"; result=1; }

# --- p: plumbing -----------------------------------------------------------------
if has_leg p; then
    d=$work/p; mkdir -p "$d"
    h0=$(inns 0 cat /proc/sys/kernel/hostname); h1=$(inns 1 cat /proc/sys/kernel/hostname)
    # Bytes node1 sends to node0 in 2 s, by name over the veth (python3's sockets).
    probe() {
        inns 0 python3 -c '
import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.10.0.1", 29400)); s.listen(1); s.settimeout(10)
c,_=s.accept(); c.settimeout(10); n=0
while True:
    b=c.recv(1<<20)
    if not b: break
    n+=len(b)
print(n)' > "$d/recv-$1.txt" &
        local listener=$!
        sleep 0.5
        inns 1 python3 -c '
import socket,time
for _ in range(50):
    try:
        s=socket.create_connection(("node0", 29400), timeout=5); break
    except OSError: time.sleep(0.1)
end=time.monotonic()+2; buf=b"x"*(1<<16)
while time.monotonic()<end: s.sendall(buf)
s.close()' 2> "$d/send-$1.err"
        wait "$listener"
        awk '{printf "%.3f", $1*8/2/1e9}' "$d/recv-$1.txt"
    }
    free=$(probe free)
    TCn 1 qdisc add dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
    TCn 1 qdisc show dev eth0 > "$d/qdisc.txt"
    limited=$(probe limited)
    TCn 1 qdisc del dev eth0 root
    cap=$(awk -v r="${rate%bit}" 'BEGIN{u=substr(r,length(r)); n=r+0; print (u=="g" ? n : n/1000) * 1.5}')
    if [ "$h0" = node0 ] && [ "$h1" = node1 ] && grep -q tbf "$d/qdisc.txt" \
        && awk -v f="$free" -v l="$limited" -v c="$cap" 'BEGIN{exit !(l > 0 && l < c && f > l)}'; then
        pass "p: hostnames $h0/$h1; node1->node0 by name over /32 routes: ${free} Gbit/s free, ${limited} Gbit/s under tbf $rate"
    else
        fail "p: hostnames $h0/$h1; free ${free} Gbit/s, limited ${limited} Gbit/s; qdisc: $(tr '\n' ' ' < "$d/qdisc.txt")"
    fi
fi

# --- a-d: the gang ---------------------------------------------------------------
# Starts the gang on the given ranks (others never start) and waits for them; the
# leg's directory is $d. Extra env for one rank: RANK_ENV_<i>="K=V ...".
gang_leg() {
    local leg=$1; shift
    d=$work/$leg; mkdir -p "$d"
    local limit=$((wait_s + ${leg_timeout:-$timeout_s} * 4 + 60)) t0 i
    waits=()
    t0=$(now)
    for i in "$@"; do
        local extra=()
        local var=RANK_ENV_$i
        [ -n "${!var:-}" ] && read -ra extra <<< "${!var}"
        start_rank "$i" "$d" "$limit" env ${extra[@]+"${extra[@]}"} \
            NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$d/nccl.rank$i.log" \
            "$bin" gang --gang-root node0 --gang-rank "$i" --gang-nodes 2 --gang-port 29501 \
            --gang-peers node0,node1 --gang-timeout "${leg_timeout:-$timeout_s}" --gang-wait "$wait_s" \
            --gang-sizes "$sizes" --gang-iterations "${leg_iters:-$iters}" --format json
    done
    wait "${waits[@]}" || true
    elapsed "$t0" "$(now)" > "$d/wall_s"
}
judge() { python3 "$here/gang_gpu_judge.py" "$@"; }

if has_leg a; then
    gang_leg a 0 1
    if line=$(judge join-pass "$d" 0 1); then pass "a: $line (wall $(cat "$d/wall_s") s)"; else fail "a: $line"; fi
fi
if has_leg b; then
    RANK_ENV_1="NCCL_ALGO=Tree" gang_leg b 0 1
    if line=$(judge consistency-fail "$d" 0 1 NCCL_ALGO); then pass "b: $line"; else fail "b: $line"; fi
fi
if has_leg c; then
    # Rewritten in place: the bind mount holds the file, not the name.
    grep -v ' node1$' "$work/hosts0" > "$work/hosts0.new" && cat "$work/hosts0.new" > "$work/hosts0"
    gang_leg c 0
    hosts_all > "$work/hosts0"
    if line=$(judge join-fail "$d" 0 $((wait_s + timeout_s)) node1 "rank 1"); then pass "c: $line (wall $(cat "$d/wall_s") s)"; else fail "c: $line"; fi
fi
if has_leg d; then
    TCn 1 qdisc add dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
    # Under the limit one all-reduce takes seconds: fewer iterations, a longer bound.
    leg_iters=3 leg_timeout=$((timeout_s * 4)) gang_leg d 0 1
    TCn 1 qdisc del dev eth0 root
    if line=$(judge slow-link "$d" 0 1 "$work/a" node1); then pass "d: $line"; else fail "d: $line"; fi
fi

# --- e: PyTorch all-reduce across the same two namespaces --------------------------
if has_leg e; then
    if [ $dry = 1 ]; then
        note "SKIP e: --dry (no GPU, no torch)"
    else
        d=$work/e; mkdir -p "$d"
        t0=$(now); waits=()
        for i in 0 1; do
            start_rank "$i" "$d" 300 env NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$d/nccl.rank$i.log" \
                PYTHONUNBUFFERED=1 python3 -m torch.distributed.run --nnodes 2 --nproc-per-node 1 \
                --node-rank "$i" --master-addr node0 --master-port 29500 \
                "$here/gang_allreduce.py" --sizes "$sizes" --iters "$iters" --out "$d/torch.json"
        done
        wait "${waits[@]}" || true
        elapsed "$t0" "$(now)" > "$d/wall_s"
        adir=(); has_leg a && adir=("$work/a")
        if line=$(judge torch "$d" ${adir[@]+"${adir[@]}"}); then pass "e: $line (wall $(cat "$d/wall_s") s)"; else fail "e: $line"; fi
    fi
fi
note "gang-gpu: $( [ $result = 0 ] && echo all legs passed || echo some legs failed )"
exit $result
