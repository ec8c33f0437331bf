#!/usr/bin/env bash
# ci/verbs.sh -- the verbs provider on a real kernel RDMA stack.
#
# Builds krcore-nic's verbs tests on the host (feature `verbs`), runs the
# device-free unit tests there, then runs every `verbs_*` test binary's
# #[ignore]d device tests inside a Soft-RoCE guest
# (../shared/softroce/softroce-run, rxe0). Called from the repository root
# (by .ci/run) with ../shared beside it. Exits non-zero on any failure.
#
# Environment:
#   SOFTROCE_DIR       where softroce-run lives (default ../shared/softroce)
#   VERBS_TIMEOUT      seconds per guest run (default 900)
#   CARGO_TARGET_DIR   honoured as usual
set -euo pipefail

cd "$(dirname "$0")/.."
SOFTROCE_DIR=${SOFTROCE_DIR:-../shared/softroce}
VERBS_TIMEOUT=${VERBS_TIMEOUT:-900}

say() { printf '[ci/verbs] %s\n' "$*" >&2; }

# --- build dependencies (rdma-sys runs bindgen against libibverbs/librdmacm)
missing=()
pkg-config --exists libibverbs 2>/dev/null || missing+=(libibverbs-dev)
pkg-config --exists librdmacm 2>/dev/null || missing+=(librdmacm-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || missing+=(libclang-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "missing build dependencies: ${missing[*]} (run as root or install them)"
    exit 1
  fi
fi

[ -x "$SOFTROCE_DIR/softroce-run" ] || { say "no $SOFTROCE_DIR/softroce-run"; exit 1; }

# --- build on the host; collect the verbs_* test executables
say "building krcore-nic and krcore-kmod tests with --features verbs"
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cargo test -p krcore-nic -p krcore-kmod --features verbs --no-run --message-format=json >"$json"
mapfile -t bins < <(
  grep '"reason":"compiler-artifact"' "$json" |
    grep '"kind":\["test"\]' |
    grep -o '"executable":"[^"]*"' |
    sed 's/^"executable":"//; s/"$//' |
    grep '/verbs_[^/]*$' | sort -u
)
if [ ${#bins[@]} -eq 0 ]; then
  say "no verbs_* test binary found in cargo's output"
  exit 1
fi

# --- device-free unit tests of the provider (receive tags, errors) on the host
say "host unit tests of the verbs module"
cargo test -p krcore-nic --features verbs --lib -- verbs::

# --- device tests in the guest, one guest per binary
status=0
for bin in "${bins[@]}"; do
  say "running $(basename "$bin") in Soft-RoCE"
  set +e
  "$SOFTROCE_DIR/softroce-run" -t "$VERBS_TIMEOUT" -- sh -c \
    'KRCORE_TEST_DEVICE="$SOFTROCE_DEV" KRCORE_TEST_GID_INDEX="$SOFTROCE_GID_INDEX" exec "$0" --ignored --test-threads=1' \
    "$bin"
  rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    case $rc in
      124) say "$(basename "$bin"): timed out after ${VERBS_TIMEOUT}s" ;;
      125) say "$(basename "$bin"): the Soft-RoCE guest failed" ;;
      *) say "$(basename "$bin"): failed (exit $rc)" ;;
    esac
    status=1
  fi
done
exit $status
