#!/usr/bin/env bash
# The README's test command: sets up what the tests need, runs the quality gates, then the whole suite
# (unit, real Triton, real Prometheus, real local Kubernetes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# One BLAS thread per process: the tuner's numpy work is on small arrays, and OpenBLAS's second thread mostly
# spins (one law test over its whole family: 37.8 s of CPU in 19.2 s -> 21.8 s in 21.8 s), a core
# taken from the cluster, the tritonservers and the operator beside it on a 2-core machine.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "[test] ruff";         ruff check tailtune devkit tests bench
echo "[test] mypy";         mypy tailtune devkit
echo "[test] import-linter"; lint-imports
echo "[test] CRD current";   tailtune crds --check
echo "[test] pytest"
exec pytest -q -rs "$@"
