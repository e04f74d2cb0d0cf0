"""`tailtune explain`: the rendering (pure) and the exit codes (object missing, Prometheus unreachable)."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tailtune.api.v1alpha1 import Batching
from tailtune.operator.engine import engine_cache_key
from tailtune.operator.explain import Facts, explain, render, to_json
from tailtune.operator.rollout import RolloutState
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
    assert "in force   max batch" in text and "next       " in text and "bound by   " in text
    assert "b=1" in text and "b=8" in text
    assert "SLOMet     True WithinSLO" in text


def test_end_to_end_minus_server_for_a_user_query() -> None:
    isvc = _isvc(spec__metrics={"latencyQuery": "gateway_p99_seconds"}).obj()
    obs = Observation(window_end=NOW, span_seconds=60, p_latency_ms=40.0, request_rate=100.0, sample_count=6000)
    facts = Facts(isvc, LatencyRead(Signal(observation=obs, source="userQuery")), None, 25.0, NOW)
    assert "15.00 ms outside Triton" in render(facts)


class Cluster:
    def __init__(self, raw: dict[str, Any] | None, events: list[dict[str, Any]] | None = None) -> None:
        self.raw = raw
        self.events = events

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.raw

    async def list_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        if self.events is None:
            raise PermissionError("events is forbidden")
        return self.events


def test_exit_codes() -> None:
    code, text = asyncio.run(explain(Cluster(None), "ml", "resnet", NOW))
    assert code == 1 and "not found" in text
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    raw = _isvc(spec__metrics={"prometheusUrl": f"http://127.0.0.1:{port}", "timeoutSeconds": 1}).dict()
    code, text = asyncio.run(explain(Cluster(raw), "ml", "resnet", NOW))
    assert code == 3 and "unavailable (refused)" in text and "PrometheusUnavailable" in text


def _overloaded(**sets: Any) -> Any:
    """P99 far over the 30 ms SLO at 900 req/s on one replica (max 2), P50 within it, Triton's quantiles read."""
    b = _isvc(spec__slo={"latencyMs": 30, "targets": [{"percentile": 50, "latencyMs": 8}]}, **sets)
    b.set("status.serviceTime.engineCacheKey", engine_cache_key(b.obj()))  # the build's curve of the engine in force
    isvc = b.obj()
    obs = Observation(
        window_end=NOW, span_seconds=60, p_latency_ms=400.0, request_rate=900.0, queue_ms=300.0, compute_ms=6.0,
        avg_batch=8.0, ready_replicas=1, sample_count=54000, queue_growth_rps=50.0,
        other_percentiles=((50, 7.0), (90, 25.0), (95, 120.0), (99.9, 800.0)),
    )  # fmt: skip
    return Facts(isvc, LatencyRead(Signal(observation=obs, source="tritonSummary")), None, None, NOW)


def test_targets_what_it_would_take_and_events() -> None:
    events = ({"type": "Warning", "reason": "SLOInfeasible", "message": "demand beyond", "count": 3,
               "lastTimestamp": "2026-01-01T11:59:00Z"},)  # fmt: skip
    facts = _overloaded()
    text = render(replace(facts, events=events))
    assert "SLO        P99 <= 30 ms, P50 <= 8 ms over 60 s" in text
    assert "P50 7.00 ms vs 8 ms: met" in text
    assert "SLOMet     False" in text
    assert "would take 1 replica(s) to carry 950 req/s steadily" in text
    assert "or a lower percentile: 30 ms holds now at P90, P50 (not at P99)" in text
    assert "2026-01-01T11:59:00Z  Warning SLOInfeasible (x3): demand beyond" in text


def test_json_carries_the_same_facts() -> None:
    code, _ = asyncio.run(explain(Cluster(None), "ml", "resnet", NOW, as_json=True))
    assert code == 1
    data = to_json(_overloaded())
    assert json.loads(json.dumps(data)) == data
    assert data["sloMet"]["status"] == "False" and data["latency"]["targets"][1]["percentile"] == 50
    assert data["wouldTake"]["lowerPercentiles"] == [90, 50] and data["wouldTake"]["replicas"] >= 1
    assert data["next"]["action"] in ("hold", "change") and data["events"] == []
    assert isinstance(data["next"]["boundBy"], str)


def test_a_rollout_in_flight_is_shown() -> None:
    record = RolloutState(
        target=Batching(max_batch_size=16, max_queue_delay_microseconds=500),
        previous=Batching(max_batch_size=8), canary="10.0.0.7", started=NOW, reason="P99 over the aim",
    )  # fmt: skip
    facts = _overloaded(metadata__annotations=record.to_annotation())
    text = render(facts)
    assert "rollout    canary: canary pod 10.0.0.7" in text and "max batch 8 -> 16, delay 0 -> 500 us" in text
    assert to_json(facts)["rollout"]["canary"] == "10.0.0.7"


def test_events_not_readable_does_not_stop_explain() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw = _isvc(spec__metrics={"prometheusUrl": f"http://127.0.0.1:{port}", "timeoutSeconds": 1}).dict()
    code, text = asyncio.run(explain(Cluster(raw, events=None), "ml", "resnet", NOW))
    assert code == 3 and "(not readable: PermissionError: events is forbidden)" in text


def test_batch_sizes_come_from_the_operators_last_tick() -> None:
    facts = _overloaded(status__latency={"breakdown": {"batches": [{"batch": 1, "count": 583, "ms": 13.0}]}})
    assert "batch sizes (operator's last tick): 1 x583" in render(facts)
    assert to_json(facts)["latency"]["breakdown"]["batches"] == [{"batch": 1, "count": 583, "ms": 13.0}]
