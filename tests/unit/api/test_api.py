"""The pydantic models judge specs the way the CRD's CEL rules do."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tailtune.api import InferenceService
from tests.unit.factories import make_isvc


def test_defaults_fill_a_minimal_spec() -> None:
    isvc = make_isvc().obj()
    assert isvc.spec.engine.backend == "tensorrt"
    assert isvc.spec.engine.optimization_profile.max == 32
    assert isvc.spec.slo.percentile == 99
    assert isvc.spec.tuning.mode == "hot"
    assert isvc.model_name == "demo"


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("spec.tuning.maxBatchSize", {"min": 1, "max": 64}, "tuning.maxBatchSize.max must be <="),
        ("spec.serving.batching", {"maxBatchSize": 64}, "serving.batching.maxBatchSize must be <="),
        ("spec.serving.batching", {"maxBatchSize": 4, "preferredBatchSizes": [8]}, "preferredBatchSizes entry 8"),
        ("spec.serving.replicas", {"min": 3, "max": 2}, "replicas.min must be <= replicas.max"),
        ("spec.engine.precision", "int8", "calibrationCacheUri"),
        ("spec.engine.optimizationProfile", {"opt": 16, "max": 8}, "opt must be <="),
        ("spec.warmup.batchSizes", [16], "warmup.batchSizes"),
        ("spec.model.uri", "ftp://x/y", "pattern"),
        ("spec.slo.latencyMs", 0, "greater than 0"),
        ("spec.serving.gpu.typo", 1, "Extra inputs"),
        ("spec.tuning.targetUtilization", 0.99, "less than or equal to 0.95"),
        ("spec.tuning.targetUtilization", 0.2, "greater than or equal to 0.5"),
    ],
)
def test_invalid_specs_name_the_field(path: str, value: object, needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        make_isvc().set(path, value).obj()
    assert needle in str(err.value)


def test_onnxruntime_refuses_int8() -> None:
    with pytest.raises(ValidationError, match="onnxruntime serves the ONNX model as it is"):
        make_isvc().backend("onnxruntime", "bf16").obj()


def test_wire_names_round_trip() -> None:
    raw = make_isvc().set("spec.engine.workspaceMiB", 2048).dict()
    isvc = InferenceService.model_validate(raw)
    dumped = isvc.spec.model_dump(by_alias=True)
    assert dumped["engine"]["workspaceMiB"] == 2048
    assert dumped["serving"]["instancesPerGpu"] == 1


TTFT = {"targetMs": 500, "percentile": 99}
TPOT = {"targetMs": 30, "percentile": 99}


def test_a_generative_spec_takes_ttft_and_tpot_targets() -> None:
    """A generative service parses with both token targets; a request service stays the default kind."""
    assert make_isvc().obj().spec.model.kind == "request"
    isvc = make_isvc().set("spec.model.kind", "generative").set("spec.slo.ttft", TTFT).set("spec.slo.tpot", TPOT)
    slo = isvc.obj().spec.slo
    assert slo.ttft is not None and slo.tpot is not None
    assert (slo.ttft.target_ms, slo.ttft.percentile, slo.tpot.target_ms) == (500, 99, 30)


@pytest.mark.parametrize(
    ("kind", "targets", "needle"),
    [
        ("generative", {}, "spec.model.kind generative needs spec.slo.ttft and spec.slo.tpot"),
        ("generative", {"ttft": TTFT}, "spec.model.kind generative needs spec.slo.ttft and spec.slo.tpot"),
        ("generative", {"tpot": TPOT}, "spec.model.kind generative needs spec.slo.ttft and spec.slo.tpot"),
        ("request", {"ttft": TTFT}, "apply to generative services only"),
        ("request", {"ttft": TTFT, "tpot": TPOT}, "apply to generative services only"),
        ("generative", {"ttft": TTFT, "tpot": {"targetMs": 30, "percentile": 99.99}}, "less than or equal to 99.9"),
        ("generative", {"ttft": {"targetMs": 0}, "tpot": TPOT}, "greater than 0"),
    ],
)
def test_token_targets_belong_to_generative_services(kind: str, targets: dict[str, object], needle: str) -> None:
    """The operator refuses what CEL refuses: a generative spec without both targets, a request spec with
    either (caught: a generative spec without targets would leave the tuner nothing to hold), P99.99 targets."""
    isvc = make_isvc().set("spec.model.kind", kind)
    for name, value in targets.items():
        isvc.set(f"spec.slo.{name}", value)
    with pytest.raises(ValidationError) as err:
        isvc.obj()
    assert needle in str(err.value)
