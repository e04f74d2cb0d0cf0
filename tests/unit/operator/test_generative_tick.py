"""One tick of a generative service (tailtune.operator.generative.generative_tick) against a fake API server and a
fake Prometheus: the status keeps moving once the service has served, whatever the ready count reconcile last wrote,
and a tick that fails says so with an Event."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest

from tailtune.api import InferenceService
from tailtune.api.v1alpha1 import Condition, GenerativeStatus
from tailtune.operator import generative
from tailtune.operator.generative import GENERATIVE_TICK_FAILED, generative_status, generative_tick
from tailtune.tuner.prom import GenerativeSignal
from tests.unit.operator.test_generative_status import _isvc, _sig


class Cluster:
    def __init__(self, fail_status: bool = False) -> None:
        self.statuses: list[GenerativeStatus] = []
        self.events: list[tuple[str, str, str]] = []
        self.annotations: list[dict[str, str]] = []
        self.fail_status = fail_status

    async def patch_annotations(self, meta: Any, annotations: dict[str, str]) -> None:
        self.annotations.append(annotations)

    async def patch_generative(self, meta: Any, g: GenerativeStatus, conditions: list[Condition] | None) -> None:
        if self.fail_status:
            raise RuntimeError("422 Unprocessable Entity")
        self.statuses.append(g)

    async def emit_event(self, meta: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]:
        return ()


class State:
    def __init__(self, raw: dict[str, Any], cluster: Cluster) -> None:
        self.raw, self.cluster = raw, cluster
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.ticking: set[tuple[str, str]] = set()

    async def current(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.raw


def _raw(ready: int, served: bool) -> dict[str, Any]:
    isvc = _isvc()
    raw = isvc.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["status"] = {"replicas": {"desired": 1, "ready": ready}}
    if served:
        raw["status"]["generative"] = generative_status(isvc, _sig()).model_dump(by_alias=True, mode="json")
    return raw


def _tick(state: State) -> float:
    async def reconciled(fresh: dict[str, Any]) -> None:
        return None

    def parse(raw: dict[str, Any]) -> InferenceService:
        return InferenceService.model_validate(raw)

    return asyncio.run(generative_tick(state, "default", "llm", parse, reconciled))  # type: ignore[arg-type]


def test_a_stale_zero_ready_count_does_not_stop_status_once_the_service_has_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reconcile writes status.replicas.ready from the Deployment's events; a 0 left there after a scale-in (the count
    read while pods went) skipped every later tick, and status.generative stood still for good. The tick now reads
    and writes whatever Prometheus shows; it decides only with a replica that served the window."""
    reads: list[GenerativeSignal] = []

    def read(isvc: InferenceService, now: Any) -> GenerativeSignal:
        reads.append(_sig(rate=0.0, ttft=None, tpot=None, ready_replicas=0))
        return reads[-1]

    monkeypatch.setattr(generative, "read_window", read)
    cluster = Cluster()
    _tick(State(_raw(ready=0, served=True), cluster))
    assert len(reads) == 1 and len(cluster.statuses) == 1  # read and written: no traffic now
    assert cluster.annotations == []  # no replica served the window: nothing decided

    never = Cluster()
    _tick(State(_raw(ready=0, served=False), never))  # before the first ready replica: no tick yet
    assert len(reads) == 1 and never.statuses == []


def test_a_tick_whose_status_write_fails_says_so_once_with_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generative, "read_window", lambda isvc, now: _sig(ttft=612.0))
    cluster = Cluster(fail_status=True)
    state = State(_raw(ready=1, served=True), cluster)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="422"):
            _tick(state)
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", GENERATIVE_TICK_FAILED)]  # once, not every tick
    assert "status write" in cluster.events[0][2] and "422" in cluster.events[0][2]
    assert state.ticking == set()  # the next tick runs


def test_kv_use_over_its_blocks_is_shown_full_not_a_failed_write() -> None:
    assert generative_status(_isvc(), _sig(kv_used_fraction=1.004)).kv_cache_used_percent == 100.0
