"""The gates: is there a window the law can judge? Each is a pure function that holds (with its own reason code,
naming itself in `Decision.bound_by`) or lets the window through (None). Where a window cannot be judged, the
measured curve alone may still leave a fragile batching (`leave_fragile`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from tailtune.tuner.control.decision import (
    AT_LIMITS,
    CONFIRMING,
    COOLDOWN,
    NO_TRAFFIC,
    REPLICAS_NOT_READY,
    SCALED_OUT,
    SIGNAL_MISSING,
    STALE_WINDOW,
    WINDOW_ALREADY_SEEN,
    WITHIN_BAND,
    batching_for,
    change_code,
    describe,
    hold,
    reset,
)
from tailtune.tuner.control.objective import UNCALIBRATED, best_plan, candidate, is_fragile, rejected_now
from tailtune.tuner.control.reading import Reading
from tailtune.tuner.servicetime import Curve, merged
from tailtune.tuner.types import Decision, InForce, Observation, Policy, TunerState


def cooling(in_force: InForce, policy: Policy, now: datetime) -> bool:
    """Whether the last change is more recent than the cooldown (spec.tuning.cooldownSeconds)."""
    return in_force.changed_at is not None and now - in_force.changed_at < timedelta(seconds=policy.cooldown_seconds)


def window_already_seen(state: TunerState, in_force: InForce, obs: Observation) -> Decision | None:
    """A window no newer than the last one judged is the same evidence twice."""
    if state.last_window_end is not None and obs.window_end <= state.last_window_end:
        why = f"window ending {obs.window_end.isoformat()} already judged"
        return hold(state, in_force, WINDOW_ALREADY_SEEN, why, bound_by="window-already-seen")
    return None


def no_traffic(st: TunerState, in_force: InForce, obs: Observation, policy: Policy, now: datetime) -> Decision | None:
    """No requests: nothing to judge, and the cheapest moment for a reload (a fragile batching is left)."""
    if obs.p_latency_ms is None and obs.request_rate == 0:
        why = "no requests in the window; holding the config"
        return leave_fragile(reset(st), in_force, policy, now, 0.0, NO_TRAFFIC, why, "no-traffic")
    return None


def signal_missing(
    st: TunerState, in_force: InForce, obs: Observation, policy: Policy, now: datetime
) -> Decision | None:
    """Never move blind: without the latency, the request rate or enough samples the config holds."""
    if (
        obs.p_latency_ms is None
        or obs.request_rate is None
        or (obs.sample_count is not None and obs.sample_count < policy.min_samples)
    ):
        missing = "latency" if obs.p_latency_ms is None else "request rate" if obs.request_rate is None else ""
        what = f"{missing} signal missing" if missing else f"only {obs.sample_count} samples"
        st = reset(st).model_copy(update={"missing_windows": st.missing_windows + 1})
        why = f"{what}; holding the config, never moving blind"
        return hold(st, in_force, SIGNAL_MISSING, why, missing=True, bound_by="signal-missing")
    return None


def stale_window(st: TunerState, in_force: InForce, obs: Observation, policy: Policy, now: datetime) -> Decision | None:
    """A window that began before the last change says nothing of the config in force yet; the measured curve
    still does: a fragile config (e.g. Triton's default max batch on a superlinear curve) is left before a burst
    runs it away."""
    if in_force.changed_at is not None and obs.window_start < in_force.changed_at:
        demand = (obs.request_rate or 0.0) + max(0.0, obs.queue_growth_rps or 0.0)
        why = f"window from {obs.window_start.isoformat()} overlaps the change at {in_force.changed_at.isoformat()}"
        return leave_fragile(st, in_force, policy, now, demand, STALE_WINDOW, why, "stale-window")
    return None


def replicas_not_ready(
    st: TunerState, in_force: InForce, obs: Observation, policy: Policy, now: datetime
) -> Decision | None:
    """A window served by fewer ready pods than the config has judges neither the config nor its count."""
    if obs.ready_replicas is not None and obs.ready_replicas < in_force.replicas:
        why = f"{obs.ready_replicas}/{in_force.replicas} replicas ready"
        return hold(st, in_force, REPLICAS_NOT_READY, why, bound_by="replicas-not-ready")
    return None


# The gate that bound a choice made before the first pod serves (`before_serving`).
BEFORE_SERVING = "before-serving"
# In order, after the window already seen and the learning from it (`law.decide`).
BEFORE_READING = (no_traffic, signal_missing, stale_window, replicas_not_ready)


def leave_fragile(
    st: TunerState,
    in_force: InForce,
    policy: Policy,
    now: datetime,
    demand_rps: float,
    code: str,
    why: str,
    gate: str,
) -> Decision:
    """Without a window to judge (no traffic, or one that predates the change): move to the most robust batching
    the measured curve gives when the one in force is fragile (or below the warmup batch), with the replicas
    the demand takes (never fewer); else hold with `code` and `why`. Either way `gate` bound the decision."""
    curve = Curve(merged(policy.build_curve, st.live))
    if not curve or cooling(in_force, policy, now):
        return hold(st, in_force, code, why, bound_by=gate)
    # Without traffic any config a canary rejected lately stays out, whatever load it failed at.
    avoid = rejected_now(st, demand_rps if demand_rps > 0 else None, now)
    plan = best_plan(curve, demand_rps * policy.demand_margin, policy, UNCALIBRATED, backlog=False, avoid=avoid)
    b = in_force.batching
    current = candidate(curve, b.max_batch_size, b.max_queue_delay_microseconds, policy, UNCALIBRATED)
    best = plan.candidate
    if not is_fragile(curve, current, policy) or (best.max_batch, best.delay_us) == (
        b.max_batch_size,
        b.max_queue_delay_microseconds,
    ):
        return hold(st, in_force, code, why, bound_by=gate)
    # No load takes no more replicas (where no config keeps the aim the plan puts every replica on the SLO).
    replicas = in_force.replicas if demand_rps <= 0 else max(in_force.replicas, min(plan.replicas, policy.replicas_max))
    batching = batching_for(best.max_batch, best.delay_us, policy)
    load = f"{demand_rps:.0f} req/s" if demand_rps > 0 else "no traffic"
    reason = (
        f"{load}: max batch {best.max_batch} carries {best.carries():.0f} req/s per replica within the aim "
        f"by the measured curve, {b.max_batch_size} only {current.carries():.0f}; "
        f"{describe(b, in_force.replicas)} -> {describe(batching, replicas)}"
    )
    code = change_code(in_force, batching, replicas)
    new = in_force.model_copy(update={"batching": batching, "replicas": replicas, "changed_at": now, "reason": reason})
    st = st.model_copy(update={"last_reason_code": code})
    return Decision(action="change", in_force=new, reason=reason, reason_code=code, state=st, bound_by=gate)


def before_serving(start: InForce, policy: Policy, now: datetime) -> Decision:
    """The batching the first pods start with: the spec's start, or where the engine build's measured curve shows it
    fragile the one the law leaves it for with no traffic (`leave_fragile`), chosen before any pod serves so that
    no reload lands on the first requests. The same choice the first no-traffic tick would make, a reload earlier."""
    why = "the spec's start batching, before the first pod serves"
    return leave_fragile(TunerState(), start, policy, now, 0.0, NO_TRAFFIC, why, BEFORE_SERVING)


def no_curve(st: TunerState, in_force: InForce, r: Reading, policy: Policy, now: datetime, seen: str) -> Decision:
    """No measured service time yet (no build curve, no live statistics): nothing to plan batching on, so only a
    replica more answers a confirmed overload."""
    if st.bad_windows < policy.bad_windows and not r.overloaded:
        code = CONFIRMING if r.over or r.saturated else WITHIN_BAND
        return hold(st, in_force, code, f"{seen}: no service-time curve yet", bound_by="no-curve")
    if cooling(in_force, policy, now):
        return hold(st, in_force, COOLDOWN, f"{seen}: cooling down", bound_by="no-curve")
    if in_force.replicas >= policy.replicas_max:
        why = f"{seen}: no service-time curve to plan batching; replicas at their maximum"
        return hold(st, in_force, AT_LIMITS, why, infeasible=r.saturated, bound_by="no-curve")
    replicas = in_force.replicas + 1
    reason = f"{seen}: no service-time curve to plan batching: one more replica"
    new = in_force.model_copy(update={"replicas": replicas, "changed_at": now, "reason": reason})
    st = st.model_copy(update={"bad_windows": 0, "good_windows": 0, "calm_windows": 0, "last_reason_code": SCALED_OUT})
    return Decision(
        action="change",
        in_force=new,
        reason=reason,
        reason_code=SCALED_OUT,
        state=st,
        demand_rps=r.demand_rps,
        bound_by="no-curve",
    )
