"""The signal judged before it is used (`tuner.judge`): generated windows, healthy ones pass, each fault is named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from tailtune.tuner.judge import (
    CLOCK_SKEW,
    IMPLAUSIBLE_RATE_FACTOR,
    SIGNAL_IMPLAUSIBLE,
    SIGNAL_STALE,
    SKEW_TOLERANCE_INTERVALS,
    STALE_TOLERANCE_WINDOWS,
    judge_signal,
)
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import Observation, Policy

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
CASES = 300


def _case(rng: np.random.Generator) -> tuple[Observation, Policy, Curve, int, float]:
    """A healthy window of a random service: a linear-ish curve, 1-8 instances, a rate within what they complete,
    the newest sample up to half a window old (a scrape at least every half window). Also the capacity in all."""
    t1, slope = float(rng.uniform(0.5, 20)), float(rng.uniform(0.05, 2))
    sizes = [1, 2, 4, 8, 16, 32][: int(rng.integers(1, 7))]
    curve = Curve([CurvePoint(batch=b, ms=t1 + slope * (b - 1), source="build") for b in sizes])
    capacity = max(1000.0 * b / ms for b, ms in zip(curve.sizes, curve.times, strict=True))
    instances = int(rng.integers(1, 9))
    window = float(rng.choice([10, 30, 60, 300]))
    interval = float(rng.integers(5, 61))
    policy = Policy(slo_ms=float(rng.uniform(5, 500)), window_seconds=window, interval_seconds=interval)
    obs = Observation(
        window_end=NOW - timedelta(seconds=float(rng.uniform(0, window / 2))),
        span_seconds=window,
        p_latency_ms=float(rng.uniform(0.1, 1000)),
        request_rate=float(rng.uniform(0.1, 1.0)) * capacity * instances,
        queue_ms=float(rng.uniform(0, 100)),
        compute_ms=float(rng.uniform(0.1, 100)),
        pending_max=float(rng.integers(0, 50)),
        ready_replicas=instances,
        other_percentiles=((50.0, float(rng.uniform(0.1, 10))),),
    )
    return obs, policy, curve, instances, capacity * instances


def test_healthy_windows_pass() -> None:
    rng = np.random.default_rng(40)
    for i in range(CASES):
        obs, policy, curve, instances, _ = _case(rng)
        assert judge_signal(obs, NOW, policy, curve, instances) is None, (i, obs)
        # A sample scraped while the read ran (within an interval of its start) is no skew.
        during = obs.model_copy(update={"window_end": NOW + timedelta(seconds=policy.interval_seconds * 0.99)})
        assert judge_signal(during, NOW, policy, curve, instances) is None, i


def test_samples_ahead_of_the_clock_are_clock_skew_with_the_offset() -> None:
    rng = np.random.default_rng(41)
    for i in range(CASES):
        obs, policy, curve, instances, _ = _case(rng)
        ahead = SKEW_TOLERANCE_INTERVALS * policy.interval_seconds + float(rng.uniform(1, 3600))
        skewed = obs.model_copy(update={"window_end": NOW + timedelta(seconds=ahead)})
        problem = judge_signal(skewed, NOW, policy, curve, instances)
        assert problem is not None and problem.code == CLOCK_SKEW, i
        assert f"{ahead:.0f} s ahead" in problem.message


def test_a_newest_sample_older_than_the_window_is_stale_with_its_time_and_a_message_stable_at_rest() -> None:
    rng = np.random.default_rng(42)
    for i in range(CASES):
        obs, policy, curve, instances, _ = _case(rng)
        age = obs.span_seconds * (1 + STALE_TOLERANCE_WINDOWS) + float(rng.uniform(1, 3600))
        stale = obs.model_copy(update={"window_end": NOW - timedelta(seconds=age)})
        problem = judge_signal(stale, NOW, policy, curve, instances)
        assert problem is not None and problem.code == SIGNAL_STALE, i
        newest = stale.window_end.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert newest in problem.message and f"P99 {obs.p_latency_ms:g} ms" in problem.message, problem.message
        # At rest (the same frozen sample, a tick later) the message is the same: no status write for it.
        later = judge_signal(stale, NOW + timedelta(seconds=policy.interval_seconds), policy, curve, instances)
        assert later == problem, (problem.message, later)


def test_negative_counts_and_times_are_implausible() -> None:
    rng = np.random.default_rng(43)
    fields = ("request_rate", "queue_ms", "compute_ms", "pending_max")
    for i in range(CASES):
        obs, policy, curve, instances, _ = _case(rng)
        field = fields[i % len(fields)]
        value = -float(rng.uniform(0.01, 1e6))
        problem = judge_signal(obs.model_copy(update={field: value}), NOW, policy, curve, instances)
        assert problem is not None and problem.code == SIGNAL_IMPLAUSIBLE, (i, field)
        assert f"{value:g}" in problem.message


def test_a_percentile_of_zero_with_traffic_is_implausible_without_traffic_it_is_not() -> None:
    rng = np.random.default_rng(44)
    for i in range(CASES):
        obs, policy, curve, instances, _ = _case(rng)
        zero = -float(rng.uniform(0, 100)) if i % 2 else 0.0
        problem = judge_signal(obs.model_copy(update={"p_latency_ms": zero}), NOW, policy, curve, instances)
        assert problem is not None and problem.code == SIGNAL_IMPLAUSIBLE, i
        other = obs.model_copy(update={"other_percentiles": ((50.0, zero),)})
        problem = judge_signal(other, NOW, policy, curve, instances)
        assert problem is not None and "P50" in problem.message, i
        idle = obs.model_copy(update={"p_latency_ms": zero, "request_rate": 0.0})
        assert judge_signal(idle, NOW, policy, curve, instances) is None, i


def test_a_rate_past_what_the_curve_allows_the_instances_is_implausible() -> None:
    rng = np.random.default_rng(45)
    for i in range(CASES):
        obs, policy, curve, instances, capacity = _case(rng)
        bound = IMPLAUSIBLE_RATE_FACTOR * capacity
        # Up to the bound: a busy service (or one that lost pods during the window), never refused.
        busy = obs.model_copy(update={"request_rate": bound * float(rng.uniform(0.5, 0.999))})
        assert judge_signal(busy, NOW, policy, curve, instances) is None, i
        rate = bound * float(10 ** rng.uniform(0.01, 12))
        problem = judge_signal(obs.model_copy(update={"request_rate": rate}), NOW, policy, curve, instances)
        assert problem is not None and problem.code == SIGNAL_IMPLAUSIBLE, i
        assert f"{rate:.4g} req/s" in problem.message and f"{instances} model instance(s)" in problem.message
        # Without a measured curve there is no bound to judge a rate by.
        assert judge_signal(obs.model_copy(update={"request_rate": rate}), NOW, policy, Curve([]), instances) is None
