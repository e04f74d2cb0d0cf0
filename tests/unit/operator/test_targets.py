"""Several percentile targets (spec.slo.targets) and where the time goes (status.latency.breakdown).

From the spec to the law's policy, from Prometheus to the observation, into status, SLOMet, the printer column
and the operator's metrics.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from tailtune.api.crdgen import build_crd
from tailtune.api.v1alpha1 import InferenceService, Slo
from tailtune.operator import metrics
from tailtune.operator.inforce import policy_for
from tailtune.operator.status import SETTLING, SLO_VIOLATED, WITHIN_SLO, compute_slo_condition
from tailtune.operator.tuning import LatencyRead, latency_status, tune_step
from tailtune.tuner.prom import Breakdown, PrometheusReader, Signal, Target
from tailtune.tuner.servicetime import BatchSample
from tailtune.tuner.types import Observation
from tests.unit.factories import make_isvc
from tests.unit.operator.test_latency_signal import Recorder

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
TARGET = Target("ml", "svc", "bert")
TARGETS = [{"percentile": 50, "latencyMs": 8}, {"percentile": 99.9, "latencyMs": 80}]


def isvc_with(targets: list[dict[str, Any]] = TARGETS, **sets: Any) -> InferenceService:
    b = make_isvc().set("status", {"replicas": {"desired": 1, "ready": 1}}).set("spec.slo.targets", targets)
    for path, value in sets.items():
        b.set(path.replace("__", "."), value)
    return b.obj()


def vec(value: float | str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [NOW.timestamp(), str(value)]}


class QuantileProm:
    """A Prometheus answering each query with its result (ms) by what it reads; records every query."""

    def __init__(self, quantiles: dict[str, float], parts: dict[str, float] | None = None) -> None:
        self.quantiles, self.parts = quantiles, parts or {}
        self.calls: list[str] = []

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        self.calls.append(promql)
        if "timestamp(" in promql:
            return [vec(NOW.timestamp() - 2)]
        if "count(nv_inference_request_duration_us_bucket" in promql:
            return []
        if "gateway_seconds" in promql:
            return [vec(40)]  # what `(query) * 1000` answers
        for q, us in self.quantiles.items():
            if f'quantile="{q}"' in promql:
                return [vec(us)]
        for metric, ms in self.parts.items():
            if f"rate({metric}" in promql and promql.startswith(f"sum(rate({metric}"):
                return [vec(ms)]
        if "sum(rate(nv_inference_request_success" in promql:
            return [vec(100)]
        return []


# ---- the spec -----------------------------------------------------------------------------------------


def test_targets_are_optional_and_the_primary_fields_keep_working() -> None:
    slo = Slo.model_validate({"latencyMs": 30})
    assert slo.targets == [] and slo.all_targets() == ((99, 30),) and slo.other_targets() == ()
    slo = Slo.model_validate({"latencyMs": 30, "targets": [{"percentile": 99.9, "latencyMs": 80}, TARGETS[0]]})
    assert slo.all_targets() == ((99, 30), (50, 8), (99.9, 80))


@pytest.mark.parametrize(
    "targets",
    [[{"percentile": 99, "latencyMs": 40}], [TARGETS[0], {"percentile": 50, "latencyMs": 9}]],
    ids=["repeats-primary", "repeats-a-target"],
)
def test_a_percentile_appears_once(targets: list[dict[str, Any]]) -> None:
    with pytest.raises(ValidationError, match="must not repeat a percentile"):
        Slo.model_validate({"latencyMs": 30, "targets": targets})


def test_the_crd_says_it_at_admission_too() -> None:
    slo = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["slo"]
    rules = [r["rule"] for r in slo["x-kubernetes-validations"]]
    assert any("t.percentile != self.percentile" in r for r in rules)
    assert any("exists_one" in r for r in rules)
    assert slo["properties"]["targets"]["maxItems"] == 8


def test_policy_carries_the_other_targets() -> None:
    assert policy_for(isvc_with()).other_targets == ((50, 8), (99.9, 80))
    assert policy_for(isvc_with([])).other_targets == ()


# ---- Prometheus -----------------------------------------------------------------------------------------


def test_reader_reads_each_extra_percentile_over_the_same_window() -> None:
    prom = QuantileProm({"0.5": 6, "0.99": 24, "0.999": 91})
    signal = PrometheusReader(prom, TARGET, 99, 60, other_percentiles=(50, 99.9)).read_signal(NOW)
    assert signal.observation.p_latency_ms == 24
    assert signal.observation.other_percentiles == ((50, 6), (99.9, 91))
    assert signal.breakdown is None  # not asked for


def test_reader_with_breakdown_and_a_user_query_reads_tritons_own_figure_too() -> None:
    parts = {
        "nv_inference_queue_duration_us": 3.0,
        "nv_inference_compute_input_duration_us": 0.5,
        "nv_inference_compute_infer_duration_us": 5.0,
        "nv_inference_compute_output_duration_us": 0.5,
        "nv_inference_request_duration_us": 11.0,
    }
    prom = QuantileProm({"0.5": 6, "0.99": 25}, parts)
    r = PrometheusReader(prom, TARGET, 99, 60, latency_query="gateway_seconds", other_percentiles=(50,), breakdown=True)
    signal = r.read_signal(NOW)
    assert signal.source == "userQuery" and signal.observation.p_latency_ms == pytest.approx(40)
    assert signal.server_ms == 25  # Triton's own P99
    # the user's query has no {quantile}: P50 comes from Triton's summary
    assert signal.observation.other_percentiles == ((50, 6),)
    assert signal.breakdown is not None and signal.breakdown.rest_ms == pytest.approx(2.0)


def test_a_user_query_with_a_quantile_placeholder_serves_every_target() -> None:
    prom = QuantileProm({})
    r = PrometheusReader(
        prom, TARGET, 99, 60, latency_query="gw{q='{quantile}'} gateway_seconds", other_percentiles=(50,)
    )
    r.read_signal(NOW)
    assert any("gw{q='0.99'}" in c for c in prom.calls) and any("gw{q='0.5'}" in c for c in prom.calls)


# ---- status and SLOMet ---------------------------------------------------------------------------------


def _read(p99: float, others: tuple[tuple[float, float | None], ...], **kw: Any) -> LatencyRead:
    obs = Observation(
        window_end=NOW, span_seconds=60, p_latency_ms=p99, request_rate=100.0, avg_batch=3.5,
        other_percentiles=others,
    )  # fmt: skip
    return LatencyRead(Signal(observation=obs, source=kw.pop("source", "tritonSummary"), **kw))


def test_every_target_against_its_figure_and_slomet_names_the_missed_one() -> None:
    isvc = isvc_with()  # primary P99 <= 30 ms (factory)
    slo_ms = isvc.spec.slo.latency_ms
    latency = latency_status(_read(slo_ms / 2, ((50, 6.0), (99.9, 91.0))), isvc, NOW)
    assert [(t.percentile, t.target_ms, t.observed_ms, t.met) for t in latency.targets] == [
        (99, slo_ms, slo_ms / 2, True), (50, 8, 6.0, True), (99.9, 80, 91.0, False),
    ]  # fmt: skip
    assert latency.targets_summary is not None and "P99.9 91/80 MISSED" in latency.targets_summary
    cond = compute_slo_condition(isvc, latency)
    assert (cond.status, cond.reason) == ("False", SLO_VIOLATED)
    assert cond.message.startswith("P99.9 missed: ") and "P50 6.0 ms vs 8 ms" in cond.message


def test_all_targets_met_is_within_slo_and_settling_still_wins() -> None:
    isvc = isvc_with()
    latency = latency_status(_read(10, ((50, 6.0), (99.9, 70.0))), isvc, NOW)
    assert compute_slo_condition(isvc, latency).reason == WITHIN_SLO
    settling = latency.model_copy(update={"overlaps_change": True, "targets": [*latency.targets[:2]]})
    assert compute_slo_condition(isvc, settling).reason == SETTLING


def test_a_target_without_data_is_not_judged_and_plus_inf_is_missed() -> None:
    isvc = isvc_with()
    latency = latency_status(_read(10, ((50, None), (99.9, math.inf))), isvc, NOW)
    by = {t.percentile: t for t in latency.targets}
    assert by[50].met is None and by[99.9].met is False and by[99.9].observed_ms is None
    cond = compute_slo_condition(isvc, latency)
    assert cond.status == "False" and "P99.9 missed" in cond.message and "P50 no data" in cond.message


def test_one_target_keeps_the_old_status_shape() -> None:
    latency = latency_status(_read(10, ()), isvc_with([]), NOW)
    assert len(latency.targets) == 1 and latency.targets_summary is None


def test_breakdown_in_status_with_batches_and_the_part_outside_triton() -> None:
    isvc = isvc_with(spec__metrics={"latencyQuery": "gateway_seconds"})
    read = _read(
        40.0, (), source="userQuery", server_ms=25.0,
        breakdown=Breakdown(queue_ms=3.0, input_ms=0.5, infer_ms=5.0, output_ms=0.5, request_ms=11.0),
    )  # fmt: skip
    stats = (BatchSample(batch=8, count=10, ms=6.0), BatchSample(batch=1, count=4, ms=2.0))
    b = latency_status(read, isvc, NOW, batch_stats=stats).breakdown
    assert b is not None
    assert (b.queue_ms, b.compute_infer_ms, b.rest_ms, b.request_ms) == (3.0, 5.0, 2.0, 11.0)
    assert (b.server_ms, b.outside_ms, b.mean_batch) == (25.0, 15.0, 3.5)
    assert [(c.batch, c.count) for c in b.batches] == [(1, 4), (8, 10)]


# ---- the operator's metrics ---------------------------------------------------------------------------


def test_metrics_export_targets_and_breakdown_and_forget_them() -> None:
    isvc = isvc_with()
    read = _read(
        10.0, ((50, 6.0), (99.9, 70.0)),
        breakdown=Breakdown(queue_ms=3.0, input_ms=0.5, infer_ms=5.0, output_ms=0.5, request_ms=11.0),
    )  # fmt: skip
    metrics.record_latency("ml-t", "svc", latency_status(read, isvc, NOW))

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"namespace": "ml-t", "name": "svc", **labels})

    assert value("tailtune_latency_observed_ms", percentile="99.9") == 70.0
    assert value("tailtune_latency_target_ms", percentile="50") == 8.0
    assert value("tailtune_latency_breakdown_ms", part="queue") == 3.0
    assert value("tailtune_latency_breakdown_ms", part="rest") == 2.0
    assert value("tailtune_latency_breakdown_ms", part="outside") is None  # no end-to-end query
    assert value("tailtune_batch_size_mean") == 3.5
    metrics.forget_inference_service("ml-t", "svc")
    assert value("tailtune_latency_observed_ms", percentile="99.9") is None
    assert value("tailtune_latency_breakdown_ms", part="queue") is None


# ---- the tuner's tick ---------------------------------------------------------------------------------


class FakeStats:
    def read(self, addresses: list[str]) -> tuple[tuple[int, int, float], ...]:
        return ((4, 25, 6.0), (1, 10, 2.0), (2, 0, 0.0))


def test_a_tick_records_targets_breakdown_and_batches_and_exports_them() -> None:
    isvc = isvc_with()
    read = _read(
        10.0, ((50, 6.0), (99.9, 95.0)),
        breakdown=Breakdown(queue_ms=3.0, input_ms=0.5, infer_ms=5.0, output_ms=0.5, request_ms=11.0),
    )  # fmt: skip
    cluster = Recorder()
    asyncio.run(tune_step(isvc, cluster, read, NOW, batch_stats=FakeStats()))
    latency = cluster.latency
    assert latency is not None and latency.breakdown is not None
    assert [(c.batch, c.count) for c in latency.breakdown.batches] == [(1, 10), (4, 25)]  # sizes never run: left out
    assert [t.met for t in latency.targets] == [True, True, False]
    sample = REGISTRY.get_sample_value(
        "tailtune_latency_observed_ms", {"namespace": isvc.metadata.namespace, "name": isvc.metadata.name,
                                         "percentile": "99.9"},
    )  # fmt: skip
    assert sample == 95.0
    metrics.forget_inference_service(isvc.metadata.namespace, isvc.metadata.name)


def test_unavailable_batch_statistics_are_said_once_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    """Caught: a line per tick per object while Triton's statistics could not be read (at 1,000 objects on kwok
    pods, which run no Triton, most of the operator's log). Said again when the reason changes or after a read."""
    import logging

    class Failing:
        reason = "connection refused"

        def read(self, addresses: list[str]) -> tuple[tuple[int, int, float], ...]:
            raise ConnectionError(self.reason)

    isvc, failing = isvc_with(), Failing()

    def tick(stats: Any) -> None:
        asyncio.run(tune_step(isvc, Recorder(), _read(10.0, ((50, 6.0), (99.9, 9.0))), NOW, batch_stats=stats))

    def said() -> int:
        return sum("batch statistics unavailable" in r.getMessage() for r in caplog.records if r.levelno >= 20)

    with caplog.at_level(logging.INFO, logger="tailtune.operator.tuning"):
        tick(failing)
        tick(failing)
        assert said() == 1
        failing.reason = "deadline exceeded"
        tick(failing)
        assert said() == 2
        tick(FakeStats())
        tick(failing)
        assert said() == 3
