"""`tailtune explain`: the rendering (pure) and the exit codes (object missing, Prometheus unreachable)."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime
from typing import Any

from tailtune.operator.explain import Facts, explain, render
from tailtune.operator.tuning import LatencyRead
from tailtune.tuner.prom import Breakdown, Signal
from tailtune.tuner.types import Observation
from tests.unit.factories import make_isvc

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _isvc(**sets: Any) -> Any:
    b = make_isvc("resnet", "ml").set("status", {"replicas": {"desired": 1, "ready": 1}})
    b.set("status.serviceTime", {"points": [{"batch": 1, "ms": 2.0, "samples": 5}, {"batch": 8, "ms": 6.0}]})
    for k, v in sets.items():
        b.set(k.replace("__", "."), v)
    return b


def test_render_shows_window_breakdown_config_and_next_step() -> None:
    isvc = _isvc().obj()
    obs = Observation(
        window_end=NOW, span_seconds=60, p_latency_ms=24.0, request_rate=100.0, queue_ms=3.0, compute_ms=6.0,
        avg_batch=2.0, ready_replicas=1, sample_count=6000,
    )  # fmt: skip
    facts = Facts(
        isvc, LatencyRead(Signal(observation=obs, source="tritonSummary")),
        Breakdown(queue_ms=3.0, input_ms=0.5, infer_ms=5.0, output_ms=0.5, request_ms=11.0), None, NOW,
    )  # fmt: skip
    text = render(facts)
    assert "P99 24.00 ms at 100 req/s (tritonSummary)" in text
    assert "queue/batching wait" in text and "compute infer" in text
    assert "rest of Triton's request" in text and "2.00 ms" in text  # 11 - 3 - 0.5 - 5 - 0.5
    assert "in force   max batch" in text and "next       " in text
    assert "b=1" in text and "b=8" in text
    assert "SLOMet     True WithinSLO" in text


def test_end_to_end_minus_server_for_a_user_query() -> None:
    isvc = _isvc(spec__metrics={"latencyQuery": "gateway_p99_seconds"}).obj()
    obs = Observation(window_end=NOW, span_seconds=60, p_latency_ms=40.0, request_rate=100.0, sample_count=6000)
    facts = Facts(isvc, LatencyRead(Signal(observation=obs, source="userQuery")), None, 25.0, NOW)
    assert "15.00 ms outside Triton" in render(facts)


class Cluster:
    def __init__(self, raw: dict[str, Any] | None) -> None:
        self.raw = raw

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.raw


def test_exit_codes() -> None:
    code, text = asyncio.run(explain(Cluster(None), "ml", "resnet", NOW))
    assert code == 1 and "not found" in text
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    raw = _isvc(spec__metrics={"prometheusUrl": f"http://127.0.0.1:{port}", "timeoutSeconds": 1}).dict()
    code, text = asyncio.run(explain(Cluster(raw), "ml", "resnet", NOW))
    assert code == 3 and "unavailable (refused)" in text and "PrometheusUnavailable" in text
