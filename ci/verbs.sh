#!/usr/bin/env bash
# ci/verbs.sh -- the verbs provider on a real kernel RDMA stack.
#
# Builds on the host (feature `verbs`): the `verbs_*` test binaries of
# krcore-nic (the conformance suite), krcore-kmod (the engine in RC fallback
# mode) and race-store (a RACE smoke test), plus the latency tool
# `krcore_lat` and the lease cost tool `lease_cost` (release). Runs the
# device-free unit tests of the provider on
# the host, then everything else inside ONE Soft-RoCE guest
# (../shared/softroce/softroce-run, rxe0): each test binary's #[ignore]d
# device tests, then krcore_lat (64 B READ / 8 B CAS latency through the
# provider and the SDK's VQP side by side with perftest, and the connect
# cost), then lease_cost (a NIC-enforced lease's key: register, revoke,
# expiry lag, checked at the NIC). The latency figures are printed, never judged (the guest is
# emulated); krcore_lat fails only if an operation fails. Then, in a
# second guest (rxe0 on dummy0, one GID per process), the deployment as
# separate processes (ci/deploy.sh: krcore-meta, two race-memnode,
# krcore-ycsb A/B/C/D/F verified, a killed memory node, krcore-elastic; and
# YCSB-C get latency beside ib_read_lat). Called from the
# repository root (by .ci/run) with ../shared beside it. Exits non-zero on
# any failure, naming every step that failed.
#
# Environment:
#   SOFTROCE_DIR       where softroce-run lives (default ../shared/softroce)
#   VERBS_TIMEOUT      seconds for the guest run (default 1500)
#   DEPLOY_TIMEOUT     seconds for the deployment's guest (default 1500)
#   VERBS_DEPLOY       0 skips the deployment step (default 1)
#   VERBS_LAT          0 skips the latency tool (default 1)
#   VERBS_LAT_ARGS     arguments of krcore_lat (default: --rounds 12 --iters 1500
#                      --pairs 3 --proc --proc-sdk --calibrate: twelve rounds in
#                      which perftest and our contenders take turns; 1,500
#                      round trips give each window about 15-20 turns per
#                      contender, against 4-5 with 300, which narrowed
#                      perftest_b's CAS spread from 0.76-1.87 to 0.91-1.13. The fair
#                      figures are the process contenders' (`provider_proc`,
#                      `sdk_vqp_proc`: children stopped and continued exactly
#                      like perftest's client); the in-process ones
#                      (`provider`, `sdk_vqp`, `sdk_request`) are still
#                      printed but are biased against us on rxe (a READ's
#                      tasklet preempts a never-stopped process on about every
#                      READ, see krcore_lat's docs). `--calibrate` adds
#                      perftest against itself (`perftest_b`): the tool's own
#                      spread, to read the ratios against; about 6.5 min in
#                      the guest)
#   CARGO_TARGET_DIR   honoured as usual
set -euo pipefail

cd "$(dirname "$0")/.."
SOFTROCE_DIR=${SOFTROCE_DIR:-../shared/softroce}
VERBS_TIMEOUT=${VERBS_TIMEOUT:-1500}
VERBS_DEPLOY=${VERBS_DEPLOY:-1}
VERBS_LAT=${VERBS_LAT:-1}
VERBS_LAT_ARGS=${VERBS_LAT_ARGS:---rounds 12 --iters 1500 --pairs 3 --proc --proc-sdk --calibrate}

say() { printf '[ci/verbs] %s\n' "$*" >&2; }

# --- build dependencies (rdma-sys runs bindgen against libibverbs/librdmacm)
missing=()
pkg-config --exists libibverbs 2>/dev/null || missing+=(libibverbs-dev)
pkg-config --exists librdmacm 2>/dev/null || missing+=(librdmacm-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
# bindgen loads libclang itself (libclang.so or libclang-N.so.1); the
# machine image ships only libclang-cpp.so.N, which does not count.
have_libclang() {
  local f
  for f in /usr/lib/llvm-*/lib/libclang.so /usr/lib/llvm-*/lib/libclang-*.so.1 \
           /usr/lib/x86_64-linux-gnu/libclang.so /usr/lib/x86_64-linux-gnu/libclang-*.so.1; do
    [ -e "$f" ] && return 0
  done
  [ -n "${LIBCLANG_PATH:-}" ] && ls "$LIBCLANG_PATH"/libclang.so* >/dev/null 2>&1
}
have_libclang || missing+=(libclang-dev)
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

# --- the promises with feature `verbs` (ci/extra.sh checks the default
# build): clippy with warnings as errors, docs with warnings as errors
feat=krcore-nic/verbs,krcore-kmod/verbs,krcore/verbs,race-store/verbs,krcore-cli/verbs,krcore-benches/verbs
say "clippy and docs with feature verbs"
cargo clippy -p krcore-nic -p krcore-kmod -p krcore -p race-store -p krcore-cli -p krcore-benches \
  --features "$feat" --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc -p krcore-nic -p krcore-kmod -p krcore -p race-store \
  --features krcore-nic/verbs,krcore-kmod/verbs,krcore/verbs,race-store/verbs --no-deps -q

# --- build on the host: every tests/verbs_*.rs of the three crates (only
# those targets: the default suite has built the rest without the feature)
say "building the verbs tests of krcore-nic, krcore-kmod and race-store"
tests=()
for f in nic/tests/verbs_*.rs kmod/tests/verbs_*.rs race-store/tests/verbs_*.rs; do
  [ -e "$f" ] && tests+=(--test "$(basename "$f" .rs)")
done
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cargo test -p krcore-nic -p krcore-kmod -p race-store --features verbs "${tests[@]}" \
  --no-run --message-format=json >"$json"
mapfile -t bins < <(
  grep '"reason":"compiler-artifact"' "$json" |
    grep '"kind":\["test"\]' |
    grep -o '"executable":"[^"]*"' |
    sed 's/^"executable":"//; s/"$//' |
    grep '/verbs_[^/]*$' | sort -u
)
# Every suite named here must have been built: a renamed or lost test
# target fails the stage instead of silently testing less.
for want in verbs_conformance verbs_engine verbs_smoke; do
  printf '%s\n' "${bins[@]}" | grep -q "/$want-[0-9a-f]*$" ||
    { say "no $want test binary in cargo's output"; exit 1; }
done

lat=
if [ "$VERBS_LAT" != 0 ]; then
  say "building krcore_lat (release)"
  cargo build --release -p krcore-examples --features verbs --example krcore_lat \
    --message-format=json >"$json"
  lat=$(grep '"reason":"compiler-artifact"' "$json" |
    grep -o '"executable":"[^"]*/krcore_lat"' |
    sed 's/^"executable":"//; s/"$//' | tail -n1)
  [ -n "$lat" ] && [ -x "$lat" ] || { say "krcore_lat was not built"; exit 1; }
fi

# lease_cost: what a NIC-enforced lease costs on rxe (its key's
# registration, revocation, expiry lag), with a check at the NIC.
say "building lease_cost (release)"
cargo build --release -p krcore-kmod --features verbs --example lease_cost \
  --message-format=json >"$json"
lease=$(grep '"reason":"compiler-artifact"' "$json" |
  grep -o '"executable":"[^"]*/lease_cost"' |
  sed 's/^"executable":"//; s/"$//' | tail -n1)
[ -n "$lease" ] && [ -x "$lease" ] || { say "lease_cost was not built"; exit 1; }

deploy_bin=
if [ "$VERBS_DEPLOY" != 0 ]; then
  say "building the deployment programs (release, verbs)"
  cargo build --release -p krcore-cli -p krcore-benches \
    --features krcore-cli/verbs,krcore-benches/verbs --bins --message-format=json >"$json"
  meta_bin=$(grep '"reason":"compiler-artifact"' "$json" |
    grep -o '"executable":"[^"]*/krcore-meta"' |
    sed 's/^"executable":"//; s/"$//' | tail -n1)
  [ -n "$meta_bin" ] && [ -x "$meta_bin" ] || { say "krcore-meta was not built"; exit 1; }
  deploy_bin=$(dirname "$meta_bin")
  for b in race-memnode race-kv krcore-ycsb krcore-elastic; do
    [ -x "$deploy_bin/$b" ] || { say "$b was not built"; exit 1; }
  done
fi

# --- device-free unit tests of the provider (receive tags, errors) on the host
say "host unit tests of the verbs module"
cargo test -p krcore-nic --features verbs --lib -- verbs::

# --- everything that needs a device, in one guest. The inner script runs
# every step even after a failure and exits with the number of failed steps.
inner='
failed=""
step() {
  name=$1; shift
  echo "[guest] === $name"
  t0=$SECONDS
  if "$@"; then echo "[guest] === $name: ok ($((SECONDS - t0)) s)"; else
    rc=$?; echo "[guest] === $name: FAILED (exit $rc, $((SECONDS - t0)) s)"; failed="$failed $name"; fi
}
export KRCORE_TEST_DEVICE="$SOFTROCE_DEV" KRCORE_TEST_GID_INDEX="$SOFTROCE_GID_INDEX"
lat=$1; lease=$2; shift 2
for bin in "$@"; do
  step "$(basename "$bin")" "$bin" --ignored --test-threads=1
done
step lease_cost "$lease" "verbs:$SOFTROCE_DEV,gid=$SOFTROCE_GID_INDEX" 2000 3
if [ -n "$lat" ]; then
  step krcore_lat "$lat" $VERBS_LAT_ARGS
fi
if [ -n "$failed" ]; then echo "[guest] failed:$failed"; exit 1; fi
echo "[guest] all steps passed"
'
say "running ${#bins[@]} test binaries, lease_cost${lat:+ and krcore_lat} in one Soft-RoCE guest"
set +e
VERBS_LAT_ARGS="$VERBS_LAT_ARGS" "$SOFTROCE_DIR/softroce-run" -t "$VERBS_TIMEOUT" -- \
  bash -c "$inner" verbs-guest "$lat" "$lease" "${bins[@]}"
rc=$?
set -e
# --- the deployment as separate processes, in a guest of its own whose
# rxe0 sits on dummy0 (so that each process gets a GID of its own: a node
# is a GID): workloads A, B, C, D and F on 20,000 records with 10,000
# operations each, verified (about 6 min in the guest).
if [ -n "$deploy_bin" ]; then
  say "running the deployment (ci/deploy.sh) in a Soft-RoCE guest (netdev dummy)"
  set +e
  DEPLOY_GIDS=1 DEPLOY_LAT=1 DEPLOY_MB=256 DEPLOY_RECORDS=${DEPLOY_RECORDS:-20000} \
    DEPLOY_OPS=${DEPLOY_OPS:-10000} DEPLOY_LAT_OPS=${DEPLOY_LAT_OPS:-3000} SOFTROCE_DIR="$SOFTROCE_DIR" \
    "$SOFTROCE_DIR/softroce-run" -t "${DEPLOY_TIMEOUT:-1500}" --netdev dummy -- \
    ci/deploy.sh "verbs:rxe0" "$deploy_bin"
  drc=$?
  set -e
  if [ "$drc" != 0 ]; then
    say "the deployment step failed (exit $drc)"
    [ "$rc" = 0 ] && rc=$drc
  fi
fi

case $rc in
  0) say "all verbs steps passed" ;;
  124) say "the guest timed out after ${VERBS_TIMEOUT}s" ;;
  125) say "the Soft-RoCE guest failed" ;;
  *) say "verbs steps failed (see the [guest] lines above)" ;;
esac
exit $rc
