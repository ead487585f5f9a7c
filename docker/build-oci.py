#!/usr/bin/env python3
"""Builds the nccl-preflight image without a container engine, as an OCI image layout.

The image is what docker/Dockerfile builds: the release binary (scripts/release.sh,
glibc 2.17) on the package set of gcr.io/distroless/cc-debian12:nonroot (base-files,
netbase, tzdata, media-types, libc6, libssl3, libgcc-s1, libgomp1, libstdc++6,
gcc-12-base, and a CA bundle), user 65532, the binary as entrypoint. The packages come
from this machine's apt sources (`apt-get download`), so on Debian 12 they are the
distroless ones; the two layers are reproducible (fixed owners and times).

    docker/build-oci.py --binary dist/nccl-preflight --out target/image
    skopeo copy oci:target/image/layout:0.1.0 docker://REGISTRY/nccl-preflight:0.1.0
    docker load -i target/image/nccl-preflight.oci.tar     # or podman load

It prints each layer's size, compressed (what a registry stores and a node pulls) and not.
Standard library only.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

PACKAGES = [
    # distroless static (debian12)
    "base-files", "netbase", "tzdata", "media-types",
    # distroless base
    "libc6", "libssl3",
    # distroless cc
    "libgcc-s1", "libgomp1", "libstdc++6", "gcc-12-base",
    # the CA bundle distroless writes to /etc/ssl/certs/ca-certificates.crt
    "ca-certificates",
]
NONROOT = 65532
# A fixed time for every file and the image itself: the same inputs give the same digests.
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
ENTRYPOINT = "/usr/local/bin/nccl-preflight"
# NCCL_PREFLIGHT_IMAGE (the --image flag): this is nccl-preflight's own image, not the trainer's.
IMAGE_ROLE = "own"


def fail(message):
    print(f"build-oci: {message}", file=sys.stderr)
    sys.exit(2)


def fetch(debs):
    """The .deb of every package in `debs`, downloading the missing ones."""
    os.makedirs(debs, exist_ok=True)
    have = {f.split("_")[0]: f for f in os.listdir(debs) if f.endswith(".deb")}
    missing = [p for p in PACKAGES if p not in have]
    if missing:
        print(f"build-oci: apt-get download {' '.join(missing)}", file=sys.stderr)
        run = subprocess.run(["apt-get", "download", *missing], cwd=debs,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            fail(f"apt-get download {' '.join(missing)} failed: {run.stderr.strip()}")
        have = {f.split("_")[0]: f for f in os.listdir(debs) if f.endswith(".deb")}
    return [os.path.join(debs, have[p]) for p in PACKAGES]


def normalized(info, uid=0, gid=0):
    info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
    info.mtime = EPOCH
    return info


def add_bytes(tar, name, data, mode=0o644, uid=0, gid=0):
    info = normalized(tarfile.TarInfo(name), uid, gid)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar, name, mode=0o755, uid=0, gid=0):
    info = normalized(tarfile.TarInfo(name), uid, gid)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def base_layer(debs):
    """The distroless-equivalent root filesystem as one uncompressed tar."""
    out = io.BytesIO()
    seen = set()
    certs = []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for deb in debs:
            data = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], check=True,
                                  stdout=subprocess.PIPE).stdout
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src:
                for member in src:
                    name = member.name.removeprefix("./").rstrip("/")
                    if not name or name in seen:
                        continue
                    seen.add(name)
                    member.name = name
                    payload = src.extractfile(member) if member.isfile() else None
                    if payload is not None and name.startswith("usr/share/ca-certificates/mozilla/"):
                        content = payload.read()
                        certs.append((name, content))
                        payload = io.BytesIO(content)
                    tar.addfile(normalized(member), payload)
        # What distroless adds to the packages: users, groups, home, /tmp, the CA bundle.
        add_bytes(tar, "etc/passwd", (
            "root:x:0:0:root:/root:/sbin/nologin\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
            f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n").encode())
        add_bytes(tar, "etc/group", (
            "root:x:0:\nnobody:x:65534:\n"
            f"tty:x:5:\nstaff:x:50:\nnonroot:x:{NONROOT}:\n").encode())
        add_bytes(tar, "etc/nsswitch.conf", b"hosts: files dns\n")
        for d in ("home", "root"):
            if d not in seen:
                add_dir(tar, d, 0o755 if d == "home" else 0o700)
        add_dir(tar, "home/nonroot", 0o700, NONROOT, NONROOT)
        if "tmp" not in seen:
            add_dir(tar, "tmp", 0o1777)
        if not certs:
            fail("ca-certificates has no certificates under /usr/share/ca-certificates/mozilla")
        bundle = b"".join(c if c.endswith(b"\n") else c + b"\n" for _, c in sorted(certs))
        add_bytes(tar, "etc/ssl/certs/ca-certificates.crt", bundle)
    return out.getvalue()


def binary_layer(binary):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("usr", "usr/local", "usr/local/bin"):
            add_dir(tar, d)
        with open(binary, "rb") as f:
            add_bytes(tar, ENTRYPOINT.lstrip("/"), f.read(), mode=0o755)
    return out.getvalue()


def blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest)
    with open(path, "wb") as f:
        f.write(data)
    return f"sha256:{digest}", len(data)


def gzipped(data):
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=9) as z:
        z.write(data)
    return out.getvalue()


def version_of(binary):
    run = subprocess.run([binary, "--version"], stdout=subprocess.PIPE, text=True)
    words = run.stdout.split()
    if run.returncode != 0 or len(words) < 2:
        fail(f"{binary} --version failed: is it the nccl-preflight binary for this machine?")
    # "nccl-preflight 0.1.0 (commit abc, 2026-11-26)": the release is the second word.
    return words[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True, help="the release binary (scripts/release.sh)")
    parser.add_argument("--out", required=True, help="output folder: layout/ and the .oci.tar")
    parser.add_argument("--debs", help="folder of the base .debs (default OUT/debs; missing ones are downloaded)")
    parser.add_argument("--tag", help="image tag (default: the binary's version)")
    args = parser.parse_args()
    if not os.path.isfile(args.binary) or not os.access(args.binary, os.X_OK):
        fail(f"--binary {args.binary}: not an executable file")
    tag = args.tag or version_of(args.binary)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        fail(f"--tag {tag!r}: a tag is letters, digits, '_', '.' and '-', at most 128, not starting with '.' or '-'")
    out = os.path.abspath(args.out)
    debs = fetch(args.debs or os.path.join(out, "debs"))

    os.makedirs(out, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".layout.", dir=out)
    try:
        os.makedirs(os.path.join(staging, "blobs", "sha256"))
        layers, diff_ids, sizes = [], [], []
        for name, tar in (("base (distroless cc-debian12 packages)", base_layer(debs)),
                          ("nccl-preflight", binary_layer(args.binary))):
            diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
            digest, size = blob(staging, gzipped(tar))
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                           "digest": digest, "size": size})
            sizes.append((name, size, len(tar)))
        created = datetime.datetime.fromtimestamp(EPOCH, datetime.timezone.utc) \
            .strftime("%Y-%m-%dT%H:%M:%SZ")
        config = {
            "created": created,
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "User": f"{NONROOT}:{NONROOT}",
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                        # As docker/Dockerfile: this image holds none of the trainer's
                        # RDMA/NCCL libraries, so the checks of those skip in it.
                        f"NCCL_PREFLIGHT_IMAGE={IMAGE_ROLE}"],
                "Entrypoint": [ENTRYPOINT],
                "Cmd": ["check"],
                "WorkingDir": "/home/nonroot",
                "Labels": {"org.opencontainers.image.title": "nccl-preflight",
                           "org.opencontainers.image.version": tag},
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created": created, "created_by": f"build-oci.py: {name}"}
                        for name, _, _ in sizes],
        }
        config_digest, config_size = blob(staging, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": layers,
        }
        manifest_digest, manifest_size = blob(staging, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": manifest_digest, "size": manifest_size,
                           "annotations": {"org.opencontainers.image.ref.name": tag}}],
        }
        with open(os.path.join(staging, "index.json"), "w") as f:
            json.dump(index, f, sort_keys=True)
        with open(os.path.join(staging, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        # The archive `docker load`, `podman load` and `skopeo copy oci-archive:` take.
        # manifest.json beside the OCI files, as `docker save` writes since Docker 25: the
        # classic `docker load` reads that one, OCI tools read index.json.
        docker_manifest = json.dumps([{
            "Config": "blobs/sha256/" + config_digest.split(":")[1],
            "RepoTags": [f"nccl-preflight:{tag}"],
            "Layers": ["blobs/sha256/" + layer["digest"].split(":")[1] for layer in layers],
        }]).encode()
        archive = os.path.join(staging, ".archive")
        with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
            for entry in ("oci-layout", "index.json", "blobs"):
                tar.add(os.path.join(staging, entry), arcname=entry,
                        filter=lambda i: normalized(i))
            add_bytes(tar, "manifest.json", docker_manifest)
        # Nothing half-written: the old layout and archive are replaced only once the new ones are whole.
        os.chmod(staging, 0o755)
        final = os.path.join(out, "layout")
        os.replace(archive, os.path.join(out, "nccl-preflight.oci.tar"))
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    total_z = sum(z for _, z, _ in sizes)
    total = sum(u for _, _, u in sizes)
    for name, z, u in sizes:
        print(f"layer {name}: {z / 1e6:.2f} MB compressed, {u / 1e6:.2f} MB")
    print(f"image {tag}: {total_z / 1e6:.2f} MB compressed, {total / 1e6:.2f} MB unpacked; "
          f"{manifest_digest}")
    print(f"layout: {os.path.join(out, 'layout')} (tag {tag}); archive: "
          f"{os.path.join(out, 'nccl-preflight.oci.tar')}")


if __name__ == "__main__":
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            fail(f"{tool} not found: the base packages come from a Debian or Ubuntu machine's apt")
    try:
        main()
    except (OSError, subprocess.CalledProcessError) as e:
        fail(str(e))
