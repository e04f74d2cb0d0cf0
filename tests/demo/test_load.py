"""The open-loop load generator, against a small local HTTP server."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from devkit.load import Buckets, LoadGenerator, Phase, Samples, infer_body, percentile, rate_at


def test_rate_schedule() -> None:
    phases = [Phase(0, 40), Phase(30, 130)]
    assert [rate_at(phases, t) for t in (0, 29.9, 30, 100)] == [40, 40, 130, 130]
    assert rate_at([Phase(5, 10)], 1) == 0


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 99) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


def test_infer_body_is_kserve_v2_json() -> None:
    doc = json.loads(infer_body("INPUT0", [16]))
    assert doc == {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}


def test_buckets_by_second() -> None:
    samples = Samples()
    for t, lat, ok in [(0.1, 5.0, True), (0.9, 7.0, True), (1.5, math.nan, False), (2.2, 9.0, True)]:
        samples.add(t, lat, ok)
    buckets = Buckets()
    buckets.update(samples)
    samples.add(2.5, 11.0, True)
    buckets.update(samples)
    stats = buckets.stats(0, 3)
    assert (stats.sent, stats.succeeded, stats.failed) == (5, 4, 1)
    assert stats.p99_ms == math.inf
    assert buckets.stats(2, 3).p99_ms == 11.0
    assert buckets.stats(0, 1).throughput_rps == 2.0


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            paths.append(self.path)
            body = b'{"outputs": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", paths
    httpd.shutdown()
    httpd.server_close()


def test_open_loop_poisson_load_is_recorded(server: tuple[str, list[str]]) -> None:
    target, paths = server
    load = LoadGenerator([Phase(0, 100)], 2.0, lambda: [target], "m", infer_body("INPUT0", [4]))
    load.start()
    deadline = time.monotonic() + 20
    while not load.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    sent, latency, ok = load.samples.snapshot()
    assert 120 <= len(sent) <= 280  # Poisson around 200
    assert all(ok) and all(x > 0 for x in latency)
    assert set(paths) == {"/v2/models/m/infer"}


def test_requests_with_no_target_count_as_failed() -> None:
    load = LoadGenerator([Phase(0, 50)], 0.5, lambda: [], "m", infer_body("INPUT0", [4]))
    load.start()
    deadline = time.monotonic() + 10
    while not load.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    _, _, ok = load.samples.snapshot()
    assert ok and not any(ok)
