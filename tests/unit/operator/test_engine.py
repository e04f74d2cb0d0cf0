"""The engine's facts in the operator: one cache-key recipe shared with the builder, one engine-info lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailtune.api.v1alpha1 import EngineStatus, TensorSpec
from tailtune.engine_builder import build, cli, fetch
from tailtune.engine_builder.cachekey import compute_cache_key
from tailtune.engine_builder.gpu import GpuInfo
from tailtune.operator.builders.engine_job import build_engine_job
from tailtune.operator.engine import engine_cache_key, engine_info, io_known
from tailtune.operator.observed import JobObservation
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
