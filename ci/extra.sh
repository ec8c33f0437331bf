#!/usr/bin/env bash
# Extra CI suites, run by .ci/run after the README's test command: the
# checks of what the code promises (formatting, the engine's import
# structure, clippy with warnings as errors, docs), the loom models, longer
# race-store linearizability histories, the deployment as separate processes on
# a sim fabric, a 30 s soak with client kills, a fuzz smoke, and the verbs
# provider on Soft-RoCE. Prints each step's duration; stops at the first
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."

durations=()
step() {
    local name=$1 t0=$SECONDS
    shift
    echo "== $name"
    "$@"
    durations+=("$(printf '%-44s %5d s' "$name" $((SECONDS - t0)))")
    echo "== $name: ok ($((SECONDS - t0)) s)"
}
trap 'printf "== step durations\n"; printf "%s\n" "${durations[@]}"' EXIT

step "formatting (cargo fmt --check)" cargo fmt --all -- --check
import_structure() {
    if ! command -v python3 >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
    fi
    # No import circle in the engine crate, and no file importing from a
    # module that contains it (docs/design.md, section 1.4).
    python3 ci/imports.py kmod/src --max-upward 0
    # No import circle in the other crates.
    for d in nic/src meta/src sdk/src race-store/src benches/src cli/src examples/src loom-tests/src; do
        python3 ci/imports.py "$d"
    done
}
step "import structure (ci/imports.py)" import_structure
step "clippy, warnings as errors" cargo clippy --workspace --all-targets -- -D warnings
step "docs, warnings as errors" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
step "loom models (ci/loom.sh)" ci/loom.sh
step "race-store histories, 1,500 seeds each (linearizability)" \
    env RACE_SIM_SEEDS=1500 cargo test -p race-store --test linearizable
deploy_sim() {
    cargo build -p krcore-cli -p krcore-benches --bins
    DEPLOY_PORT=7491 ci/deploy.sh "sim:krcore-ci-deploy-$$" "${CARGO_TARGET_DIR:-target}/debug"
}
step "the deployment as separate processes on sim (ci/deploy.sh)" deploy_sim
step "soak: 30 s of client kills, own engines then attached to a daemon (krcore-soak)" \
    cargo test -p krcore-benches --test drivers -- --ignored short_soak
redis_backend() {
    if ! command -v redis-server >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    fi
    KRCORE_NEED_REDIS=1 cargo test -p krcore-benches --lib driver::redis
}
step "the redis backend against redis-server" redis_backend
step "fuzz smoke: every target 20 s (ci/fuzz.sh)" env FUZZ_SECONDS="${FUZZ_SECONDS:-20}" ci/fuzz.sh
if [ -x ci/verbs.sh ]; then
    step "verbs provider on Soft-RoCE (ci/verbs.sh)" ci/verbs.sh
fi
