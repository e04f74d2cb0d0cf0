#!/usr/bin/env bash
# Sets up a fresh machine for tailtune's tests and demo: Debian packages, the Python venv, the local
# cluster's binaries (built once from the Go module proxy, cached by version under ~/.cache/tailtune).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[setup] $*" >&2; }

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v openssl >/dev/null || need_apt+=(openssl)
ldconfig -p | grep -q libb64.so.0d || need_apt+=(libb64-0d)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.tailtune-deps
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing Python dependencies"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  # tensorrt-stubs declares a dependency on TensorRT itself, which is not installable here: stubs only.
  .venv/bin/pip install -q --no-deps tensorrt-stubs
  touch "$stamp"
fi
if [ ! -d .typings/tensorrt ]; then
  PATH="$PWD/.venv/bin:$PATH" bash hack/tensorrt-stubs.sh .typings
fi

log "local cluster binaries"
bash hack/cluster/build.sh >/dev/null
