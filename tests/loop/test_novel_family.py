"""Do no harm on the family of shapes the tuner was not tuned on (bench/tuner/novel.py), on a small seeded sample.

The benchmark sweeps the family against the oracle; here each sampled scenario starts at its most replicas, as a
fleet sized for the peak would, and the operator's loop must serve at least as many requests within the SLO as that
fleet left at Triton's default config or at the start config (the same arrivals: the margin is the simulator's
service-time noise, as in test_whatif's do-no-harm)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.tuner.novel import SEED, Scenario, scenarios
from tailtune.offline.whatif import summarize
from tests.sampling import full_families

FAMILY = 24  # the benchmark's default family
# The suite's sample, a prefix of the family (a failure replays in the benchmark under the same number): fewer than
# tests/sampling.py's SAMPLE_MIN, since each case runs the operator's loop over 40 ticks (~0.5-1 s of one core).
SAMPLE = 4
# Cheaper to simulate, the same shapes and loads: slower curves and fewer requests (bench/tuner/novel.py scales them).
REQUESTS = 40_000
NOISE = 0.97  # the same arrivals for every policy; the rest is the simulator's 3 % service-time noise


DRAWN = scenarios(FAMILY if full_families() else SAMPLE, SEED, REQUESTS)


@pytest.mark.parametrize("scenario", DRAWN, ids=lambda sc: sc.name)
def test_tuning_does_no_harm_on_shapes_it_was_not_tuned_on(scenario: Scenario) -> None:
    setup = dataclasses.replace(scenario.setup, replicas=scenario.setup.replicas_max)
    ours = summarize(setup, "tailtune")["goodput_rps"]
    default = summarize(setup, "triton-default")["goodput_rps"]
    start = summarize(setup, f"static:{setup.start_max_batch}:0")["goodput_rps"]
    assert ours >= NOISE * default, (ours, default)
    assert ours >= NOISE * start, (ours, start)
