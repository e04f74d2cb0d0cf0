"""The per-pod TTFT/TPOT read a generative canary is judged on (`prom.read_pod_generative`), against a real
Prometheus scraping two fake LLM pods (on 127.0.0.1 and 127.0.0.2: a pod is told apart by its scrape instance's host,
as on a cluster each pod by its IP) whose token-latency histograms grow at fixed rates with known bucket shares, so
each pod's quantile over the window is known in advance."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import requests
from prometheus_client import start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from devkit.ports import free_port
from tailtune.tuner import prom
from tests.prometheus.conftest import SCRAPE_SECONDS, running_prometheus, static_scrape_config

pytestmark = pytest.mark.prometheus

WINDOW_S = 10.0


@dataclass(frozen=True)
class FakeLlmPod:
    """One pod's token histograms: requests/s, and (le ms, share at or below) per histogram."""

    host: str
    rps: float
    ttft: tuple[tuple[str, float], ...]
    tpot: tuple[tuple[str, float], ...]


# Pod a: TTFT half under 100 ms, all under 200: P99 = 100 + 0.49 / 0.5 x 100 = 198 ms; TPOT half under 20, all under
# 40: P99 39.6 ms. Pod b: TTFT half under 200, all under 400: P99 396 ms; TPOT all above every finite bound.
PODS = (
    FakeLlmPod("127.0.0.1", 10.0, (("100", 0.5), ("200", 1.0), ("400", 1.0), ("+Inf", 1.0)),
               (("20", 0.5), ("40", 1.0), ("+Inf", 1.0))),
    FakeLlmPod("127.0.0.2", 4.0, (("100", 0.0), ("200", 0.5), ("400", 1.0), ("+Inf", 1.0)),
               (("20", 0.0), ("40", 0.0), ("+Inf", 1.0))),
)  # fmt: skip


class LlmExporter(Collector):
    """The emulated LLM's histograms (devkit.llm.metrics' names) for one model, counters growing since `start`."""

    def __init__(self, pod: FakeLlmPod) -> None:
        self.pod = pod
        self.start = time.time()

    def collect(self) -> Iterable[Metric]:
        now = time.time()
        n = self.pod.rps * (now - self.start + 1000)  # as if up a while: rate() has no zero to clamp to
        labels = {"model": "llm", "version": "1"}
        for name, buckets in ((prom.TTFT_HISTOGRAM_MS, self.pod.ttft), (prom.TPOT_HISTOGRAM_MS, self.pod.tpot)):
            family = Metric(name, f"fake {name}", "histogram")
            for le, share in buckets:
                family.add_sample(f"{name}_bucket", {**labels, "le": le}, n * share, timestamp=now)
            family.add_sample(f"{name}_count", labels, n, timestamp=now)
            family.add_sample(f"{name}_sum", labels, n * 50.0, timestamp=now)
            yield family


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prometheus-llm")
    servers, targets = [], []
    for pod in PODS:
        registry = CollectorRegistry()
        registry.register(LlmExporter(pod))
        port = free_port()
        server, _ = start_http_server(port, addr=pod.host, registry=registry)
        servers.append(server)
        targets.append((f"{pod.host}:{port}", {"namespace": "ml"}))
    try:
        with running_prometheus(tmp, static_scrape_config("llm", targets)) as (address, _):
            deadline = time.time() + 60
            query = f'count_over_time({prom.TTFT_HISTOGRAM_MS}_count{{model="llm"}}[{WINDOW_S:g}s])'
            while time.time() < deadline:  # a full window of scrapes from both pods
                body = requests.get(f"{address}/api/v1/query", params={"query": query}, timeout=5).json()
                counts = [float(r["value"][1]) for r in body["data"]["result"]]
                if len(counts) == 2 and min(counts) >= WINDOW_S / SCRAPE_SECONDS - 1:
                    break
                time.sleep(1)
            else:
                pytest.fail("Prometheus did not collect a full window in time")
            yield address
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_each_pods_own_ttft_and_tpot_come_from_its_buckets_alone(url: str) -> None:
    """Pod a's P99 TTFT 198 ms and pod b's 396 ms, each from its own buckets (summed over both pods the P99 would be
    one figure for both); the requests behind each are its rate times the window. Pod b's TPOT lies in the +Inf
    bucket: Prometheus answers the highest finite bound (40 ms), not +Inf, so a figure there is a floor (the emulated
    LLM's buckets reach 65 s)."""
    client = prom.HttpPromClient(url)
    pods = prom.read_pod_generative(client.query, prom.Target("ml", "llm", "llm"), 99, 99, WINDOW_S, datetime.now(UTC))
    assert set(pods) == {"127.0.0.1", "127.0.0.2"}, pods
    a, b = pods["127.0.0.1"], pods["127.0.0.2"]
    assert a.ttft_ms == pytest.approx(198.0, rel=0.01) and a.tpot_ms == pytest.approx(39.6, rel=0.01)
    assert b.ttft_ms == pytest.approx(396.0, rel=0.01)
    assert b.tpot_ms == 40.0 and not b.above_range_tpot
    assert a.ttft_requests == pytest.approx(10 * WINDOW_S, rel=0.15) and b.ttft_requests == pytest.approx(
        4 * WINDOW_S, rel=0.15
    )
    assert a.tpot_requests == pytest.approx(a.ttft_requests, rel=0.01)
