"""Timing the engine at the batch ladder: the pure parts, onnxruntime for real, TensorRT against fakes."""

from __future__ import annotations

import enum
import itertools
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from tailtune.engine_builder import cli, onnx_model, ort, timing, trt
from tailtune.tuner.servicetime import ladder as tuner_ladder

from .onnx_models import multi_input_model, relu_model


@pytest.mark.parametrize("max_batch", [1, 2, 3, 8, 12, 32, 100])
def test_ladder_matches_the_tuners(max_batch: int) -> None:
    assert timing.ladder(max_batch) == tuner_ladder(max_batch)


def test_ladder_sizes() -> None:
    assert timing.ladder(1) == (1,)
    assert timing.ladder(12) == (1, 2, 4, 8, 12)
    assert timing.ladder(16) == (1, 2, 4, 8, 16)


def test_median_after_warmup() -> None:
    ticks = itertools.count()
    calls: list[int] = []
    # Each timed call takes one tick (1 s); warm-up calls are not timed.
    ms = timing.median_ms(lambda: calls.append(1), warmup=2, runs=5, clock=lambda: float(next(ticks)))
    assert len(calls) == 7 and ms == 1000.0


def test_input_shape_puts_the_batch_first_and_opt_elsewhere() -> None:
    assert timing.input_shape("x", [-1, 4], 8, {}) == [8, 4]
    assert timing.input_shape("t", [-1, -1, 768], 2, {("t", 1): (16, 128, 512)}) == [2, 128, 768]
    assert timing.input_shape("t", [-1, -1], 2, {}) == [2, 1]


def test_report_points_round_and_never_reach_zero() -> None:
    assert timing.report_points(((1, 0.12345), (2, 0.0001))) == [{"batch": 1, "ms": 0.123}, {"batch": 2, "ms": 0.001}]


def test_a_failing_size_ends_the_ladder() -> None:
    failed: list[int] = []

    def prepare(batch: int) -> Any:
        if batch == 4:
            raise RuntimeError("out of memory")
        return lambda: None

    got = timing.time_ladder(
        (1, 2, 4, 8), prepare, warmup=0, runs=1, clock=lambda: 0.0, on_error=lambda b, e: failed.append(b)
    )
    assert [b for b, _ in got] == [1, 2] and failed == [4]


def test_onnxruntime_ladder(tmp_path: Path) -> None:
    path = tmp_path / "multi.onnx"
    onnx.save(multi_input_model(), str(path))
    info = onnx_model.load_model_info(path)
    got = ort.time_ladder(path, info.inputs, (1, 2, 4), {}, warmup=1, runs=3)
    assert [b for b, _ in got] == [1, 2, 4] and all(ms > 0 for _, ms in got)


def test_onnxruntime_ladder_ends_at_a_size_the_model_refuses(tmp_path: Path) -> None:
    path = tmp_path / "static.onnx"
    onnx.save(relu_model(1), str(path))
    info = onnx_model.load_model_info(path)
    assert [b for b, _ in ort.time_ladder(path, info.inputs, (1, 2), {}, warmup=0, runs=1)] == [1]


def test_report_keeps_the_service_time_within_the_limit() -> None:
    metadata = {"cacheKey": "k", "serviceTime": [{"batch": b, "ms": 1.5} for b in timing.ladder(4096)]}
    report = json.loads(cli.build_report(metadata, "built"))
    assert report["serviceTime"][-1] == {"batch": 4096, "ms": 1.5}
    huge = metadata | {"inputs": [{"name": "x" * 40, "dtype": "TYPE_FP32", "dims": [-1, 4]}] * 45}
    text = cli.build_report(huge, "built")
    assert len(text.encode()) <= cli.TERMINATION_LOG_LIMIT
    assert "serviceTime" not in json.loads(text) and json.loads(text)["cacheKey"] == "k"


# --- TensorRT, against hand-written fakes of `tensorrt` and cuda-python's runtime ------------------------


class _Mode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


class _FakeCuda:
    """cuda-python's runtime calls the timing makes, recording allocations."""

    def __init__(self) -> None:
        self.cudaError_t = types.SimpleNamespace(cudaSuccess=0)
        self.live: dict[int, int] = {}
        self.zeroed: set[int] = set()
        self.syncs = 0
        self._next = itertools.count(0x1000, 0x1000)
        self.streams = 0

    def cudaStreamCreate(self) -> tuple[int, int]:
        self.streams += 1
        return 0, 7

    def cudaStreamDestroy(self, stream: int) -> tuple[int]:
        self.streams -= 1
        return (0,)

    def cudaMalloc(self, nbytes: int) -> tuple[int, int]:
        pointer = next(self._next)
        self.live[pointer] = nbytes
        return 0, pointer

    def cudaMemsetAsync(self, pointer: int, value: int, nbytes: int, stream: int) -> tuple[int]:
        assert value == 0 and self.live[pointer] >= nbytes and stream == 7
        self.zeroed.add(pointer)
        return (0,)

    def cudaFree(self, pointer: int) -> tuple[int]:
        del self.live[pointer]
        return (0,)

    def cudaStreamSynchronize(self, stream: int) -> tuple[int]:
        self.syncs += 1
        return (0,)


class _FakeContext:
    def __init__(self, engine: _FakeEngine, cuda: _FakeCuda) -> None:
        self.engine, self.cuda = engine, cuda
        self.shapes: dict[str, list[int]] = {}
        self.addresses: dict[str, int] = {}
        self.executed: list[int] = []

    def set_input_shape(self, name: str, shape: list[int]) -> bool:
        if shape[0] > self.engine.max_batch:
            return False
        self.shapes[name] = list(shape)
        return True

    def get_tensor_shape(self, name: str) -> list[int]:
        return [self.shapes["x"][0], 3] if name == "y" else self.shapes[name]

    def set_tensor_address(self, name: str, pointer: int) -> bool:
        self.addresses[name] = pointer
        return True

    def execute_async_v3(self, stream: int) -> bool:
        assert stream == 7
        for name, pointer in self.addresses.items():
            volume = 1
            for d in self.get_tensor_shape(name):
                volume *= d
            assert self.cuda.live[pointer] >= volume * 4 and pointer in self.cuda.zeroed
        self.executed.append(self.shapes["x"][0])
        return True


class _FakeEngine:
    num_io_tensors = 2

    def __init__(self, cuda: _FakeCuda, max_batch: int) -> None:
        self.max_batch = max_batch
        self.context = _FakeContext(self, cuda)

    def get_tensor_name(self, index: int) -> str:
        return ["x", "y"][index]

    def get_tensor_mode(self, name: str) -> _Mode:
        return _Mode.INPUT if name == "x" else _Mode.OUTPUT

    def get_tensor_shape(self, name: str) -> list[int]:
        return [-1, 5] if name == "x" else [-1, 3]

    def get_tensor_dtype(self, name: str) -> Any:
        return types.SimpleNamespace(itemsize=4)

    def create_execution_context(self) -> _FakeContext:
        return self.context


def _fake_tensorrt(engine: _FakeEngine | None) -> types.ModuleType:
    module = types.ModuleType("fake_tensorrt")

    class Logger:
        WARNING = 2

        def __init__(self, severity: int) -> None:
            pass

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> _FakeEngine | None:
            assert data == b"engine"
            return engine

    module.Logger = Logger  # type: ignore[attr-defined]
    module.Runtime = Runtime  # type: ignore[attr-defined]
    module.TensorIOMode = _Mode  # type: ignore[attr-defined]
    return module


@pytest.fixture
def cuda() -> Iterator[_FakeCuda]:
    fake = _FakeCuda()
    yield fake
    assert fake.live == {} and fake.streams == 0  # every buffer and the stream were released


def _cudart(fake: _FakeCuda) -> types.ModuleType:
    module = types.ModuleType("fake_cudart")
    module.__dict__.update({k: getattr(fake, k) for k in dir(fake) if k.startswith("cuda")})
    return module


def test_tensorrt_timing_runs_every_size_on_zeroed_buffers(cuda: _FakeCuda) -> None:
    engine = _FakeEngine(cuda, max_batch=8)
    ticks = itertools.count()
    got = trt.time_engine(
        b"engine",
        (1, 2, 4, 8),
        {},
        warmup=2,
        runs=3,
        clock=lambda: float(next(ticks)),
        tensorrt=_fake_tensorrt(engine),
        cudart=_cudart(cuda),
    )
    assert got == ((1, 1000.0), (2, 1000.0), (4, 1000.0), (8, 1000.0))
    assert engine.context.executed == [1] * 5 + [2] * 5 + [4] * 5 + [8] * 5
    assert cuda.syncs == 20  # every execution waited for the stream


def test_tensorrt_timing_stops_where_the_profile_ends(cuda: _FakeCuda) -> None:
    engine = _FakeEngine(cuda, max_batch=2)
    got = trt.time_engine(
        b"engine", (1, 2, 4), {}, warmup=0, runs=1, tensorrt=_fake_tensorrt(engine), cudart=_cudart(cuda)
    )
    assert [b for b, _ in got] == [1, 2]


def test_tensorrt_timing_without_an_engine_or_cuda_measures_nothing(cuda: _FakeCuda) -> None:
    assert trt.time_engine(b"engine", (1,), {}, tensorrt=_fake_tensorrt(None), cudart=_cudart(cuda)) == ()
    if trt.import_tensorrt() is None:
        assert trt.time_engine(b"engine", (1,), {}) == ()
