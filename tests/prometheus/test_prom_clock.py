"""Samples a real Prometheus holds with lying timestamps: an exporter whose samples are stamped 4 minutes ahead (a
clock that is off) and one whose newest sample stopped 2 minutes ago (frozen). The reader sees both as stamped and the
judge names them: ClockSkew with the offset, SignalStale with the age."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from prometheus_client import start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from devkit.ports import free_port
from tailtune.operator.tuning import judge_read, read_latency
from tailtune.tuner.prom import PrometheusReader, Target
from tests.prometheus.conftest import running_prometheus, static_scrape_config
from tests.unit.factories import make_isvc

pytestmark = pytest.mark.prometheus

AHEAD_SECONDS = 240.0
FROZEN_AGE_SECONDS = 120.0


class Stamped(Collector):
    """Triton's success counter and P99 summary of one model, stamped by `stamp(now)`."""

    def __init__(self, model: str, stamp: float | None) -> None:
        self.model, self.start = model, time.time()
        # None: stamped ahead of each scrape; else frozen at this time.
        self.frozen = stamp

    def collect(self) -> Iterable[Metric]:
        now = time.time()
        at = now + AHEAD_SECONDS if self.frozen is None else self.frozen
        labels = {"model": self.model, "version": "1"}
        success = Metric("nv_inference_request_success", "fake", "untyped")
        success.add_sample("nv_inference_request_success", labels, 100 * (at - self.start + 1000), timestamp=at)
        summary = Metric("nv_inference_request_summary_us", "fake", "summary")
        summary.add_sample("nv_inference_request_summary_us", {**labels, "quantile": "0.99"}, 200_000, timestamp=at)
        return [success, summary]


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("prometheus-clock")
    registry = CollectorRegistry()
    registry.register(Stamped("ahead", None))
    registry.register(Stamped("frozen", time.time() - FROZEN_AGE_SECONDS))
    exporter_port = free_port()
    server, _ = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    config = static_scrape_config("triton", [(f"127.0.0.1:{exporter_port}", {"namespace": "ml"})])
    try:
        with running_prometheus(tmp, config) as (url, proc):
            deadline = time.time() + 30
            while time.time() < deadline:  # both models scraped once
                try:
                    ahead = {"query": "count(nv_inference_request_success)", "time": f"{time.time() + 300:.3f}"}
                    body = requests.get(f"{url}/api/v1/query", params=ahead, timeout=1).json()
                    result = body["data"]["result"]
                    if result and float(result[0]["value"][1]) >= 1:
                        frozen = {"query": 'count(nv_inference_request_success{model="frozen"})'}
                        if requests.get(f"{url}/api/v1/query", params=frozen, timeout=1).json()["data"]["result"]:
                            break
                except (requests.RequestException, ValueError, KeyError):
                    pass
                if proc.poll() is not None:
                    pytest.fail(f"prometheus exited: {(tmp / 'prometheus.log').read_text()[-2000:]}")
                time.sleep(0.2)
            else:
                pytest.fail(f"prometheus never scraped both models: {(tmp / 'prometheus.log').read_text()[-2000:]}")
            yield url
    finally:
        server.shutdown()
        server.server_close()


def test_samples_ahead_are_clock_skew_and_a_frozen_newest_sample_is_stale(prom_url: str) -> None:
    isvc = make_isvc().set("status", {"replicas": {"desired": 1, "ready": 1}}).obj()
    now = datetime.now(UTC)
    ahead = read_latency(PrometheusReader.connect(prom_url, Target("ml", "svc", "ahead"), 99, 60), now)
    judged = judge_read(ahead, isvc)
    assert judged.problem == "ClockSkew", judged
    offset = float(judged.message.split(" s ahead")[0].rsplit(" ", 1)[-1])
    assert AHEAD_SECONDS - 5 <= offset <= AHEAD_SECONDS + 1
    frozen = read_latency(PrometheusReader.connect(prom_url, Target("ml", "svc", "frozen"), 99, 60), now)
    assert frozen.signal is not None and frozen.signal.observation.p_latency_ms == 200.0  # still within the lookback
    judged = judge_read(frozen, isvc)
    assert judged.problem == "SignalStale", judged
    assert "P99 200 ms of then not judged" in judged.message
