"""The SLO, the aim and the per-tick limits, computed once per tick into one value (`Limits`) that the reading,
the plan, the guards and the act read; and the demand's upper bound over the lead time a scale-in must cover."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import datetime

from tailtune.tuner.types import Policy, TunerState, judged_window_seconds


@dataclass(frozen=True)
class Limits:
    """What one tick aims at and the limits it keeps, from the spec and what has been measured."""

    slo_ms: float  # spec.slo.latencyMs
    aim_ms: float  # the SLO times spec.tuning.headroom: above it a window is bad
    comfort_ms: float  # the aim times the headroom again: below it a window is comfortably good
    interval_s: float  # spec.tuning.intervalSeconds
    judged_window_s: float  # how far back a window's latency reaches (the SLO window, at least Triton's 60 s)
    # How long a replica given back takes to serve again once it is needed: a window to see the rise, then a pod
    # start (the last one measured; one interval before any was measured, as the drain floor assumes).
    pod_start_s: float
    lead_s: float
    # How far back the highest demand bounds a scale-in: the spec's stabilization window where it sets one (the
    # HPA's meaning), else the lead time (what a replica given back must not be missed for).
    lookback_s: float
    # How far back the demand is remembered (the spec's stabilization window, default the HPA's 300 s): its rises
    # over a lead time there are the margin its own variability calls for.
    memory_s: float
    batch_floor: int  # the least max batch: the spec's minimum, at least the largest warmup batch
    batch_cap: int  # the largest max batch: the spec's bound at most the engine's (`Policy.from_spec`)


def limits(policy: Policy, st: TunerState) -> Limits:
    """The tick's `Limits` for a policy and the state's measured pod start."""
    interval = policy.interval_seconds
    pod_start = st.startup_seconds if st.startup_seconds is not None else interval
    lead = interval + pod_start
    spec = policy.scale_in_stabilization_seconds
    return Limits(
        slo_ms=policy.slo_ms,
        aim_ms=policy.aim_ms,
        comfort_ms=policy.comfort_ms,
        interval_s=interval,
        judged_window_s=judged_window_seconds(policy.window_seconds),
        pod_start_s=pod_start,
        lead_s=lead,
        lookback_s=spec if spec is not None else lead,
        memory_s=policy.scale_in_window_seconds,
        batch_floor=max(policy.batch_min, policy.warmup_max),
        batch_cap=policy.batch_max,
    )


def upper_demand_rps(recent: tuple[tuple[datetime, float], ...], lim: Limits) -> float:
    """The demand's upper bound over the lead time (`recent`: (window end, demand) over the memory, this window
    last): the highest demand within the lookback, and at least this window's demand plus the largest rise the
    demand made within one lead time anywhere in its memory (a replica given back now is back only a lead time
    after the demand rises again, and it has risen that fast before)."""
    end, now_rps = recent[-1]
    peak = max(d for t, d in recent if (end - t).total_seconds() < lim.lookback_s or t == end)
    rise = max(
        (
            b - a
            for (ta, a), (tb, b) in itertools.combinations(recent, 2)
            if 0 < (tb - ta).total_seconds() <= lim.lead_s
        ),
        default=0.0,
    )
    return max(peak, now_rps + max(0.0, rise))


# Standard errors of a window's request count (Poisson) within which a demand is taken as the same: 2.576, the
# two-sided 99 % point of the normal distribution (the margin covers the noise of the one window read).
DEMAND_NOISE_Z = 2.576


def measured_margin(recent: tuple[tuple[datetime, float], ...], lim: Limits, policy: Policy) -> float | None:
    """The margin the demand's own variability calls for: its upper bound over the lead time (`upper_demand_rps`)
    over its present value, and the largest factor it fell by within a lead time over its memory (a demand that
    halves within a lead time can double as fast: a random walk's steps go both ways); at least the window's
    sampling noise (a Poisson count over the interval), at most the fixed margin of the utilisation target. None
    (the fixed margin) before the demand's history covers its memory: how far it moves within a lead time is not
    known yet."""
    end, now_rps = recent[-1]
    span = (end - recent[0][0]).total_seconds() + lim.interval_s
    if now_rps <= 0 or span < lim.memory_s:
        return None
    noise = 1.0 + DEMAND_NOISE_Z / math.sqrt(now_rps * lim.interval_s)
    fell = max(
        (
            a / b
            for (ta, a), (tb, b) in itertools.combinations(recent, 2)
            if 0 < (tb - ta).total_seconds() <= lim.lead_s and b > 0
        ),
        default=1.0,
    )
    return min(policy.fixed_margin, max(noise, upper_demand_rps(recent, lim) / now_rps, fell))
