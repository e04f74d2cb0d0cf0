"""The Prometheus reader against a real Prometheus scraping fake Triton pods with known values."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
import requests

from tailtune.tuner.prom import PrometheusReader, Target
from tailtune.tuner.types import Observation
from tests.prometheus.conftest import PromEnv

pytestmark = pytest.mark.prometheus

WINDOW = 20.0


def _read(prom: PromEnv, model: str, **kwargs: str) -> Observation:
    reader = PrometheusReader.connect(prom.url, Target("ml", "svc", model), 99, WINDOW, **kwargs)
    return reader.read(datetime.now(UTC))


@pytest.fixture(scope="module")
def warm(prom: PromEnv) -> PromEnv:
    """Wait until Prometheus holds a full window of scrapes from both pods."""
    deadline = time.time() + 60
    while time.time() < deadline:
        body = requests.get(
            f"{prom.url}/api/v1/query",
            params={"query": 'count_over_time(nv_inference_request_success{model="bert"}[20s])'},
            timeout=5,
        ).json()
        counts = [float(r["value"][1]) for r in body["data"]["result"]]
        if len(counts) == 2 and min(counts) >= WINDOW - 1:
            return prom
        time.sleep(1)
    pytest.fail("Prometheus did not collect a full window in time")


def test_default_queries_give_the_known_values(warm: PromEnv) -> None:
    obs = _read(warm, "bert")
    # Summaries cannot be averaged: the reader takes the worst pod's P99.
    assert obs.p_latency_ms == pytest.approx(30.0)
    assert obs.request_rate == pytest.approx(200.0, rel=0.1)
    assert obs.queue_ms == pytest.approx(2.0, rel=0.02)
    assert obs.compute_ms == pytest.approx(6.5, rel=0.02)
    assert obs.avg_batch == pytest.approx(4.0, rel=0.02)
    assert obs.queue_growth_rps == pytest.approx(0.0, abs=1e-6)
    # The window's tail (its last third) at a steady load: the same demand.
    assert obs.tail_demand_rps == pytest.approx(200.0, rel=0.1)
    assert obs.ready_replicas == 2
    # A pod's queue is its own: the fullest pod's count (3 on one, 7 on the other), not the sum.
    assert obs.pending_max == pytest.approx(7.0)
    # The summary reaches 60 s back whatever the window: the law waits that long after a change.
    assert obs.span_seconds == 60.0


def test_user_promql_replaces_the_latency_query(warm: PromEnv) -> None:
    query = 'min(nv_inference_request_summary_us{namespace="{namespace}",model="{model}",quantile="0.5"}) / 1e6'
    obs = _read(warm, "bert", latency_query=query)
    assert obs.p_latency_ms == pytest.approx(5.0)
    assert obs.span_seconds == WINDOW
    assert obs.request_rate == pytest.approx(200.0, rel=0.1)


def test_histogram_is_used_when_exposed(warm: PromEnv) -> None:
    obs = _read(warm, "histo")
    # Buckets add up across pods; the 99th percentile interpolates inside (10, 20] ms.
    assert obs.p_latency_ms == pytest.approx(19.8, rel=0.01)
    assert obs.span_seconds == WINDOW


def test_no_traffic_gives_zero_rate_and_no_latency(warm: PromEnv) -> None:
    obs = _read(warm, "idle")
    assert obs.request_rate == 0.0
    assert obs.p_latency_ms is None
    assert obs.queue_ms is None and obs.compute_ms is None and obs.avg_batch is None


def test_missing_series_give_none(warm: PromEnv) -> None:
    obs = _read(warm, "absent")
    assert obs.p_latency_ms is None
    assert obs.request_rate is None
    assert obs.queue_ms is None
    assert obs.compute_ms is None
    assert obs.avg_batch is None
    assert obs.queue_growth_rps is None
    assert obs.tail_demand_rps is None
    assert obs.pending_max is None
    assert obs.ready_replicas is None
    assert obs.sample_count is None


# ---- issue 14: several targets over one window, where the time goes -------------------------------


def test_other_targets_are_read_over_the_same_window(warm: PromEnv) -> None:
    reader = PrometheusReader.connect(warm.url, Target("ml", "svc", "bert"), 99, WINDOW, other_percentiles=(50, 99.9))
    obs = reader.read(datetime.now(UTC))
    assert obs.p_latency_ms == pytest.approx(30.0)
    # The worst pod's P50; Triton's summary of these pods carries no 0.999: no data, never a guess.
    assert obs.other_percentiles == ((50, pytest.approx(7.0)), (99.9, None))


def test_a_user_query_with_quantile_serves_every_target_and_tritons_own_figure_is_read_beside_it(
    warm: PromEnv,
) -> None:
    query = 'max(nv_inference_request_summary_us{namespace="{namespace}",model="{model}",quantile="{quantile}"}) / 1e6'
    reader = PrometheusReader.connect(
        warm.url, Target("ml", "svc", "bert"), 99, WINDOW, latency_query=query, other_percentiles=(50,)
    )
    signal = reader.read_signal(datetime.now(UTC))
    assert signal.source == "userQuery"
    assert signal.observation.p_latency_ms == pytest.approx(30.0)
    assert signal.observation.other_percentiles == ((50, pytest.approx(7.0)),)
    assert signal.server_ms == pytest.approx(30.0)  # Triton's own P99: nothing outside Triton here


def test_breakdown_from_tritons_counters_summed_over_pods(warm: PromEnv) -> None:
    reader = PrometheusReader.connect(warm.url, Target("ml", "svc", "bert"), 99, WINDOW, breakdown=True)
    b = reader.read_signal(datetime.now(UTC)).breakdown
    assert b is not None
    assert b.queue_ms == pytest.approx(2.0, rel=0.02)
    assert (b.input_ms, b.infer_ms, b.output_ms) == (
        pytest.approx(1.0, rel=0.02), pytest.approx(5.0, rel=0.02), pytest.approx(0.5, rel=0.02),
    )  # fmt: skip
    # These fake pods export no request-duration counter: the rest is unknown, not zero.
    assert b.request_ms is None and b.rest_ms is None
