"""The control law: `decide(state, in_force, observation, policy, now) -> Decision`. Pure: no I/O, no clock.

A pipeline in the style of the Kubernetes HPA (a recommendation, then bounds, rate limits and stabilization that
each name themselves), its parts in `tailtune.tuner.control`:

1. gates (`gates`): is there a window to judge? A window already seen, no traffic, a missing signal, a window that
   overlaps the last change, replicas not ready, no service-time curve yet: each holds with its own reason code
   (where nothing can be judged, the measured curve alone may still leave a fragile batching);
2. reading (`reading`): the demand (completions plus the queue's growth), the backlog and whether requests back
   up, the model's calibration on the config in force, the demand's trend over the stabilization window;
3. plan (`objective`, weighed in `assess`): one objective over the candidate batchings, from the measured
   service-time curve and a queueing model of the batcher: the fewest replicas that carry the load (the demand
   with its margin, a ramp's projection, a backlog's drain) within the aim, then the most robust batching, then
   the smaller batch; short of the aim within the bounds, the SLO on every replica allowed; short of the SLO, the
   most of the demand answered within it. Evidence beats the model: a config that breaks the SLO for distinct
   windows while the model overrates it is left (none better: `SLOInfeasible`);
4. guards (`guards`): pure functions that only hold the config in force or limit the plan, each naming itself in
   `Decision.bound_by`: the hysteresis band and the noise of unconfirmed bad windows, a draining backlog, the
   cooldown, the reload budget, the stabilized batching, no cut under a backlog, no scale-out without pressure,
   the scale-in (only to a count the model holds within the SLO at the demand's upper bound over the lead time a
   replica given back takes to return, `limits.upper_demand_rps`; after calm windows, the batching kept inside the
   band; above counts that broke the aim, never under pressure, at most half at once), the drain floor, the queue
   over the model. The SLO, the aim and the tick's limits are computed once (`limits.Limits`, `Tick.lim`);
5. act (`_act`): hold (`Settled`, `AtLimits`, `SLOInfeasible`) or change, remembering what was left for breaking
   the SLO and the counts scaled out of.

Invariants (each has a unit test, tests/unit/tuner/test_law.py): a change never adopts a config whose modelled
capacity is below the demand times the margin (unless nothing within the bounds reaches it: then the config with
the most capacity, and `SLOInfeasible`); never cuts capacity under a backlog; never takes the batching's capacity
below the highest demand of the stabilization window where the config in force keeps up with it; never sets max
batch below the largest warmup batch; at the limits with a growing queue it says so.
"""

from __future__ import annotations

from datetime import datetime

from tailtune.tuner.control import gates, guards
from tailtune.tuner.control.assess import Tick, assess
from tailtune.tuner.control.decision import (
    AT_LIMITS,
    BACKLOG_DRAINING,
    BATCHING_TIGHTENED,
    BATCHING_WIDENED,
    CONFIRMING,
    COOLDOWN,
    NO_TRAFFIC,
    REPLICAS_NOT_READY,
    SCALED_IN,
    SCALED_OUT,
    SETTLED,
    SIGNAL_MISSING,
    SLO_INFEASIBLE,
    STALE_WINDOW,
    WINDOW_ALREADY_SEEN,
    WITHIN_BAND,
    batching_for,
    change_code,
    describe,
    hold,
)
from tailtune.tuner.control.guards import Proposal
from tailtune.tuner.control.limits import limits, measured_margin
from tailtune.tuner.control.objective import (
    BURST_GAIN,
    CANDIDATE_CALIBRATION,
    CANDIDATES_PER_OCTAVE,
    DRAIN_INTERVALS,
    REJECTED_DEMAND_SHARE,
    SHARE_GAIN,
    SWITCH_GAIN,
    Candidate,
    Plan,
    best_plan,
    candidate,
    candidate_delays,
    candidate_sizes,
    drain_replicas,
    explain,
    is_fragile,
    rejected_now,
    safe_capacity,
    share,
)
from tailtune.tuner.control.objective import _capacity as _capacity
from tailtune.tuner.control.objective import measured_sizes as _measured_sizes
from tailtune.tuner.control.objective import share_gained as _share_gained
from tailtune.tuner.control.reading import GROWTH_SHARE, ramp_rps_per_s, read_window, readiness
from tailtune.tuner.control.reading import Reading as _Reading
from tailtune.tuner.servicetime import learn
from tailtune.tuner.types import Decision, InForce, Observation, Policy, RejectedConfig, TooFewReplicas, TunerState

# What other modules, tests and benchmarks read of the law (its parts live in `tailtune.tuner.control`).
__all__ = [
    "AT_LIMITS", "BACKLOG_DRAINING", "BATCHING_TIGHTENED", "BATCHING_WIDENED", "BURST_GAIN", "CANDIDATES_PER_OCTAVE",
    "CANDIDATE_CALIBRATION", "CONFIRMING", "COOLDOWN", "DRAIN_INTERVALS", "GROWTH_SHARE", "MAX_REJECTED",
    "NO_TRAFFIC", "REJECTED_DEMAND_SHARE", "REPLICAS_NOT_READY", "SCALED_IN", "SCALED_OUT", "SETTLED", "SHARE_GAIN",
    "SIGNAL_MISSING", "SLO_INFEASIBLE", "STALE_WINDOW", "SWITCH_GAIN", "WINDOW_ALREADY_SEEN", "WITHIN_BAND",
    "Candidate", "Plan", "_Reading", "_capacity", "_measured_sizes", "_share_gained", "best_plan",
    "candidate", "candidate_delays", "candidate_sizes", "decide", "demand_margin", "drain_replicas", "hold",
    "is_fragile", "ramp_rps_per_s", "rejected_now", "safe_capacity", "share",
]  # fmt: skip

# Rejections and too-few counts remembered, each (oldest dropped first): a bound on the annotation that keeps the
# state.
MAX_REJECTED = 10


def demand_margin(state: TunerState, policy: Policy) -> float:
    """The margin on the demand the law plans with after the window `state` last kept (`limits.measured_margin`:
    the demand's own variability over its memory, else the utilisation target's fixed margin)."""
    recent = state.recent_demand
    measured = measured_margin(recent, limits(policy, state), policy) if recent else None
    return measured if measured is not None else policy.fixed_margin


def decide(state: TunerState, in_force: InForce, observation: Observation, policy: Policy, now: datetime) -> Decision:
    """Decide the config to have in force after one window: gates, reading, plan, guards, act (module docstring)."""
    obs = observation
    if (already := gates.window_already_seen(state, in_force, obs)) is not None:
        return already
    # Per-size execution times do not depend on the batching in force: learn from every window.
    st = state.model_copy(
        update={
            "last_window_end": obs.window_end,
            "live": learn(state.live, obs.batch_stats),
            **readiness(state, in_force, obs),
        }
    )
    for gate in gates.BEFORE_READING:
        if (held := gate(st, in_force, obs, policy, now)) is not None:
            return held
    p_ms, rate = obs.p_latency_ms, obs.request_rate
    assert p_ms is not None and rate is not None  # else `gates.signal_missing` held

    st, w = read_window(st, in_force, obs, policy, p_ms, rate)
    if not w.curve:
        return gates.no_curve(st, in_force, w.r, policy, now, w.seen)

    t = assess(st, in_force, obs, policy, now, w)
    for guard in guards.HOLDS:
        if (held := guard(t)) is not None:
            return held
    p, _ = guards.choose(t.plan, t.current, in_force, t.r, t.relieve, t.policy, t.avoid, t.in_share, t.peak_need_rps)
    p = guards.band_keeps_batching(p, t)
    for limit in (*guards.SCALE_IN, guards.drain_floor, guards.queue_over_model):
        p = limit(p, t)
    return _act(t, p)


def _act(t: Tick, p: Proposal) -> Decision:
    """Hold where the guards left the config in force (saying why), else change to the proposal; remember a
    batching left for breaking the SLO and a count scaled out of."""
    st, in_force, r, policy, plan = t.st, t.in_force, t.r, t.policy, t.plan
    # Said only on evidence: the aim broken, a queue growing at the limits, or a demand beyond what the bounds can
    # drain at all. A plan short of its margin while the SLO holds is no alarm, just no room to grow.
    at_limits = r.saturated and in_force.replicas >= policy.replicas_max
    infeasible = t.stuck or (
        not plan.feasible and (r.over or at_limits or r.demand_rps > policy.replicas_max * plan.candidate.capacity_rps)
    )
    why = explain(plan, t.load_rps, t.curve, policy, alarm=infeasible) + "".join(p.notes)
    if t.stuck:
        why = (
            f"the SLO breaks at {r.demand_rps:.0f} req/s and no config within the bounds holds it with the model "
            f"erring as it does on the config in force (x{st.calibration:.2f}); {why}"
        )
    old = in_force.batching
    target, replicas = p.target, p.replicas
    if (target.max_batch, target.delay_us, replicas) == (
        old.max_batch_size,
        old.max_queue_delay_microseconds,
        in_force.replicas,
    ):
        code = SLO_INFEASIBLE if infeasible else AT_LIMITS if t.relieve else SETTLED
        return hold(
            st,
            in_force,
            code,
            f"{t.w.seen}: {why}",
            infeasible=infeasible,
            demand_rps=r.demand_rps,
            capacity_rps=t.capacity_rps,
            bound_by=p.bound_by,
        )
    batching = batching_for(target.max_batch, target.delay_us, policy)
    code = change_code(in_force, batching, replicas)
    reason = f"{t.w.seen}: {why}; {describe(old, in_force.replicas)} -> {describe(batching, replicas)}" + (
        f" (bound by {p.bound_by})" if p.bound_by else ""
    )
    new = InForce(batching=batching, replicas=replicas, changed_at=t.now, reason=reason, rolled=in_force.rolled)
    st = st.model_copy(update={"bad_windows": 0, "good_windows": 0, "calm_windows": 0, "last_reason_code": code})
    moved = (target.max_batch, target.delay_us) != (old.max_batch_size, old.max_queue_delay_microseconds)
    if t.relieve and r.p_ms > policy.slo_ms and moved:
        # Left for confirmed bad windows past the SLO: not planned again at this demand (or more) for a while. So
        # too where nothing holds the SLO (a share plan): every config breaks it there, and the model's ranking of
        # two alike configs flips with the calibration the one in force gives, so a move back is churn.
        gone = RejectedConfig(batching=old, demand_rps=r.demand_rps, at=t.now, reason=f"{t.w.seen}: {why}")
        st = st.model_copy(update={"rejected": (*st.rejected, gone)[-MAX_REJECTED:]})
    if replicas > in_force.replicas:
        few = TooFewReplicas(replicas=in_force.replicas, demand_rps=r.demand_rps, at=t.now)
        st = st.model_copy(update={"too_few": (*st.too_few, few)[-MAX_REJECTED:], "scaled_out_at": t.now})
    return Decision(
        action="change",
        in_force=new,
        reason=reason,
        reason_code=code,
        state=st,
        infeasible=infeasible,
        demand_rps=r.demand_rps,
        capacity_rps=t.capacity_rps,
        bound_by=p.bound_by,
    )
