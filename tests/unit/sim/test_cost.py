"""What the simulated fleet pays: replica-seconds from each replica's request (it holds its device while it starts)
until it is let go, and from its readiness."""

from __future__ import annotations

import numpy as np
import pytest

from tailtune.api.v1alpha1 import Batching
from tailtune.sim import SimCluster
from tailtune.sim.curves import PiecewiseCurve

FLAT_10MS = PiecewiseCurve(((1, 10.0), (8, 10.0)), "flat-10ms")
FEW = np.arange(0.0, 120.0, 0.5)  # 2 req/s: the fleet idles, only the accounting is under test


def test_two_replicas_for_a_minute_then_one_for_a_minute_is_180() -> None:
    sim = SimCluster(FLAT_10MS, FEW, Batching(max_batch_size=8), replicas=2, startup_s=30.0)
    sim.advance(60.0)
    sim.apply(Batching(max_batch_size=8), replicas=1)
    sim.advance(120.0)
    assert sim.replica_seconds(120.0) == pytest.approx(180.0)
    assert sim.replica_seconds(120.0, ready_only=True) == pytest.approx(180.0)  # both ready from the start
    assert sim.replica_seconds(30.0) == pytest.approx(60.0)  # counted up to the time asked, not to now


def test_a_starting_replica_is_paid_from_its_request_and_one_let_go_while_starting_too() -> None:
    """1 replica; at 20 s scale to 3 (pod start 10 s); at 25 s, before they are ready, back to 2; read at 60 s:
    paid 60 + 40 + 5 = 105 (the one let go paid its 5 s of start), ready 60 + 30 + 0 = 90."""
    sim = SimCluster(FLAT_10MS, FEW, Batching(max_batch_size=8), replicas=1, startup_s=10.0)
    sim.advance(20.0)
    sim.apply(Batching(max_batch_size=8), replicas=3)
    sim.advance(25.0)
    sim.apply(Batching(max_batch_size=8), replicas=2)
    sim.advance(60.0)
    assert sim.replica_seconds(60.0) == pytest.approx(105.0)
    assert sim.replica_seconds(60.0, ready_only=True) == pytest.approx(90.0)


def test_a_reload_costs_nothing_and_the_last_replica_is_never_let_go() -> None:
    sim = SimCluster(FLAT_10MS, FEW, Batching(max_batch_size=8), replicas=1)
    sim.advance(30.0)
    sim.apply(Batching(max_batch_size=4), replicas=0)  # the simulator keeps one, as a Deployment at min 1
    sim.advance(90.0)
    assert sim.replica_seconds(90.0) == sim.replica_seconds(90.0, ready_only=True) == pytest.approx(90.0)
