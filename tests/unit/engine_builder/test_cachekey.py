"""The cache key: stable, DNS-1123 safe, changed by each input and by nothing else."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from tailtune.engine_builder import build
from tailtune.engine_builder.cachekey import compute_cache_key
from tailtune.engine_builder.gpu import GpuInfo

DIGEST = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
BASE: dict[str, Any] = {
    "model_digest": DIGEST,
    "tensorrt_version": "10.13.0.35",
    "gpu_product": "NVIDIA-H200",
    "compute_capability": "9.0",
    "precision": "fp16",
    "profile": (1, 8, 32),
    "flags": {"backend": "tensorrt", "workspace_mib": 4096, "opt_level": 3},
}
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def test_key_is_stable_and_a_dns_label() -> None:
    key = compute_cache_key(**BASE)
    assert key == compute_cache_key(**BASE)
    # Pinned: the operator and the builder must keep computing the same key for the same inputs.
    assert key == "eng-8da9e28b721bf58b"
    assert DNS_1123_LABEL.fullmatch(key) and len(key) <= 63


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_digest", "0" * 64),
        ("tensorrt_version", "10.12.0.36"),
        ("gpu_product", "NVIDIA-A100-SXM4-80GB"),
        ("compute_capability", "8.0"),
        ("precision", "bf16"),
        ("profile", (1, 4, 32)),
        ("profile", (1, 8, 64)),
        ("profile", (2, 8, 32)),
        ("flags", {"backend": "tensorrt", "workspace_mib": 2048, "opt_level": 3}),
        ("flags", {"backend": "tensorrt", "workspace_mib": 4096, "opt_level": 5}),
        ("flags", {"backend": "tensorrt", "workspace_mib": 4096, "opt_level": 3, "extra": True}),
        ("flags", {"backend": "tensorrt", "workspace_mib": "4096", "opt_level": 3}),
    ],
)
def test_each_input_changes_the_key(field: str, value: Any) -> None:
    assert compute_cache_key(**(BASE | {field: value})) != compute_cache_key(**BASE)


def test_flag_order_and_digest_spelling_do_not_change_the_key() -> None:
    reordered = dict(reversed(list(BASE["flags"].items())))
    assert compute_cache_key(**(BASE | {"flags": reordered})) == compute_cache_key(**BASE)
    spelled = f"sha256:{DIGEST.upper()}"
    assert compute_cache_key(**(BASE | {"model_digest": spelled})) == compute_cache_key(**BASE)


def test_bool_and_int_flags_differ() -> None:
    assert compute_cache_key(**(BASE | {"flags": {"x": True}})) != compute_cache_key(**(BASE | {"flags": {"x": 1}}))


@pytest.mark.parametrize("profile", [(1, 8), (1, 8, 32, 64), (1.0, 8, 32), (True, 8, 32)])
def test_bad_profile_is_refused(profile: Any) -> None:
    with pytest.raises(ValueError, match="profile"):
        compute_cache_key(**(BASE | {"profile": profile}))


def test_bad_flag_value_is_refused() -> None:
    with pytest.raises(ValueError, match="flag"):
        compute_cache_key(**(BASE | {"flags": {"x": 1.5}}))


REQUEST = build.BuildRequest(
    model_uri="https://example.com/m.onnx",
    backend="tensorrt",
    model_name="m",
    store=Path("/store"),
    precision="fp16",
    max_batch=32,
    opt_batch=8,
    gpu_product="NVIDIA-H200",
)
MACHINE = build.Machine(
    tensorrt_version="10.13.0.35",
    gpu=GpuInfo("NVIDIA H200", "9.0"),
    pvc_root=Path("/mnt/models"),
    builder_version="0.1.0",
)


def _request_key(req: build.BuildRequest, machine: build.Machine = MACHINE, calibration: str = "") -> str:
    inputs = build.key_inputs(req, model_digest=DIGEST, machine=machine, calibration_digest=calibration)
    return compute_cache_key(**inputs)


@pytest.mark.parametrize(
    "change",
    [
        {"precision": "bf16"},
        {"max_batch": 64},
        {"opt_batch": 4},
        {"workspace_mib": 1024},
        {"opt_level": 5},
        {"gpu_product": "NVIDIA-H200-MIG-1g.18gb"},
        {"model_name": "other"},
        {"backend": "onnxruntime", "precision": "fp32"},
        {"dim_ranges": {("x", 1): (1, 64, 128)}},
    ],
)
def test_each_request_field_that_shapes_the_engine_changes_the_key(change: dict[str, Any]) -> None:
    assert _request_key(dataclasses.replace(REQUEST, **change)) != _request_key(REQUEST)


def test_machine_and_calibration_change_the_tensorrt_key() -> None:
    other_trt = dataclasses.replace(MACHINE, tensorrt_version="10.12.0.36")
    other_gpu = dataclasses.replace(MACHINE, gpu=GpuInfo("NVIDIA H200", "9.1"))
    assert _request_key(REQUEST, other_trt) != _request_key(REQUEST)
    assert _request_key(REQUEST, other_gpu) != _request_key(REQUEST)
    assert _request_key(REQUEST, calibration="a" * 64) != _request_key(REQUEST)


@pytest.mark.parametrize(
    "change",
    [
        {"model_uri": "pvc://models/m.onnx"},
        {"store": Path("/elsewhere")},
        {"timing_cache": True},
        {"sha256": DIGEST},
        {"cache_key": "eng-0000000000000000"},
    ],
)
def test_nothing_else_changes_the_key(change: dict[str, Any]) -> None:
    assert _request_key(dataclasses.replace(REQUEST, **change)) == _request_key(REQUEST)


def test_onnxruntime_key_ignores_the_gpu_and_tensorrt() -> None:
    ort = dataclasses.replace(REQUEST, backend="onnxruntime", precision="fp32", gpu_product="")
    cpu_machine = dataclasses.replace(MACHINE, tensorrt_version="", gpu=None)
    assert _request_key(ort, cpu_machine) == _request_key(ort, MACHINE)
    assert _request_key(ort) == _request_key(dataclasses.replace(ort, gpu_product="NVIDIA-L4", workspace_mib=1))
