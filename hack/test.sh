#!/usr/bin/env bash
# The README's test command: sets up what the tests need, runs the quality gates, then the whole suite
# (unit, real Triton, real Prometheus, real local Kubernetes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "[test] ruff";         ruff check tailtune devkit tests bench
echo "[test] mypy";         mypy tailtune devkit
echo "[test] import-linter"; lint-imports
echo "[test] CRD current";   tailtune crds --check
echo "[test] pytest"
exec pytest -q -rs "$@"
