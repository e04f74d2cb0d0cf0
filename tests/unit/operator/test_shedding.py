"""spec.serving.shedding: the model config's default_queue_policy, from the SLO and the build's curve at the batching
in force (pure rendering), and the spec rules that keep it the timeout's one owner."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tailtune.api.crdgen import build_crd
from tailtune.api.v1alpha1 import Batching, InferenceService, ServiceTimePoint
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.observed import EngineInfo
from tailtune.triton.config import config_from_json
from tests.unit.factories import make_isvc

# The build's ladder: t(b) = 1.5 + 0.5 b ms.
BUILD = tuple(ServiceTimePoint(batch=b, ms=1.5 + 0.5 * b, source="build") for b in (1, 2, 4, 8, 16, 32))
INFO = EngineInfo(service_time=BUILD)


def _shedding(**serving: Any) -> InferenceService:
    b = make_isvc().set("spec.serving.shedding", {"enabled": True})  # slo.latencyMs: 30
    for key, value in serving.items():
        b = b.set(f"spec.serving.{key}", value)
    return b.obj()


def _policy(isvc: InferenceService, batching: Batching, info: EngineInfo | None = INFO) -> Any:
    cfg = config_from_json(model_config_json(isvc, batching, info))
    return cfg.dynamic_batching.default_queue_policy if cfg.dynamic_batching.HasField("default_queue_policy") else None


def test_the_timeout_is_the_slo_less_the_max_batch_in_force() -> None:
    qp = _policy(_shedding(), Batching(max_batch_size=8))
    # 30 ms - t(8) 5.5 ms x 1.1 (the spread allowance) = 23.95 ms.
    assert qp.default_timeout_microseconds == 23_950
    assert qp.timeout_action == 0  # REJECT
    assert not qp.allow_timeout_override
    assert qp.max_queue_size == 0


def test_the_timeout_is_recomputed_with_the_batching() -> None:
    isvc = _shedding()
    assert _policy(isvc, Batching(max_batch_size=16)).default_timeout_microseconds == 30_000 - 10_450
    # Interpolated on the build's ladder: t(12) = 7.5 ms.
    assert _policy(isvc, Batching(max_batch_size=12)).default_timeout_microseconds == 30_000 - 8_250


def test_each_instance_on_the_device_takes_its_batch_off_the_timeout() -> None:
    qp = _policy(_shedding(instancesPerGpu=2), Batching(max_batch_size=8))
    assert qp.default_timeout_microseconds == 30_000 - 2 * 6_050


def test_a_max_batch_past_the_slo_is_floored_at_a_light_loads_wait() -> None:
    qp = _policy(_shedding(instancesPerGpu=2), Batching(max_batch_size=32, max_queue_delay_microseconds=3_000))
    assert qp.default_timeout_microseconds == 3_000 + 2_000  # the delay and t(1): 30 - 2 x 17.5 x 1.1 is below 0


def test_without_a_measured_curve_the_timeout_is_the_whole_slo() -> None:
    assert _policy(_shedding(), Batching(max_batch_size=8), EngineInfo()).default_timeout_microseconds == 30_000
    assert _policy(_shedding(), Batching(max_batch_size=8), None).default_timeout_microseconds == 30_000


def test_the_queue_size_bound_stays_the_specs() -> None:
    qp = _policy(_shedding(queuePolicy={"maxQueueSize": 64}), Batching(max_batch_size=8))
    assert (qp.max_queue_size, qp.default_timeout_microseconds) == (64, 23_950)


def test_off_by_default_the_config_has_triton_s_queue_policy() -> None:
    isvc = make_isvc().obj()
    assert not isvc.spec.serving.shedding.enabled
    assert _policy(isvc, Batching(max_batch_size=8)) is None
    own = make_isvc().set("spec.serving.queuePolicy", {"timeoutMicroseconds": 5_000}).obj()
    assert _policy(own, Batching(max_batch_size=8)).default_timeout_microseconds == 5_000


def test_shedding_and_a_timeout_of_ones_own_are_refused_together() -> None:
    with pytest.raises(ValidationError, match=r"leave serving\.queuePolicy\.timeoutMicroseconds at 0"):
        _shedding(queuePolicy={"timeoutMicroseconds": 5_000})
    serving = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "serving"
    ]
    rules = [r["rule"] for r in serving["x-kubernetes-validations"]]
    assert "!self.shedding.enabled || self.queuePolicy.timeoutMicroseconds == 0" in rules
    assert serving["properties"]["shedding"]["default"] == {"enabled": False}
