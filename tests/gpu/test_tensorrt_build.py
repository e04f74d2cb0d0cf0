"""End to end on a GPU: the builder CLI makes a TensorRT engine that TensorRT loads back.

Skipped unless TensorRT is installed and nvidia-smi sees a GPU; run it with hack/gpu-check.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tailtune.engine_builder import gpu, trt
from tailtune.engine_builder.errors import BuildError, Failure

from ..unit.engine_builder.onnx_models import custom_op_model, multi_input_model, relu_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_info() -> gpu.GpuInfo:
    if trt.import_tensorrt() is None:
        pytest.skip("TensorRT is not installed")
    try:
        return gpu.detect_gpu()
    except BuildError as exc:
        pytest.skip(str(exc))


def _label(info: gpu.GpuInfo) -> str:
    """The nvidia.com/gpu.product label of this GPU."""
    return "-".join(info.name.split())


def _build(tmp_path: Path, model: onnx.ModelProto, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    log = tmp_path / "termination-log"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tailtune.engine_builder",
            "build",
            "--model-uri",
            str(path),
            "--backend",
            "tensorrt",
            "--model-name",
            "m",
            "--store",
            str(tmp_path / "store"),
            "--termination-log",
            str(log),
            "--workspace-mib",
            "1024",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return done, log.read_text() if log.exists() else ""


def _engine(entry: Path) -> object:
    import tensorrt

    runtime = tensorrt.Runtime(tensorrt.Logger(tensorrt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine((entry / "m/1/model.plan").read_bytes())
    assert engine is not None
    return engine


def _profile(engine: object, name: str) -> list[tuple[int, ...]]:
    """(min, opt, max) shapes of input `name` in profile 0."""
    import tensorrt

    assert isinstance(engine, tensorrt.ICudaEngine)
    return [tuple(dims[i] for i in range(len(dims))) for dims in engine.get_tensor_profile_shape(name, 0)]


def test_fp16_engine_with_dynamic_batch(gpu_info: gpu.GpuInfo, tmp_path: Path) -> None:
    import tensorrt

    args = [
        "--precision",
        "fp16",
        "--max-batch",
        "16",
        "--opt-batch",
        "4",
        "--gpu-product",
        _label(gpu_info),
        "--timing-cache",
    ]
    done, message = _build(tmp_path, relu_model("batch"), *args)
    assert done.returncode == 0, done.stderr
    key = json.loads(done.stdout)["cacheKey"]
    entry = tmp_path / "store" / key
    assert message.startswith(f"EngineReady: {key} built in ")

    metadata = json.loads((entry / "metadata.json").read_text())
    assert metadata["tensorrtVersion"] == tensorrt.__version__
    assert metadata["gpu"] == {
        "product": _label(gpu_info),
        "name": gpu_info.name,
        "computeCapability": gpu_info.compute_capability,
    }
    assert metadata["profile"] == {"min": 1, "opt": 4, "max": 16}
    assert list((tmp_path / "store" / "timing-caches").glob("*.cache")), "the timing cache was not saved"

    engine = _engine(entry)
    assert isinstance(engine, tensorrt.ICudaEngine)
    assert engine.num_io_tensors == 2
    assert _profile(engine, "x") == [(1, 4), (4, 4), (16, 4)]

    again, message = _build(tmp_path, relu_model("batch"), *args)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["storeHit"] is True
    assert message.endswith("build skipped\n")


def test_several_inputs_and_a_second_dynamic_dim(gpu_info: gpu.GpuInfo, tmp_path: Path) -> None:
    import tensorrt

    done, _ = _build(
        tmp_path,
        multi_input_model(),
        "--max-batch",
        "8",
        "--opt-batch",
        "2",
        "--gpu-product",
        _label(gpu_info),
        "--dim",
        "mask:1=1,32,128",
    )
    assert done.returncode == 0, done.stderr
    engine = _engine(tmp_path / "store" / json.loads(done.stdout)["cacheKey"])
    assert isinstance(engine, tensorrt.ICudaEngine)
    assert engine.num_io_tensors == 6
    assert _profile(engine, "mask") == [(1, 1), (2, 32), (8, 128)]


def test_parser_errors_reach_the_termination_log(gpu_info: gpu.GpuInfo, tmp_path: Path) -> None:
    done, message = _build(tmp_path, custom_op_model(), "--max-batch", "4", "--gpu-product", _label(gpu_info))
    assert done.returncode == Failure.UNSUPPORTED_OP.exit_code, done.stderr + message
    assert message.startswith("UnsupportedOp: TensorRT's ONNX parser refused the model")
    assert "Frobnicate" in message
