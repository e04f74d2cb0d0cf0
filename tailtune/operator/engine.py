"""The operator's one home for the engine's facts: the cache key it names the build Job by, and what the
build reported (the engine's I/O, versions and service time), read from status or the build's termination message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime

from pydantic import ValidationError

from tailtune.api.v1alpha1 import (
    EngineStatus,
    InferenceService,
    ServiceTimePoint,
    ServiceTimeStatus,
    TensorSpec,
)
from tailtune.engine_builder import trtllm
from tailtune.engine_builder.cachekey import KeyInputs, engine_key
from tailtune.operator.observed import EngineInfo, JobObservation
from tailtune.tuner.servicetime import CurvePoint

_MODEL_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def engine_cache_key(isvc: InferenceService) -> str:
    """The engine cache key in force: the build Job's name and the store entry's (`--cache-key`).

    `cachekey.engine_key` over what the operator knows before the build: the declared sha256 (else the
    URI), the builder image standing for the TensorRT version it pins, no compute capability (the GPU product
    stands for it), the calibration cache's URI and `spec.model.revision` (a new one rebuilds from the bytes the
    URI serves then). The builder records the measured values in the entry.
    """
    spec = isvc.spec
    engine = spec.engine
    if spec.model.kind == "generative":
        return llm_engine_cache_key(isvc)
    return engine_key(
        KeyInputs(
            backend=engine.backend,
            model_digest=spec.model.sha256 or f"uri:{spec.model.uri}",
            model_name=isvc.model_name,
            precision=engine.precision,
            profile=(1, engine.optimization_profile.opt, engine.optimization_profile.max),
            gpu_product=spec.serving.gpu.product,
            tensorrt_version=engine.builder_image,
            workspace_mib=engine.workspace_mi_b,
            opt_level=engine.builder_optimization_level,
            calibration=engine.calibration_cache_uri or "",
            model_revision=spec.model.revision or "",
        )
    )


def llm_engine_cache_key(isvc: InferenceService) -> str:
    """A generative model's key: the same recipe over the TensorRT-LLM build (spec.engine.llm's options; the
    builder image stands for both TensorRT's and TensorRT-LLM's versions). spec.serving.llm is read at load, so
    it keys nothing."""
    spec = isvc.spec
    inputs = trtllm.key_inputs(
        trtllm.TrtllmBuildSpec.from_api(spec.llm_engine()),
        model_name=isvc.model_name,
        gpu_product=spec.serving.gpu.product,
        model_digest=spec.model.sha256 or f"uri:{spec.model.uri}",
        tensorrt_version=spec.engine.builder_image,
        tensorrt_llm_version=spec.engine.builder_image,
        model_revision=spec.model.revision or "",
    )
    return engine_key(inputs)


def engine_info(isvc: InferenceService, cache_key: str, job: JobObservation | None) -> EngineInfo | None:
    """What the build of `cache_key` reported, or None while nothing says.

    `status.engine`, when it records this key, wins over the build's termination message: it is the copy an
    earlier reconcile made of that same report (the Job is named after the key, so the report cannot change
    under it), and having it is what lets `observe` skip reading the build pod (`io_known`). The message is
    read only when there is no record yet.
    """
    recorded = _recorded(cache_key, isvc)
    if recorded is not None:
        return recorded
    return parse_build_report(job.message) if job is not None and job.message else None


def io_known(isvc: InferenceService, cache_key: str) -> bool:
    """Whether the engine's inputs and outputs are known without the build pod (declared, or recorded)."""
    declared = bool(isvc.spec.model.inputs and isvc.spec.model.outputs)
    return declared or _recorded(cache_key, isvc) is not None


def report_recorded(isvc: InferenceService, cache_key: str) -> bool:
    """Whether an earlier reconcile recorded this key's build report (then the build pod need not be read).

    Declared I/O is not enough: the report also carries what only the build measured (its service-time ladder,
    TensorRT version, engine size)."""
    return _recorded(cache_key, isvc) is not None


def engine_status(cache_key: str, store_pvc: str, info: EngineInfo | None, previous: EngineStatus) -> EngineStatus:
    """status.engine from the cache key and, once built, what the builder reported (kept once known)."""
    if info is None and previous.cache_key == cache_key:
        return previous.model_copy(update={"job_name": cache_key})
    info = info or EngineInfo()
    return EngineStatus(
        cache_key=cache_key,
        job_name=cache_key,
        model_digest=info.model_digest,
        location=info.location or f"pvc://{store_pvc}/{cache_key}",
        tensorrt_version=info.tensorrt_version,
        gpu_product=info.gpu_product,
        engine_bytes=info.engine_bytes,
        inputs=list(info.inputs),
        outputs=list(info.outputs),
    )


def service_time_status(
    cache_key: str,
    info: EngineInfo | None,
    previous: ServiceTimeStatus,
    now: datetime,
    live: Sequence[CurvePoint] = (),
) -> ServiceTimeStatus:
    """status.serviceTime: the build's points once the engine is built, and the tuner's live points. Pure.

    Build points come from the engine's build report (kept from `previous` while the report is not read);
    live points are the tuner's (Triton's batch statistics, kept in the tuner state annotation). Points measured
    on another engine (`engineCacheKey` differs) are dropped. Unchanged points keep `updatedAt`.
    """
    stale = previous.engine_cache_key not in (None, cache_key)
    if info is not None:
        build = list(info.service_time)
    else:
        build = [] if stale else [p for p in previous.points if p.source == "build"]
    live_points = [ServiceTimePoint(batch=p.batch, ms=round(p.ms, 3), samples=p.samples, source="live") for p in live]
    if info is None and not build and not live_points:
        return previous
    points = sorted(build + live_points, key=lambda p: (p.batch, p.source))
    if previous.points == points and previous.engine_cache_key == cache_key:
        return previous
    return ServiceTimeStatus(points=points, engine_cache_key=cache_key, updated_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"))


def build_curve(isvc: InferenceService) -> tuple[CurvePoint, ...]:
    """The build's service-time curve of the engine in force (`source="build"`), () while none is recorded."""
    recorded = isvc.status.service_time
    if recorded.engine_cache_key != engine_cache_key(isvc):
        return ()
    return build_points(recorded.points)


def build_points(points: Sequence[ServiceTimePoint]) -> tuple[CurvePoint, ...]:
    """The build's points of a service-time record (status.serviceTime, or a build report) as the tuner's curve."""
    return tuple(
        CurvePoint(batch=p.batch, ms=p.ms, samples=p.samples, source="build") for p in points if p.source == "build"
    )


def _recorded(cache_key: str, isvc: InferenceService) -> EngineInfo | None:
    """What an earlier reconcile recorded of this key's build report (status.engine, status.serviceTime)."""
    previous = isvc.status.engine
    if previous.cache_key != cache_key or not previous.inputs:
        return None
    timed = isvc.status.service_time
    return EngineInfo(
        tensorrt_version=previous.tensorrt_version,
        gpu_product=previous.gpu_product,
        location=previous.location,
        model_digest=previous.model_digest,
        engine_bytes=previous.engine_bytes,
        inputs=tuple(previous.inputs),
        outputs=tuple(previous.outputs),
        service_time=(
            tuple(p for p in timed.points if p.source == "build") if timed.engine_cache_key == cache_key else ()
        ),
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
        model_digest=_digest(report.get("modelDigest")),
        engine_bytes=_size(report.get("engineBytes")),
        inputs=inputs,
        outputs=outputs,
        service_time=_service_time(report.get("serviceTime")),
    )


def _size(value: object) -> int | None:
    """The report's `engineBytes`, or None when absent or not a size (never fatal)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _digest(value: object) -> str | None:
    """The report's `modelDigest` (`sha256:<hex>`), or None when absent or not one (never fatal)."""
    return value if isinstance(value, str) and _MODEL_DIGEST.fullmatch(value) else None


def _service_time(points: object) -> tuple[ServiceTimePoint, ...]:
    """The report's `serviceTime: [{batch, ms}]` as build points; () when absent or malformed (never fatal)."""
    if not isinstance(points, list):
        return ()
    try:
        parsed = [ServiceTimePoint(batch=p["batch"], ms=p["ms"], samples=1, source="build") for p in points]
    except (ValidationError, KeyError, TypeError):
        return ()
    return tuple(sorted(parsed, key=lambda p: p.batch))
