#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for FUZZ_SECONDS (default 60) each, on the
# stable toolchain (libFuzzer coverage, no sanitizer), and prints libFuzzer's
# final stats line (execs/s, coverage) per target. Exits non-zero on a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
for t in $(cargo fuzz list); do
    echo "== $t (${FUZZ_SECONDS}s)"
    mkdir -p "corpus/$t"
    cargo fuzz run --sanitizer none --release "$t" "corpus/$t" -- \
        -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 2>&1 \
        | grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb|ERROR|==[0-9]+== ERROR|panicked|Done)" || true
    if ls "artifacts/$t"/crash-* >/dev/null 2>&1; then
        echo "finding in $t: $(ls artifacts/$t)"
        exit 1
    fi
done
