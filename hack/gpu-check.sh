#!/usr/bin/env bash
# Run the engine builder's GPU test (tests/gpu) on a machine with an NVIDIA GPU.
#
#   hack/gpu-check.sh            from the repo root; PYTHON=... to pick the interpreter
#
# It reports the GPU and TensorRT it finds, tries `pip install tensorrt` when TensorRT is
# missing (NVIDIA's TensorRT/Triton images have it already), then runs the test. Everything
# it prints also goes to $OUT/gpu-check.log, and pytest's report to $OUT/gpu-junit.xml, when
# OUT is set. Exit: pytest's status; 3 when no GPU is visible; 4 when TensorRT is unavailable.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-}
if [[ -n $out ]]; then
  mkdir -p "$out"
  exec > >(tee "$out/gpu-check.log") 2>&1
fi
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

has_tensorrt() { "$py" -c 'import tensorrt, sys; sys.exit(0 if hasattr(tensorrt, "Builder") else 1)' 2>/dev/null; }
has_module() { "$py" -c "import $1" 2>/dev/null; }

echo "== GPU"
if ! nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader; then
  echo "no GPU visible (nvidia-smi failed): nothing to check here"
  exit 3
fi

echo "== TensorRT"
if ! has_tensorrt; then
  echo "TensorRT not importable with $py; trying pip install tensorrt"
  "$py" -m pip install --quiet tensorrt || echo "pip install tensorrt failed"
fi
if ! has_tensorrt; then
  echo "TensorRT unavailable: run this in NVIDIA's TensorRT or Triton image, or install TensorRT"
  exit 4
fi
"$py" -c 'import tensorrt; print("tensorrt", tensorrt.__version__)'

echo "== Python packages"
for pkg in onnx pytest numpy; do
  has_module "$pkg" || "$py" -m pip install --quiet "$pkg" || echo "pip install $pkg failed"
done
# pyproject.toml sets a pytest-timeout option; without the plugin that is only a warning.
extra=()
has_module pytest_timeout || "$py" -m pip install --quiet pytest-timeout || extra+=(-W "ignore::pytest.PytestConfigWarning")
"$py" -c 'import onnx, pytest; print("onnx", onnx.__version__, "pytest", pytest.__version__)'

echo "== tests/gpu"
junit=()
[[ -n $out ]] && junit=(--junitxml "$out/gpu-junit.xml")
"$py" -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider "${extra[@]}" "${junit[@]}"
status=$?
echo "== pytest exit $status"
exit $status
