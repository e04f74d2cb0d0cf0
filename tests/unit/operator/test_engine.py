"""The engine's facts in the operator: one cache-key recipe shared with the builder, one engine-info lookup."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tailtune.api.v1alpha1 import EngineStatus, ServiceTimePoint, ServiceTimeStatus, TensorSpec
from tailtune.engine_builder import build, cli, fetch
from tailtune.engine_builder.cachekey import compute_cache_key
from tailtune.engine_builder.gpu import GpuInfo
from tailtune.operator.builders.engine_job import build_engine_job
from tailtune.operator.engine import (
    build_curve,
    engine_cache_key,
    engine_info,
    io_known,
    parse_build_report,
    report_recorded,
    service_time_status,
)
from tailtune.operator.observed import JobObservation
from tailtune.tuner.servicetime import CurvePoint
from tests.unit.factories import IsvcBuilder, make_isvc

SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
REPORT = '{"inputs": [{"name": "r", "dataType": "TYPE_FP32", "dims": [3]}], "outputs": [], "location": "pvc://x/y"}'


def _builder_key(isvc: IsvcBuilder) -> str:
    """The builder's own key for the Job's flags, on a machine that knows what the operator knows."""
    parsed = isvc.obj()
    command = build_engine_job(parsed, "eng-ignored")["spec"]["template"]["spec"]["containers"][0]["command"]
    req = cli._request(cli._parser().parse_args(command[3:]))
    machine = build.Machine(
        tensorrt_version=parsed.spec.engine.builder_image,
        gpu=GpuInfo(name=req.gpu_product, compute_capability=""),
        pvc_root=Path("/mnt/models"),
        builder_version="test",
    )
    digest = fetch.normalize_sha256(req.sha256) if req.sha256 else f"uri:{req.model_uri}"
    calibration = parsed.spec.engine.calibration_cache_uri or ""
    inputs = build.key_inputs(req, model_digest=digest, machine=machine, calibration_digest=calibration)
    return compute_cache_key(**inputs)


@pytest.mark.parametrize(
    "isvc",
    [
        make_isvc().set("spec.model.sha256", SHA),
        make_isvc().set("spec.model.sha256", SHA).backend("onnxruntime", "fp32"),
        make_isvc().backend("tensorrt", "int8").set("spec.engine.calibrationCacheUri", "https://c/calib.cache"),
        make_isvc("other").set("spec.engine.workspaceMiB", 1024).set("spec.engine.builderOptimizationLevel", 5),
    ],
)
def test_operator_and_builder_share_one_recipe(isvc: IsvcBuilder) -> None:
    assert engine_cache_key(isvc.obj()) == _builder_key(isvc)


def test_operator_key_is_pinned() -> None:
    # Was eng-6f726201060ad844. Changed once by the single recipe (issue 11): snake_case flags, the model
    # name in the key (two services with the same model but different names shared one Job and one store
    # entry before), "" for what an onnxruntime engine does not depend on. Existing engines are rebuilt
    # once under their new key.
    assert engine_cache_key(make_isvc().obj()) == engine_cache_key(make_isvc().obj())
    assert engine_cache_key(make_isvc("a").obj()) != engine_cache_key(make_isvc("b").obj())
    assert engine_cache_key(make_isvc().obj()) == "eng-e98c7892006be524"


def test_the_record_wins_over_the_report_and_needs_no_pod() -> None:
    bare = make_isvc().set("spec.model.inputs", []).set("spec.model.outputs", [])
    key = engine_cache_key(bare.obj())
    job = JobObservation(succeeded=True, message=REPORT)
    assert not io_known(bare.obj(), key)
    from_report = engine_info(bare.obj(), key, job)
    assert from_report is not None and from_report.location == "pvc://x/y"

    recorded = EngineStatus(
        cache_key=key, location="pvc://rec/k", inputs=[TensorSpec(name="x", data_type="TYPE_FP32", dims=[1])]
    )
    kept = bare.set("status", {"engine": recorded.model_dump(by_alias=True, mode="json")})
    assert io_known(kept.obj(), key)
    info = engine_info(kept.obj(), key, job)
    assert info is not None and info.location == "pvc://rec/k"
    # A record of another key is not this engine's.
    assert engine_info(kept.obj(), "eng-other", None) is None
    assert not io_known(kept.obj(), "eng-other")


def test_declared_io_is_known_without_a_record() -> None:
    isvc = make_isvc().obj()
    assert io_known(isvc, engine_cache_key(isvc))


def test_the_report_is_read_until_recorded_even_with_declared_io() -> None:
    # Declared I/O renders the config, but only the report has the build's service-time ladder: the build pod
    # is read until status records this key's report, then never again.
    isvc = make_isvc().obj()
    key = engine_cache_key(isvc)
    assert io_known(isvc, key) and not report_recorded(isvc, key)
    recorded = make_isvc().set(
        "status",
        {
            "engine": EngineStatus(
                cache_key=key, inputs=[TensorSpec(name="r", data_type="TYPE_FP32", dims=[3])]
            ).model_dump(by_alias=True)
        },
    )
    assert report_recorded(recorded.obj(), key)
    assert not report_recorded(recorded.obj(), "eng-other")


# --- the build's service time: termination message -> EngineInfo -> status.serviceTime -> the tuner's curve --

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
TIMED = (
    '{"inputs": [{"name": "r", "dataType": "TYPE_FP32", "dims": [3]}],'
    ' "serviceTime": [{"batch": 2, "ms": 1.5}, {"batch": 1, "ms": 1.25}]}'
)


def _build_point(batch: int, ms: float) -> ServiceTimePoint:
    return ServiceTimePoint(batch=batch, ms=ms, samples=1, source="build")


def test_the_report_carries_the_build_curve() -> None:
    info = parse_build_report(TIMED)
    assert info is not None and info.service_time == (_build_point(1, 1.25), _build_point(2, 1.5))
    assert parse_build_report(REPORT) == parse_build_report(REPORT)  # no serviceTime: still a report
    assert parse_build_report(REPORT) is not None and parse_build_report(REPORT).service_time == ()  # type: ignore[union-attr]
    malformed = TIMED.replace('"ms": 1.5', '"ms": -1')
    assert parse_build_report(malformed) is not None and parse_build_report(malformed).service_time == ()  # type: ignore[union-attr]


def test_service_time_status_from_the_build() -> None:
    info = parse_build_report(TIMED)
    empty = ServiceTimeStatus()
    first = service_time_status("eng-1", info, empty, NOW)
    assert first == ServiceTimeStatus(
        points=[_build_point(1, 1.25), _build_point(2, 1.5)],
        engine_cache_key="eng-1",
        updated_at="2025-01-02T03:04:05Z",
    )
    assert service_time_status("eng-1", info, first, NOW + timedelta(minutes=1)) is first  # unchanged: kept
    assert service_time_status("eng-1", None, first, NOW) is first  # no engine (yet): nothing to say
    # The tuner's live points (its state annotation) join the build's, by batch size.
    learned = (CurvePoint(batch=4, ms=3.0, samples=40, source="live"),)
    live = service_time_status("eng-1", info, first, NOW, live=learned)
    assert live.points == [*first.points, ServiceTimePoint(batch=4, ms=3.0, samples=40, source="live")]
    assert service_time_status("eng-1", None, live, NOW, live=learned) is live  # report not read: kept
    other = service_time_status("eng-2", info, live, NOW)  # a new engine: the old one's points go
    assert other.engine_cache_key == "eng-2" and all(p.source == "build" for p in other.points)


def test_build_curve_of_the_engine_in_force() -> None:
    key = engine_cache_key(make_isvc().obj())
    timed = ServiceTimeStatus(
        points=[_build_point(1, 1.25), ServiceTimePoint(batch=1, ms=1.0, samples=9, source="live")],
        engine_cache_key=key,
    )
    isvc = make_isvc().set("status", {"serviceTime": timed.model_dump(by_alias=True)}).obj()
    assert build_curve(isvc) == (CurvePoint(batch=1, ms=1.25, samples=1, source="build"),)
    stale = make_isvc().set("status", {"serviceTime": timed.model_dump(by_alias=True) | {"engineCacheKey": "x"}})
    assert build_curve(stale.obj()) == ()


def test_the_recorded_engine_keeps_its_build_curve() -> None:
    isvc = make_isvc().obj()
    key = engine_cache_key(isvc)
    job = JobObservation(succeeded=True, message=TIMED)
    info = engine_info(isvc, key, job)
    assert info is not None
    status = {
        "engine": {"cacheKey": key, "inputs": [{"name": "r", "dataType": "TYPE_FP32", "dims": [3]}]},
        "serviceTime": service_time_status(key, info, ServiceTimeStatus(), NOW).model_dump(by_alias=True),
    }
    recorded = make_isvc().set("status", status).obj()
    # Without the build pod's message (observe skips it once the I/O is recorded), status still has it.
    again = engine_info(recorded, key, JobObservation(succeeded=True))
    assert again is not None and again.service_time == info.service_time
