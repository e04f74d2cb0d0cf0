"""The control law: `decide(state, observation, policy, now) -> Decision`. Pure: no I/O, no clock.

Queueing view of one replica (its instances share one device, so executions serialize): a batch of b
takes t(b); a greedy batcher (delay 0) grows its batches with the load, so a request waits about one batch
in flight plus its own, 2 t(b), until the batches hit max_batch and a queue builds. So:

- the latency cap is the largest b with 2 t(b) + delay <= headroom * SLO;
- the capacity of a replica is b / t(b) at b = max_batch; on a superlinear curve t(b)/b has a minimum b*
  and batches past it are slower *and* serve less, so max_batch stays at b* once exact data show it;
- max_batch grows only when throughput is short (a backlog, or full batches on a busy device), up to the
  latency cap, or in one step to where the measured slope carried on keeps the aim (at most double), or to
  double when backlogged at full batches; it is cut only on evidence (data show it too slow or clearly
  less efficient) or when far past anything measured;
- when the best batch still leaves a backlog, batching cannot help: replicas, sized from the demand
  (completions plus the queue's growth) plus draining the backlog; back in, one at a time, when
  comfortably under;
- the queue delay helps only when several instances would grab half-empty batches and load is high enough
  to fill them; with one instance a free instance takes what is queued, so the delay stays at its minimum.

t(b) is learned from the windows themselves (`tailtune.tuner.curve`), pessimistic past the data. Missing
data, repeated and stale windows, noise (K bad windows; one is enough when it shows overload: over the SLO,
the device full and requests queued past the batch in flight), hysteresis (a band between the aim and the
comfort line), a draining backlog (waited for) and reload cost (cooldown, step limits) are the gates in
`decide`, in that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.curve import add_point, largest_exact_batch, predict_ms, predict_trend_ms
from tailtune.tuner.types import CurvePoint, Decision, Observation, Policy, TunerState

# Reason codes (CamelCase, for Events and conditions).
WINDOW_ALREADY_SEEN = "WindowAlreadySeen"
SIGNAL_MISSING = "SignalMissing"
NO_TRAFFIC = "NoTraffic"
STALE_WINDOW = "StaleWindow"
REPLICAS_NOT_READY = "ReplicasNotReady"
CONFIRMING = "ConfirmingBadWindows"
WITHIN_BAND = "WithinBand"
COOLDOWN = "Cooldown"
SETTLED = "Settled"
AT_LIMITS = "AtLimits"
BATCHING_TIGHTENED = "BatchingTightened"
BATCHING_WIDENED = "BatchingWidened"
SCALED_OUT = "ScaledOut"
SCALED_IN = "ScaledIn"
BACKLOG_DRAINING = "BacklogDraining"

# Completed requests understate demand while the queue grows: without a measured growth, assume this much.
SATURATED_DEMAND_FACTOR = 1.25
# A pending count growing faster than this share of the completion rate is a backlog.
GROWTH_SHARE = 0.05
# A queue time above this share of the SLO, or above this many batch times, means a backlog.
BACKLOG_SHARE_OF_SLO = 0.5
BACKLOG_BATCHES = 3.0
# A backlog is sized to drain within this many intervals.
DRAIN_INTERVALS = 2
# Batches this full of max_batch mean the cap binds.
FULL_BATCH_SHARE = 0.85
# Windows teach the curve at a load steady within this share; their point is exact with a mean batch at
# most SINGLE_BATCH or at least this share of max_batch.
STEADY_RATE_SHARE = 0.2
SINGLE_BATCH = 1.2
FULL_BATCH_LEARN_SHARE = 0.9
# A cut for efficiency alone must take max_batch below this share of its value (else not worth a reload).
CUT_SHARE = 0.85
# The pessimistic model assumes no batching gain past the data; max_batch may go this many times past its
# latency cap before the law cuts without evidence.
UNMEASURED_SLACK = 2
# Under pressure max_batch may grow to this many times its value on the curve's trend alone.
TREND_REACH = 2
# Per-request cost within this share of the best counts as the best (prefer the smaller batch).
EFFICIENCY_TOLERANCE = 1.02


@dataclass(frozen=True)
class Target:
    """What the curve model says for a load.

    `latency_cap` is the largest batch that keeps the aim by the pessimistic model (the bound for trying
    larger batches); `trend_cap` the same with the last measured slope carried past the data; `seen_cap`
    the largest that data within their range allow (batch_max when no data speak against any size: only
    evidence cuts); `efficient` the cheapest batch per request where exact
    data show the cost rising past it, else None. `max_batch` is the recommendation: `efficient`, or
    the latency cap.
    """

    max_batch: int
    delay_us: int
    replicas: int
    latency_cap: int
    seen_cap: int
    trend_cap: int
    efficient: int | None
    capacity_rps: float
    exec_ms: float


@dataclass(frozen=True)
class _Reading:
    """What one window says, in the law's terms."""

    p_ms: float
    demand_rps: float
    per_replica_rps: float
    util: float | None
    saturated: bool
    over: bool
    comfortable: bool
    batches_full: bool
    # Over the SLO with the device the bottleneck: one window is enough to act.
    overloaded: bool
    # The pending count shrinks: the latency still shows a past backlog, not the config.
    draining: bool
    # Requests pending (estimated), to be drained on top of the demand.
    backlog: float


def compute_target(points: tuple[CurvePoint, ...], demand_rps: float, policy: Policy) -> Target | None:
    """The batching and replicas the curve model recommends for a total load; None without a curve."""
    if not points:
        return None
    sizes = range(policy.batch_min, policy.batch_max + 1)
    exec_ms = {b: predict_ms(points, b) or 0.0 for b in sizes}
    seen = max(p.batch for p in points)

    def keeps_aim(b: int) -> bool:
        # With the delay the law would add at this load on one replica (more replicas only shrink it).
        return 2 * exec_ms[b] + _delay_us(b, exec_ms[b], demand_rps, policy) / 1000 <= policy.aim_ms

    latency_cap = max((b for b in sizes if keeps_aim(b)), default=policy.batch_min)
    # With the measured slope carried on (a bet, bounded by the caller).
    trend_cap = max(
        (b for b in sizes if 2 * (predict_trend_ms(points, b) or math.inf) <= policy.aim_ms),
        default=policy.batch_min,
    )
    too_slow = [b for b in sizes if b <= seen and not keeps_aim(b)]
    seen_cap = max(policy.batch_min, min(too_slow) - 1) if too_slow else policy.batch_max
    per_request = {b: exec_ms[b] / b for b in sizes if b <= latency_cap}
    best = min(per_request.values())
    cheapest = min(b for b, c in per_request.items() if c <= best * EFFICIENCY_TOLERANCE)
    # Past the data the model is flat by construction: only exact data can show the cost rising.
    efficient = cheapest if cheapest < 0.9 * largest_exact_batch(points) else None
    max_batch = efficient if efficient is not None else latency_cap
    capacity = 1000.0 * max_batch / exec_ms[max_batch]
    needed = math.ceil(demand_rps / (policy.util_target * capacity)) if demand_rps > 0 else 1
    replicas = min(policy.replicas_max, max(policy.replicas_min, needed))
    return Target(
        max_batch=max_batch,
        delay_us=_delay_us(max_batch, exec_ms[max_batch], demand_rps / replicas, policy),
        replicas=replicas,
        latency_cap=latency_cap,
        seen_cap=seen_cap,
        trend_cap=max(latency_cap, trend_cap),
        efficient=efficient,
        capacity_rps=capacity,
        exec_ms=exec_ms[max_batch],
    )


def _delay_us(batch: int, exec_ms: float, per_replica_rps: float, policy: Policy) -> int:
    """Queue delay: only with several instances and enough load to fill the batch while waiting."""
    if policy.instances <= 1 or per_replica_rps <= 0 or batch <= 1:
        return policy.delay_min_us
    if per_replica_rps * exec_ms / batch / 1000 < 0.5:
        return policy.delay_min_us
    fill_us = (batch - 1) / per_replica_rps * 1e6
    slack_us = max(0.0, (policy.aim_ms - 2 * exec_ms) * 1000 / 2)
    return int(min(policy.delay_max_us, max(policy.delay_min_us, min(fill_us, slack_us))))


def decide(state: TunerState, observation: Observation, policy: Policy, now: datetime) -> Decision:
    """Decide the next config from one window of observation. See the module docstring."""
    obs = observation
    if state.last_window_end is not None and obs.window_end <= state.last_window_end:
        return _hold(state, WINDOW_ALREADY_SEEN, f"window ending {obs.window_end.isoformat()} already judged")
    st = _learn(state, obs, policy).model_copy(
        update={
            "last_window_end": obs.window_end,
            "last_rate": _demand(obs) if obs.request_rate is not None else None,
        }
    )

    pname = f"P{policy.percentile:g}"
    if obs.p_latency_ms is None and obs.request_rate == 0:
        return _hold(_reset(st), NO_TRAFFIC, "no requests in the window; holding the config")
    if (
        obs.p_latency_ms is None
        or obs.request_rate is None
        or (obs.sample_count is not None and obs.sample_count < policy.min_samples)
    ):
        missing = (
            "latency" if obs.p_latency_ms is None else "request rate" if obs.request_rate is None else ""
        )
        what = f"{missing} signal missing" if missing else f"only {obs.sample_count} samples"
        st = _reset(st).model_copy(update={"missing_windows": st.missing_windows + 1})
        return _hold(st, SIGNAL_MISSING, f"{what}; holding the config, never moving blind", missing=True)

    slo_met = obs.p_latency_ms <= policy.slo_ms
    if st.last_change is not None and obs.window_start < st.last_change:
        return _hold(
            st,
            STALE_WINDOW,
            f"window from {obs.window_start.isoformat()} overlaps the change at {st.last_change.isoformat()}",
            slo_met=slo_met,
        )
    if obs.ready_replicas is not None and obs.ready_replicas < st.replicas:
        return _hold(
            st, REPLICAS_NOT_READY, f"{obs.ready_replicas}/{st.replicas} replicas ready", slo_met=slo_met
        )

    r = _read(obs, obs.p_latency_ms, obs.request_rate, st, policy)
    # Batches hitting max_batch on a busy device are pressure even while the latency holds: a burst
    # away from a backlog.
    pressure = r.batches_full and (r.util or 0.0) >= policy.util_target
    bad = r.over or r.saturated or pressure
    good = r.comfortable and not bad
    st = st.model_copy(
        update={
            "missing_windows": 0,
            "bad_windows": st.bad_windows + 1 if bad else 0,
            "good_windows": st.good_windows + 1 if good else 0,
            # Evidence for scaling in: a replica was seen to serve this much within the aim.
            "served_per_replica": max(st.served_per_replica, r.per_replica_rps)
            if not bad
            else st.served_per_replica,
        }
    )
    seen = f"{pname} {r.p_ms:.1f} ms (aim {policy.aim_ms:.1f}) at {r.demand_rps:.0f} req/s" + (
        ", queue backing up" if r.saturated else ""
    )
    mode: Literal["relieve", "relax"]
    if st.bad_windows >= policy.bad_windows or r.overloaded:
        # Overload is no noise: each window waited makes the backlog to drain larger.
        mode = "relieve"
    elif st.good_windows >= policy.good_windows:
        mode = "relax"
    elif bad:
        return _hold(
            st, CONFIRMING, f"{seen}: bad window {st.bad_windows}/{policy.bad_windows}", slo_met=slo_met
        )
    else:
        return _hold(st, WITHIN_BAND, f"{seen}: within the band", slo_met=slo_met)

    if mode == "relieve" and r.draining:
        # Capacity already exceeds the demand: a change now would chase the past backlog.
        return _hold(st, BACKLOG_DRAINING, f"{seen}: the backlog drains; waiting for it", slo_met=slo_met)
    if st.last_change is not None and now - st.last_change < timedelta(seconds=policy.cooldown_seconds):
        left = policy.cooldown_seconds - (now - st.last_change).total_seconds()
        return _hold(st, COOLDOWN, f"{seen}: cooling down, {left:.0f} s left", slo_met=slo_met)

    target = compute_target(st.curve, r.demand_rps, policy)
    batching, replicas, why = (
        _relieve(st, r, target, policy) if mode == "relieve" else _relax(st, r, target, policy)
    )
    if batching == st.batching and replicas == st.replicas:
        code = AT_LIMITS if mode == "relieve" else SETTLED
        return _hold(st, code, f"{seen}: {why}", slo_met=slo_met)
    code = _change_code(st, batching, replicas)
    st = st.model_copy(
        update={
            "batching": batching,
            "replicas": replicas,
            "last_change": now,
            "bad_windows": 0,
            "good_windows": 0,
            "last_reason_code": code,
        }
    )
    reason = f"{seen}: {why}; {_describe(state.batching, state.replicas)} -> {_describe(batching, replicas)}"
    return Decision(
        action="change",
        batching=batching,
        replicas=replicas,
        reason=reason,
        reason_code=code,
        state=st,
        slo_met=slo_met,
    )


def _learn(st: TunerState, obs: Observation, policy: Policy) -> TunerState:
    """Add the window's (mean batch, compute time) to the curve, when one config served a steady load.

    Triton's compute time is per request, so a window's mean weights large batches more than its mean
    batch does: mixed batch sizes read slow. The point is exact only when the batches were nearly all
    full or nearly all single requests.
    """
    b, ms, rate = obs.avg_batch, obs.compute_ms, obs.request_rate
    if b is None or ms is None or rate is None:
        return st
    if st.last_change is not None and obs.window_start < st.last_change:
        return st
    full = b >= FULL_BATCH_LEARN_SHARE * st.batching.max_batch_size
    demand = _demand(obs)
    # Full batches are one size whatever the load did; only partial ones mix sizes when the load moves.
    if (
        not full
        and st.last_rate is not None
        and abs(demand - st.last_rate) > STEADY_RATE_SHARE * max(demand, st.last_rate)
    ):
        return st
    if not full and _backlogged(obs, st, policy):
        # A queue building up behind half-full batches is a regime change inside the window.
        return st
    exact = full or b <= SINGLE_BATCH
    return st.model_copy(update={"curve": add_point(st.curve, b, ms, exact)})


def _demand(obs: Observation) -> float:
    """Offered load: completions plus the growth of the queue, when measured."""
    rate = obs.request_rate or 0.0
    return rate + max(0.0, obs.queue_growth_rps or 0.0)


def _backlogged(obs: Observation, st: TunerState, policy: Policy) -> bool:
    """Whether requests pile up: queued for several batch times or a large share of the SLO, or growing.

    A greedy batcher keeps the device busy at any load by shrinking batches, so utilisation says little.
    """
    delay_ms = st.batching.max_queue_delay_microseconds / 1000
    backlog_ms = min(
        BACKLOG_SHARE_OF_SLO * policy.slo_ms,
        BACKLOG_BATCHES * (obs.compute_ms if obs.compute_ms is not None else math.inf),
    )
    growth = obs.queue_growth_rps
    return (obs.queue_ms is not None and obs.queue_ms - delay_ms >= backlog_ms) or (
        growth is not None and obs.request_rate is not None and growth > GROWTH_SHARE * obs.request_rate
    )


def _read(obs: Observation, p_ms: float, rate: float, st: TunerState, policy: Policy) -> _Reading:
    replicas = max(1, obs.ready_replicas if obs.ready_replicas is not None else st.replicas)
    util = None
    if obs.compute_ms is not None and obs.avg_batch is not None and obs.avg_batch > 0:
        # Request-weighted compute over-weights big batches, so this reads high: only a hint of a busy
        # device, acted on together with full batches or a latency over the aim.
        util = rate / replicas * obs.compute_ms / obs.avg_batch / 1000
    saturated = _backlogged(obs, st, policy)
    growth = obs.queue_growth_rps
    fallback = rate * SATURATED_DEMAND_FACTOR if saturated else rate
    demand = rate + max(0.0, growth) if growth is not None else fallback
    batches_full = (
        obs.avg_batch is not None and obs.avg_batch >= FULL_BATCH_SHARE * st.batching.max_batch_size
    )
    growing = growth is not None and growth > GROWTH_SHARE * rate
    waiting_ms = (obs.queue_ms or 0.0) - st.batching.max_queue_delay_microseconds / 1000
    # Requests wait past the batch in flight, or pile up, while batches fill or the device is near full.
    device_full = batches_full or (util or 0.0) >= policy.util_high
    queued = growing or (obs.compute_ms is not None and waiting_ms >= obs.compute_ms)
    # Pending now: what the window added, or what Little's law says waits on average.
    backlog = max(max(0.0, growth or 0.0) * obs.span_seconds, rate * max(0.0, waiting_ms) / 1000)
    # The queue shrinks fast enough to be gone within a few intervals.
    drain_s = 2 * DRAIN_INTERVALS * policy.interval_seconds
    draining = growth is not None and growth < -GROWTH_SHARE * rate and backlog <= -growth * drain_s
    return _Reading(
        p_ms=p_ms,
        demand_rps=demand,
        per_replica_rps=demand / replicas,
        util=util,
        saturated=saturated,
        over=p_ms > policy.aim_ms,
        comfortable=p_ms < policy.comfort_ms and not saturated,
        batches_full=batches_full,
        overloaded=p_ms > policy.slo_ms and device_full and queued and not draining,
        draining=draining,
        backlog=backlog if saturated else 0.0,
    )


def _relieve(st: TunerState, r: _Reading, target: Target | None, policy: Policy) -> tuple[Batching, int, str]:
    """Bad for K windows: bring the latency back under the aim."""
    cur = st.batching
    replicas = st.replicas
    if target is None:
        if replicas < policy.replicas_max:
            return cur, replicas + 1, "no compute/batch data to tune batching: one more replica"
        return cur, replicas, "no compute/batch data to tune batching and replicas at their maximum"
    max_batch = cur.max_batch_size
    why = f"batches up to {target.latency_cap} keep the aim"
    cut = _cut_to(max_batch, target)
    grow = _grow_to(max_batch, target, r, policy)
    if cut is not None:
        max_batch = _step(max_batch, cut, policy.max_batch_step)
        why += f"; above {cut} batches are seen to break the aim or cost more per request"
    elif grow is not None:
        max_batch = _step(max_batch, grow, policy.max_batch_step)
        why += "; batches are full and the queue backs up: larger ones"
    delay = _step(cur.max_queue_delay_microseconds, target.delay_us, policy.max_delay_step_us)
    capacity = _capacity(st.curve, max_batch)
    # The backlog must drain within a couple of intervals, on top of the demand.
    drain_rps = r.backlog / (DRAIN_INTERVALS * policy.interval_seconds)
    load = r.demand_rps + drain_rps
    needed = math.ceil(load / (policy.util_target * capacity)) if capacity > 0 else replicas
    if replicas < policy.replicas_max:
        if r.saturated or needed > replicas:
            # Larger batches are a bet past the data: the model only credits capacity it has seen.
            replicas = min(policy.replicas_max, max(replicas + 1, needed))
            why += f"; {capacity:.0f} req/s per replica at batch {max_batch}"
            why += f" for {load:.0f} req/s with the backlog" if drain_rps else ""
            why += f": {replicas} replicas"
        elif max_batch == cur.max_batch_size and delay == cur.max_queue_delay_microseconds:
            replicas += 1
            why += "; latency unexplained by batching: one more replica"
    if (max_batch, delay, replicas) == (cur.max_batch_size, cur.max_queue_delay_microseconds, st.replicas):
        if delay > policy.delay_min_us:
            delay = _step(delay, policy.delay_min_us, policy.max_delay_step_us)
            why += "; less delay"
        else:
            why += "; nothing left to move within the bounds"
    return _batching(max_batch, delay, policy), replicas, why


def _relax(st: TunerState, r: _Reading, target: Target | None, policy: Policy) -> tuple[Batching, int, str]:
    """Comfortable for K windows: give back replicas and unsafe batching, never reach for more."""
    cur = st.batching
    if target is None:
        return cur, st.replicas, "comfortable; no curve to plan with"
    max_batch = cur.max_batch_size
    cut = _cut_to(max_batch, target)
    if cut is not None:
        max_batch = _step(max_batch, cut, policy.max_batch_step)
    delay = _step(cur.max_queue_delay_microseconds, target.delay_us, policy.max_delay_step_us)
    replicas = st.replicas
    why = "comfortable"
    if replicas > policy.replicas_min:
        after = r.demand_rps / (replicas - 1)
        util_after = after / _capacity(st.curve, max_batch)
        if util_after <= policy.util_scale_in or after <= st.served_per_replica:
            replicas -= 1
            why += f"; one replica fewer would serve {after:.0f} req/s each"
            why += (
                f", {util_after:.0%} of its modelled capacity"
                if util_after <= policy.util_scale_in
                else f", as one served within the aim before ({st.served_per_replica:.0f} req/s)"
            )
    if max_batch < cur.max_batch_size:
        why += f"; batches above {cut} are seen to break the aim or cost more per request"
    return _batching(max_batch, delay, policy), replicas, why


def _cut_to(max_batch: int, target: Target) -> int | None:
    """Where to cut max_batch: data show it too slow or clearly less efficient, or it is far past the data."""
    if max_batch > target.seen_cap:
        return min(target.seen_cap, target.efficient or target.seen_cap)
    if target.efficient is not None and target.efficient < CUT_SHARE * max_batch:
        return target.efficient
    if max_batch > UNMEASURED_SLACK * target.latency_cap:
        # Far past anything measured, where a superlinear curve would collapse under a load step.
        return UNMEASURED_SLACK * target.latency_cap
    return None


def _grow_to(max_batch: int, target: Target, r: _Reading, policy: Policy) -> int | None:
    """Where to widen max_batch when throughput is short; None when data say larger is no better."""
    busy = (r.util or 0.0) >= policy.util_target
    if not (r.saturated or r.overloaded or (busy and (r.batches_full or r.over))):
        return None
    if target.efficient is not None and target.efficient <= max_batch:
        return None
    # Where time still grows slower than the batch, go straight to where the trend keeps the aim, at most
    # double: one reload instead of several small steps while the SLO is missed.
    goal = target.latency_cap
    trend = min(target.trend_cap, TREND_REACH * max_batch)
    if CUT_SHARE * trend > max_batch:
        # A bet is worth a reload only when it moves max_batch by a good share.
        goal = max(goal, trend)
    if r.saturated and (r.batches_full or r.overloaded):
        # Backlogged at full batches: the pessimistic model is already wrong about latency; try double.
        goal = max(goal, TREND_REACH * max_batch)
    goal = min(goal, target.seen_cap, policy.batch_max)
    return goal if goal > max_batch else None


def _capacity(points: tuple[CurvePoint, ...], max_batch: int) -> float:
    """Requests/s one replica serves in batches of max_batch, by the (pessimistic) model."""
    ms = predict_ms(points, max_batch)
    return 1000.0 * max_batch / ms if ms else 0.0


def _step(current: int, target: int, step: int) -> int:
    return current + max(-step, min(step, target - current))


def _batching(max_batch: int, delay_us: int, policy: Policy) -> Batching:
    preferred = [c for c in policy.preferred_candidates if c <= max_batch]
    return Batching(
        max_batch_size=max_batch, preferred_batch_sizes=preferred, max_queue_delay_microseconds=delay_us
    )


def _change_code(st: TunerState, batching: Batching, replicas: int) -> str:
    if replicas > st.replicas:
        return SCALED_OUT
    if replicas < st.replicas:
        return SCALED_IN
    if batching.max_batch_size > st.batching.max_batch_size:
        return BATCHING_WIDENED
    if batching.max_batch_size < st.batching.max_batch_size:
        return BATCHING_TIGHTENED
    if batching.max_queue_delay_microseconds > st.batching.max_queue_delay_microseconds:
        return BATCHING_WIDENED
    return BATCHING_TIGHTENED


def _describe(b: Batching, replicas: int) -> str:
    return f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us, {replicas} replica(s)"


def _reset(st: TunerState) -> TunerState:
    return st.model_copy(update={"bad_windows": 0, "good_windows": 0})


def _hold(
    st: TunerState, code: str, reason: str, *, missing: bool = False, slo_met: bool | None = None
) -> Decision:
    st = st.model_copy(update={"last_reason_code": code})
    return Decision(
        action="hold",
        batching=st.batching,
        replicas=st.replicas,
        reason=reason,
        reason_code=code,
        state=st,
        signal_missing=missing,
        slo_met=slo_met,
    )
