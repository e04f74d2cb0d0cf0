#!/usr/bin/env bash
# Copy tensorrt-stubs out of site-packages into a folder mypy reads through mypy_path, fixing
# what keeps mypy from using them as shipped (10.13.0.35.1): the `tensorrt/` package has no
# py.typed (mypy: import-untyped), and five stubs are not Python (`in` as a parameter name, a
# non-default parameter after defaults).
set -euo pipefail
dest=${1:-.typings}
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$dest/tensorrt" "$dest/tensorrt_bindings"
mkdir -p "$dest"
cp -r "$site/tensorrt" "$site/tensorrt_bindings" "$dest/"
sed -i -E \
  -e 's/\((self(: [A-Za-z0-9]+)?), in: /(\1, in_: /' \
  -e 's/power: Weights = None, channel_axis: int\)/power: Weights = None, channel_axis: int = ...)/' \
  "$dest/tensorrt_bindings/tensorrt.pyi"
