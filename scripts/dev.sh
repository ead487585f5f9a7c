#!/usr/bin/env bash
# The two everyday commands, each setting up a fresh Debian/Ubuntu machine first:
#   scripts/dev.sh check [FLAGS]   build, check this machine, print the report
#   scripts/dev.sh test            run every test (the real-kernel tests need root)
set -euo pipefail
cd "$(dirname "$0")/.."
# `check` needs only what builds the binary; `test` also what the tests drive.
scripts/setup.sh "$([ "${1:-}" = test ] && echo test || echo build)"
export PATH="$HOME/.cargo/bin:$PATH"

case "${1:-}" in
  check)
    shift
    # The first build takes about 100 s on 2 cores: say so, and let cargo show its progress.
    echo "dev.sh: building the release binary (cargo build --release; about 100 s the first time)" >&2
    cargo build --release
    echo "dev.sh: checking this machine (nccl-preflight check $*)" >&2
    exec target/release/nccl-preflight check "$@"
    ;;
  test)
    echo "dev.sh: building and running every test (cargo test --all-targets; several minutes)" >&2
    exec cargo test --all-targets
    ;;
  *)
    echo "usage: scripts/dev.sh check [FLAGS] | test" >&2
    exit 2
    ;;
esac
