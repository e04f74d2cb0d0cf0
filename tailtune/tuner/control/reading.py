"""The reading of one window: the demand with what is queued, whether requests back up, the calibration of the
model on the config in force, the demand's trend, and when the pods in force were all ready."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from tailtune.tuner.control.objective import DRAIN_INTERVALS, MS_PER_S, Candidate
from tailtune.tuner.model import predict
from tailtune.tuner.servicetime import Curve, merged
from tailtune.tuner.types import InForce, Observation, Policy, TunerState

# Each constant is the quantity it names; where its value comes from follows it ("design value": chosen when the
# rule was written, not measured nor derived).

# Share of the completion rate past which a pending count's growth is a backlog, and past which the demand moved
# from one window to the next (design value: the noise of two rate() reads).
GROWTH_SHARE = 0.05
# Demand per completion of a backlogged window without a measured queue growth (a choice, not derived: the
# demand past the completions is unread there, and a quarter more is what the law plans on until a growth is read).
SATURATED_DEMAND_FACTOR = 1.25
# Queue wait, as a share of the SLO, past which requests back up without a measured queue growth (a choice, not
# derived: half the SLO spent waiting leaves the other half for the batch and its execution).
BACKLOG_SHARE_OF_SLO = 0.5
# Queue wait, in batch times, past which requests back up (design value: past the batch forming and the one
# waiting of a batcher that keeps up).
BACKLOG_BATCHES = 3.0
# Bounds of the model's observed/predicted calibration, and the weight (in log) of each clean window's ratio
# (design values: the model errs by at most 2x low and 4x high; halfway to each window).
CALIBRATION_RANGE = (0.5, 4.0)
CALIBRATION_WEIGHT = 0.5
# Decimal digits the calibration is kept to (the state's annotation stays short; 1e-4 is far below its noise).
CALIBRATION_DIGITS = 4
# Windows in which the demand must rise to be a ramp (the fewest with two rises to compare), and the intervals
# ahead the plan meets it (one for the change to show in a window, one to confirm it).
RAMP_WINDOWS = 3
RAMP_HORIZON_INTERVALS = 2
# Largest ratio of one rise to another in a ramp (else it is a step; a choice, not derived: rises within 3x of each
# other are read as one slope).
RAMP_EVENNESS = 3.0
# A shrinking queue drains by itself where it is gone within this many times the drain horizon (DRAIN_INTERVALS).
DRAINING_HORIZONS = 2


@dataclass(frozen=True)
class Reading:
    p_ms: float
    rate: float
    demand_rps: float
    saturated: bool
    over: bool
    comfortable: bool
    overloaded: bool
    draining: bool
    backlog: float


def read(obs: Observation, p_ms: float, rate: float, in_force: InForce, policy: Policy) -> Reading:
    seen = dict(obs.other_percentiles)
    # (target ms, observed ms) of the other targets observed in this window (a missing one says nothing).
    others = [(slo, ms) for pct, slo in policy.other_targets if (ms := seen.get(pct)) is not None]
    delay_ms = in_force.batching.max_queue_delay_microseconds / MS_PER_S
    waiting_ms = (obs.queue_ms or 0.0) - delay_ms
    growth = obs.queue_growth_rps
    # A queue several batches deep is a backlog. Without a measured queue growth, so is a wait past a share of the
    # SLO; with one, such a wait behind long batches that keep up is their own cost, not a growing backlog.
    deep_ms = BACKLOG_BATCHES * (obs.compute_ms if obs.compute_ms is not None else math.inf)
    backlog_ms = (
        deep_ms
        if growth is not None and obs.compute_ms is not None
        else min(BACKLOG_SHARE_OF_SLO * policy.slo_ms, deep_ms)
    )
    growing = growth is not None and growth > GROWTH_SHARE * rate
    saturated = (obs.queue_ms is not None and waiting_ms >= backlog_ms) or growing
    demand = rate + max(0.0, growth) if growth is not None else rate * (SATURATED_DEMAND_FACTOR if saturated else 1.0)
    # Queued now: at least what the window added, what its mean wait says, and what the fullest pod holds.
    backlog = max(
        max(0.0, growth or 0.0) * obs.span_seconds, rate * max(0.0, waiting_ms) / MS_PER_S, obs.pending_max or 0
    )
    drain_s = DRAINING_HORIZONS * DRAIN_INTERVALS * policy.interval_seconds
    draining = growth is not None and growth < -GROWTH_SHARE * rate and backlog <= -growth * drain_s
    queued = growing or (obs.compute_ms is not None and waiting_ms >= obs.compute_ms)
    return Reading(
        p_ms=p_ms,
        rate=rate,
        demand_rps=demand,
        saturated=saturated,
        over=p_ms > policy.aim_ms or any(ms > policy.headroom * slo for slo, ms in others),
        comfortable=p_ms < policy.comfort_ms
        and not saturated
        and all(ms < policy.headroom * policy.headroom * slo for slo, ms in others),
        overloaded=p_ms > policy.slo_ms and queued and not draining,
        draining=draining,
        backlog=backlog if saturated else 0.0,
    )


def calibrate(old: float, pred: float, r: Reading) -> float:
    """Move the calibration towards this window's observed/`pred`icted ratio of the config in force."""
    if not (math.isfinite(pred) and pred > 0 and r.p_ms > 0):
        return old
    lo, hi = CALIBRATION_RANGE
    ratio = min(hi, max(lo, r.p_ms / pred))
    value = math.exp((1 - CALIBRATION_WEIGHT) * math.log(old) + CALIBRATION_WEIGHT * math.log(ratio))
    return round(value, CALIBRATION_DIGITS)


def predicted_ms(curve: Curve, in_force: InForce, r: Reading, policy: Policy) -> float:
    """The model's latency at the percentile for the config in force at the measured demand, shared evenly by its
    replicas (uncalibrated)."""
    b = in_force.batching
    per = r.demand_rps / max(1, in_force.replicas)
    return predict(
        curve.ms, b.max_batch_size, b.max_queue_delay_microseconds, policy.instances, per, policy.percentile
    ).p_ms


def as_delivered(c: Candidate, r: Reading, in_force: InForce) -> Candidate:
    """The config in force as it performs: while requests pile up under it, what it delivers is its capacity,
    whatever the model says (e.g. batches that ran away to a slow max batch on a superlinear curve)."""
    if not r.saturated:
        return c
    delivered = r.rate / max(1, in_force.replicas)
    return dataclasses.replace(
        c,
        capacity_rps=min(c.capacity_rps, delivered),
        robust_rps=min(c.robust_rps, delivered),
        burst_rps=min(c.burst_rps, delivered),
    )


def partial(obs: Observation, r: Reading, rising: bool) -> bool:
    """Whether the window's demand understates the present one: its tail shows more than the whole (past noise), a
    crowd that entered part way through, whatever the windows before (the first after an idle spell has none);
    without a tail figure, any rise over the last window may be one."""
    tail = obs.tail_demand_rps
    return rising if tail is None else tail > (1 + GROWTH_SHARE) * r.demand_rps


def recurs(recent: tuple[tuple[datetime, float], ...], margin: float) -> bool:
    """Whether the last window's demand was reached before (within the margin) in `recent` (the stabilization
    window) and fell back below it (past the margin) since: bursts, not a step."""
    demand = recent[-1][1]
    earlier = [d for _, d in recent[:-1]]
    return any(
        d * margin >= demand and any(x * margin < demand for x in earlier[i + 1 :]) for i, d in enumerate(earlier)
    )


def readiness(state: TunerState, in_force: InForce, obs: Observation) -> dict[str, object]:
    """`ready_count` and `ready_at` after this window (see `TunerState`). The first count ever seen all ready
    served the windows before it (a Deployment is Ready only once its pods are): no partial window then."""
    ready, n = obs.ready_replicas, in_force.replicas
    if ready is None:
        return {}
    if ready < n:
        return {"ready_count": ready}
    if n == state.ready_count:
        return {}
    grew = 0 < state.ready_count < n
    out: dict[str, object] = {"ready_count": n, "ready_at": obs.window_end if grew else state.ready_at}
    if grew and state.scaled_out_at is not None and obs.window_end > state.scaled_out_at:
        out["startup_seconds"] = (obs.window_end - state.scaled_out_at).total_seconds()
        out["scaled_out_at"] = None
    return out


def ramp_rps_per_s(recent: tuple[tuple[datetime, float], ...]) -> float:
    """The growth of the demand per second over the last RAMP_WINDOWS windows when it rose in every one of them by
    more than noise (GROWTH_SHARE) and by alike amounts (a sustained ramp, e.g. a diurnal morning), else 0: a step,
    or a step after noise, is no trend."""
    last = recent[-RAMP_WINDOWS:]
    if len(last) < RAMP_WINDOWS:
        return 0.0
    rises = [b[1] - a[1] for a, b in itertools.pairwise(last)]
    if any(x <= GROWTH_SHARE * a[1] for x, a in zip(rises, last, strict=False)):
        return 0.0
    if max(rises) > RAMP_EVENNESS * min(rises):
        return 0.0
    span = (last[-1][0] - last[0][0]).total_seconds()
    return (last[-1][1] - last[0][1]) / span if span > 0 else 0.0


@dataclass(frozen=True)
class Window:
    """One judged window as the law reads it, once per tick: what every later step reads."""

    curve: Curve  # the build's curve refined by the live statistics (empty: none measured yet)
    r: Reading
    # (window end, demand) over the scale-in stabilization window, this one last.
    recent: tuple[tuple[datetime, float], ...]
    # The model's latency for the config in force at the measured demand (NaN without a curve), and the
    # calibration held before this window moved it.
    predicted_ms: float
    calibration_before: float
    bad: bool
    # The demand rose over the last window past noise (a crowd may have entered part way through).
    rising: bool
    seen: str  # what the window showed, the head of every reason


def read_window(
    st: TunerState, in_force: InForce, obs: Observation, policy: Policy, p_ms: float, rate: float
) -> tuple[TunerState, Window]:
    """Read the window (`read`), keep its demand for the stabilization window, calibrate the model on the config
    in force, and count the window bad, good or neither."""
    curve = Curve(merged(policy.build_curve, st.live))
    r = read(obs, p_ms, rate, in_force, policy)
    horizon = obs.window_end - timedelta(seconds=policy.scale_in_window_seconds)
    recent = (*tuple((t, d) for t, d in st.recent_demand if t > horizon), (obs.window_end, r.demand_rps))
    calibration_before = st.calibration
    st = st.model_copy(update={"recent_demand": recent})
    # The model's latency for the config in force at the measured demand: what the calibration corrects, and what
    # tells a foretold bad window from noise.
    predicted = predicted_ms(curve, in_force, r, policy) if curve else math.nan
    if curve and not r.saturated:
        st = st.model_copy(update={"calibration": calibrate(st.calibration, predicted, r)})
    bad = r.over or r.saturated
    good = r.comfortable and not bad
    # A window that overlaps the last one counted bad is the same evidence (a 60 s summary read every 30 s):
    # bad windows are counted once per distinct window.
    distinct = st.last_bad_window_end is None or obs.window_start >= st.last_bad_window_end
    st = st.model_copy(
        update={
            "missing_windows": 0,
            "bad_windows": (st.bad_windows + (1 if distinct else 0)) if bad else 0,
            "last_bad_window_end": (obs.window_end if distinct else st.last_bad_window_end) if bad else None,
            "good_windows": st.good_windows + 1 if good else 0,
            "calm_windows": 0 if bad else min(policy.good_windows, st.calm_windows + 1),
        }
    )
    seen = f"P{policy.percentile:g} {r.p_ms:.1f} ms (aim {policy.aim_ms:.1f}) at {r.demand_rps:.0f} req/s" + (
        ", queue backing up" if r.saturated else ""
    )
    rising = len(recent) >= 2 and recent[-1][1] > (1 + GROWTH_SHARE) * recent[-2][1]
    return st, Window(curve, r, recent, predicted, calibration_before, bad, rising, seen)
