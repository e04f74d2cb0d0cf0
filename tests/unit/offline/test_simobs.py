"""The simulator's windows reach the tuner as its own observations, field for field."""

from __future__ import annotations

import dataclasses

import numpy as np

from tailtune.api.v1alpha1 import Batching
from tailtune.offline.simobs import observation_from_sim
from tailtune.sim import SimCluster, WindowStats, linear_power
from tailtune.tuner.types import Observation


def test_every_window_field_is_an_observation_field() -> None:
    assert {f.name for f in dataclasses.fields(WindowStats)} <= set(Observation.model_fields)


def test_a_simulated_window_converts_unchanged() -> None:
    cluster = SimCluster(linear_power(), np.arange(0.0, 10.0, 0.01), Batching(max_batch_size=4))
    cluster.advance(10.0)
    stats = cluster.observe(window_s=5.0, percentile=99)
    observation = observation_from_sim(stats)
    scalars = {f.name: getattr(stats, f.name) for f in dataclasses.fields(WindowStats) if f.name != "batch_stats"}
    assert observation.model_dump(include=set(scalars)) == scalars
    assert tuple((s.batch, s.count, s.ms) for s in observation.batch_stats) == stats.batch_stats
    assert observation.window_start == cluster.clock(5.0)
    assert observation.sample_count == 500
