"""Reconciles of kopf's events and timers in flight at once are bounded (`handlers.RECONCILES_AT_ONCE`)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tailtune.operator import handlers
from tailtune.operator.reconcile import Outcome


def test_a_fleet_created_at_once_reconciles_at_most_as_many_as_the_api_client_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Caught: 1,000 objects created at once were all reconciling together, each holding its manifests and answers
    while waiting for one of the API client's threads (the operator's RSS passed 500 MiB before 50 were Ready)."""
    in_flight, most = 0, 0

    async def slow(raw: dict[str, Any], cluster: object, now: object, *, force: bool = False) -> Outcome:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return Outcome(None)

    monkeypatch.setattr(handlers, "reconcile", slow)

    async def run() -> None:
        memo = {"tailtune": handlers.State(cast(Any, None))}
        objects = 3 * handlers.RECONCILES_AT_ONCE
        bodies = [{"metadata": {"name": f"svc-{i}", "namespace": "ml"}} for i in range(objects)]
        await asyncio.gather(*(handlers.run_reconcile(memo, "ml", b["metadata"]["name"], body=b) for b in bodies))

    asyncio.run(run())
    assert most == handlers.RECONCILES_AT_ONCE
