"""The generative tuner against a Dynamo-style planner on generated traces, in the token-level simulator: a small
seeded sample of what bench/generative/planner.py sweeps (the model and each guard:
tests/unit/tuner/test_generative.py)."""

from __future__ import annotations

import math

from tailtune.offline.generative import family_trace, profile_replica_tokens_per_s, run_policy
from tailtune.sim.llm import ROOFLINES, EngineConfig, TokenLengths
from tailtune.tuner.generative import GenEngineModel, GenPolicy
from tests.sampling import cases

L4 = EngineConfig(roofline=ROOFLINES["l4"])
POLICY = GenPolicy(
    ttft_target_ms=2000, tpot_target_ms=100, engine=GenEngineModel.from_engine(L4), replicas_min=1, replicas_max=8
)


FAMILY = 40  # the family the benchmark sweeps; the suite draws `cases(FAMILY)` of it
SHAPES = ("step", "diurnal", "bursts", "long-prompt")


def test_tailtune_goodput_is_never_below_the_planners_on_generated_traces() -> None:
    """Seeded traces of each shape (short, light: a small sample); the planner profiled once, as Dynamo's is."""
    lengths = TokenLengths()
    profile = profile_replica_tokens_per_s(L4, lengths, POLICY.tpot_target_ms / 1000, POLICY.tpot_percentile)
    assert profile > 0
    for k in range(cases(FAMILY)):
        reqs = family_trace(SHAPES[k % len(SHAPES)], k, 600.0, 1.5, lengths)
        tt = run_policy("tailtune", reqs, L4, POLICY, 1)
        pl = run_policy("planner", reqs, L4, POLICY, 1, planner_profile=profile)
        assert tt.goodput >= pl.goodput, (k, tt.goodput, pl.goodput)
        assert math.isfinite(tt.replica_seconds) and tt.replica_seconds > 0
