"""Seeded arrival processes."""

from __future__ import annotations

import numpy as np
import pytest

from tailtune.sim import diurnal, mmpp, poisson, step


def test_same_seed_same_arrivals() -> None:
    assert np.array_equal(poisson(100, 10, seed=7).arrivals, poisson(100, 10, seed=7).arrivals)
    assert not np.array_equal(poisson(100, 10, seed=7).arrivals, poisson(100, 10, seed=8).arrivals)


def test_step_levels_and_steps() -> None:
    trace = step([(0, 100.0), (50, 400.0), (100, 50.0)], 150, seed=1)
    assert trace.steps == (50, 100)
    arr = trace.arrivals
    assert np.all(np.diff(arr) >= 0)
    assert np.sum(arr < 50) / 50 == pytest.approx(100, rel=0.1)
    assert np.sum((arr >= 50) & (arr < 100)) / 50 == pytest.approx(400, rel=0.1)
    assert trace.rate_at(120) == 50.0


def test_mmpp_alternates_between_rates() -> None:
    trace = mmpp((100.0, 500.0), (10.0, 5.0), 600, seed=3)
    rates = {r for _, _, r in trace.segments}
    assert rates == {100.0, 500.0}
    mean = len(trace.arrivals) / 600
    assert 150 < mean < 350


def test_diurnal_swings_between_low_and_high() -> None:
    trace = diurnal(100.0, 900.0, period_s=600, duration_s=600, seed=4)
    assert trace.rate_at(0.5) == pytest.approx(100, rel=0.01)
    assert trace.rate_at(300.5) == pytest.approx(900, rel=0.01)
