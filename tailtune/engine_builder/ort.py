"""The onnxruntime backend: no build, but load the model once so unsupported ops fail here, not in Triton."""

from __future__ import annotations

import importlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tailtune.engine_builder import timing
from tailtune.engine_builder.errors import BuildError, Failure
from tailtune.engine_builder.onnx_model import DimRanges, TensorInfo

log = logging.getLogger(__name__)

_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_UNSUPPORTED_OP_MARKS = (
    "is not a registered function/op",
    "Could not find an implementation",
    "NOT_IMPLEMENTED",
)
# ONNX element type -> numpy dtype of the zero inputs timing feeds; a model with another input type is not timed.
_NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FLOAT16": np.float16,
    "FLOAT": np.float32,
    "DOUBLE": np.float64,
}


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


def time_ladder(
    onnx_path: Path,
    inputs: Sequence[TensorInfo],
    sizes: Sequence[int],
    dim_ranges: DimRanges,
    *,
    warmup: int = timing.WARMUP_RUNS,
    runs: int = timing.TIMED_RUNS,
    clock: Callable[[], float] = time.perf_counter,
) -> timing.ServiceTime:
    """Median ms of one `InferenceSession.run` on zero inputs at each batch size; () when it cannot time.

    The session takes the GPU when this onnxruntime has CUDA (the serving device), else the CPU.
    """
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return ()
    if any(t.dims is None or t.onnx_dtype not in _NUMPY_DTYPES for t in inputs):
        log.warning("service time not measured: an input has an unknown rank or a type timing cannot feed")
        return ()
    available = ort.get_available_providers()
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own pybind exception classes
        log.warning("service time not measured: onnxruntime cannot open the model with %s: %s", providers, exc)
        return ()

    def prepare(batch: int) -> Callable[[], None]:
        feed = {
            t.name: np.zeros(timing.input_shape(t.name, t.dims or (), batch, dim_ranges), _NUMPY_DTYPES[t.onnx_dtype])
            for t in inputs
        }

        def run() -> None:
            session.run(None, feed)

        return run

    def on_error(batch: int, exc: Exception) -> None:
        log.warning("service time: onnxruntime failed at batch %d (%s); ladder ends there", batch, exc)

    return timing.time_ladder(sizes, prepare, warmup=warmup, runs=runs, clock=clock, on_error=on_error)
