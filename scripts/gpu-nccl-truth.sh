#!/usr/bin/env bash
# The NCCL truth table (issue 36 item 4), not part of CI: for each situation of the
# table below (settings, namespaces, visible GPUs, settings files, the NCCL build), in
# exactly that situation, `nccl-preflight facts` (and `check --facts` of it: the tool's
# prediction) beside a real all-reduce of 2 or 4 ranks (scripts/nccl_truth_rank.py:
# ctypes on libcuda and the libnccl under test, NCCL_DEBUG=INFO). Reads only; changes no
# GPU setting; NCCL_NVLS_ENABLE=0 in every row (NVLS is never switched on). Every file it writes is under /tmp/nccl-truth and OUTDIR; /etc is changed
# only inside mount namespaces of its own (a bound copy).
#
# Usage:
#   scripts/gpu-nccl-truth.sh CARRYDIR OUTDIR
#   scripts/gpu-nccl-truth.sh --dry FAKELIBS SCENARIO BINARY OUTDIR
# CARRYDIR holds nccl-preflight (or nccl-preflight.xz), nccl_truth_rank.py, this script,
# and optionally libnccl-<version>.so.2.xz (scripts/nccl-slim.py output, xz-compressed):
# each becomes the `v<version>` library of the rows that name it (rows whose library is
# missing are recorded as skipped). The wheel's NCCL is PyTorch's
# (/opt/torch/.venv/.../nvidia/nccl/lib/libnccl.so.2), the system one ldconfig's.
# On the lent 4x H200 (the run tool), carrying target/release/nccl-preflight and
# target/nccl-truth-carry (libnccl-2.30.7.so.2.xz; 64 MiB fit one extra NCCL):
#   mkdir -p /tmp/c && cp target/release/nccl-preflight scripts/nccl_truth_rank.py \
#     target/nccl-truth-carry/*.xz /tmp/c/ && timeout 540 bash scripts/gpu-nccl-truth.sh /tmp/c "$OUT"
# --dry runs the same table here against the fake libraries (target/tmp/fake-libs of a
# test run: nvidia/ and nccl-gang/; SCENARIO a tests/fixtures/gpu-*/gpu.scenario): every
# row runs and is recorded, NCCL's INFO lines aside (the fake prints none).
# Bounds: each row's ranks and `facts` at most 30 s, `check` 15 s more; no row starts
# after 330 s; so the whole run ends within 7 minutes (expected: about 4-6 s a row on 4x
# H200, 59 rows, 4-6 minutes; the dry run here: 171 s). Killed (TERM), it still writes
# its tarball of the rows done.
# Result: OUTDIR/nccl-truth.tar.gz: manifest.json, rows.tsv (this table), summary.tsv
# (expected, predicted, observed per row) and rows/<id>/ (row.env, facts.json,
# check.json, rank<r>.log, rank<r>.json). tests/data/h200x4/nccl-truth/README.md says how
# a tarball becomes the capture the replay test (tests/integration/nccl_truth.rs) reads.
set -uo pipefail

dry=0
if [ "${1:-}" = "--dry" ]; then
    dry=1
    fakes=$(cd "${2:?usage: --dry FAKELIBS SCENARIO BINARY OUTDIR}" && pwd)
    scenario=$(cd "$(dirname "${3:?}")" && pwd)/$(basename "$3")
    bin=$(cd "$(dirname "${4:?}")" && pwd)/$(basename "$4")
    out=${5:?usage: --dry FAKELIBS SCENARIO BINARY OUTDIR}
    carry=$(cd "$(dirname "$0")" && pwd)
else
    carry=$(cd "${1:?usage: gpu-nccl-truth.sh CARRYDIR OUTDIR}" && pwd)
    out=${2:?usage: gpu-nccl-truth.sh CARRYDIR OUTDIR}
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
w=/tmp/nccl-truth
rm -rf "$w" && mkdir -p "$w/rows" "$w/libs" || exit 2
t0=$(date +%s)
budget=330
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=$(command -v python3 || echo /opt/torch/.venv/bin/python)
[ -x /opt/torch/.venv/bin/python ] && py=/opt/torch/.venv/bin/python
log() { echo "$(date -u +%T) $*" | tee -a "$w/run.log"; }
finish() { tar -C "$w" -czf "$out/nccl-truth.tar.gz" manifest.json rows.tsv summary.tsv run.log rows 2>/dev/null; }
trap finish EXIT
trap 'exit 124' TERM INT

# --- the libraries -----------------------------------------------------------------
"$py" - "$carry" "$w/libs" <<'PY'
import lzma, os, shutil, sys
carry, libs = sys.argv[1], sys.argv[2]
for name in os.listdir(carry):
    src = os.path.join(carry, name)
    if name == "nccl-preflight.xz":
        dst = os.path.join(libs, "nccl-preflight")
    elif name.startswith("libnccl-") and name.endswith(".so.2.xz"):
        version = name[len("libnccl-"):-len(".so.2.xz")]
        os.makedirs(os.path.join(libs, "v" + version), exist_ok=True)
        dst = os.path.join(libs, "v" + version, "libnccl.so.2")
    else:
        continue
    with lzma.open(src) as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 24)
PY
if [ "$dry" = 0 ]; then
    bin=$carry/nccl-preflight
    [ -x "$w/libs/nccl-preflight" ] && bin=$w/libs/nccl-preflight
    chmod +x "$bin" 2>/dev/null
    wheel=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 2>/dev/null | head -1)
    system=$(ldconfig -p 2>/dev/null | awk '/libnccl.so.2 / {print $NF; exit}')
    base_ld=""
else
    wheel=$fakes/nccl-gang/libnccl.so.2
    system=$wheel
    base_ld=$fakes/nvidia
fi
lib_path() {
    case "$1" in
        wheel) echo "$wheel" ;;
        system) echo "$system" ;;
        v*) if [ "$dry" = 1 ]; then echo "$wheel"; else echo "$w/libs/$1/libnccl.so.2"; fi ;;
    esac
}

# --- this machine's interfaces: the default route's, and its IPv4 address ----------
read -r primary primary_ip < <("$py" - <<'PY'
import fcntl, socket, struct
dev = "lo"
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000":
        dev = f[0]
        break
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", dev[:15].encode()))[20:24])
except OSError:
    addr = "127.0.0.1"
print(dev, addr)
PY
)
log "gpu-nccl-truth: dry=$dry primary=$primary ($primary_ip) wheel=$wheel system=$system"

# --- the table -------------------------------------------------------------------
# id | ranks | devices | namespaces | library | variables | files | expected (from source)
# devices: "0,1": CUDA_VISIBLE_DEVICES for every rank, rank r on device r; "each:0,1":
#   rank r sees only the r-th GPU (device 0). namespaces: none, ipc, uts (a hostname per
#   rank), uts+ipc, etc (a private /etc with the row's nccl.conf). expected:
#   transport;init;bootstrap, written from NVIDIA/nccl v2.28.9-1 before any run
#   (src/transport/p2p.cc, shm.cc, net.cc; src/graph/paths.cc; src/init.cc;
#   src/bootstrap.cc; src/misc/param.cc; src/graph/xml.cc), `auto` = the default
#   route's interface. `@P` in variables is that interface, `@IP` its address.
cat > "$w/rows.tsv" <<'ROWS'
default|2|0,1|none|wheel|-|none|P2P/CUMEM;ok;auto
four|4|0,1,2,3|none|wheel|-|none|P2P/CUMEM;ok;auto
p2p-off|2|0,1|none|wheel|NCCL_P2P_DISABLE=1|none|SHM;ok;auto
p2p-off-4|4|0,1,2,3|none|wheel|NCCL_P2P_DISABLE=1|none|SHM;ok;auto
p2p-level-loc|2|0,1|none|wheel|NCCL_P2P_LEVEL=LOC|none|SHM;ok;auto
p2p-level-nvl|2|0,1|none|wheel|NCCL_P2P_LEVEL=NVL|none|P2P/CUMEM;ok;auto
p2p-level-pix|2|0,1|none|wheel|NCCL_P2P_LEVEL=PIX|none|P2P/CUMEM;ok;auto
p2p-level-legacy|2|0,1|none|wheel|NCCL_P2P_LEVEL=0|none|SHM;ok;auto
shm-off|2|0,1|none|wheel|NCCL_SHM_DISABLE=1|none|P2P/CUMEM;ok;auto
socket-forced|2|0,1|none|wheel|NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1|none|NET/Socket;ok;auto
socket-lo|2|0,1|none|wheel|NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo|none|NET/Socket;ok;lo
cumem-off|2|0,1|none|wheel|NCCL_CUMEM_ENABLE=0|none|P2P/IPC;ok;auto
cumem-off-ipc|2|0,1|ipc|wheel|NCCL_CUMEM_ENABLE=0|none|P2P/IPC;ok;auto
ipc-ns|2|0,1|ipc|wheel|-|none|P2P/CUMEM;ok;auto
hostname|2|0,1|uts|wheel|-|none|NET/Socket;ok;auto
hostname-ipc|2|0,1|uts+ipc|wheel|-|none|NET/Socket;ok;auto
hostid|2|0,1|uts|wheel|NCCL_HOSTID=same-node|none|P2P/CUMEM;ok;auto
cvd-each|2|each:0,1|none|wheel|-|none|P2P/CUMEM;ok;auto
cvd-order|2|1,0|none|wheel|-|none|P2P/CUMEM;ok;auto
cvd-23|2|3,2|none|wheel|-|none|P2P/CUMEM;ok;auto
cvd-02|2|0,2|none|wheel|-|none|P2P/CUMEM;ok;auto
cvd-each-4|4|each:3,1,0,2|none|wheel|-|none|P2P/CUMEM;ok;auto
algo-ring|2|0,1|none|wheel|NCCL_ALGO=Ring|none|P2P/CUMEM;ok;auto
algo-tree|2|0,1|none|wheel|NCCL_ALGO=Tree|none|P2P/CUMEM;ok;auto
algo-nvls-off|2|0,1|none|wheel|NCCL_ALGO=NVLS|none|P2P/CUMEM;fail:no algorithm;auto
algo-collnet|2|0,1|none|wheel|NCCL_ALGO=CollNetDirect|none|P2P/CUMEM;fail:no algorithm;auto
algo-typo|2|0,1|none|wheel|NCCL_ALGO=Rng|none|-;fail:Unrecognized element token;auto
proto-ll|2|0,1|none|wheel|NCCL_PROTO=LL|none|P2P/CUMEM;ok;auto
proto-ll128|2|0,1|none|wheel|NCCL_PROTO=LL128|none|P2P/CUMEM;ok;auto
proto-simple|2|0,1|none|wheel|NCCL_PROTO=Simple|none|P2P/CUMEM;ok;auto
proto-not-ll128|2|0,1|none|wheel|NCCL_PROTO=^LL128|none|P2P/CUMEM;ok;auto
proto-typo|2|0,1|none|wheel|NCCL_PROTO=LL129|none|-;fail:Unrecognized element token;auto
ifname-lo|2|0,1|none|wheel|NCCL_SOCKET_IFNAME=lo|none|P2P/CUMEM;ok;lo
ifname-none|2|0,1|none|wheel|NCCL_SOCKET_IFNAME=nonexist0|none|-;fail:Bootstrap : no socket interface found;-
ifname-not-lo|2|0,1|none|wheel|NCCL_SOCKET_IFNAME=^lo|none|P2P/CUMEM;ok;auto
ifname-exact|2|0,1|none|wheel|NCCL_SOCKET_IFNAME==@P|none|P2P/CUMEM;ok;@P
ifname-exclude-all|2|0,1|none|wheel|NCCL_SOCKET_IFNAME=^@P,lo,docker|none|-;fail:Bootstrap : no socket interface found;-
comm-id|2|0,1|none|wheel|NCCL_COMM_ID=@IP:29555|none|P2P/CUMEM;ok;@P
comm-id-elsewhere|2|0,1|none|wheel|NCCL_COMM_ID=192.0.2.1:29555|none|-;fail:No usable listening interface found;-
net-socket|2|0,1|none|wheel|NCCL_NET=Socket|none|P2P/CUMEM;ok;auto
ib-off|2|0,1|none|wheel|NCCL_IB_DISABLE=1|none|P2P/CUMEM;ok;auto
channels|2|0,1|none|wheel|NCCL_MAX_NCHANNELS=2|none|P2P/CUMEM;ok;auto
threads|2|0,1|none|wheel|NCCL_NTHREADS=100|none|P2P/CUMEM;ok;auto
conf-file|2|0,1|none|wheel|-|conf-p2p-off|SHM;ok;auto
conf-env-wins|2|0,1|none|wheel|NCCL_P2P_DISABLE=0|conf-p2p-off|P2P/CUMEM;ok;auto
conf-home|2|0,1|none|wheel|-|home-p2p-off|P2P/CUMEM;ok;auto
conf-etc|2|0,1|etc|wheel|-|etc-p2p-off|SHM;ok;auto
conf-crlf|2|0,1|none|wheel|-|conf-crlf-lo|-;fail:Bootstrap : no socket interface found;-
conf-quoted|2|0,1|none|wheel|-|conf-quoted-lo|-;fail:Bootstrap : no socket interface found;-
conf-blanks|2|0,1|none|wheel|-|conf-blanks-p2p-off|P2P/CUMEM;ok;auto
topo-bad|2|0,1|none|wheel|-|topo-bad|-;fail:expected >, got '?';auto
topo-missing|2|0,1|none|wheel|-|topo-missing|P2P/CUMEM;ok;auto
graph-missing|2|0,1|none|wheel|-|graph-missing|-;fail:Could not open XML graph file;auto
system|2|0,1|none|system|-|none|P2P/CUMEM;ok;auto
system-p2p-off|2|0,1|none|system|NCCL_P2P_DISABLE=1|none|SHM;ok;auto
v2.30-home|2|0,1|none|v2.30.7|-|home-p2p-off|SHM;ok;auto
v2.30-crlf|2|0,1|none|v2.30.7|-|conf-crlf-lo|P2P/CUMEM;ok;lo
v2.21-default|2|0,1|none|v2.21.5|-|none|P2P/CUMEM;ok;auto
v2.21-conf-file|2|0,1|none|v2.21.5|-|conf-p2p-off|P2P/CUMEM;ok;auto
ROWS

# --- the files a row's variant writes ------------------------------------------------
files_for() {  # variant dir -> extra variables, one per line
    local v=$1 d=$2
    case "$v" in
        conf-p2p-off) printf 'NCCL_P2P_DISABLE=1\n' > "$d/nccl.conf"; echo "NCCL_CONF_FILE=$d/nccl.conf" ;;
        conf-crlf-lo) printf 'NCCL_SOCKET_IFNAME=lo\r\n' > "$d/nccl.conf"; echo "NCCL_CONF_FILE=$d/nccl.conf" ;;
        conf-quoted-lo) printf 'NCCL_SOCKET_IFNAME="lo"\n' > "$d/nccl.conf"; echo "NCCL_CONF_FILE=$d/nccl.conf" ;;
        conf-blanks-p2p-off) printf 'NCCL_P2P_DISABLE = 1\n' > "$d/nccl.conf"; echo "NCCL_CONF_FILE=$d/nccl.conf" ;;
        home-p2p-off) mkdir -p "$d/home"; printf 'NCCL_P2P_DISABLE=1\n' > "$d/home/.nccl.conf"; echo "HOME=$d/home" ;;
        etc-p2p-off) cp -a /etc "$d/etc" && printf 'NCCL_P2P_DISABLE=1\n' > "$d/etc/nccl.conf" ;;
        topo-bad) printf '<?xml version="1.0"?>\n<system version="1">\n</system>\n' > "$d/topo.xml"; echo "NCCL_TOPO_FILE=$d/topo.xml" ;;
        topo-missing) echo "NCCL_TOPO_FILE=$d/absent-topo.xml" ;;
        graph-missing) echo "NCCL_GRAPH_FILE=$d/absent-graph.xml" ;;
    esac
}

# The command prefix that puts rank r of a row into its namespaces.
wrap() {  # ns rank dir
    case "$1" in
        none) ;;
        ipc) echo "unshare --ipc" ;;
        uts) echo "unshare --uts sh -c 'hostname truth-rank$2 && exec \"\$@\"' sh" ;;
        uts+ipc) echo "unshare --uts --ipc sh -c 'hostname truth-rank$2 && exec \"\$@\"' sh" ;;
        etc) echo "unshare -m sh -c 'mount --bind $3/etc /etc && exec \"\$@\"' sh" ;;
    esac
}

run_row() {
    local id=$1 n=$2 devs=$3 ns=$4 lib=$5 vars=$6 files=$7 expect=$8
    local d=$w/rows/$id
    mkdir -p "$d"
    printf '%s|%s|%s|%s|%s|%s|%s|%s\n' "$@" > "$d/row.txt"
    local libnccl
    libnccl=$(lib_path "$lib")
    if [ ! -f "$libnccl" ]; then
        echo "skipped: no library $lib" > "$d/skipped"; log "$id: skipped (no $lib)"; return
    fi
    local -a env=("PATH=/usr/sbin:/usr/bin:/sbin:/bin" "NCCL_DEBUG=INFO"
        "NCCL_DEBUG_SUBSYS=INIT,ENV,BOOTSTRAP,NET,P2P,SHM,GRAPH,NVLS" "NCCL_NVLS_ENABLE=0"
        "HOME=$d" "PYTHONUNBUFFERED=1")
    [ -n "$base_ld" ] && env+=("LD_LIBRARY_PATH=$base_ld" "FAKE_GPU_SCENARIO=$scenario")
    [ "$dry" = 1 ] && env+=("NCCL_COMM_ID=127.0.0.1:$((29600 + RANDOM % 300))")
    local v
    for v in $(files_for "$files" "$d"); do env+=("$v"); done
    if [ "$vars" != "-" ]; then
        for v in $vars; do v=${v//@IP/$primary_ip}; env+=("${v//@P/$primary}"); done
    fi
    printf '%s\n' "${env[@]}" > "$d/row.env"
    local -a visible
    local each=0
    case "$devs" in each:*) each=1; IFS=, read -ra visible <<< "${devs#each:}" ;; *) IFS=, read -ra visible <<< "$devs" ;; esac
    local cvd0=$devs; [ "$each" = 1 ] && cvd0=${visible[0]}
    # The tool, in rank 0's situation, beside the ranks.
    ( eval "$(wrap "$ns" 0 "$d") env -i ${env[*]@Q} CUDA_VISIBLE_DEVICES=$cvd0 timeout 30 $bin facts --nccl-lib $libnccl" \
        > "$d/facts.json" 2> "$d/facts.err"
      timeout 15 "$bin" check --format json --facts "$d/facts.json" > "$d/check.json" 2> "$d/check.err"
      echo "$?" > "$d/check.rc" ) &
    local tool=$!
    local -a pids=()
    local r
    for ((r = 0; r < n; r++)); do
        local cvd=$devs dev=$r
        if [ "$each" = 1 ]; then cvd=${visible[$r]}; dev=0; fi
        eval "$(wrap "$ns" "$r" "$d") env -i ${env[*]@Q} CUDA_VISIBLE_DEVICES=$cvd timeout 30 $py $carry/nccl_truth_rank.py $r $n $dev $d/unique-id $libnccl $d/rank$r.json" \
            > "$d/rank$r.log" 2>&1 &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
    wait "$tool"
    log "$id: $(cat "$d"/rank*.json 2>/dev/null | tr -d '\n' | cut -c1-200)"
}

while IFS='|' read -r id n devs ns lib vars files expect; do
    [ -z "$id" ] && continue
    if [ $(( $(date +%s) - t0 )) -gt "$budget" ]; then
        mkdir -p "$w/rows/$id"; echo "skipped: out of time" > "$w/rows/$id/skipped"; continue
    fi
    run_row "$id" "$n" "$devs" "$ns" "$lib" "$vars" "$files" "$expect"
done < "$w/rows.tsv"

# --- the manifest and the summary --------------------------------------------------
"$py" - "$w" "$dry" "$primary" "$wheel" "$system" <<'PY'
import glob, json, os, subprocess, sys, time
w, dry, primary, wheel, system = sys.argv[1:6]
def gpus():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.splitlines()
    except Exception as e:
        return [f"nvidia-smi: {e}"]
manifest = {"mode": "dry" if dry == "1" else "gpu", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "primary_interface": primary, "wheel": wheel, "system": system, "gpus": [] if dry == "1" else gpus()}
json.dump(manifest, open(os.path.join(w, "manifest.json"), "w"), indent=1)
def transport(token):
    """P2P/CUMEM/read -> P2P/CUMEM, SHM/direct/direct -> SHM, NET/Socket/0 -> NET/Socket."""
    parts = token.split("/")
    if parts[0] == "SHM":
        return "SHM"
    return "/".join(parts[:2])
lines = ["id\texpected\tpredicted\tobserved"]
for row in open(os.path.join(w, "rows.tsv")).read().splitlines():
    rid, devs, exp = row.split("|")[0], row.split("|")[2], row.split("|")[7]
    d = os.path.join(w, "rows", rid)
    visible = {int(x) for x in devs.split(":")[-1].split(",")}
    if os.path.exists(os.path.join(d, "skipped")):
        lines.append(f"{rid}\t{exp}\tskipped\tskipped"); continue
    seen, boot = set(), "-"
    for log in glob.glob(os.path.join(d, "rank*.log")):
        for l in open(log, errors="replace"):
            if "Channel" in l and " via " in l:
                seen.add(transport(l.split(" via ")[1].split()[0]))
            if "Bootstrap" in l and "Using" in l and boot == "-":
                boot = l.split("Using")[1].strip().split(":")[0]
    inits = []
    for r in sorted(glob.glob(os.path.join(d, "rank*.json"))):
        j = json.load(open(r))
        inits.append("ok" if j.get("init") == 0 and j.get("allreduce", 0) == 0 and j.get("correct") else f"fail:{j.get('init')}/{j.get('allreduce')}:{j.get('last_error', j.get('error', ''))[:60]}")
    pred = "-"
    try:
        c = json.load(open(os.path.join(d, "check.json")))
        # NVML indices; the same as CUDA's on a machine of identical GPUs in PCI order.
        pairs = sorted({transport(p["transport"]) for p in c["nccl"]["intra_node"] or []
                        if p["a"] in visible and p["b"] in visible})
        b = (c["nccl"]["sockets"].get("value") or {}).get("bootstrap")
        pred = f"{','.join(pairs) or '-'};{[x['id'] + ':' + x['status'] for x in c['checks'] if x['status'] == 'fail']};{b['interface'] if b else '-'}"
    except Exception as e:
        pred = f"unreadable: {e}"
    lines.append(f"{rid}\t{exp}\t{pred}\t{','.join(sorted(seen)) or '-'};{'|'.join(sorted(set(inits)))};{boot}")
open(os.path.join(w, "summary.tsv"), "w").write("\n".join(lines) + "\n")
PY
log "done in $(( $(date +%s) - t0 )) s"
