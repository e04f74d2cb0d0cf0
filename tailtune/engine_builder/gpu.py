"""The GPU the Job runs on, and which precisions it (and the backend) can build."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from tailtune.engine_builder.errors import BuildError, Failure

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
# Lowest compute capability with fast kernels for each precision.
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "fp32": (0, 0),
    "fp16": (5, 3),
    "bf16": (8, 0),
    "int8": (6, 1),
    "fp8": (8, 9),
}


@dataclass(frozen=True)
class GpuInfo:
    """Name as the driver reports it (`NVIDIA H200`) and compute capability (`9.0`)."""

    name: str
    compute_capability: str


def detect_gpu(nvidia_smi: str = "nvidia-smi", timeout_s: float = 30.0) -> GpuInfo:
    """Ask nvidia-smi for the first visible GPU; GPU_MISMATCH when there is none."""
    command = [nvidia_smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(Failure.GPU_MISMATCH, f"no GPU visible: {nvidia_smi} failed: {exc}") from None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise BuildError(
            Failure.GPU_MISMATCH,
            f"no GPU visible: {nvidia_smi} exited {done.returncode}: {said[0] if said else 'no output'}",
        )
    return parse_nvidia_smi_line(lines[0])


def parse_nvidia_smi_line(line: str) -> GpuInfo:
    """`NVIDIA H200, 9.0` -> GpuInfo."""
    name, sep, capability = line.rpartition(",")
    capability = capability.strip()
    if not sep or not name.strip() or _parse_capability(capability) is None:
        raise BuildError(Failure.GPU_MISMATCH, f"cannot read the GPU from nvidia-smi output {line!r}")
    return GpuInfo(name=name.strip(), compute_capability=capability)


def check_gpu_product(gpu: GpuInfo, product: str) -> None:
    """Refuse to build for `product` (the `nvidia.com/gpu.product` label) on another GPU.

    The label is the driver's name with spaces as dashes, plus a suffix for MIG slices
    (`-MIG-1g.10gb`) or time-slicing (`-SHARED`).
    """
    name = _label_form(gpu.name)
    label = _label_form(product)
    if label != name and not label.startswith(name + "-"):
        raise BuildError(
            Failure.GPU_MISMATCH,
            f"the engine is for {product} but this Job runs on {gpu.name} "
            f"(compute {gpu.compute_capability}); an engine only runs on the GPU it was built on",
        )


def check_precision(precision: str, *, backend: str, calibration_cache: str | None) -> None:
    """Refuse a precision the backend cannot build, whatever the GPU. Pure."""
    if precision not in PRECISIONS:
        raise BuildError(Failure.INVALID_ARGUMENTS, f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)}")
    if backend == "onnxruntime" and precision != "fp32":
        raise BuildError(
            Failure.PRECISION_UNSUPPORTED,
            f"onnxruntime serves the ONNX model as exported; {precision} needs the tensorrt backend",
        )
    if backend == "tensorrt" and precision == "int8" and not calibration_cache:
        raise BuildError(
            Failure.PRECISION_UNSUPPORTED,
            "int8 needs a calibration cache (--calibration-cache); the build Job does not calibrate",
        )


def check_precision_on_gpu(precision: str, compute_capability: str) -> None:
    """Refuse a precision this GPU has no fast kernels for. Pure."""
    have = _parse_capability(compute_capability)
    if have is None:
        raise BuildError(Failure.GPU_MISMATCH, f"unknown compute capability {compute_capability!r}")
    need = MIN_COMPUTE_CAPABILITY[precision]
    if have < need:
        raise BuildError(
            Failure.PRECISION_UNSUPPORTED,
            f"{precision} needs compute capability {need[0]}.{need[1]} or newer; this GPU has {compute_capability}",
        )


def _parse_capability(text: str) -> tuple[int, int] | None:
    major, _, minor = text.strip().partition(".")
    if not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def _label_form(name: str) -> str:
    return "-".join(name.split()).lower()
