"""The Prometheus client against a fake Prometheus on 127.0.0.1 that hangs, errors, refuses, returns several
series, NaN or +Inf; and the percentiles on the real Prometheus."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from devkit.ports import free_port
from tailtune.operator.status import PROMETHEUS_UNAVAILABLE
from tailtune.operator.tuning import read_latency
from tailtune.tuner.prom import HttpPromClient, PrometheusReader, PrometheusUnavailable, Target
from tests.prometheus.conftest import PromEnv

pytestmark = pytest.mark.prometheus


class FakeProm(ThreadingHTTPServer):
    mode = "ok"
    latency: list[dict[str, Any]] = []


class Handler(BaseHTTPRequestHandler):
    server: FakeProm

    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        mode = self.server.mode
        if mode == "hang":
            time.sleep(30)
            return
        if mode == "error":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        query = self.path
        result = (
            self.server.latency if "summary" in query or "latency" in query else [{"metric": {}, "value": [0, "5"]}]
        )
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def fake() -> Iterator[tuple[FakeProm, str]]:
    server = FakeProm(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _reader(url: str, timeout: float = 1.0, **kw: Any) -> PrometheusReader:
    return PrometheusReader.connect(url, Target("ml", "svc", "bert"), 99, 20, timeout_seconds=timeout, **kw)


def test_a_hanging_prometheus_costs_one_timeout_per_read(fake: tuple[FakeProm, str]) -> None:
    server, url = fake
    server.mode = "hang"
    start = time.monotonic()
    read = read_latency(_reader(url, timeout=1.0), datetime.now(UTC))
    took = time.monotonic() - start
    assert read.problem == PROMETHEUS_UNAVAILABLE and "(timeout)" in read.message and url in read.message
    assert took < 2.5, f"a hanging Prometheus blocked the read {took:.1f} s"


def test_http_status_refused_and_dns_are_told_apart(fake: tuple[FakeProm, str]) -> None:
    server, url = fake
    server.mode = "error"
    with pytest.raises(PrometheusUnavailable) as err:
        HttpPromClient(url, 1).query("up", datetime.now(UTC))
    assert err.value.kind == "http" and "503" in err.value.detail
    with pytest.raises(PrometheusUnavailable) as err:
        HttpPromClient(f"http://127.0.0.1:{free_port()}", 1).query("up", datetime.now(UTC))
    assert err.value.kind == "refused"
    with pytest.raises(PrometheusUnavailable) as err:
        HttpPromClient("http://prometheus.tailtune-test.invalid:9090", 2).query("up", datetime.now(UTC))
    assert err.value.kind == "dns"


def test_several_series_nan_and_inf(fake: tuple[FakeProm, str]) -> None:
    server, url = fake
    server.latency = [
        {"metric": {"route": "a"}, "value": [0, "0.01"]},
        {"metric": {"route": "b"}, "value": [0, "0.1"]},
    ]
    sig = _reader(url, latency_query="my_latency_seconds").read_signal(datetime.now(UTC))
    assert sig.observation.p_latency_ms is None and sig.series == 2 and "route" in sig.ambiguous
    server.latency = [{"metric": {}, "value": [0, "+Inf"]}]
    sig = _reader(url, latency_query="my_latency_seconds").read_signal(datetime.now(UTC))
    assert sig.above_range and sig.observation.p_latency_ms == math.inf
    server.latency = [{"metric": {}, "value": [0, "NaN"]}]
    sig = _reader(url, latency_query="my_latency_seconds").read_signal(datetime.now(UTC))
    assert sig.observation.p_latency_ms is None and not sig.above_range


def test_percentiles_on_the_real_prometheus(prom: PromEnv) -> None:
    deadline = time.time() + 60
    while True:  # wait for a window of scrapes
        now = datetime.now(UTC)
        p50 = PrometheusReader.connect(prom.url, Target("ml", "svc", "bert"), 50, 20).read_signal(now)
        if p50.observation.request_rate or time.time() > deadline:
            break
        time.sleep(1)
    # Summaries: the worst pod's P50 (pods say 5 and 7 ms); the window ends at the newest scrape.
    assert p50.observation.p_latency_ms == pytest.approx(7.0) and p50.source == "tritonSummary"
    assert 0 <= (now - p50.observation.window_end).total_seconds() < 5
    # P99.9 is not among this exporter's quantiles: no data, never another quantile's figure.
    p999 = PrometheusReader.connect(prom.url, Target("ml", "svc", "bert"), 99.9, 20).read_signal(now)
    assert p999.observation.p_latency_ms is None
    # Histograms serve any percentile: P50 interpolates to 10 ms, P95 to 19 ms, P99.9 to 19.98 ms.
    for pct, ms in ((50, 10.0), (95, 19.0), (99.9, 19.98)):
        sig = PrometheusReader.connect(prom.url, Target("ml", "svc", "histo"), pct, 20).read_signal(now)
        assert sig.source == "histogram" and sig.observation.p_latency_ms == pytest.approx(ms, rel=0.02), pct
