"""The operator's side of the engine cache: the key it names the build Job by, and the build's report."""

from __future__ import annotations

import json

from pydantic import ValidationError

from tailtune.api.v1alpha1 import InferenceService, TensorSpec
from tailtune.engine_builder.cachekey import compute_cache_key
from tailtune.operator.observed import EngineInfo


def engine_cache_key(isvc: InferenceService) -> str:
    """Cache key from what the operator knows before the build.

    The model digest is the declared sha256 (else the URI), and the TensorRT version is pinned by the
    builder image; the builder records the measured ones in the engine's metadata.
    """
    spec = isvc.spec
    engine = spec.engine
    flags: dict[str, str | int | bool] = {"backend": engine.backend}
    if engine.backend == "tensorrt":
        flags |= {"workspaceMiB": engine.workspace_mi_b, "optLevel": engine.builder_optimization_level}
        if engine.calibration_cache_uri:
            flags["calibrationCache"] = engine.calibration_cache_uri
    return compute_cache_key(
        model_digest=spec.model.sha256 or f"uri:{spec.model.uri}",
        tensorrt_version=engine.builder_image if engine.backend == "tensorrt" else "none",
        gpu_product=spec.serving.gpu.product if engine.backend == "tensorrt" else "any",
        compute_capability="",
        precision=engine.precision,
        profile=(1, engine.optimization_profile.opt, engine.optimization_profile.max),
        flags=flags,
    )


def parse_build_report(message: str) -> EngineInfo | None:
    """The JSON summary a successful build leaves as its termination message, or None."""
    try:
        report = json.loads(message)
        inputs = tuple(TensorSpec.model_validate(t) for t in report.get("inputs", []))
        outputs = tuple(TensorSpec.model_validate(t) for t in report.get("outputs", []))
    except (ValueError, ValidationError, AttributeError, TypeError):
        return None
    return EngineInfo(
        tensorrt_version=report.get("tensorrtVersion"),
        gpu_product=report.get("gpuProduct"),
        location=report.get("location"),
        inputs=inputs,
        outputs=outputs,
    )
