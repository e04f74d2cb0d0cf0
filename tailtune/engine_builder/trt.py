"""Build a serialized TensorRT engine from an ONNX file with the TensorRT Python API.

TensorRT is imported lazily: it exists only in the build image, and mypy checks these calls
against `tensorrt-stubs`. The pure parts (profile shapes, error classification) need no TensorRT.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tailtune.engine_builder import timing
from tailtune.engine_builder.errors import BuildError, Failure
from tailtune.engine_builder.onnx_model import DYNAMIC, DimRanges

if TYPE_CHECKING:
    import tensorrt as trt
    from typing_extensions import Buffer

log = logging.getLogger(__name__)

_OOM = re.compile(
    r"out of memory|outofmemory|cudaErrorMemoryAllocation|requested amount of gpu memory|"
    r"failed to allocate|insufficient memory|MEM_ALLOC_FAILED",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class TrtBuildSpec:
    """Everything a TensorRT build takes besides the ONNX file."""

    precision: str
    profile: tuple[int, int, int]
    dim_ranges: DimRanges
    workspace_mib: int
    opt_level: int
    timing_cache: Path | None = None
    calibration_cache: bytes | None = None


def import_tensorrt() -> ModuleType | None:
    """The `tensorrt` module, or None where it is absent.

    `tensorrt-stubs` leaves an empty `tensorrt/` folder behind, which imports as a namespace
    package: only a module with `Builder` is the real thing.
    """
    try:
        import tensorrt
    except ImportError:
        return None
    return tensorrt if hasattr(tensorrt, "Builder") else None


def import_cudart() -> ModuleType | None:
    """cuda-python's runtime module (`cuda.bindings.runtime`, or `cuda.cudart` before 12.6), or None."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def tensorrt_version() -> str | None:
    """The installed TensorRT version, or None."""
    module = import_tensorrt()
    return str(module.__version__) if module is not None else None


def profile_shapes(
    name: str, dims: Sequence[int], batch: tuple[int, int, int], dim_ranges: DimRanges
) -> tuple[list[int], list[int], list[int]]:
    """(min, opt, max) shapes of one input: dim 0 from `batch`, other dynamic dims from `dim_ranges`."""
    shapes: tuple[list[int], list[int], list[int]] = ([], [], [])
    for axis, size in enumerate(dims):
        if size != DYNAMIC:
            triple = (size, size, size)
        elif axis == 0:
            triple = batch
        elif (name, axis) in dim_ranges:
            triple = dim_ranges[(name, axis)]
        else:
            raise BuildError(
                Failure.UNSUPPORTED_TENSOR,
                f"input {name!r} dim {axis} is dynamic: give its range with --dim {name}:{axis}=MIN,OPT,MAX",
            )
        for shape, value in zip(shapes, triple, strict=True):
            shape.append(value)
    return shapes


def classify_build_failure(messages: Sequence[str]) -> Failure:
    """OUT_OF_MEMORY when any logged error speaks of memory, else BUILD_FAILED."""
    return Failure.OUT_OF_MEMORY if any(_OOM.search(m) for m in messages) else Failure.BUILD_FAILED


def build_engine(onnx_path: Path, spec: TrtBuildSpec) -> bytes:
    """Parse, configure and build; return the serialized engine. Raises BuildError on every failure."""
    if import_tensorrt() is None:
        raise BuildError(Failure.BUILD_FAILED, "TensorRT is not installed in this image (import tensorrt failed)")
    import tensorrt as trt

    errors: list[str] = []
    logger = _make_logger(errors)
    try:
        builder = trt.Builder(logger)
    except (TypeError, RuntimeError) as exc:  # pybind11 raises when CUDA cannot start
        detail = "; ".join(errors) or str(exc)
        raise BuildError(Failure.GPU_MISMATCH, f"TensorRT cannot use the GPU: {detail}") from None
    # Explicit batch is the only mode in TensorRT 10; the flag keeps 8.x on the same path.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    # From the file, so external weights next to it are found.
    if not parser.parse_from_file(str(onnx_path)):
        raise _parser_failure(parser)

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_mib << 20)
    config.builder_optimization_level = spec.opt_level
    _set_precision(builder, config, spec)
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        dims = [tensor.shape[axis] for axis in range(len(tensor.shape))]
        lo, opt, hi = profile_shapes(tensor.name, dims, spec.profile, spec.dim_ranges)
        profile.set_shape(tensor.name, trt.Dims(lo), trt.Dims(opt), trt.Dims(hi))
    config.add_optimization_profile(profile)
    if spec.timing_cache is not None:
        _load_timing_cache(config, spec.timing_cache)

    try:
        serialized = builder.build_serialized_network(network, config)
    except MemoryError:
        raise BuildError(Failure.OUT_OF_MEMORY, "host memory ran out while building the engine") from None
    if serialized is None:
        summary = errors[-1] if errors else "no error was logged"
        raise BuildError(classify_build_failure(errors), f"TensorRT built no engine: {summary}", details=errors)
    if spec.timing_cache is not None:
        _save_timing_cache(config, spec.timing_cache)
    return bytes(serialized)


def _make_logger(errors: list[str]) -> trt.ILogger:
    import tensorrt as trt

    class _Logger(trt.ILogger):
        """Keeps errors for the termination log and forwards the rest to the Job's log."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                errors.append(msg)
                log.error("tensorrt: %s", msg)
            elif severity == trt.ILogger.Severity.WARNING:
                log.warning("tensorrt: %s", msg)
            elif severity == trt.ILogger.Severity.INFO:
                log.info("tensorrt: %s", msg)

    return _Logger()


def _parser_failure(parser: trt.OnnxParser) -> BuildError:
    """One BuildError carrying every parser error; unsupported ops win over other kinds."""
    import tensorrt as trt

    unsupported = (
        trt.ErrorCode.UNSUPPORTED_GRAPH,
        trt.ErrorCode.UNSUPPORTED_NODE,
        trt.ErrorCode.UNSUPPORTED_NODE_ATTR,
        trt.ErrorCode.UNSUPPORTED_NODE_INPUT,
        trt.ErrorCode.UNSUPPORTED_NODE_DATATYPE,
        trt.ErrorCode.UNSUPPORTED_NODE_DYNAMIC,
        trt.ErrorCode.UNSUPPORTED_NODE_SHAPE,
    )
    lines: list[str] = []
    failure = Failure.CORRUPT_MODEL
    for index in range(parser.num_errors):
        error: trt.ParserError = parser.get_error(index)
        code = error.code()
        where = f"node {error.node()} ({error.node_operator()} {error.node_name()!r})" if error.node() >= 0 else "graph"
        lines.append(f"{where}: {error.desc()}")
        if code == trt.ErrorCode.MEM_ALLOC_FAILED:
            failure = Failure.OUT_OF_MEMORY
        elif code in unsupported and failure is Failure.CORRUPT_MODEL:
            failure = Failure.UNSUPPORTED_OP
    if not lines:
        lines.append("the ONNX parser failed without saying why")
    count = f" ({len(lines)} errors)" if len(lines) > 1 else ""
    return BuildError(failure, f"TensorRT's ONNX parser refused the model{count}: {'; '.join(lines)}", details=lines)


def _set_precision(builder: trt.Builder, config: trt.IBuilderConfig, spec: TrtBuildSpec) -> None:
    """Set the precision flag; fp32 layers stay available as fallback for layers without kernels."""
    import tensorrt as trt

    if spec.precision == "fp16":
        if not builder.platform_has_fast_fp16:
            raise BuildError(Failure.PRECISION_UNSUPPORTED, "fp16: TensorRT reports no fast fp16 on this GPU")
        config.set_flag(trt.BuilderFlag.FP16)
    elif spec.precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    elif spec.precision == "fp8":
        # fp8 layers come from Q/DQ nodes in the model; fp16 covers the layers around them.
        config.set_flag(trt.BuilderFlag.FP8)
        config.set_flag(trt.BuilderFlag.FP16)
    elif spec.precision == "int8":
        if not builder.platform_has_fast_int8:
            raise BuildError(Failure.PRECISION_UNSUPPORTED, "int8: TensorRT reports no fast int8 on this GPU")
        if spec.calibration_cache is None:
            raise BuildError(Failure.PRECISION_UNSUPPORTED, "int8 needs a calibration cache")
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = _cache_calibrator(spec.calibration_cache)


def _cache_calibrator(cache: bytes) -> trt.IInt8Calibrator:
    """A calibrator that only replays a calibration cache made elsewhere."""
    import tensorrt as trt

    class _CacheCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> list[int]:
            # No data: TensorRT only asks when the cache does not fit the network, and None ends it.
            return None  # type: ignore[return-value]

        def read_calibration_cache(self) -> bytes:
            return cache

        def write_calibration_cache(self, cache: Buffer) -> None:
            return None

    return _CacheCalibrator()


def _load_timing_cache(config: trt.IBuilderConfig, path: Path) -> None:
    """Start from the stored timing cache if there is one; a stale or foreign one is dropped, not fatal."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        log.warning("timing cache %s unreadable (%s); starting an empty one", path, exc)
        data = b""
    cache = config.create_timing_cache(data)
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        log.warning("timing cache %s does not match this GPU/TensorRT; starting an empty one", path)
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)


def _save_timing_cache(config: trt.IBuilderConfig, path: Path) -> None:
    """Write the timing cache atomically; failing to save it does not fail the build."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not save the timing cache to %s: %s", path, exc)
        tmp.unlink(missing_ok=True)


def time_engine(
    engine: bytes,
    sizes: Sequence[int],
    dim_ranges: DimRanges,
    *,
    warmup: int = timing.WARMUP_RUNS,
    runs: int = timing.TIMED_RUNS,
    clock: Callable[[], float] = time.perf_counter,
    tensorrt: ModuleType | None = None,
    cudart: ModuleType | None = None,
) -> timing.ServiceTime:
    """Median ms of one execution of the engine on zeroed device buffers at each batch size.

    Per size: set every input's shape (batch in dim 0, other dynamic dims at their opt), point each I/O tensor
    at a zeroed device buffer, then `execute_async_v3` and synchronize the stream. () when TensorRT or
    cuda-python is missing. `tensorrt`/`cudart` stand in for the modules in tests.

    Untested on a GPU: written against the TensorRT 10 Python API (tensorrt-stubs) and cuda-python, and tested
    only with hand-written fakes of both (tests/unit/engine_builder/test_timing.py).
    """
    trt_mod = tensorrt if tensorrt is not None else import_tensorrt()
    cuda = cudart if cudart is not None else import_cudart()
    if trt_mod is None or cuda is None:
        log.warning("service time not measured: %s is not installed", "TensorRT" if trt_mod is None else "cuda-python")
        return ()
    # TensorRT's own logger: its errors land in the Job's log, next to the warning below.
    runtime = trt_mod.Runtime(trt_mod.Logger(trt_mod.Logger.WARNING))
    cuda_engine = runtime.deserialize_cuda_engine(engine)
    if cuda_engine is None:
        log.warning("service time not measured: TensorRT cannot load the engine it just built")
        return ()
    context = cuda_engine.create_execution_context()
    names = [cuda_engine.get_tensor_name(i) for i in range(cuda_engine.num_io_tensors)]
    inputs = [n for n in names if cuda_engine.get_tensor_mode(n) == trt_mod.TensorIOMode.INPUT]
    with _stream(cuda) as stream, _buffers(cuda) as allocate:

        def prepare(batch: int) -> Callable[[], None]:
            for name in inputs:
                dims = list(cuda_engine.get_tensor_shape(name))
                if not context.set_input_shape(name, timing.input_shape(name, dims, batch, dim_ranges)):
                    raise RuntimeError(f"set_input_shape({name!r}) refused batch {batch}")
            for name in names:
                shape = list(context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise RuntimeError(f"tensor {name!r} has a data-dependent shape {shape}")
                volume = 1
                for d in shape:
                    volume *= d
                size = max(1, volume * int(cuda_engine.get_tensor_dtype(name).itemsize))
                if not context.set_tensor_address(name, allocate(name, size, stream)):
                    raise RuntimeError(f"set_tensor_address({name!r}) failed")

            def run() -> None:
                if not context.execute_async_v3(int(stream)):
                    raise RuntimeError("execute_async_v3 failed")
                _check(cuda, cuda.cudaStreamSynchronize(stream))

            return run

        def on_error(batch: int, exc: Exception) -> None:
            log.warning("service time: TensorRT failed at batch %d (%s); ladder ends there", batch, exc)

        return timing.time_ladder(sizes, prepare, warmup=warmup, runs=runs, clock=clock, on_error=on_error)


def _check(cuda: ModuleType, result: object) -> Any:
    """cuda-python returns `(error, *values)`: raise on an error, return the value (None when there is none)."""
    values = result if isinstance(result, tuple) else (result,)
    if values[0] != cuda.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA error {values[0]}")
    return values[1] if len(values) > 1 else None


@contextmanager
def _stream(cuda: ModuleType) -> Iterator[Any]:
    stream = _check(cuda, cuda.cudaStreamCreate())
    try:
        yield stream
    finally:
        cuda.cudaStreamDestroy(stream)


@contextmanager
def _buffers(cuda: ModuleType) -> Iterator[Callable[[str, int, object], int]]:
    """`allocate(name, nbytes, stream)`: a zeroed device buffer per tensor, grown as the batch grows; all freed."""
    held: dict[str, tuple[int, int]] = {}

    def allocate(name: str, nbytes: int, stream: object) -> int:
        if name in held and held[name][1] >= nbytes:
            return held[name][0]
        if name in held:
            cuda.cudaFree(held.pop(name)[0])
        pointer = int(_check(cuda, cuda.cudaMalloc(nbytes)))
        held[name] = (pointer, nbytes)
        _check(cuda, cuda.cudaMemsetAsync(pointer, 0, nbytes, stream))
        return pointer

    try:
        yield allocate
    finally:
        for pointer, _ in held.values():
            cuda.cudaFree(pointer)
