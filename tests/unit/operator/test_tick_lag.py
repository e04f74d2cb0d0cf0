"""The tuner's tick lag (`tailtune_tick_lag_seconds`): from when a tick was due on its phase to decided."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tailtune.operator import handlers
from tests.unit.operator.test_schedule import body, new_state, run_for


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
        await asyncio.sleep(tick_seconds)
        ticks += 1  # counted once complete: a tick the end of the run cancels mid-sleep records no lag
        return interval

    monkeypatch.setattr(handlers, "tuner_tick", tick)
    monkeypatch.setenv(handlers.FAST_PATH_ENV, "0")

    async def run() -> None:
        state = new_state()
        state.see(("ml", "svc"), "uid-1", body("svc", "uid-1"))
        state.schedule.at(("ml", "svc"), handlers.TICK, 0.0)
        state.tracked[("ml", "svc")].tick_due = time.time()
        await run_for(state.schedule, 0.45)

    count0, sum0 = _lag()
    asyncio.run(run())
    count, total = _lag()
    assert ticks >= 2
    assert count - count0 == ticks
    # Each tick took 0.05 s from its due time at least, and a timer on a busy machine is late by well under a second.
    assert tick_seconds * ticks - 0.01 <= total - sum0 <= (tick_seconds + 0.5) * ticks
