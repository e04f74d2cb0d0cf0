"""The simulator's windows as the tuner's observations (the simulator sits below the tuner and knows nothing of it)."""

from __future__ import annotations

import dataclasses

from tailtune.sim import SimCluster, WindowStats
from tailtune.tuner.servicetime import BatchSample
from tailtune.tuner.surge import PodReading
from tailtune.tuner.types import Observation


def observation_from_sim(stats: WindowStats) -> Observation:
    """The `Observation` of one simulated window: the same fields, the same meaning."""
    fields = dataclasses.asdict(stats)
    fields["batch_stats"] = tuple(BatchSample(batch=b, count=n, ms=ms) for b, n, ms in stats.batch_stats)
    return Observation(**fields)


def pod_readings_from_sim(sim: SimCluster) -> tuple[PodReading, ...]:
    """What the fast path reads on each ready pod now (Triton's pending gauge and request counters), simulated."""
    at = sim.clock(sim.now)
    return tuple(
        PodReading(pod=f"replica-{i}", at=at, pending=float(pending), completed=float(done))
        for i, pending, done in sim.pod_counts()
    )
