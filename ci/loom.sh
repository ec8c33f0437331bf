#!/usr/bin/env bash
# Runs the loom models (loom-tests/) in release with LOOM_MAX_PREEMPTIONS=2,
# under the project-specific cfg, in a target directory of their own (the cfg
# changes every crate's build).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg krcore_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
cargo test -p krcore-loom-tests --release -- --test-threads=1 "$@"
