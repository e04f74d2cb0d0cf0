"""How many generated cases a property test draws: a small seeded sample in the suite, the whole family as a benchmark.

A property test loops over `cases(full)` seeded cases. In the suite that is a sample: the first `sample(full)` cases
of the same seeded family (the draws are sequential, so the sample is a prefix of the family: a failure in CI
replays in the benchmark under the same case number). The edges the families would otherwise reach only by chance
(bounds, idle, saturation, backlog, the shapes that once failed) are explicit examples in each test module, so a
small sample never loses them.

`bench/tuner/properties.py` runs the same tests over the whole family (`TAILTUNE_FULL_FAMILIES=1`) and prints
how many cases each drew and its time; that is where a property's full sweep runs, not on every commit.
"""

from __future__ import annotations

import math
import os

FULL_FAMILIES_ENV = "TAILTUNE_FULL_FAMILIES"
# The share of a family the suite draws. A family of 300 becomes 24 cases: with at least one change, one backlog
# and one infeasible case in every ten generated (the families' own `assert ... >= CASES // k` lines check the mix),
# a sample of two dozen still holds each kind at least twice. The unit tier's budget (60 s on 2 cores) bounds it
# from above: the law's families cost ~40 ms a case, and 39 of them at 300 cases took ~8.5 minutes.
SAMPLE_SHARE = 0.04
# No sample below this, whatever the family: fewer and a test's "exercised at least k" floor is all noise.
SAMPLE_MIN = 8


def full_families() -> bool:
    """True when the whole generated families run (the benchmark), not the suite's sample."""
    return os.environ.get(FULL_FAMILIES_ENV) == "1"


def sample(full: int) -> int:
    """The suite's sample of a family of `full` cases: SAMPLE_SHARE of it, at least SAMPLE_MIN (never past full)."""
    return min(full, max(SAMPLE_MIN, math.ceil(SAMPLE_SHARE * full)))


def cases(full: int) -> int:
    """How many cases of a family of `full` this run draws: all of them in the benchmark, a sample in the suite."""
    return full if full_families() else sample(full)


def floor(k: int, full: int) -> int:
    """A test's "the family exercised this at least k times in `full` cases", scaled to this run's draw (the mix the
    floor checks is a share of the family, so a sample holds its share of it)."""
    return math.ceil(k * cases(full) / full)


# The fewest cases of a rare kind the suite's sample must still find (k, where the family asks fewer): three, so a
# kind is seen more than once or twice by chance.
RARE_MIN = 3


def wanted(k: int) -> int:
    """How many cases of a rare kind a test must find: k in the benchmark; in the suite SAMPLE_SHARE of k, at least
    RARE_MIN (never past k)."""
    return k if full_families() else min(k, max(RARE_MIN, math.ceil(SAMPLE_SHARE * k)))


def enough(found: int, k: int) -> bool:
    """For a test that checks a rare kind of case (a few in a hundred draws): in the suite, whether it has found
    its sample of them (`wanted(k)`), so it stops drawing; never in the benchmark, where the whole family runs."""
    return not full_families() and found >= wanted(k)
