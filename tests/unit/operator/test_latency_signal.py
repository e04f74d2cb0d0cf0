"""The latency signal, told truthfully: windows, sources, failures, ambiguity, +Inf, percentiles, retries."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.v1alpha1 import Batching, Condition, InferenceService, LatencyStatus, ObjectMeta
from tailtune.operator.handlers import retry_delay
from tailtune.operator.inforce import in_force_annotation
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tailtune.operator.status import (
    NO_LATENCY_DATA,
    NO_TRAFFIC,
    PROMETHEUS_UNAVAILABLE,
    QUERY_AMBIGUOUS,
    SETTLING,
    SLO_INFEASIBLE,
    SLO_VIOLATED,
    WITHIN_SLO,
    compute_slo_condition,
)
from tailtune.operator.tuning import LatencyRead, latency_status, read_latency, tune_step
from tailtune.tuner.prom import PrometheusReader, PrometheusUnavailable, Target, build_queries, quantile_label
from tailtune.tuner.types import InForce
from tests.unit.factories import make_isvc

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
TARGET = Target("ml", "svc", "bert")


class FakeProm:
    """Answers each query by the first matching substring; counts the calls."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]], error: Exception | None = None) -> None:
        self.answers = answers
        self.error = error
        self.calls: list[str] = []

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        self.calls.append(promql)
        if self.error is not None:
            raise self.error
        for key, value in self.answers.items():
            if key in promql:
                return value
        return []


def vec(value: float | str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [NOW.timestamp(), str(value)]}


def traffic(latency: list[dict[str, Any]], newest: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Answers of a serving model: the latency series as given, 100 req/s, newest sample at `newest`."""
    return {
        "sum(rate(nv_inference_request_success": [vec(100)],
        "timestamp(": [vec(newest if newest is not None else NOW.timestamp() - 2)],
        "nv_inference_request_summary_us": latency,
        "histogram_quantile": latency,
        "count(nv_inference_request_duration_us_bucket": [],
        "count(count by": [vec(1)],
    }


def reader(prom: FakeProm, percentile: float = 99, **kw: Any) -> PrometheusReader:
    return PrometheusReader(prom, TARGET, percentile, 60, **kw)


def serving(**sets: Any) -> InferenceService:
    b = make_isvc().set("status", {"replicas": {"desired": 1, "ready": 1}})
    for path, value in sets.items():
        b.set(path.replace("__", "."), value)
    return b.obj()


# ---- the reader -------------------------------------------------------------------------------------


def test_window_end_is_the_newest_sample_so_a_read_without_a_new_scrape_is_the_same_window() -> None:
    prom = FakeProm(traffic([vec(12)], newest=NOW.timestamp() - 7))
    first = reader(prom).read_signal(NOW).observation
    again = reader(prom).read_signal(NOW + timedelta(seconds=5)).observation
    assert first.window_end == NOW - timedelta(seconds=7)
    assert again.window_end == first.window_end  # the law's WindowAlreadySeen gate then holds
    assert first.p_latency_ms == 12.0 and first.span_seconds == 60


def test_several_series_are_ambiguous_never_the_first_one() -> None:
    series = [vec(0.010, route="a", pod="p1"), vec(0.100, route="b", pod="p1")]
    sig = reader(FakeProm(traffic(series) | {"my_latency": series}), latency_query="my_latency").read_signal(NOW)
    assert sig.observation.p_latency_ms is None
    assert sig.series == 2 and "2 series" in sig.ambiguous and "route" in sig.ambiguous
    assert "pod" not in sig.ambiguous  # only the labels that tell the series apart
    status = latency_status(LatencyRead(sig), serving(), NOW)
    assert status.problem == QUERY_AMBIGUOUS
    cond = compute_slo_condition(serving(), status)
    assert (cond.status, cond.reason) == ("Unknown", QUERY_AMBIGUOUS)


def test_plus_inf_is_over_the_slo_and_nan_is_no_data() -> None:
    sig = reader(FakeProm(traffic([vec("+Inf")]))).read_signal(NOW)
    assert sig.above_range and sig.observation.p_latency_ms == math.inf
    status = latency_status(LatencyRead(sig), serving(), NOW)
    assert status.above_range and status.observed_ms is None
    cond = compute_slo_condition(serving(), status)
    assert (cond.status, cond.reason) == ("False", SLO_VIOLATED) and "above every" in cond.message
    nan = reader(FakeProm(traffic([vec("NaN")]))).read_signal(NOW)
    assert nan.observation.p_latency_ms is None and not nan.above_range


def test_a_failure_ends_the_read_at_the_first_query() -> None:
    prom = FakeProm({}, PrometheusUnavailable("http://prom:9090", "timeout", "no answer within 3 s"))
    read = read_latency(reader(prom), NOW)
    assert read.signal is None and read.problem == PROMETHEUS_UNAVAILABLE
    assert "http://prom:9090" in read.message and "timeout" in read.message
    assert len(prom.calls) == 1  # a hanging Prometheus costs one timeout per tick, not one per query


@pytest.mark.parametrize(("percentile", "label"), [(50, "0.5"), (95, "0.95"), (99, "0.99"), (99.9, "0.999")])
def test_each_percentile_reaches_the_summary_label_and_the_histogram(percentile: float, label: str) -> None:
    assert quantile_label(percentile) == label
    summary = build_queries(TARGET, percentile, 60)
    assert f'quantile="{label}"' in summary.latency_ms and summary.source == "tritonSummary"
    histo = build_queries(TARGET, percentile, 30, histogram=True)
    assert histo.latency_ms.startswith(f"histogram_quantile({percentile / 100:g},") and histo.source == "histogram"
    assert "sum by (le)" in histo.latency_ms


def test_a_percentile_triton_does_not_summarise_says_so() -> None:
    isvc = serving(spec__slo={"latencyMs": 30, "percentile": 97})
    sig = reader(FakeProm(traffic([])), percentile=97).read_signal(NOW)
    status = latency_status(LatencyRead(sig), isvc, NOW)
    assert status.problem == NO_LATENCY_DATA and "only their configured quantiles" in (status.message or "")
    assert "0.97" in (status.message or "")


# ---- status and SLOMet ------------------------------------------------------------------------------


def _changed(minutes_ago: float) -> InferenceService:
    kept = InForce(batching=Batching(max_batch_size=4), replicas=1, changed_at=NOW - timedelta(minutes=minutes_ago))
    b = make_isvc().set("status", {"replicas": {"desired": 1, "ready": 1}})
    return b.annotate(APPLIED_ANNOTATION, in_force_annotation(kept)[APPLIED_ANNOTATION]).obj()


def test_a_window_reaching_back_before_the_change_is_settling_not_a_breach() -> None:
    sig = reader(FakeProm(traffic([vec(5858)]))).read_signal(NOW)  # ms (the query divides by 1000)
    isvc = _changed(minutes_ago=0.5)
    status = latency_status(LatencyRead(sig), isvc, NOW)
    assert status.overlaps_change and status.clean_ms is None and status.observed_ms == 5858.0
    assert status.source == "tritonSummary" and status.window_start and status.window_end
    cond = compute_slo_condition(isvc, status)
    assert (cond.status, cond.reason) == ("Unknown", SETTLING)
    later = latency_status(LatencyRead(reader(FakeProm(traffic([vec(23)]))).read_signal(NOW)), _changed(5), NOW)
    assert not later.overlaps_change and later.clean_ms == 23.0
    assert compute_slo_condition(_changed(5), later).reason == WITHIN_SLO


def test_slo_met_reasons() -> None:
    isvc = serving()
    down = LatencyStatus(problem=PROMETHEUS_UNAVAILABLE, message="Prometheus at http://x unavailable (dns): ...")
    assert compute_slo_condition(isvc, down).reason == PROMETHEUS_UNAVAILABLE
    assert "http://x" in compute_slo_condition(isvc, down).message
    idle = latency_status(
        LatencyRead(reader(FakeProm({"request_success": [vec(0)]} | traffic([]))).read_signal(NOW)), isvc, NOW
    )
    assert idle.problem == NO_TRAFFIC and compute_slo_condition(isvc, idle).reason == NO_TRAFFIC
    over = LatencyStatus(observed_ms=80, infeasible="infeasible within the bounds: 900 req/s needs 6 replicas")
    cond = compute_slo_condition(isvc, over)
    assert (cond.status, cond.reason) == ("False", SLO_INFEASIBLE) and "6 replicas" in cond.message
    assert compute_slo_condition(isvc, LatencyStatus(observed_ms=80)).reason == SLO_VIOLATED


def test_an_interval_shorter_than_the_summary_window_is_explained() -> None:
    sig = reader(FakeProm(traffic([vec(12)]))).read_signal(NOW)
    status = latency_status(LatencyRead(sig), serving(spec__tuning={"intervalSeconds": 5}), NOW)
    assert "overlap" in (status.message or "") and status.problem is None


# ---- the tuner's plumbing ---------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.latency: LatencyStatus | None = None
        self.observed = Observed(
            job=JobObservation(succeeded=True), deployment=DeploymentObservation(replicas=1, ready_replicas=1)
        )

    async def observe(self, isvc: InferenceService, job_name: str, **_: Any) -> Observed:
        return self.observed

    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]:
        return self.observed.deployment.ready_pod_ips if self.observed.deployment else ()

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None:
        return None

    async def patch_latency(
        self, meta: ObjectMeta, latency: LatencyStatus, conditions: list[Condition] | None = None
    ) -> None:
        self.latency = latency
        self.conditions = conditions

    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None:
        return None


def test_tune_step_takes_a_read_made_outside_the_lock_and_surfaces_the_error() -> None:
    cluster = Recorder()
    read = LatencyRead(None, PROMETHEUS_UNAVAILABLE, "Prometheus at http://p:9090 unavailable (refused): refused")
    decision = asyncio.run(tune_step(serving(), cluster, read, NOW))
    assert decision is not None and decision.signal_missing
    assert cluster.latency is not None and cluster.latency.problem == PROMETHEUS_UNAVAILABLE
    assert "refused" in (cluster.latency.message or "")


def test_a_failed_tick_retries_within_the_interval() -> None:
    delays = [retry_delay(n, 30) for n in range(1, 6)]
    assert delays == [5, 10, 20, 30, 30]
    # A 20 s API-server outage from t=0: tries at 0, 5, 15, 35; the tuner is back 15 s after it ended.
    t, n = 0.0, 0
    while t < 20:
        n += 1
        t += retry_delay(n, 30)
    assert t - 20 <= 30


def test_a_user_query_with_a_label_matcher_reaches_prometheus_with_single_braces() -> None:
    # The spec check asks for literal braces doubled (Python format strings); PromQL needs them single.
    from tailtune.tuner.prom import Target, fill_user_query

    target = Target(namespace="ns", name="svc", model="m")
    query = 'histogram_quantile(0.99, sum by (le) (rate(gw_seconds_bucket{{namespace="{namespace}"}}[{window}])))'
    assert fill_user_query(query, target, 60) == (
        'histogram_quantile(0.99, sum by (le) (rate(gw_seconds_bucket{namespace="ns"}[60s])))'
    )
