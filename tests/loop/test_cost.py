"""The tuner's cost on generated diurnal traces, in the simulator: a small seeded sample of what
`bench/tuner/run.py` sweeps (its cost section: replica-seconds against min-cost and static-max)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtune.offline.whatif import PLAN, Setup, excess_by_rule, run_policy, summarize
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner.control import assess
from tailtune.tuner.servicetime import ladder
from tests.sampling import cases, full_families

# A day's swing in the simulator: long enough that the falling half outlasts the demand's memory (the HPA's 300 s,
# before which no replica is given back) by several intervals.
DAY_S = 1200.0
SEGMENTS = 24


def _cosine_day(
    rng: np.random.Generator,
    day_s: float,
    segments: int,
    batch_cost_ms: tuple[float, float],
    replicas: tuple[int, int],
    peak_share: tuple[float, float],
    low_share: tuple[float, float],
) -> Setup:
    """A linear curve (a fixed cost per batch drawn from `batch_cost_ms` and a cost per request), a cosine day of
    `segments` steps from a low (a `low_share` of the peak) to a peak that the most replicas carry at a
    `peak_share` of their capacity, started at the most replicas (drawn from `replicas`, upper bound excluded)."""
    a = float(rng.uniform(*batch_cost_ms))
    c = a / float(rng.uniform(8, 30))
    curve = PiecewiseCurve(tuple((b, round(a + c * b, 3)) for b in (1, 2, 4, 8, 16, 32)), "linear")
    most = int(rng.integers(*replicas))
    peak = float(rng.uniform(*peak_share)) * most * 1000.0 * 8 / curve.ms(8)
    low = peak * float(rng.uniform(*low_share))
    step = day_s / segments
    segs = tuple(
        (i * step, (i + 1) * step, low + (peak - low) * (1 - math.cos(2 * math.pi * (i + 0.5) / segments)) / 2)
        for i in range(segments)
    )
    return Setup(
        curve=curve,
        segments=segs,
        slo_ms=round(4.0 * curve.ms(8), 2),
        replicas=most,
        replicas_max=most,
        start_max_batch=8,
        seed=int(rng.integers(1, 10_000)),
    )


def _diurnal(rng: np.random.Generator) -> Setup:
    """A day on 3-4 replicas whose peak the most replicas carry at 45-75 % of their capacity."""
    return _cosine_day(rng, DAY_S, SEGMENTS, (4.0, 10.0), (3, 5), (0.45, 0.75), (0.1, 0.3))


def test_the_tuner_gives_back_replicas_on_a_diurnal_falling_half_while_windows_hold_the_slo() -> None:
    """Caught: a tuner that holds every replica through a day's falling half (0 % saved against static-max), or one
    that saves by breaking the SLO. Measured in the sweep (bench/tuner/run.py): the targets of issue 38 (<= 1.25x
    min-cost, >= 35 % saved) are not met there; this holds the part that is (replicas given back, windows kept)."""
    rng = np.random.default_rng(3801)
    for i in range(cases(8) // 4):
        setup = _diurnal(rng)
        tuned = summarize(setup, "tailtune", run_policy(setup, "tailtune"))
        static_max_s = setup.replicas_max * setup.end_s
        assert tuned["replica_seconds"] < static_max_s - setup.interval_s, (i, tuned["replica_seconds"])
        fair = tuned["windows_excluding_steps"]
        assert tuned["windows_in_slo_excluding_steps"] >= 0.99 * fair, (i, tuned["windows_in_slo_excluding_steps"])


# A day long against the demand's memory (the HPA's 300 s): an hour, an interval a segment, so the margin the demand's
# own variability calls for is measured over most of it.
LONG_DAY_S = 3600.0


def _long_day(rng: np.random.Generator) -> Setup:
    """A smooth hour-long cosine day on 4-6 replicas of a slow linear curve (few requests: a fast run), an interval
    a segment."""
    return _cosine_day(rng, LONG_DAY_S, round(LONG_DAY_S / 30.0), (20.0, 40.0), (4, 7), (0.6, 0.8), (0.2, 0.35))


def test_the_measured_margin_gives_back_what_the_fixed_one_held_on_a_smooth_day_and_keeps_the_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Caught: a plan that carries the utilisation target's fixed margin (x1.18) on a demand whose own variability
    over its memory is a few percent pays for replicas nothing calls for; and a measured margin so thin that
    windows break the SLO. The same day twice, the margin measured (the law) and fixed (`measured_margin` -> None):
    the law pays fewer replica-seconds, and holds the SLO in the windows."""
    rng = np.random.default_rng(3802)
    # The suite samples one day (`cases` never draws fewer than SAMPLE_MIN = 8, the whole family here); the
    # benchmark run (TAILTUNE_FULL_FAMILIES=1) all 8.
    for i in range(8 if full_families() else 1):
        setup = _long_day(rng)
        measured = summarize(setup, "tailtune", run_policy(setup, "tailtune"))
        with monkeypatch.context() as m:
            m.setattr(assess, "measured_margin", lambda *_: None)
            fixed = summarize(setup, "tailtune", run_policy(setup, "tailtune"))
        assert measured["replica_seconds"] < fixed["replica_seconds"], (i, measured["replica_seconds"])
        held = measured["windows_in_slo_excluding_steps"]
        assert held >= 0.99 * measured["windows_excluding_steps"], (i, held)


def test_the_excess_of_a_simulated_run_sums_its_windows_above_min_cost() -> None:
    """On a simulated run: the rules' replica-seconds add up to the windows' replicas above min-cost's, and each
    rule is one tailtune's decisions named (or the plan)."""
    setup = Setup(
        curve=PiecewiseCurve(tuple((b, 2 + 0.4 * b**1.3) for b in ladder(32)), "power-1.3"),
        segments=((0.0, 240.0, 400.0), (240.0, 480.0, 60.0)),
        slo_ms=60.0,
        replicas=2,
        replicas_max=2,
        seed=5,
    )
    ours, least = summarize(setup, "tailtune"), summarize(setup, "min-cost")
    got = excess_by_rule(ours, least, setup.interval_s)
    above = sum(
        max(0, w["replicas"] - v["replicas"]) * setup.interval_s
        for w, v in zip(ours["timeline"], least["timeline"], strict=True)
    )
    assert above > 0  # a fall to a sixth of the load: tailtune gives back later than the clairvoyant
    assert sum(got.values()) == pytest.approx(above)
    named = {w["bound_by"] for w in ours["timeline"] if w["decision"]}
    assert set(got) <= named | {PLAN}
