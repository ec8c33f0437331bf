#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for FUZZ_SECONDS (default 60) each, one
# after the other under `nice -n 10`, on the stable toolchain (libFuzzer
# coverage, no sanitizer), and prints a summary table: execs/s, coverage
# (libFuzzer's cov = edges, ft = features) and corpus size per target.
# Exits non-zero on a finding (a crash/panic input lands in
# fuzz/artifacts/<target>/). Arguments: target names to run (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
summary=()
status=0
for t in "${targets[@]}"; do
    echo "== $t (${FUZZ_SECONDS}s)"
    mkdir -p "corpus/$t"
    log=$(mktemp)
    nice -n 10 cargo fuzz run --sanitizer none --release "$t" "corpus/$t" -- \
        -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 >"$log" 2>&1 || true
    grep -E "^(#[0-9]+.*DONE|stat::|==[0-9]+== ERROR|.*panicked|Done|SUMMARY)" "$log" || true
    done_line=$(grep -E "^#[0-9]+.*DONE" "$log" | tail -1 || true)
    execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
    corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$done_line")
    finding=none
    if ls "artifacts/$t"/crash-* >/dev/null 2>&1 || [ -z "$done_line" ]; then
        finding="FOUND: $(ls "artifacts/$t" 2>/dev/null | tr '\n' ' ')"
        tail -30 "$log"
        status=1
    fi
    summary+=("$(printf '%-16s %10s %6s %6s %12s  %s' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$finding")")
    rm -f "$log"
done
echo
printf '%-16s %10s %6s %6s %12s  %s\n' target "execs/s" cov ft corpus findings
printf '%s\n' "${summary[@]}"
exit $status
