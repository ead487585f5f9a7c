#!/usr/bin/env bash
# Fetches real NCCL builds from PyPI for the differential tests (issue 25): tests run
# ncclGetVersion/ncclGetUniqueId of each, which need no GPU, and compare what NCCL
# prints with what the tool predicts.
#
# Cache layout (stable; other tests read it too):
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nccl-preflight/nccl/<version>/libnccl.so.2
# where <version> is NCCL's own (2.21.5), one directory per version, holding only the
# library from the wheel's nvidia/nccl/lib/ (the wheel itself is not kept). A directory
# appears only once its library is complete (extracted to a temporary name, renamed).
# NCCL_PREFLIGHT_NCCL_CACHE overrides the nccl/ directory.
#
# Usage: scripts/nccl-wheels.sh [VERSION...]   (default: the spread below)
# Safe to run again: versions already cached are skipped; a fresh machine downloads once
# (~14 wheels of 190-250 MB; only the ~200-400 MB libraries stay).
set -euo pipefail

cache="${NCCL_PREFLIGHT_NCCL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nccl-preflight/nccl}"
# nvidia-nccl-cu11 carries 2.13-2.21, nvidia-nccl-cu12 2.16-2.32: one build per minor
# version NCCL changed its bootstrap or plugin code in, the newest patch of each.
default_versions=(2.13.4 2.16.5 2.18.3 2.19.3 2.21.5 2.23.4 2.24.3 2.26.5 2.27.7 2.28.9
  2.29.7 2.30.7 2.31.2 2.32.3)
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=("${default_versions[@]}"); fi

package_for() {
  case "$1" in
    2.13.* | 2.14.* | 2.15.*) echo nvidia-nccl-cu11 ;;
    *) echo nvidia-nccl-cu12 ;;
  esac
}

pip_cmd=()
find_pip() {
  if [ "${#pip_cmd[@]}" -gt 0 ]; then return; fi
  if python3 -m pip --version >/dev/null 2>&1; then
    pip_cmd=(python3 -m pip)
  else
    # Debian's python3 has no pip without python3-pip: a venv of our own brings it.
    local venv="$cache/.venv"
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    pip_cmd=("$venv/bin/pip")
  fi
}

mkdir -p "$cache"
for v in "${versions[@]}"; do
  case "$v" in
    [0-9]*.[0-9]*.[0-9]*) ;;
    *) echo "nccl-wheels: not a version: $v" >&2; exit 2 ;;
  esac
  dest="$cache/$v/libnccl.so.2"
  [ -s "$dest" ] && continue
  find_pip
  pkg="$(package_for "$v")"
  work="$(mktemp -d "$cache/.download.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo "nccl-wheels: fetching $pkg==$v" >&2
  start=$(date +%s)
  "${pip_cmd[@]}" download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$work" "$pkg==$v"
  wheel=("$work"/*.whl)
  mkdir -p "$cache/$v"
  # Only the library: the wheel's other files (headers, the package) are not needed.
  python3 - "${wheel[0]}" "$cache/$v/.libnccl.so.2.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.endswith("/lib/libnccl.so.2")]
    if len(names) != 1:
        sys.exit(f"nccl-wheels: {sys.argv[1]}: expected one lib/libnccl.so.2, found {names}")
    with z.open(names[0]) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  mv "$cache/$v/.libnccl.so.2.part" "$dest"
  rm -rf "$work"
  trap - EXIT
  echo "nccl-wheels: $v cached in $(($(date +%s) - start)) s ($(du -h "$dest" | cut -f1))" >&2
done
