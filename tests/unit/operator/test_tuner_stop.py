"""The tuner daemon told to stop (its object deleted) while a tick is in flight."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tailtune.operator import handlers
from tailtune.operator.watched import ChildVersions, PodIps, WriteEchoes


def test_a_tick_in_flight_is_left_at_once_when_its_object_is_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught: the tuner went on with its tick (a Prometheus read, a reconcile) after its object was deleted, so kopf
    cancelled it ("Daemon tuner is cancelled. Will escalate.") and looked at the deleted object again later."""
    left = False

    async def long_tick(state: Any, namespace: str, name: str) -> float:
        nonlocal left
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            left = True
            raise
        return 30.0

    monkeypatch.setattr(handlers, "tuner_tick", long_tick)
    monkeypatch.setenv(handlers.FAST_PATH_ENV, "0")

    async def run() -> handlers.State:
        cluster = SimpleNamespace(echoes=WriteEchoes(), pod_ips=PodIps(), children=ChildVersions())
        state = handlers.State(cast(Any, cluster))
        live = {"metadata": {"name": "svc", "namespace": "ml", "uid": "u", "resourceVersion": "1"}}
        await handlers.isvc_seen(type=None, namespace="ml", name="svc", uid="u", body=cast(Any, live), memo=state.memo)
        state.schedule.at(("ml", "svc"), handlers.TICK, 0.0)
        schedule = asyncio.create_task(state.schedule.run())
        await asyncio.sleep(0.05)
        assert state.schedule.running(("ml", "svc"), handlers.TICK)
        deleted = {"metadata": {**live["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
        start = time.monotonic()
        await handlers.isvc_seen(
            type="MODIFIED", namespace="ml", name="svc", uid="u", body=cast(Any, deleted), memo=state.memo
        )
        await asyncio.sleep(0.05)
        assert left and time.monotonic() - start < 1.0
        schedule.cancel()
        return state

    state = asyncio.run(run())
    assert ("ml", "svc") not in state.bodies  # other handlers read the object again, no longer a stopped live view


class _NoCalls:
    """An API client that must not be called; counts the reads it was asked for."""

    def __init__(self, raw: dict[str, Any] | None = None) -> None:
        self.raw, self.reads = raw, 0

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.raw


def test_a_resync_of_an_object_being_deleted_waits_for_no_lock_and_sends_nothing() -> None:
    """Caught: a timer that fired during deletion waited for a tick holding the object's lock, then read the object,
    and kopf looked at the deleted object again after its polling interval."""
    state = handlers.State(cast(Any, _NoCalls()))
    state.bodies[("ml", "svc")] = {"metadata": {"name": "svc", "deletionTimestamp": "2026-01-01T00:00:00Z"}}

    async def run() -> None:
        async with state.locks[("ml", "svc")]:  # a tick in flight
            await asyncio.wait_for(handlers.run_reconcile({"tailtune": state}, "ml", "svc", force=True), 0.5)

    asyncio.run(run())
    assert cast(Any, state.cluster).reads == 0


def test_child_events_of_another_shards_object_read_it_once() -> None:
    """Caught: every child event (a Deployment's status moves often) of an object another shard serves cost this
    operator a GET of the owner."""
    from tailtune.operator.shard import parse_shard_selector

    cluster = _NoCalls({"metadata": {"name": "svc", "namespace": "ml", "labels": {"tailtune.io/shard": "b"}}})
    state = handlers.State(cast(Any, cluster))
    memo = {"tailtune": state, "shard": parse_shard_selector("tailtune.io/shard=a")}
    for _ in range(3):
        asyncio.run(handlers.run_reconcile(memo, "ml", "svc"))
    assert cluster.reads == 1
