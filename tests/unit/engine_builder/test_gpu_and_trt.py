"""GPU identity, precision support, and the TensorRT module's pure parts (no TensorRT needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailtune.engine_builder import gpu, trt
from tailtune.engine_builder.errors import BuildError, Failure
from tailtune.engine_builder.gpu import GpuInfo


def test_nvidia_smi_line() -> None:
    assert gpu.parse_nvidia_smi_line("NVIDIA H200, 9.0") == GpuInfo("NVIDIA H200", "9.0")
    assert gpu.parse_nvidia_smi_line("Tesla T4, 7.5") == GpuInfo("Tesla T4", "7.5")
    with pytest.raises(BuildError) as err:
        gpu.parse_nvidia_smi_line("[Not Supported]")
    assert err.value.failure is Failure.GPU_MISMATCH


def test_no_nvidia_smi_means_no_gpu() -> None:
    with pytest.raises(BuildError) as err:
        gpu.detect_gpu(nvidia_smi="/nonexistent/nvidia-smi")
    assert err.value.failure is Failure.GPU_MISMATCH
    assert err.value.message.startswith("no GPU visible")


@pytest.mark.parametrize(
    "label",
    [
        "NVIDIA-A100-SXM4-80GB",
        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
        "NVIDIA-A100-SXM4-80GB-SHARED",
        "nvidia-a100-sxm4-80gb",
    ],
)
def test_product_label_matches_the_driver_name(label: str) -> None:
    gpu.check_gpu_product(GpuInfo("NVIDIA A100-SXM4-80GB", "8.0"), label)


@pytest.mark.parametrize("label", ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100", "Tesla-T4"])
def test_another_product_is_refused(label: str) -> None:
    with pytest.raises(BuildError) as err:
        gpu.check_gpu_product(GpuInfo("NVIDIA A100-SXM4-80GB", "8.0"), label)
    assert err.value.failure is Failure.GPU_MISMATCH
    assert err.value.message.startswith(f"the engine is for {label} but this Job runs on NVIDIA A100-SXM4-80GB")


@pytest.mark.parametrize(
    ("precision", "capability", "ok"),
    [
        ("fp32", "7.5", True),
        ("fp16", "7.5", True),
        ("bf16", "7.5", False),
        ("bf16", "8.0", True),
        ("fp8", "8.6", False),
        ("fp8", "8.9", True),
        ("fp8", "9.0", True),
        ("int8", "7.5", True),
        ("fp16", "10.0", True),
    ],
)
def test_precision_needs_its_compute_capability(precision: str, capability: str, ok: bool) -> None:
    if ok:
        gpu.check_precision_on_gpu(precision, capability)
        return
    with pytest.raises(BuildError) as err:
        gpu.check_precision_on_gpu(precision, capability)
    assert err.value.failure is Failure.PRECISION_UNSUPPORTED
    assert err.value.message.endswith(f"this GPU has {capability}")


def test_precision_the_backend_cannot_build() -> None:
    gpu.check_precision("int8", backend="tensorrt", calibration_cache="pvc://c/calib.cache")
    gpu.check_precision("fp32", backend="onnxruntime", calibration_cache=None)
    for precision, backend, says in [
        ("int8", "tensorrt", "int8 needs a calibration cache"),
        ("fp16", "onnxruntime", "onnxruntime serves the ONNX model as exported"),
    ]:
        with pytest.raises(BuildError) as err:
            gpu.check_precision(precision, backend=backend, calibration_cache=None)
        assert err.value.failure is Failure.PRECISION_UNSUPPORTED
        assert err.value.message.startswith(says)


def test_profile_shapes_cover_batch_and_other_dynamic_dims() -> None:
    shapes = trt.profile_shapes("tokens", [-1, -1, 768], (1, 8, 32), {("tokens", 1): (16, 128, 512)})
    assert shapes == ([1, 16, 768], [8, 128, 768], [32, 512, 768])
    assert trt.profile_shapes("x", [1, 4], (1, 1, 1), {}) == ([1, 4], [1, 4], [1, 4])
    with pytest.raises(BuildError) as err:
        trt.profile_shapes("tokens", [-1, -1], (1, 8, 32), {})
    assert err.value.failure is Failure.UNSUPPORTED_TENSOR


@pytest.mark.parametrize(
    ("messages", "failure"),
    [
        (
            ["[virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory (no further information)"],
            Failure.OUT_OF_MEMORY,
        ),
        (["Requested amount of GPU memory (17179869184 bytes) could not be allocated."], Failure.OUT_OF_MEMORY),
        (["cudaErrorMemoryAllocation"], Failure.OUT_OF_MEMORY),
        (["Network validation failed."], Failure.BUILD_FAILED),
        ([], Failure.BUILD_FAILED),
    ],
)
def test_build_failures_are_classified_from_the_log(messages: list[str], failure: Failure) -> None:
    assert trt.classify_build_failure(messages) is failure


def test_tensorrt_is_absent_here_even_with_its_stubs_installed() -> None:
    # tensorrt-stubs leaves a namespace package named tensorrt; it must not pass for TensorRT.
    if trt.import_tensorrt() is not None:
        pytest.skip("TensorRT is installed here")
    assert trt.tensorrt_version() is None
    with pytest.raises(BuildError) as err:
        trt.build_engine(Path("m.onnx"), trt.TrtBuildSpec("fp16", (1, 1, 1), {}, 64, 3))
    assert err.value.failure is Failure.BUILD_FAILED
