"""The onnxruntime backend: no build, but load the model once so unsupported ops fail here, not in Triton."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tailtune.engine_builder.errors import BuildError, Failure

_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_UNSUPPORTED_OP_MARKS = (
    "is not a registered function/op",
    "Could not find an implementation",
    "NOT_IMPLEMENTED",
)


def onnxruntime_version() -> str | None:
    """The installed onnxruntime version, or None where the image has none."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return None
    return str(ort.__version__)


def check_loads(onnx_path: Path) -> bool:
    """Open the model in onnxruntime on CPU; False when onnxruntime is absent (nothing checked).

    Raises UNSUPPORTED_OP for ops onnxruntime has no kernel for, CORRUPT_MODEL for other load errors.
    """
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return False
    options = ort.SessionOptions()
    # Only kernel lookup matters here; skipping graph rewrites keeps the check cheap on big models.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own pybind exception classes
        message = _ORT_PREFIX.sub("", " ".join(str(exc).split()))[:600]
        unsupported = any(mark in message for mark in _UNSUPPORTED_OP_MARKS)
        failure = Failure.UNSUPPORTED_OP if unsupported else Failure.CORRUPT_MODEL
        raise BuildError(failure, f"onnxruntime cannot load the model: {message}") from None
    return True
