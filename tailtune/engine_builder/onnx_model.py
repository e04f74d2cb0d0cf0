"""Inspect an ONNX model and decide whether a backend can serve it.

`load_model_info` reads names, dtypes and dims (dynamic dims as -1); `check_servable` is pure
and refuses what Triton or the backend cannot serve with a message naming the tensor and dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from tailtune.engine_builder.errors import BuildError, Failure

DYNAMIC = -1

# ONNX element type name -> Triton data type. Types absent here (complex, float8, int4, ...)
# have no Triton equivalent and cannot be a served input or output.
TRITON_DTYPES: dict[str, str] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FLOAT16": "TYPE_FP16",
    "FLOAT": "TYPE_FP32",
    "DOUBLE": "TYPE_FP64",
    "BFLOAT16": "TYPE_BF16",
    "STRING": "TYPE_STRING",
}
# Network I/O types TensorRT 10 accepts (and Triton can carry).
TENSORRT_IO_DTYPES = frozenset({"BOOL", "UINT8", "INT8", "INT32", "INT64", "FLOAT16", "FLOAT", "BFLOAT16"})

DimRanges = Mapping[tuple[str, int], tuple[int, int, int]]


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output. `dims` is None when the model does not give its rank."""

    name: str
    onnx_dtype: str
    dims: tuple[int, ...] | None

    @property
    def triton_dtype(self) -> str | None:
        return TRITON_DTYPES.get(self.onnx_dtype)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.triton_dtype,
            "onnxDtype": self.onnx_dtype,
            "dims": None if self.dims is None else list(self.dims),
        }


@dataclass(frozen=True)
class ModelInfo:
    """What the build needs to know about a model's graph."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int
    op_types: frozenset[str]


def load_model_info(path: Path) -> ModelInfo:
    """Check the model with `onnx.checker` and read its I/O. Raises CORRUPT_MODEL or UNSUPPORTED_OP."""
    try:
        # By path, so models over 2 GiB with external data are checked without loading them whole.
        onnx.checker.check_model(str(path))
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises ValidationError, DecodeError, RuntimeError, ... for bad files
        message = _one_line(exc)
        failure = Failure.UNSUPPORTED_OP if "No Op registered" in message else Failure.CORRUPT_MODEL
        raise BuildError(failure, f"{path.name}: {message}") from None
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    return ModelInfo(
        # Old exporters list weights as graph inputs too; they are not served inputs.
        inputs=tuple(_tensor_info(v) for v in graph.input if v.name not in initializers),
        outputs=tuple(_tensor_info(v) for v in graph.output),
        opset=max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0),
        op_types=frozenset(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.node),
    )


def check_servable(info: ModelInfo, *, backend: str, max_batch: int, dim_ranges: DimRanges) -> None:
    """Refuse a model the backend cannot serve in a batch of up to `max_batch`. Pure.

    Dim 0 of every input is the batch dim: dynamic, or fixed at 1 when `max_batch` is 1.
    For TensorRT every other dynamic input dim needs a (min, opt, max) in `dim_ranges`.
    """
    if not info.inputs:
        raise BuildError(Failure.UNSUPPORTED_TENSOR, "the model has no inputs to serve")
    for tensor, kind in [(t, "input") for t in info.inputs] + [(t, "output") for t in info.outputs]:
        _check_dtype(tensor, kind, backend)
    for tensor in info.inputs:
        _check_batch_dim(tensor, max_batch)
    inputs = {t.name: t for t in info.inputs}
    for (name, axis), (lo, opt, hi) in dim_ranges.items():
        dims = inputs[name].dims if name in inputs else None
        if dims is None or not 0 < axis < len(dims):
            raise BuildError(Failure.INVALID_ARGUMENTS, f"--dim {name}:{axis}: the model has no input dim like that")
        if dims[axis] != DYNAMIC:
            raise BuildError(Failure.INVALID_ARGUMENTS, f"--dim {name}:{axis}: that dim is fixed at {dims[axis]}")
        if not 1 <= lo <= opt <= hi:
            raise BuildError(Failure.INVALID_ARGUMENTS, f"--dim {name}:{axis}: need 1 <= min <= opt <= max")
    if backend == "tensorrt":
        for tensor in info.inputs:
            for axis, size in enumerate(tensor.dims or ()):
                if axis > 0 and size == DYNAMIC and (tensor.name, axis) not in dim_ranges:
                    raise BuildError(
                        Failure.UNSUPPORTED_TENSOR,
                        f"input {tensor.name!r} dim {axis} is dynamic: give TensorRT its range with "
                        f"--dim {tensor.name}:{axis}=MIN,OPT,MAX",
                    )


def _check_dtype(tensor: TensorInfo, kind: str, backend: str) -> None:
    if tensor.triton_dtype is None:
        raise BuildError(
            Failure.UNSUPPORTED_TENSOR,
            f"{kind} {tensor.name!r} has dtype {tensor.onnx_dtype}, which Triton cannot serve",
        )
    if backend == "tensorrt" and tensor.onnx_dtype not in TENSORRT_IO_DTYPES:
        raise BuildError(
            Failure.UNSUPPORTED_TENSOR,
            f"{kind} {tensor.name!r} has dtype {tensor.onnx_dtype}, which TensorRT cannot take as "
            "network I/O (use the onnxruntime backend or change the export)",
        )


def _check_batch_dim(tensor: TensorInfo, max_batch: int) -> None:
    if tensor.dims is None:
        raise BuildError(Failure.UNSUPPORTED_TENSOR, f"input {tensor.name!r} has no shape in the model")
    if not tensor.dims:
        raise BuildError(Failure.UNSUPPORTED_TENSOR, f"input {tensor.name!r} is a scalar: it has no dim 0 to batch")
    batch = tensor.dims[0]
    if batch == DYNAMIC or (batch == 1 and max_batch == 1):
        return
    if batch == 1:
        raise BuildError(
            Failure.UNSUPPORTED_TENSOR,
            f"input {tensor.name!r} dim 0 is fixed at 1, so it cannot batch up to {max_batch}: "
            "export it with a dynamic dim 0, or set max batch to 1",
        )
    raise BuildError(
        Failure.UNSUPPORTED_TENSOR,
        f"input {tensor.name!r} dim 0 is fixed at {batch}: Triton needs dim 0 to be the batch dim "
        "(dynamic, or 1 with max batch 1)",
    )


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    if not value.type.HasField("tensor_type"):
        kind = value.type.WhichOneof("value") or "untyped value"
        return TensorInfo(name=value.name, onnx_dtype=kind.upper(), dims=None)
    tensor_type = value.type.tensor_type
    dtype = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
    if not tensor_type.HasField("shape"):
        return TensorInfo(name=value.name, onnx_dtype=dtype, dims=None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC for d in tensor_type.shape.dim)
    return TensorInfo(name=value.name, onnx_dtype=dtype, dims=dims)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."
