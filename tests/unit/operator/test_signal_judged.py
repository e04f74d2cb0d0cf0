"""A signal that lies is judged before the tuner uses it: clocks ahead, stale data and impossible figures give a named
reason on SLOMet and in status.latency, the tuner holds, and the impossible figure is never published or explained
as real. A hold on a thin signal (SignalMissing) is said in status too. Reason codes are spelled out: they are the
interface a user reads."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService
from tailtune.operator.engine import engine_cache_key
from tailtune.operator.explain import Facts, render, to_json
from tailtune.operator.status import compute_slo_condition
from tailtune.operator.tuning import LatencyRead, read_latency, tune_step
from tailtune.tuner.judge import _at
from tailtune.tuner.prom import PrometheusReader, Signal, Target
from tailtune.tuner.types import Observation
from tests.unit.factories import make_isvc
from tests.unit.operator.test_tuning import SERVING, FakeTunerCluster

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
# The build's curve below: full batches of 8 in 10 ms, 800 req/s per instance at most.
CAPACITY_RPS = 800.0


def isvc() -> InferenceService:
    """One ready pod of a 30 ms SLO over 60 s, tuned every 30 s, room to scale to 8, a measured curve."""
    b = (
        make_isvc()
        .set("status", {"replicas": {"desired": 1, "ready": 1}})
        .set("spec.tuning.mode", "rolling")
        .set("spec.tuning.cooldownSeconds", 0)
        .set("spec.serving.replicas", {"min": 1, "max": 8})
    )
    points = [{"batch": 1, "ms": 5.0, "source": "build"}, {"batch": 8, "ms": 10.0, "source": "build"}]
    return b.set("status.serviceTime", {"engineCacheKey": engine_cache_key(b.obj()), "points": points}).obj()


def window(**fields: Any) -> Observation:
    """A window past the SLO with a queue behind it, fresh at NOW: the law would act on it."""
    base: dict[str, Any] = dict(
        window_end=NOW - timedelta(seconds=5), span_seconds=60, p_latency_ms=200.0, request_rate=600.0,
        queue_ms=150.0, compute_ms=10.0, avg_batch=8.0, queue_growth_rps=50.0, pending_max=40.0, ready_replicas=1,
        sample_count=36000,
    )  # fmt: skip
    return Observation(**(base | fields))


def tick(obs: Observation) -> tuple[Any, FakeTunerCluster]:
    cluster = FakeTunerCluster(SERVING)
    decision = asyncio.run(tune_step(isvc(), cluster, LatencyRead(Signal(obs, "tritonSummary")), NOW))
    return decision, cluster


def faults(rng: np.random.Generator) -> list[tuple[str, dict[str, Any], str]]:
    """(expected reason, fields of the window, a figure the message must name), drawn from each fault's family."""
    ahead = float(rng.uniform(31, 3600))
    age = float(rng.uniform(91, 3600))
    negative = -float(rng.uniform(1, 1e4))
    zero = 0.0 if rng.uniform() < 0.5 else -float(rng.uniform(0.1, 50))
    huge = 4 * CAPACITY_RPS * float(10 ** rng.uniform(0.1, 9))
    return [
        ("ClockSkew", {"window_end": NOW + timedelta(seconds=ahead)}, f"{ahead:.0f} s ahead"),
        ("SignalStale", {"window_end": NOW - timedelta(seconds=age)}, _at(NOW - timedelta(seconds=age))),
        ("SignalImplausible", {"request_rate": negative, "sample_count": None}, f"request rate {negative:g}"),
        ("SignalImplausible", {"p_latency_ms": zero}, f"P99 {zero:g} ms"),
        ("SignalImplausible", {"request_rate": huge}, f"request rate {huge:.4g} req/s"),
    ]


def test_the_law_acts_on_the_healthy_window() -> None:
    # The faults below start from this window: whatever holds there holds because of the fault.
    for _ in range(3):
        decision, cluster = tick(window())
        assert decision is not None and decision.changed, decision
        assert APPLIED_ANNOTATION in cluster.annotations


def test_each_fault_holds_and_status_names_it_without_the_figure() -> None:
    rng = np.random.default_rng(40)
    for _ in range(20):
        for reason, fields, figure in faults(rng):
            decision, cluster = tick(window(**fields))
            assert decision is not None and not decision.changed and decision.reason_code == reason, (reason, fields)
            assert APPLIED_ANNOTATION not in cluster.annotations and cluster.events == []
            latency = cluster.latency
            assert latency is not None and latency.problem == reason and figure in (latency.message or "")
            # Never published as if it were real: no figure, no throughput, no verdict per target.
            assert latency.observed_ms is None and latency.throughput_rps is None and latency.clean_ms is None
            assert latency.targets == []
            cond = compute_slo_condition(isvc(), latency)
            assert (cond.status, cond.reason) == ("Unknown", reason) and figure in cond.message
            assert "the tuner holds" in cond.message


def test_a_clock_ahead_is_not_remembered_as_a_judged_window() -> None:
    # Else every window after the clock is fixed would be "already judged" until the clock's lead passed.
    decision, _ = tick(window(window_end=NOW + timedelta(minutes=5)))
    assert decision is not None and decision.state.last_window_end is None


def test_a_hold_on_a_thin_signal_is_said_on_slomet_and_in_status_latency() -> None:
    decision, cluster = tick(window(request_rate=None, sample_count=None))
    assert decision is not None and decision.reason_code == "SignalMissing" and not decision.changed
    latency = cluster.latency
    assert latency is not None and latency.problem == "SignalMissing" and "request rate" in (latency.message or "")
    cond = compute_slo_condition(isvc(), latency)
    # The figure is real and over the SLO: the verdict stands, and says the tuner holds and why.
    assert (cond.status, cond.reason) == ("False", "SLOViolated")
    assert "the tuner holds (SignalMissing)" in cond.message and "request rate" in cond.message


def test_explain_never_sizes_replicas_on_an_impossible_rate() -> None:
    read = LatencyRead(Signal(window(request_rate=-50.0, sample_count=None), "tritonSummary"))
    text = render(Facts(isvc(), read, None, None, NOW))
    assert "-50 req/s" not in text and "would take" not in text
    assert "SignalImplausible" in text and "request rate -50" in text
    data = to_json(Facts(isvc(), read, None, None, NOW))
    assert data["sloMet"]["reason"] == "SignalImplausible" and "throughputRps" not in data["latency"]
    assert data["next"]["action"] == "hold" and data["next"]["reasonCode"] == "SignalImplausible"


class ClockedProm:
    """A Prometheus whose newest sample is stamped `lead` seconds ahead of the operator's clock: at a query time it
    shows only the samples stamped at or before it (as Prometheus does), up to its 5 min lookback."""

    def __init__(self, lead: float) -> None:
        self.newest = NOW.timestamp() + lead

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        if "timestamp(" in promql:
            t = at.timestamp()
            newest = min(self.newest, t)
            return [{"metric": {}, "value": [t, str(newest)]}] if newest > t - 300 else []
        if "sum(rate(nv_inference_request_success" in promql:
            return [{"metric": {}, "value": [at.timestamp(), "100"]}]
        if "nv_inference_request_summary_us" in promql:
            return [{"metric": {}, "value": [at.timestamp(), "0.012"]}]
        return []


def test_the_reader_looks_ahead_and_never_clamps_a_window_to_the_read_time() -> None:
    reader = PrometheusReader(ClockedProm(lead=240), Target("ml", "svc", "bert"), 99, 60)
    read = read_latency(reader, NOW)
    assert read.signal is not None
    assert read.signal.observation.window_end == NOW + timedelta(seconds=240)
    decision, cluster = tick(read.signal.observation)
    assert decision is not None and decision.reason_code == "ClockSkew"
    assert cluster.latency is not None and "240 s ahead" in (cluster.latency.message or "")
    # A clock in step: the newest sample as Prometheus shows it at the read's time.
    fresh = read_latency(PrometheusReader(ClockedProm(lead=-3), Target("ml", "svc", "bert"), 99, 60), NOW)
    assert fresh.signal is not None and fresh.signal.observation.window_end == NOW - timedelta(seconds=3)
