"""The simulator's windows as the tuner's observations (the simulator sits below the tuner and knows nothing of it)."""

from __future__ import annotations

import dataclasses

from tailtune.sim import WindowStats
from tailtune.tuner.servicetime import BatchSample
from tailtune.tuner.types import Observation


def observation_from_sim(stats: WindowStats) -> Observation:
    """The `Observation` of one simulated window: the same fields, the same meaning."""
    fields = dataclasses.asdict(stats)
    fields["batch_stats"] = tuple(BatchSample(batch=b, count=n, ms=ms) for b, n, ms in stats.batch_stats)
    return Observation(**fields)
