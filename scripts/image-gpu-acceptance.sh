#!/usr/bin/env bash
# Runs the image on a GPU machine the way the NVIDIA container runtime would (not
# part of CI): unpacks docker/build-oci.py's layout into a root filesystem, mounts
# the driver's libnvidia-ml and libcuda and the /dev/nvidia* nodes into it, a 1 GiB
# tmpfs on /dev/shm, and runs the tool there as the image's user 65532 through
# chroot, in a mount namespace of its own. Checks that `check` sees the GPUs
# through the mounted libraries and that `doctor` prints the same topology as
# nvidia-smi. Needs root (mounts, chroot). Reads only; changes no GPU setting.
# Usage: scripts/image-gpu-acceptance.sh [LAYOUT_DIR] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
layout="${1:-target/image/layout}"
out="${2:-${OUT:-.}}"
mkdir -p "$out"
root=$(mktemp -d /tmp/nccl-preflight-image.XXXXXX)
trap 'rm -rf "$root"' EXIT

# The layers, in the manifest's order, as a runtime applies them.
python3 - "$layout" "$root/rootfs" <<'EOF'
import json, os, sys, tarfile
layout, rootfs = sys.argv[1], sys.argv[2]
blob = lambda d: os.path.join(layout, "blobs", *d.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
os.makedirs(rootfs)
for layer in manifest["layers"]:
    with tarfile.open(blob(layer["digest"]), "r:gz") as t:
        t.extractall(rootfs, numeric_owner=True, filter="fully_trusted")
c = config["config"]
print(f"image user {c['User']}, entrypoint {c['Entrypoint']}, cmd {c['Cmd']}")
EOF

lib_of() { ldconfig -p | awk -v n="$1" '$1 == n && /x86-64/ {print $NF; exit}'; }
nvml=$(lib_of libnvidia-ml.so.1)
cuda=$(lib_of libcuda.so.1)
echo "driver libraries: $nvml $cuda"
unshare --mount --propagation private bash -euo pipefail -s "$root/rootfs" "$out" "$nvml" "$cuda" <<'EOF'
rootfs=$1 out=$2 nvml=$3 cuda=$4
libdir=$rootfs/usr/lib/x86_64-linux-gnu
for lib in "$nvml" "$cuda"; do
  [ -n "$lib" ] || continue
  touch "$libdir/$(basename "$lib")"
  mount --bind "$lib" "$libdir/$(basename "$lib")"
done
mkdir -p "$rootfs/dev" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev/shm"
for node in /dev/nvidia* /dev/null /dev/zero /dev/urandom; do
  [ -c "$node" ] || continue
  touch "$rootfs$node"
  mount --bind "$node" "$rootfs$node"
done
mount -t proc proc "$rootfs/proc"
mount --rbind /sys "$rootfs/sys"
mount -t tmpfs -o size=1g,mode=1777 shm "$rootfs/dev/shm"
run() { chroot --userspec=65532:65532 "$rootfs" /usr/local/bin/nccl-preflight "$@"; }
run --version
set +e
run check > "$out/image-check.txt" 2>&1; echo "check exit $?" | tee -a "$out/image-check.txt"
run check --format json > "$out/image-check.json" 2> "$out/image-check.err"
run doctor > "$out/image-doctor.txt" 2>&1; echo "doctor exit $?" >> "$out/image-doctor.txt"
set -e
EOF
nvidia-smi topo -m > "$out/topo-m.txt"
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/image-check.json"))
status = {c["id"]: c["status"] for c in r["checks"]}
gpus = r["facts"]["gpus"]["nvml"]["state"].get("loaded", {}).get("gpus", [])
print(f"in the image: {len(gpus)} GPU(s) through NVML; gpu-devices {status['gpu-devices']}, "
      f"gpu-p2p {status['gpu-p2p']}, nvlink {status['nvlink']}, gpu-health {status['gpu-health']}, "
      f"dev-shm {status['dev-shm']}; verdict {r['verdict']}")
ok = gpus and all(status[c] == "pass" for c in ("gpu-devices", "gpu-p2p", "dev-shm"))
sys.exit(0 if ok else 1)
EOF
