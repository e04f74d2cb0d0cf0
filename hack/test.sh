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
if [ $# -gt 0 ]; then exec pytest -q -rs "$@"; fi

# The whole suite as two pytest sessions side by side: the real-tritonserver tests (tests/demo, tests/triton:
# mostly waiting on 60 s canary windows, Triton's fixed summary window) beside everything else (unit, real
# Prometheus, the local cluster's e2e, chart, README). One after the other they took ~20 minutes on 2 cores, most
# of it waiting; side by side each waits while the other computes. Each session owns its real components (its own
# clusters, servers and ports) and tears them down on its own. The first session's output goes to a log file,
# printed when both are done; its failures make this command fail as the second's do.
# The generative e2e test (~150 s) brings up a demo cluster of its own (not the session's cluster fixture) around
# real tritonservers: it joins that side, which otherwise ends minutes before the rest (CI at 43f5acc: 11.5 vs 15.8
# min; the generative canary's e2e, ~80 s, stays with the rest to keep the two sides about even).
logs=.cache/test-logs
mkdir -p "$logs"
triton_log="$logs/triton-and-demo.log"
beside=(tests/demo tests/triton tests/e2e/test_generative.py)
ignored=()
for path in "${beside[@]}"; do ignored+=("--ignore=$path"); done
echo "[test] ${beside[*]} run beside the rest; their output: $triton_log"
pytest -q -rs "${beside[@]}" >"$triton_log" 2>&1 &
triton_pid=$!
pytest -q -rs tests "${ignored[@]}" &
rest_pid=$!
# SIGTERM/SIGINT/SIGHUP reach both sessions (each unwinds its fixtures: tests/conftest.py); this script waits for
# their cleanup. (Background jobs of a script ignore SIGINT, so Ctrl-C is passed on as SIGTERM.)
stop() { kill -TERM "$triton_pid" "$rest_pid" 2>/dev/null || true; }
trap stop TERM INT HUP
rest_rc=0; triton_rc=0
wait "$rest_pid" || rest_rc=$?
wait "$triton_pid" || triton_rc=$?
# A signal interrupts `wait` (status > 128) before the session has ended: wait again for its cleanup.
while kill -0 "$rest_pid" 2>/dev/null || kill -0 "$triton_pid" 2>/dev/null; do sleep 1; done
echo "[test] ${beside[*]} (from $triton_log):"
if [ "$triton_rc" -eq 0 ]; then tail -n 25 "$triton_log"; else cat "$triton_log"; fi
echo "[test] exit codes: rest $rest_rc, beside (tests/demo, tests/triton, generative e2e) $triton_rc"
[ "$rest_rc" -eq 0 ] && [ "$triton_rc" -eq 0 ]
