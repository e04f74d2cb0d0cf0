#!/usr/bin/env bash
# The local demo, the README's main command: sets up what it needs (hack/setup.sh), then runs
# `python -m devkit.demo` (same as `tailtune demo`) with the given flags, e.g. --quick.
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/setup.sh
exec .venv/bin/python -m devkit.demo "$@"
