#!/usr/bin/env bash
# Builds the release binary against glibc 2.17 with cargo-zigbuild, so it runs on
# old nodes and inside any training image, and proves it needs nothing beyond
# glibc at load time. Output: dist/nccl-preflight.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
target=x86_64-unknown-linux-gnu

# zig comes from PyPI (ziglang), in a virtual environment of its own.
venv=target/zig-venv
if ! "$venv/bin/python3" -c 'import ziglang' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet ziglang
fi
export PATH="$PWD/$venv/bin:$PATH"
command -v cargo-zigbuild >/dev/null 2>&1 || cargo install --quiet --locked cargo-zigbuild
rustup target add "$target" >/dev/null 2>&1 || true

cargo zigbuild --release --quiet --target "$target.2.17"
mkdir -p dist
cp "target/$target/release/nccl-preflight" dist/nccl-preflight.tmp
mv dist/nccl-preflight.tmp dist/nccl-preflight

# The same allowed-library list the test suite uses, plus the glibc symbol versions.
NCCL_PREFLIGHT_RELEASE_BIN="$PWD/dist/nccl-preflight" \
  cargo test --quiet --test integration binary::release -- --ignored
ls -l dist/nccl-preflight
