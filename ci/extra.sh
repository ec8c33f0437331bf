#!/usr/bin/env bash
# Extra CI suites, run by .ci/run after the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== loom models (ci/loom.sh)"
ci/loom.sh

if [ -x ci/verbs.sh ]; then
    echo "== verbs provider on Soft-RoCE (ci/verbs.sh)"
    ci/verbs.sh
fi
