#!/usr/bin/env bash
# Extra CI suites, run by .ci/run after the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== loom models (ci/loom.sh)"
ci/loom.sh

echo "== the deployment as separate processes on a sim fabric (ci/deploy.sh)"
cargo build -p krcore-cli -p krcore-benches --bins
DEPLOY_PORT=7491 ci/deploy.sh "sim:krcore-ci-deploy-$$" "${CARGO_TARGET_DIR:-target}/debug"

if [ -x ci/verbs.sh ]; then
    echo "== verbs provider on Soft-RoCE (ci/verbs.sh)"
    ci/verbs.sh
fi
