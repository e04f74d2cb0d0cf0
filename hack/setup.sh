#!/usr/bin/env bash
# Sets up a fresh machine for tailtune's tests and demo: Debian packages, the Python venv, the local
# cluster's binaries (built once from the Go module proxy, cached by version under ~/.cache/tailtune).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[setup] $*" >&2; }
done_in() { log "$1 done in $((SECONDS - $2)) s"; }

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v openssl >/dev/null || need_apt+=(openssl)
ldconfig -p | grep -q libb64.so.0d || need_apt+=(libb64-0d)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"; t=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  done_in "apt-get install" "$t"
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.tailtune-deps
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing Python dependencies into .venv (a few minutes the first time)"; t=$SECONDS
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  # tensorrt-stubs declares a dependency on TensorRT itself, which is not installable here: stubs only.
  .venv/bin/pip install -q --no-deps tensorrt-stubs
  touch "$stamp"
  done_in "Python dependencies" "$t"
fi
if [ ! -d .typings/tensorrt ]; then
  PATH="$PWD/.venv/bin:$PATH" bash hack/tensorrt-stubs.sh .typings
fi

# build.sh prints one line per binary it builds (nothing when cached) and keeps Go's output in its log file.
log "local cluster binaries"; t=$SECONDS
bash hack/cluster/build.sh >/dev/null
done_in "local cluster binaries" "$t"
