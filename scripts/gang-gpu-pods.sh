# Sourced by scripts/gang-gpu.sh for --pods N (N > 2): N "pods" on a Linux bridge,
# the gang's legs of issues 24 and 37 (see gang-gpu.sh's header). Uses the caller's $bin,
# $work, $dry, $fakes, $node_env, $wait_s, $timeout_s, $sizes, $iters, $rate,
# $tools, $pids, $within, IP, TC, note and has_leg.

pod_name() { if [ "$1" = 0 ]; then echo job-master-0; else echo "job-worker-$(($1 - 1))"; fi; }
p_now() { date +%s.%N; }
p_elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }
result=0
skipped=
declare -a pod_holder

# Seconds left of --within.
p_left() { echo $((deadline - $(date +%s))); }

# Leg LEG was asked for and fits what is left of --within (--gang-wait +
# --gang-timeout at least); a leg left out is a SKIP row in the summary.
runs_leg() {
    has_leg "$1" || return 1
    local left
    left=$(p_left)
    [ "$left" -ge $((wait_s + timeout_s)) ] && return 0
    note "$1	SKIP	$left s left of --within $within"
    skipped="$skipped $1"
    return 1
}

# Runs a command in pod I's namespaces (mount, UTS, net), or only its network one.
pod_ns() { local i=$1; shift; nsenter -t "${pod_holder[$i]}" -m -u -n -- "$@"; }
pod_net() { local i=$1; shift; nsenter -t "${pod_holder[$i]}" -n -- "$@"; }
pod_ip() { local i=$1; shift; if [ -n "$tools" ]; then pod_net "$i" env LD_LIBRARY_PATH="$tools/lib" "$tools/ip" "$@"; else pod_net "$i" ip "$@"; fi; }
pod_tc() { local i=$1; shift; if [ -n "$tools" ]; then pod_net "$i" env LD_LIBRARY_PATH="$tools/lib" "$tools/tc" "$@"; else pod_net "$i" tc "$@"; fi; }

# The pods and the switch (holder N): namespaces, bridge, veths, names, routes.
make_pods() {
    local n=$pods i j
    for i in $(seq 0 "$n"); do
        unshare --mount --uts --net --propagation private sleep 86400 &
        pod_holder[$i]=$!
        pids+=($!)
    done
    for i in $(seq 0 "$n"); do
        for _ in $(seq 50); do
            [ "$(readlink "/proc/${pod_holder[$i]}/ns/net")" != "$(readlink /proc/self/ns/net)" ] && break
            sleep 0.1
        done
        [ "$(readlink "/proc/${pod_holder[$i]}/ns/net")" != "$(readlink /proc/self/ns/net)" ] \
            || die "pod $i: no network namespace after 5 s"
    done
    pod_ip "$n" link set lo up
    pod_ip "$n" link add br0 type bridge
    pod_ip "$n" link set br0 up
    for i in $(seq 0 $((n - 1))); do
        printf '127.0.0.1 localhost\n' > "$work/hosts$i"
        for j in $(seq 0 $((n - 1))); do echo "10.10.0.$((j + 1)) $(pod_name "$j")" >> "$work/hosts$i"; done
        IP link add "gp$i" type veth peer name "gq$i"
        IP link set "gp$i" netns "${pod_holder[$i]}"
        IP link set "gq$i" netns "${pod_holder[$n]}"
        pod_ip "$n" link set "gq$i" master br0
        pod_ip "$n" link set "gq$i" up
        pod_ns "$i" sh -c "echo $(pod_name "$i") > /proc/sys/kernel/hostname && mount --bind '$work/hosts$i' /etc/hosts"
        pod_ip "$i" link set lo up
        pod_ip "$i" link set "gp$i" name eth0
        pod_ip "$i" addr add "10.10.0.$((i + 1))/32" dev eth0
        pod_ip "$i" link set eth0 up
        for j in $(seq 0 $((n - 1))); do
            [ "$j" = "$i" ] || pod_ip "$i" route add "10.10.0.$((j + 1))/32" dev eth0
        done
        pod_ip "$i" route add default dev eth0
    done
    pod_ip 0 -brief addr > "$work/pod0-addr.txt"
}

# The libnccl every pod loads (the trainer's: the PyTorch wheel's), and the other one.
pick_libraries() {
    if [ "$dry" = 1 ]; then
        lib_main=$fakes/libnccl.so.2
        lib_other=$fakes/libnccl.so.2
        return
    fi
    lib_main=$(python3 -c 'import os, nvidia.nccl; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null) || lib_main=
    lib_other=$(ldconfig -p | awk '/libnccl\.so\.2 /{print $NF; exit}')
    note "libnccl: the PyTorch wheel's ${lib_main:-none}, the system's ${lib_other:-none}"
}

# The pid of process PID's child running gang-worker, from /proc (no procps needed).
worker_of() {
    local c ppid _
    for c in /proc/[0-9]*; do
        # pid (comm) state ppid ...: our processes' comm has no space.
        read -r _ _ _ ppid _ < "$c/stat" 2>/dev/null || continue
        [ "$ppid" = "$1" ] || continue
        tr '\0' ' ' < "$c/cmdline" 2>/dev/null | grep -q gang-worker && { basename "$c"; return 0; }
    done
    return 1
}

# Kills pod $kill_pod (its nccl-preflight, with SIGKILL: the worker dies with it)
# $kill_after seconds after its NCCL worker started, once it is measuring.
kill_when_measuring() {
    local i=$kill_pod pidfile=$d/rank$kill_pod.pid pid= w _
    for _ in $(seq 600); do [ -s "$pidfile" ] && break; sleep 0.1; done
    pid=$(cat "$pidfile" 2>/dev/null) || return 0
    for _ in $(seq 1200); do
        w=$(worker_of "$pid") && break
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.05
    done
    sleep "$kill_after"
    echo "$(p_now) killing pod $i (pid $pid, worker ${w:-none})" > "$d/killed.txt"
    kill -9 "$pid" 2>/dev/null || true
}

# Starts the gang on pods RANKS... (others never start); leg directory $d; extra
# environment for pod i in POD_ENV_<i>="K=V ...", extra flags in $leg_flags; with
# $kill_pod set, that pod is killed mid-measurement (kill_when_measuring).
pods_leg() {
    local leg=$1; shift
    d=$work/$leg; mkdir -p "$d"
    local n=$pods t0 i g ngpu=${ngpu:-1}
    local limit=$((wait_s + timeout_s * 3 + 60)) left
    left=$(($(p_left) - 5))
    [ "$left" -lt "$limit" ] && limit=$((left > 1 ? left : 1))
    local waits=()
    t0=$(p_now)
    for i in "$@"; do
        g=$((i * ngpu / n))
        local extra=()
        local var=POD_ENV_$i
        [ -n "${!var:-}" ] && read -ra extra <<< "${!var}"
        ( set +e
          # shellcheck disable=SC2086
          pod_ns "$i" env "${node_env[@]}" CUDA_VISIBLE_DEVICES="$g" \
              MASTER_ADDR=job-master-0 MASTER_PORT=29500 PET_NNODES="$n" PET_NODE_RANK="$i" \
              NCCL_PREFLIGHT_NCCL_LIB="$lib_main" ${extra[@]+"${extra[@]}"} \
              timeout -k 5 "$limit" sh -c 'echo $$ > "$0"; exec "$@"' "$d/rank$i.pid" \
              "$bin" gang --format json --gang-wait "$wait_s" $leg_flags \
              > "$d/rank$i.out" 2> "$d/rank$i.err"
          echo $? > "$d/rank$i.rc" ) &
        waits+=($!)
    done
    [ -n "${kill_pod:-}" ] && kill_when_measuring
    wait "${waits[@]}" || true
    p_elapsed "$t0" "$(p_now)" > "$d/wall_s"
}

# Judges the leg just run: every started rank exits CODE, rank 0's and rank 1's
# verdicts contain EXPECT.
pods_judge() {
    local leg=$1 code=$2 expect=$3; shift 3
    local line
    if line=$(python3 "$here/gang_pods_judge.py" "$leg" "$d" "$code" 1 "$expect" "$@"); then
        note "$line"
    else
        note "$line"
        result=1
    fi
}

run_pods() {
    local n=$pods all
    all=$(seq -s ' ' 0 $((n - 1)))
    deadline=$(($(date +%s) + within))
    if [ "$dry" = 1 ]; then ngpu=1; else ngpu=$(nvidia-smi -L | grep -c '^GPU'); fi
    note "pods: $n on a bridge, $ngpu GPU(s): pod i on GPU i x $ngpu / $n"
    make_pods
    pick_libraries
    [ -n "$lib_main" ] || die "no PyTorch wheel libnccl here (python3 -c 'import nvidia.nccl')"
    local tuned="--gang-timeout $timeout_s --gang-sizes $sizes --gang-iterations $iters"
    if runs_leg A; then
        leg_flags=$tuned pods_leg A $all
        pods_judge A 0 "all pass" $all
    fi
    if runs_leg V; then
        if [ "$dry" = 1 ]; then
            POD_ENV_1="FAKE_NCCL_VERSION=22803 FAKE_NCCL_MISMATCH_HANG=1" leg_flags=$tuned pods_leg V $all
        else
            POD_ENV_1="NCCL_PREFLIGHT_NCCL_LIB=$lib_other" leg_flags=$tuned pods_leg V $all
        fi
        pods_judge V 1 "loads NCCL" $all
    fi
    if runs_leg L; then
        POD_ENV_1="NCCL_SOCKET_IFNAME=eth9" leg_flags=$tuned pods_leg L $all
        pods_judge L 1 "failed its own checks: nccl-env" $all
    fi
    if runs_leg M; then
        local some
        some=$(seq -s ' ' 0 $((n - 2)))
        leg_flags=$tuned pods_leg M $some
        pods_judge M 3 "never reached the rendezvous" $some
    fi
    if runs_leg P; then
        # Ingress on pod 2: TCP to the gang port passes, every other SYN is dropped
        # (IPv4 without options: TCP flags at byte 33, SYN set and ACK clear).
        local how= ipt=()
        if pod_tc 2 qdisc add dev eth0 ingress 2> "$work/P-tc.err" \
            && pod_tc 2 filter add dev eth0 parent ffff: prio 1 protocol ip u32 \
                match ip protocol 6 0xff match ip dport 29501 0xffff action ok 2>> "$work/P-tc.err" \
            && pod_tc 2 filter add dev eth0 parent ffff: prio 2 protocol ip u32 \
                match ip protocol 6 0xff match u8 0x02 0x12 at 33 action drop 2>> "$work/P-tc.err"; then
            how="tc u32"
        else
            pod_tc 2 qdisc del dev eth0 ingress 2>/dev/null || true
            ipt=(iptables)
            [ -n "$tools" ] && [ -x "$tools/iptables" ] \
                && ipt=(env LD_LIBRARY_PATH="$tools/lib" XTABLES_LIBDIR="$tools/xtables" "$tools/iptables")
            pod_net 2 "${ipt[@]}" -A INPUT -p tcp --syn ! --dport 29501 -j DROP 2>> "$work/P-tc.err" \
                && how=iptables
        fi
        if [ -n "$how" ]; then
            note "P: pod 2 drops TCP SYNs to every port but 29501 ($how)"
            leg_flags=$tuned pods_leg P $all
            if [ "$how" = iptables ]; then
                pod_net 2 "${ipt[@]}" -D INPUT -p tcp --syn ! --dport 29501 -j DROP || true
            else
                pod_tc 2 qdisc del dev eth0 ingress || true
            fi
            pods_judge P 3 "NCCL's join did not complete" $all
        else
            note "SKIP P: neither tc nor iptables can drop here: $(tr '\n' ' ' < "$work/P-tc.err")"
        fi
    fi
    if runs_leg D; then
        # Logging on one pod only: NCCL reads these in src/debug.cc alone (nccl::roles).
        POD_ENV_1="NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL" leg_flags=$tuned pods_leg D $all
        pods_judge D 0 "all pass" $all
        note "D: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print([e for c in r["checks"] if c["id"]=="gang-consistency" for e in c.get("evidence",[]) if e.startswith("not compared")])' "$d/rank0.out" 2>&1)"
    fi
    if runs_leg G; then
        # Pod 1 sees two GPUs where the others see one: the one is named, the job's.
        # (The fake libcuda applies CUDA_VISIBLE_DEVICES to its eight GPUs as CUDA does.)
        POD_ENV_1="CUDA_VISIBLE_DEVICES=$((ngpu > 1 ? 1 : 0)),$((ngpu > 2 ? 2 : 1))" leg_flags=$tuned pods_leg G $all
        pods_judge G 1 "job-worker-0) has 2 GPU(s) where the other $((n - 1)) pod(s) have 1 GPU(s)" $all
    fi
    if runs_leg K; then
        # Pod 2 killed once its NCCL worker is measuring: every other pod names it gone.
        local others
        others=$(seq 0 $((n - 1)) | grep -vx 2 | tr '\n' ' ')
        if [ "$dry" = 1 ]; then
            # The fake's measurement is over in well under a second: its own hook kills
            # the pod at its 11th communication call, in the pairwise probe.
            POD_ENV_2="FAKE_NCCL_KILL_POD_AFTER=10" leg_flags=$tuned pods_leg K $all
        else
            # 50 iterations keep the measurement going well past the kill, 3 s after
            # the worker started (NCCL's join took 0.65 s on 4x H100).
            kill_pod=2 kill_after=3 leg_flags="--gang-timeout $timeout_s --gang-sizes $sizes --gang-iterations 50" \
                pods_leg K $all
        fi
        pods_judge K 3 "job-worker-1) is gone" $others
        note "K: $(cat "$d/killed.txt" 2>/dev/null || echo 'pod 2 killed by the fake libnccl'); its exit: $(cat "$d/rank2.rc")"
    fi
    if runs_leg I; then
        # 256 idle connections on the gang port from the switch namespace, before the pods.
        pod_net "$n" python3 -c '
import socket,sys,time
conns=[]; end=time.time()+60
while len(conns)<256 and time.time()<end:
    try: conns.append(socket.create_connection(("10.10.0.1",29501),timeout=1))
    except OSError: time.sleep(0.05)
time.sleep(120)' > "$work/I-flood.txt" 2>&1 &
        local flood=$!
        pids+=($flood)
        leg_flags=$tuned pods_leg I $all
        kill "$flood" 2>/dev/null || true
        pods_judge I 0 "all pass" $all
    fi
    if runs_leg S; then
        pod_tc 2 qdisc add dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
        pod_tc "$n" qdisc add dev gq2 root tbf rate "$rate" burst 128kb latency 50ms
        leg_flags= pods_leg S $all
        pod_tc 2 qdisc del dev eth0 root || true
        pod_tc "$n" qdisc del dev gq2 root || true
        pods_judge S 3 "job-worker-1) is the straggler" $all
    fi
}
