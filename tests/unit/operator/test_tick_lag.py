"""The tuner daemon's tick lag (`tailtune_tick_lag_seconds`): from when a tick was due on its phase to decided."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, cast

import kopf
import pytest
from prometheus_client import REGISTRY

from tailtune.operator import handlers


class _StopsAfter:
    """kopf's daemon flag, set after `seconds`: its wait is a plain sleep until then."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def __bool__(self) -> bool:
        return time.monotonic() >= self.until

    def wait(self, timeout: float | None = None) -> Coroutine[Any, Any, None]:
        return asyncio.sleep(max(0.0, min(timeout or 0.0, self.until - time.monotonic())))


def _lag() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("tailtune_tick_lag_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("tailtune_tick_lag_seconds_sum") or 0.0
    return count, total


def test_each_completed_tick_records_its_lag_from_due_to_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught: without the daemon's observation the benchmark at fleet size has no tick lag to report (the count
    stays); a lag that missed the tick's own time (observed before it ran) would be about zero."""
    interval, tick_seconds = 0.2, 0.05
    ticks = 0

    async def tick(state: Any, namespace: str, name: str) -> float:
        nonlocal ticks
        ticks += 1
        await asyncio.sleep(tick_seconds)
        return interval

    monkeypatch.setattr(handlers, "tuner_tick", tick)
    memo = {"tailtune": handlers.State(cast(Any, None))}
    count0, sum0 = _lag()
    asyncio.run(handlers._tune_until_stopped(memo, "ml", "svc", "uid-1", cast(kopf.DaemonStopped, _StopsAfter(0.45))))
    count, total = _lag()
    assert ticks >= 2
    assert count - count0 == ticks
    # Each tick took 0.05 s from its due time at least, and a timer on a busy machine is late by well under a second.
    assert tick_seconds * ticks - 0.01 <= total - sum0 <= (tick_seconds + 0.5) * ticks
