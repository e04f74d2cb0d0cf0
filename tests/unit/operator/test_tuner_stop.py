"""The tuner daemon told to stop (its object deleted) while a tick is in flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest

from tailtune.operator import handlers
from tailtune.operator.watched import ChildVersions, PodIps, WriteEchoes


class _SetAfter:
    """kopf's daemon flag, set after `seconds`; its wait ends then, or at its timeout."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def __bool__(self) -> bool:
        return time.monotonic() >= self.until

    def wait(self, timeout: float | None = None) -> Coroutine[Any, Any, None]:
        left = self.until - time.monotonic()
        return asyncio.sleep(max(0.0, left if timeout is None else min(timeout, left)))


def test_a_tick_in_flight_is_left_at_once_and_the_daemon_ends_without_being_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Caught: the daemon went on with its tick (a Prometheus read, a reconcile) after kopf told it to stop, so kopf
    cancelled it ("Daemon tuner is cancelled. Will escalate.") and looked at the deleted object again later."""

    async def long_tick(state: Any, namespace: str, name: str) -> float:
        await asyncio.sleep(30)
        return 30.0

    monkeypatch.setattr(handlers, "tuner_tick", long_tick)
    cluster = SimpleNamespace(echoes=WriteEchoes(), pod_ips=PodIps(), children=ChildVersions())
    state = handlers.State(cast(Any, cluster))
    memo = {"tailtune": state}
    body = cast(kopf.Body, {"metadata": {"name": "svc", "namespace": "ml"}})
    stopped = cast(kopf.DaemonStopped, _SetAfter(0.1))
    start = time.monotonic()
    asyncio.run(handlers.tuner(namespace="ml", name="svc", uid="u", body=body, memo=memo, stopped=stopped))
    assert time.monotonic() - start < 1.0
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
