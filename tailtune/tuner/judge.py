"""The signal judged before the law uses it: `judge_signal(observation, read_at, policy, curve, instances)`. Pure.

A window whose samples lie ahead of the operator's clock (`ClockSkew`), whose newest sample is older than the window
(`SignalStale`), or whose figures cannot be real (`SignalImplausible`: a negative rate or time, a percentile of 0
with traffic, more completions than the ready pods' measured curve can serve by a wide factor) is not acted on: the
tuner holds and status says why, with the figure. Every bound below is physical (a clock, a window, a capacity);
none is fitted to a case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from tailtune.tuner.servicetime import Curve
from tailtune.tuner.types import Observation, Policy

# Reason codes (CamelCase, for the tuner's decision, status.latency.problem and SLOMet).
CLOCK_SKEW = "ClockSkew"
SIGNAL_STALE = "SignalStale"
SIGNAL_IMPLAUSIBLE = "SignalImplausible"
JUDGED = frozenset({CLOCK_SKEW, SIGNAL_STALE, SIGNAL_IMPLAUSIBLE})

# Samples may lie this many tuning intervals ahead of the read's time before the clocks are said to disagree: the
# read starts at `now` and ends before the next tick (one tick in flight per object), so a sample scraped while the
# read ran is stamped at most that much later; past it, Prometheus', an exporter's or the operator's clock is off.
SKEW_TOLERANCE_INTERVALS = 1.0
# The newest sample may be this many windows older than the window itself before the signal is stale: rate() needs two
# samples in its window, so a live series is scraped at least every half window and its newest sample is at most half
# a window old; past the window and another half, the last two scrapes at least were missed (a stopped scrape, a
# frozen exporter): no new data, not a late scrape.
STALE_TOLERANCE_WINDOWS = 0.5
# Completions per second cannot exceed what full batches of the most efficient measured size drain on every model
# instance that served the window (rate() never reads more than the rate between the samples it has). The bound is
# widened by this factor before a rate is called impossible: a window can be served by up to twice the pods ready now
# (a scale-in gives back at most half of them at once: the law's own limit), and the curve may understate a device by
# up to half (its times are means, measured by the build or live under other loads and clock states): 2 x 2. What it
# catches is a rate off by orders of magnitude (a counter that jumped, a unit error), never a busy service.
IMPLAUSIBLE_RATE_FACTOR = 4.0


@dataclass(frozen=True)
class SignalProblem:
    """Why a window is not acted on: its reason code and a message with the figure and why."""

    code: str
    message: str


def _at(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def judge_signal(
    obs: Observation, read_at: datetime, policy: Policy, curve: Curve, instances: int
) -> SignalProblem | None:
    """The problem with this window, or None when it can be used. `read_at` is the operator's clock when it read the
    window; `instances` the model instances that could have served it (pods x GPUs per pod x instances per GPU)."""
    ahead = (obs.window_end - read_at).total_seconds()
    tolerance = SKEW_TOLERANCE_INTERVALS * policy.interval_seconds
    if ahead > tolerance:
        return SignalProblem(
            CLOCK_SKEW,
            f"the newest sample ({_at(obs.window_end)}) is {ahead:.0f} s ahead of the operator's clock "
            f"({_at(read_at)}; tolerance {tolerance:g} s, one tuning interval): Prometheus', an exporter's or the "
            "operator's clock is off, and no window can be placed in time",
        )
    age = -ahead
    grace = STALE_TOLERANCE_WINDOWS * obs.span_seconds
    if age > obs.span_seconds + grace:
        return SignalProblem(
            SIGNAL_STALE,
            # (No age in the message: it would change every tick and rewrite status at rest; the time says it.)
            f"the newest sample ({_at(obs.window_end)}) is older than the {obs.span_seconds:g} s "
            f"window by more than {grace:g} s: no new data (a stopped scrape, a frozen exporter, or the operator's "
            f"clock ahead of Prometheus'); {_figure(obs, policy)} of then not judged",
        )
    return _implausible(obs, policy, curve, instances)


def _figure(obs: Observation, policy: Policy) -> str:
    p = obs.p_latency_ms
    shown = "no figure" if p is None else "above every bucket" if math.isinf(p) else f"{p:g} ms"
    return f"P{policy.percentile:g} {shown}"


def _implausible(obs: Observation, policy: Policy, curve: Curve, instances: int) -> SignalProblem | None:
    """A figure no real service gives: a negative count or time, a zero percentile with traffic, or more completions
    than the measured curve allows the instances by `IMPLAUSIBLE_RATE_FACTOR`."""
    negative = [
        (name, value)
        for name, value in (
            ("request rate", obs.request_rate),
            ("queue time", obs.queue_ms),
            ("compute time", obs.compute_ms),
            ("pending requests", obs.pending_max),
        )
        if value is not None and value < 0
    ]
    if negative:
        shown = ", ".join(f"{name} {value:g}" for name, value in negative)
        return SignalProblem(SIGNAL_IMPLAUSIBLE, f"{shown}: a count or a time is never negative")
    rate = obs.request_rate
    if rate is not None and rate > 0:
        latencies = ((policy.percentile, obs.p_latency_ms), *obs.other_percentiles)
        zero = [(p, ms) for p, ms in latencies if ms is not None and ms <= 0]
        if zero:
            shown = ", ".join(f"P{p:g} {ms:g} ms" for p, ms in zero)
            return SignalProblem(SIGNAL_IMPLAUSIBLE, f"{shown} at {rate:.4g} req/s: every request takes some time")
        if curve and instances > 0:
            per_instance = max(1000.0 * b / ms for b, ms in zip(curve.sizes, curve.times, strict=True))
            bound = IMPLAUSIBLE_RATE_FACTOR * per_instance * instances
            if rate > bound:
                return SignalProblem(
                    SIGNAL_IMPLAUSIBLE,
                    f"request rate {rate:.4g} req/s is more than {IMPLAUSIBLE_RATE_FACTOR:g}x what {instances} model "
                    f"instance(s) can complete ({per_instance:.4g} req/s each at full batches of the measured service "
                    f"time, {bound:.4g} req/s with that margin): not a real rate",
                )
    return None
