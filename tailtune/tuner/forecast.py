"""Scale ahead of load that repeats: a seasonal forecast of the demand. Pure: no I/O, no clock.

A pod takes its start (pulling, loading the engine, warmup) before it serves: a rise shorter than that is lost by
any policy that waits to see it, even where it came at the same phase of every period before. With the forecast on
(`Policy.forecast`, spec.tuning.forecast.enabled) the tuner keeps the demand per tuning interval
(`TunerState.demand_history`, at most `HISTORY_BINS`), and after the law has decided:

1. the period: the lag at which the history's autocorrelation peaks, over at least `MIN_REPEATS` periods, above
   both the noise of a correlation over that many pairs and `SKILL_CORRELATION`, after a trough (`detect_period`);
2. the prediction: over the next pod start and one interval (the next tick could order replicas only that much
   later), the most demand that two of the last three cycles reached at that phase, give or take a bin
   (`predict`): a seasonal naive forecast, at the upper end of what repeats;
3. the floor: the replicas that carry that demand with the law's margin on the batching the law chose; a decision
   with fewer gets that many (`ahead`). It never lowers the law's count, so a forecast never scales in; it keeps
   replicas up only while a rise is predicted within the horizon, and the law's own scale-in rules give them back
   on the measured demand after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import NormalDist

import numpy as np

from tailtune.tuner.law import candidate, hold
from tailtune.tuner.servicetime import Curve, merged
from tailtune.tuner.types import TAIL_SHARE, Decision, DemandHistory, InForce, Observation, Policy, TunerState

# Reason codes (CamelCase, for Events and conditions).
SCALED_OUT_AHEAD = "ScaledOutAhead"
HELD_FOR_FORECAST = "HeldForForecast"

# Bins kept (one per tuning interval): 4 h at the default 30 s interval, so periods up to 80 min are found (over
# MIN_REPEATS of them). The cap keeps the tuner-state annotation small: 480 numbers of at most 7 characters are
# about 3.5 KB, under 2 % of the 256 KiB Kubernetes allows an object's annotations in all. A daily period needs a
# coarser history than the annotation holds at this resolution (not done: Prometheus keeps that history).
HISTORY_BINS = 480
# A period is believed only over at least this many of it in the history: with two, one coincidence of two bursts
# is a "period"; with three, the first repeat is confirmed by the second.
MIN_REPEATS = 3
# The shortest period in bins: a lag of one bin measures how smooth the demand is, not that it repeats.
MIN_PERIOD_BINS = 2
# The chance, over all the lags tested, that white noise shows a correlation past the significance line: 5 %, the
# usual test size, split among the lags (Bonferroni), so the line for one lag is z(1 - 0.05 / (2 x lags)) / sqrt(n)
# (the sample autocorrelation of white noise over n pairs has a standard deviation of about 1/sqrt(n): Bartlett).
FALSE_PERIOD_CHANCE = 0.05
# A seasonal naive forecast x(t) = x(t - P) errs by 2 (1 - r) var(x) in mean square, where r is the correlation at
# lag P; the series' mean errs by var(x). Below r = 1/2 the period predicts worse than the mean: no forecast.
SKILL_CORRELATION = 0.5
# Bins either side of the phase read in each past cycle: a period that is not a whole number of bins drifts by up
# to a bin per cycle against them, and ticks are spread over the interval.
PHASE_SLACK_BINS = 1
# A rise is predicted at the level the last MIN_REPEATS cycles reached at that phase in at least this many of them
# (a majority): one burst that happened to fall there once is no season.
AGREEING_CYCLES = 2
# Demand is recorded rounded to this many significant digits (the annotation's size; the law's resolution is 5 %).
DIGITS = 3


@dataclass(frozen=True)
class Period:
    """A period found in the demand history."""

    bins: int
    seconds: float
    correlation: float


@dataclass(frozen=True)
class Prediction:
    """The most demand predicted over the horizon, when, and the period it comes from."""

    demand_rps: float
    at: datetime
    period: Period


def window_demand(obs: Observation) -> float | None:
    """A window's demand for the history: the more of its two parts, the tail (`TAIL_SHARE` of it) and the rest
    (the whole's completions plus queue growth less the tail's share). A rise shorter than the window shows near
    its full rate in one part and diluted in the whole: the forecast is an upper bound. None without a request
    rate."""
    if obs.request_rate is None:
        return None
    whole = obs.request_rate + max(0.0, obs.queue_growth_rps or 0.0)
    if obs.tail_demand_rps is None:
        return whole
    rest = (whole - TAIL_SHARE * obs.tail_demand_rps) / (1 - TAIL_SHARE)
    return max(whole, obs.tail_demand_rps, rest)


def record(history: DemandHistory | None, at: datetime, demand_rps: float, step_seconds: float) -> DemandHistory:
    """The history with the demand of the window that ended `at` in its bin (the most, when a bin has two), gaps
    as None, at most HISTORY_BINS (the oldest dropped). A new step (the interval changed) starts a new history."""
    value = float(f"{demand_rps:.{DIGITS}g}")
    if history is None or history.step_seconds != step_seconds or at < history.start:
        # The first sample in the middle of its bin: ticks a little early or late stay in their own bins.
        return DemandHistory(start=at - timedelta(seconds=step_seconds / 2), step_seconds=step_seconds, rates=(value,))
    i = int((at - history.start).total_seconds() // step_seconds)
    rates = list(history.rates)
    if i < len(rates):
        old = rates[i]
        rates[i] = value if old is None else max(old, value)
    else:
        rates += [None] * (i - len(rates)) + [value]
    drop = max(0, len(rates) - HISTORY_BINS)
    start = history.start + timedelta(seconds=drop * step_seconds)
    return DemandHistory(start=start, step_seconds=step_seconds, rates=tuple(rates[drop:]))


def significance(pairs: int, lags: int) -> float:
    """The correlation white noise passes at one of `lags` lags with FALSE_PERIOD_CHANCE, over `pairs` pairs."""
    z = NormalDist().inv_cdf(1 - FALSE_PERIOD_CHANCE / (2 * max(1, lags)))
    return z / math.sqrt(max(1, pairs))


def detect_period(rates: tuple[float | None, ...], step_seconds: float) -> Period | None:
    """The shortest lag (in bins) at which the autocorrelation of the rates peaks above both the significance line
    and SKILL_CORRELATION, after a trough below it by that line (a trend or a slow drift has no trough: its
    correlation falls with the lag), with MIN_REPEATS periods in the history; None when there is none."""
    n = len(rates)
    top = n // MIN_REPEATS
    if top < MIN_PERIOD_BINS:
        return None
    x = np.array([math.nan if r is None else r for r in rates], dtype=float)
    known = ~np.isnan(x)
    if known.sum() < MIN_REPEATS * MIN_PERIOD_BINS:
        return None
    centred = np.where(known, x - float(np.nanmean(x)), 0.0)  # a gap counts as the mean: no evidence either way
    var = float(np.sum(centred**2)) / int(known.sum())
    if var <= 1e-12 * max(1.0, float(np.nanmax(np.abs(x)))) ** 2:
        return None  # flat: nothing repeats
    both = known.astype(float)
    lags = top - MIN_PERIOD_BINS + 1
    acf = [1.0]
    for k in range(1, top + 2):
        # Pearson's correlation over the pairs k apart that are both known (about the whole series' mean).
        a, b = centred[:-k] * both[k:], centred[k:] * both[:-k]
        norm = math.sqrt(float(np.sum(a**2)) * float(np.sum(b**2)))
        acf.append(float(np.sum(a * b)) / norm if norm > 0 else math.nan)
    for k in range(MIN_PERIOD_BINS, top + 1):
        r = acf[k]
        if not math.isfinite(r):
            continue
        nxt = acf[k + 1] if math.isfinite(acf[k + 1]) else -math.inf
        line = significance(int(np.sum(both[:-k] * both[k:])), lags)
        trough = min(a for a in acf[1:k] if math.isfinite(a)) if k > 1 else r
        if r >= acf[k - 1] and r >= nxt and r > max(line, SKILL_CORRELATION) and trough <= r - line:
            return Period(bins=k, seconds=k * step_seconds, correlation=r)
    return None


def predict(history: DemandHistory, now: datetime, horizon_seconds: float) -> Prediction | None:
    """The most demand that AGREEING_CYCLES of the last MIN_REPEATS cycles reached at the phases of the bins ending
    within `horizon_seconds` after `now` (PHASE_SLACK_BINS either side, never the phase of now or before), the bin
    it is predicted for, and the period; None without a period."""
    period = detect_period(history.rates, history.step_seconds)
    if period is None:
        return None
    step = history.step_seconds
    rates = history.rates
    last = len(rates) - 1
    now_bin = int((now - history.start).total_seconds() // step)
    best: tuple[float, int] | None = None
    for j in range(1, max(1, math.ceil(horizon_seconds / step)) + 1):
        target = now_bin + j
        seen = []  # per past cycle, the most at the target's phase
        for cycle in range(1, MIN_REPEATS + 1):
            centre = target - cycle * period.bins
            # The slack reaches ahead, never back to the phase of now (a rise already here is the law's).
            values = [
                v
                for i in range(centre - PHASE_SLACK_BINS, centre + PHASE_SLACK_BINS + 1)
                if 0 <= i <= last and i + cycle * period.bins > now_bin and (v := rates[i]) is not None
            ]
            if values:
                seen.append(max(values))
        if len(seen) >= AGREEING_CYCLES:
            value = sorted(seen)[-AGREEING_CYCLES]
            if best is None or value > best[0]:
                best = (value, target)
    if best is None:
        return None
    at = history.start + timedelta(seconds=(best[1] + 0.5) * step)
    return Prediction(demand_rps=best[0], at=at, period=period)


def ahead(decision: Decision, in_force: InForce, observation: Observation, policy: Policy, now: datetime) -> Decision:
    """The law's decision with the window's demand recorded in the history and, where a period predicts more
    demand within the next pod start and interval than the decision's replicas carry with the law's margin, that
    many replicas (at most replicas.max). Never fewer than the decision's: scale-in stays the law's."""
    st = decision.state
    demand = window_demand(observation)
    if demand is not None:
        st = st.model_copy(
            update={
                "demand_history": record(st.demand_history, observation.window_end, demand, policy.interval_seconds)
            }
        )
    decision = decision.model_copy(update={"state": st})
    startup_s = st.startup_seconds
    pod_start = startup_s if startup_s is not None else policy.interval_seconds
    if st.demand_history is None:
        return decision
    prediction = predict(st.demand_history, now, pod_start + policy.interval_seconds)
    curve = Curve(merged(policy.build_curve, st.live))
    if prediction is None or not curve:
        return decision
    b = decision.batching
    carries = candidate(curve, b.max_batch_size, b.max_queue_delay_microseconds, policy, st.calibration).carries()
    need = math.ceil(prediction.demand_rps * policy.demand_margin / max(carries, 1e-9))
    floor = min(policy.replicas_max, need)
    if floor <= decision.replicas:
        return decision
    measured = (
        f"the measured pod start {pod_start:.0f} s"
        if startup_s is not None
        else (f"one interval ({pod_start:.0f} s; no pod start measured yet)")
    )
    note = (
        f"forecast: {prediction.demand_rps:.0f} req/s at {prediction.at:%H:%M:%S} from a period of "
        f"{prediction.period.seconds:.0f} s (correlation {prediction.period.correlation:.2f}); "
    )
    if floor == in_force.replicas and decision.batching == in_force.batching:
        # The law would give replicas back that the predicted rise needs: they stay.
        why = note + f"kept {in_force.replicas} replica(s) ({carries:.0f} req/s each) ahead of it"
        return hold(st, in_force, HELD_FOR_FORECAST, f"{decision.reason}; {why}" if decision.reason else why)
    scaled = f"scaled out by {measured} ahead ({decision.replicas} -> {floor} replica(s), {carries:.0f} req/s each)"
    reason = (f"{decision.reason}; " if decision.changed else "") + note + scaled
    code = SCALED_OUT_AHEAD if floor > in_force.replicas and decision.replicas <= in_force.replicas else None
    code = code or decision.reason_code
    new = InForce(
        batching=decision.batching,
        replicas=floor,
        changed_at=now,
        reason=reason,
        rolled=in_force.rolled,
    )
    st = _scaled_out(st, in_force, floor, now, code)
    return decision.model_copy(
        update={"action": "change", "in_force": new, "reason": reason, "reason_code": code, "state": st}
    )


def _scaled_out(st: TunerState, in_force: InForce, replicas: int, now: datetime, code: str) -> TunerState:
    """The state after a change to `replicas`: a scale-out's pod start is measured as the law's is."""
    update: dict[str, object] = {"last_reason_code": code}
    if replicas > in_force.replicas:
        update["scaled_out_at"] = now
    return st.model_copy(update=update)
