"""Seeded arrival processes. Each returns sorted arrival times in seconds within [0, duration)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Times = npt.NDArray[np.float64]

# The simulator keeps every request's arrival and latency in memory and runs each through Python: past this
# many expected requests a run would exhaust memory or take hours, and the tools that run it refuse it. Measured
# (`bench/tuner/sim_scale.py`): about 80 MB and 2-3 s of one core per million requests for the tailtune policy,
# so 4 GB and a couple of minutes here; the oracle replays a dozen static configs, each a fraction of that.
MAX_REQUESTS = 50_000_000


@dataclass(frozen=True)
class Trace:
    """A named arrival trace: the times, and the piecewise-constant rate that drew them (for plots)."""

    name: str
    arrivals: Times
    duration_s: float
    # (start_s, end_s, rate) pieces; and the instants where the load steps (for settle metrics).
    segments: tuple[tuple[float, float, float], ...]
    steps: tuple[float, ...] = field(default=())

    def rate_at(self, t: float) -> float:
        """Offered rate at time t, req/s."""
        return next((r for a, b, r in self.segments if a <= t < b), 0.0)


def piecewise_poisson(segments: Sequence[tuple[float, float, float]], seed: int) -> Times:
    """Poisson arrivals with a piecewise-constant rate given as (start_s, end_s, rate) pieces."""
    rng = np.random.default_rng(seed)
    parts = []
    for start, end, rate in segments:
        n = int(rng.poisson(max(rate, 0.0) * (end - start)))
        parts.append(np.sort(rng.uniform(start, end, n)))
    return np.concatenate(parts) if parts else np.empty(0)


def poisson(rate: float, duration_s: float, seed: int) -> Trace:
    """Poisson arrivals at a constant rate."""
    segs = ((0.0, duration_s, rate),)
    return Trace(f"poisson-{rate:g}", piecewise_poisson(segs, seed), duration_s, segs)


def step(levels: Sequence[tuple[float, float]], duration_s: float, seed: int, name: str = "step") -> Trace:
    """Poisson arrivals whose rate steps: levels are (from_s, rate), the first from 0."""
    bounds = [t for t, _ in levels] + [duration_s]
    segs = tuple((bounds[i], bounds[i + 1], r) for i, (_, r) in enumerate(levels))
    return Trace(name, piecewise_poisson(segs, seed), duration_s, segs, tuple(bounds[1:-1]))


def mmpp(rates: tuple[float, float], mean_dwell_s: tuple[float, float], duration_s: float, seed: int) -> Trace:
    """Bursty two-state Markov-modulated Poisson process: exponential dwell times in each state."""
    rng = np.random.default_rng(seed + 1_000_003)
    segs: list[tuple[float, float, float]] = []
    t, state = 0.0, 0
    while t < duration_s:
        end = min(duration_s, t + float(rng.exponential(mean_dwell_s[state])))
        segs.append((t, end, rates[state]))
        t, state = end, 1 - state
    return Trace("mmpp", piecewise_poisson(segs, seed), duration_s, tuple(segs))


def diurnal(low: float, high: float, period_s: float, duration_s: float, seed: int, piece_s: float = 1.0) -> Trace:
    """A day compressed into `period_s`: the rate follows a sine between low and high (starting low)."""
    n = math.ceil(duration_s / piece_s)
    segs = tuple(
        (
            i * piece_s,
            min(duration_s, (i + 1) * piece_s),
            low + (high - low) * (1 - math.cos(2 * math.pi * (i + 0.5) * piece_s / period_s)) / 2,
        )
        for i in range(n)
    )
    return Trace("diurnal", piecewise_poisson(segs, seed), duration_s, segs)


def deterministic(times: Sequence[float], duration_s: float | None = None) -> Trace:
    """Exactly these arrival times (for tests)."""
    arr = np.sort(np.asarray(times, dtype=np.float64))
    end = duration_s if duration_s is not None else (float(arr[-1]) + 1.0 if len(arr) else 1.0)
    return Trace("deterministic", arr, end, ((0.0, end, len(arr) / end),))
