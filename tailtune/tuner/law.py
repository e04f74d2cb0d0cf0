"""The control law: `decide(state, in_force, observation, policy, now) -> Decision`. Pure: no I/O, no clock.

It plans from a model, not from steps:

1. the measured service-time curve t(b) (`servicetime`: the build's ladder, refined by Triton's live
   per-batch-size statistics);
2. the measured demand (completions plus the growth of the queue), with a margin (on a sustained ramp, where
   the demand will be by the time a change is confirmed), plus what it takes to drain a backlog within a
   couple of intervals; a pod's queue is its own (new replicas take none of it), so under a backlog the count is
   at least the one at which the fullest pod (Triton's pending-request count) drains within that time while the
   new arrivals are spread over every replica;
3. a queueing model of the batcher (`model`): for each candidate (max batch, queue delay) the largest
   rate one replica serves with the predicted latency within the aim, corrected by the observed/predicted
   ratio of the config in force (calibration);
4. the cheapest config: the fewest replicas that carry the load, then the most robust batching (the most load
   within the aim), then the smaller batch, among batchings that are not fragile (the count is theirs). It goes
   there in one change. Short of the aim within the bounds: the SLO on every replica allowed. Short of the SLO
   within the bounds: the most load within the SLO among configs that keep up; where nothing holds the SLO even
   at the demand itself, the most goodput (the largest share of the demand the model answers within the SLO: a
   config whose batches at this load take longer than the SLO answers none in time, however much it drains);
5. evidence over the model: a config that breaks the SLO for distinct windows at a steady queue while the
   model overrates it is left for one that holds the SLO with the model erring as much on it (none: said
   `SLOInfeasible`); what was left for breaking the SLO, or a canary rejected, is not planned again at that
   demand or more for a while, nor is a replica count scaled out of for bad windows scaled in to again.

Invariants (each has a unit test): a change never adopts a config whose modelled capacity is below the
demand times the margin (unless nothing within the bounds reaches it: then the config with the most
capacity, and `SLOInfeasible`); never cuts capacity while a backlog exists; never takes the batching's capacity
below the highest demand of the stabilization window where the config in force keeps up with it; never sets max
batch below the largest warmup batch; at the limits with a growing queue it says so (`infeasible`, with demand, capacity
and the replicas it would take).

The gates stay: missing data, windows already judged, windows overlapping the last change, replicas not
ready, noise (K bad windows; one when it shows overload, or a latency past the SLO that the model foretold for
the config in force at the measured demand where another config holds the SLO with the margin, or holds it at
the demand itself, or answers a good deal more of the demand within it; the last two not where a crowd entered
the window part way through, its tail, `Observation.tail_demand_rps`, showing more than the whole, nor on a rise
like one that came and went within the stabilization window), hysteresis (a band between the aim and the
comfort line; no reload for a few percent while the config in force holds, nor, where nothing keeps the aim,
while it holds the SLO with room; a scale-in only to a count the model puts below the comfort line, never while
the demand rises, at most half the replicas at once; the batching judged at the replicas kept, not a plan's
fewer, while bad windows are relieved), a draining backlog (waited for; under one, a reload only for more capacity) and
the cooldown between reloads. A stale window still lets the measured curve replace a fragile config.

Under a backlog the config in force is judged by what it delivers (its completions per replica), except in a
window whose demand rose (a crowd may have entered part way through) or that started before the replicas of a
scale-out (or a pod that came back) were all ready: fewer pods served part of it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from tailtune.api.v1alpha1 import Batching
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
    is_fragile,
    rejected_now,
    safe_capacity,
    share,
)
from tailtune.tuner.control.objective import _capacity as _capacity
from tailtune.tuner.control.objective import applies as _applies
from tailtune.tuner.control.objective import avoided as _avoided
from tailtune.tuner.control.objective import measured_sizes as _measured_sizes
from tailtune.tuner.control.objective import outrun as _outrun
from tailtune.tuner.control.objective import share_gained as _share_gained
from tailtune.tuner.control.reading import (
    GROWTH_SHARE,
    RAMP_HORIZON_INTERVALS,
    ramp_rps_per_s,
)
from tailtune.tuner.control.reading import Reading as _Reading
from tailtune.tuner.control.reading import as_delivered as _as_delivered
from tailtune.tuner.control.reading import calibrate as _calibrate
from tailtune.tuner.control.reading import partial as _partial
from tailtune.tuner.control.reading import predicted_ms as _predicted_ms
from tailtune.tuner.control.reading import read as _read
from tailtune.tuner.control.reading import readiness as _readiness
from tailtune.tuner.control.reading import recurs as _recurs
from tailtune.tuner.servicetime import Curve, learn, merged
from tailtune.tuner.types import Decision, InForce, Observation, Policy, RejectedConfig, TooFewReplicas, TunerState

# What other modules, tests and benchmarks read of the law (its parts live in `tailtune.tuner.control`).
__all__ = [
    "AT_LIMITS", "BACKLOG_DRAINING", "BATCHING_TIGHTENED", "BATCHING_WIDENED", "BURST_GAIN", "CANDIDATES_PER_OCTAVE",
    "CANDIDATE_CALIBRATION", "CONFIRMING", "COOLDOWN", "DRAIN_INTERVALS", "GROWTH_SHARE", "MAX_REJECTED",
    "NO_TRAFFIC", "REJECTED_DEMAND_SHARE", "REPLICAS_NOT_READY", "SCALED_IN", "SCALED_OUT", "SETTLED", "SHARE_GAIN",
    "SIGNAL_MISSING", "SLO_INFEASIBLE", "STALE_WINDOW", "SWITCH_GAIN", "WINDOW_ALREADY_SEEN", "WITHIN_BAND",
    "Candidate", "Plan", "_Reading", "_capacity", "_choose", "_measured_sizes", "_share_gained", "best_plan",
    "candidate", "candidate_delays", "candidate_sizes", "decide", "drain_replicas", "hold", "is_fragile",
    "ramp_rps_per_s", "rejected_now", "safe_capacity", "share",
]  # fmt: skip

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
SLO_INFEASIBLE = "SLOInfeasible"
BATCHING_TIGHTENED = "BatchingTightened"
BATCHING_WIDENED = "BatchingWidened"
SCALED_OUT = "ScaledOut"
SCALED_IN = "ScaledIn"
BACKLOG_DRAINING = "BacklogDraining"

# Rejections remembered (oldest dropped first).
MAX_REJECTED = 10


def decide(state: TunerState, in_force: InForce, observation: Observation, policy: Policy, now: datetime) -> Decision:
    """Decide the config to have in force after one window. See the module docstring."""
    obs = observation
    if state.last_window_end is not None and obs.window_end <= state.last_window_end:
        return hold(state, in_force, WINDOW_ALREADY_SEEN, f"window ending {obs.window_end.isoformat()} already judged")
    # Per-size execution times do not depend on the batching in force: learn from every window.
    st = state.model_copy(
        update={
            "last_window_end": obs.window_end,
            "live": learn(state.live, obs.batch_stats),
            **_readiness(state, in_force, obs),
        }
    )
    pname = f"P{policy.percentile:g}"
    if obs.p_latency_ms is None and obs.request_rate == 0:
        return _idle(_reset(st), in_force, policy, now)
    if (
        obs.p_latency_ms is None
        or obs.request_rate is None
        or (obs.sample_count is not None and obs.sample_count < policy.min_samples)
    ):
        missing = "latency" if obs.p_latency_ms is None else "request rate" if obs.request_rate is None else ""
        what = f"{missing} signal missing" if missing else f"only {obs.sample_count} samples"
        st = _reset(st).model_copy(update={"missing_windows": st.missing_windows + 1})
        return hold(st, in_force, SIGNAL_MISSING, f"{what}; holding the config, never moving blind", missing=True)
    if in_force.changed_at is not None and obs.window_start < in_force.changed_at:
        # The window says nothing of the config in force yet; the measured curve still does: a fragile config
        # (e.g. Triton's default max batch on a superlinear curve) is left before a burst runs it away.
        demand = obs.request_rate + max(0.0, obs.queue_growth_rps or 0.0)
        return _unfragile(
            st,
            in_force,
            policy,
            now,
            demand,
            STALE_WINDOW,
            f"window from {obs.window_start.isoformat()} overlaps the change at {in_force.changed_at.isoformat()}",
        )
    if obs.ready_replicas is not None and obs.ready_replicas < in_force.replicas:
        return hold(st, in_force, REPLICAS_NOT_READY, f"{obs.ready_replicas}/{in_force.replicas} replicas ready")

    curve = Curve(merged(policy.build_curve, st.live))
    r = _read(obs, obs.p_latency_ms, obs.request_rate, in_force, policy)
    horizon = obs.window_end - timedelta(seconds=policy.scale_in_window_seconds)
    recent = (*tuple((t, d) for t, d in st.recent_demand if t > horizon), (obs.window_end, r.demand_rps))
    st = st.model_copy(update={"recent_demand": recent})
    # The model's latency for the config in force at the measured demand: what the calibration corrects, and what
    # tells a foretold bad window from noise.
    predicted_ms = _predicted_ms(curve, in_force, r, policy) if curve else math.nan
    if curve and not r.saturated:
        st = st.model_copy(update={"calibration": _calibrate(st.calibration, predicted_ms, r)})
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
        }
    )
    seen = f"{pname} {r.p_ms:.1f} ms (aim {policy.aim_ms:.1f}) at {r.demand_rps:.0f} req/s" + (
        ", queue backing up" if r.saturated else ""
    )
    if not curve:
        return _without_curve(st, in_force, r, policy, now, seen)

    # A sustained ramp is met where it will be by the time a change shows and is confirmed, not where it is.
    ahead = r.demand_rps + ramp_rps_per_s(recent) * RAMP_HORIZON_INTERVALS * policy.interval_seconds
    load = max(r.demand_rps * policy.demand_margin, ahead) + r.backlog / (DRAIN_INTERVALS * policy.interval_seconds)
    # The residual measured on the config in force says little about configs in another regime: they get
    # only a bounded share of it.
    mild = min(CANDIDATE_CALIBRATION[1], max(CANDIDATE_CALIBRATION[0], st.calibration))
    mb, delay = in_force.batching.max_batch_size, in_force.batching.max_queue_delay_microseconds
    # A window past the SLO that the model foretold for the config in force at the measured demand (with the
    # calibration held before it) needs no second one where another config holds the SLO with the margin (below):
    # the noise gate is for a latency the model cannot explain.
    foretold = r.p_ms > policy.slo_ms and not r.draining and predicted_ms * state.calibration > policy.slo_ms
    confirmed = st.bad_windows >= policy.bad_windows or r.overloaded
    relieve = confirmed or foretold
    # Fixing bad windows: what failed at about this demand (or less) stays out; re-optimizing while the latency
    # holds: whatever failed lately stays out (a move back is churn).
    avoid = rejected_now(st, r.demand_rps if relieve else None, now)
    peak = max(d for _, d in recent)
    if ahead > r.demand_rps * policy.demand_margin:
        # A ramp goes on past where it is planned: a config that keeps up with the projection only at full use
        # is overrun an interval later. Short of the SLO, the plan keeps up with it with the margin.
        peak = max(peak, ahead * policy.demand_margin)
    plan = best_plan(curve, load, policy, mild, backlog=r.saturated, avoid=avoid, peak_rps=peak)
    # Evidence beats the model: a config in force that breaks the SLO window after window while the model rates
    # it better than the share of calibration other configs get is left (and not planned again at this demand,
    # as after a canary's rejection) for another config that holds the SLO at the measured demand even with the
    # model erring on it as much as on the one in force. When none does, the SLO is out of reach: said so.
    broken = r.p_ms > policy.slo_ms
    stuck = False
    # Confirmed by distinct windows at a steady queue: an overload or a backlog is a capacity problem (a burst
    # also inflates the calibration), not evidence that the model misjudges the config in force.
    misjudged = st.bad_windows >= policy.bad_windows and not (r.saturated or r.overloaded)
    if misjudged and broken and st.calibration > CANDIDATE_CALIBRATION[1]:
        away = avoid | {(mb, delay)}
        alt = best_plan(curve, load, policy, st.calibration, backlog=r.saturated, avoid=away, peak_rps=peak)
        c = alt.candidate
        holds = alt.replicas * c.carries() >= r.demand_rps
        # Never a bet on a config that could not keep up with the planned load by what full batches drain,
        # nor on a fragile one: the evidence is against the one in force, not for any other.
        sturdy = alt.replicas * c.burst_rps >= load and not is_fragile(curve, c, policy)
        if not _avoided(c.max_batch, c.delay_us, away) and sturdy and holds:
            plan, avoid = alt, away
        else:
            stuck = True
    # The config in force as observed (full calibration) decides whether it carries the load; compared with
    # the candidates it gets their share, so a switch is never an artefact of the calibration.
    observed = candidate(curve, mb, delay, policy, st.calibration)
    current = candidate(curve, mb, delay, policy, mild)
    # A window whose demand rose past noise may have been entered by a crowd part way through: its completions mix
    # the calm before with the backlog after and understate what the config in force drains.
    rising = len(recent) >= 2 and recent[-1][1] > (1 + GROWTH_SHARE) * recent[-2][1]
    # Nor do those of a window that the pods in force served only in part (some were starting): per replica, they
    # understate what the config in force drains.
    unjudged = rising or (st.ready_at is not None and obs.window_start < st.ready_at)
    if not unjudged:
        observed, current = _as_delivered(observed, r, in_force), _as_delivered(current, r, in_force)
    fragile = is_fragile(curve, current, policy)
    at_risk = in_force.replicas * observed.carries() < load or fragile
    relax = st.good_windows >= policy.good_windows
    cap_total = plan.replicas * plan.candidate.capacity_rps
    if plan.within_slo_only:
        # The plan's candidates were judged against the SLO, not the aim: so is the config in force here.
        at_slo = policy.model_copy(update={"headroom": 1.0})
        current = candidate(curve, mb, delay, at_slo, mild)
        current = current if unjudged else _as_delivered(current, r, in_force)
    # (A share plan is made only without a backlog: `current` is the config in force as the model has it.)
    in_share = 0.0 if plan.share is None else share(curve, current, r.demand_rps, policy, mild, plan.replicas)
    # Where nothing within the bounds holds the SLO with the margin, a second window shows more of the demand (a
    # burst the plan must keep up with) before a bet on a config that may not; unless the config in force broke the
    # SLO as the model foretold and the plan holds the SLO at the demand itself (without the margin), or else
    # answers a good deal more of it within the SLO: a second window there is a window more of the
    # goodput lost (the move is the one `_choose` makes a window later, on the same model). Not on a rise that
    # may not last the plan: one that entered the window part way through (the window's tail shows more than the
    # whole: a crowd's first window understates it), or that came and went before within the stabilization
    # window (bursts: a plan made for one is undone when it passes).
    # (The completions of a rising window never judge the config in force: above.)
    sudden = _partial(obs, r, rising) or (rising and _recurs(recent, policy.demand_margin))
    at_demand = plan.share is None and plan.replicas * plan.candidate.carries() >= r.demand_rps
    gained = False
    if foretold and not plan.feasible and not at_demand and not sudden:
        # (Whichever way the plan was made: a share plan, or the most load within the SLO short of the demand.)
        target_share, now_share = plan.share, in_share
        if target_share is None:
            target_share = share(curve, plan.candidate, r.demand_rps, policy, mild, plan.replicas)
            now_share = share(curve, current, r.demand_rps, policy, mild, plan.replicas)
        gained = _share_gained(target_share, plan.candidate, now_share, current, policy)
    relieve = confirmed or (foretold and (plan.feasible or ((at_demand or gained) and not sudden)))
    if not relieve and not relax and not (at_risk and not bad):
        code, why = (
            (CONFIRMING, f"bad window {st.bad_windows}/{policy.bad_windows}")
            if bad
            else (WITHIN_BAND, "within the band")
        )
        return hold(st, in_force, code, f"{seen}: {why}", demand_rps=r.demand_rps, capacity_rps=cap_total)
    if relieve and r.draining:
        return hold(
            st,
            in_force,
            BACKLOG_DRAINING,
            f"{seen}: the backlog drains; waiting for it",
            demand_rps=r.demand_rps,
            capacity_rps=cap_total,
        )
    if in_force.changed_at is not None and now - in_force.changed_at < timedelta(seconds=policy.cooldown_seconds):
        left = policy.cooldown_seconds - (now - in_force.changed_at).total_seconds()
        return hold(
            st,
            in_force,
            COOLDOWN,
            f"{seen}: cooling down, {left:.0f} s left",
            demand_rps=r.demand_rps,
            capacity_rps=cap_total,
        )

    peak_need = max(d for _, d in recent) * policy.demand_margin
    target, replicas, held = _choose(plan, current, in_force, r, relieve, policy, avoid, in_share, peak_need)
    kept_note = (
        f"; max batch {plan.candidate.max_batch} would not keep up with the {peak_need / policy.demand_margin:.0f} "
        f"req/s seen in the last {policy.scale_in_window_seconds:.0f} s: the batching stays"
        if held
        else ""
    )
    scale_note = ""
    if replicas < in_force.replicas:
        # Scale in only as far as the highest demand of the stabilization window allows, only once the
        # window is full of history, and never while requests queue up. And only to a count the model puts
        # below the comfort line (the hysteresis band's lower edge), with the model erring as it does on the
        # config in force if that is worse: a scale-in that lands between the comfort line and the aim is
        # bounced back out by the first noisy window or by a model a few percent optimistic.
        snug = policy.model_copy(update={"headroom": policy.comfort_ms / policy.slo_ms})
        calm = candidate(curve, target.max_batch, target.delay_us, snug, max(mild, st.calibration))
        carried = min(target.carries(), calm.carries())
        replicas = max(replicas, min(in_force.replicas, math.ceil(peak_need / max(carried, 1e-9))))
        # Nor to a count that broke the aim lately at this demand or less (the model was wrong there once).
        floor = max((x.replicas + 1 for x in st.too_few if _applies(x.at, x.demand_rps, r.demand_rps, now)), default=0)
        replicas = max(replicas, min(in_force.replicas, floor))
        span = (obs.window_end - recent[0][0]).total_seconds() + policy.interval_seconds
        # Never while the latency is bad, nor on a plan that keeps only the SLO (no headroom), nor while the
        # demand rises (a window above the last by more than noise may be the first of a crowd: giving back a
        # replica is never urgent, and one given back at a crowd's start comes back through a cold start).
        if r.saturated or relieve or plan.within_slo_only or rising or span < policy.scale_in_window_seconds:
            replicas = in_force.replicas
        # Down slowly: at most half the replicas go at once (a replica given back comes back through a cold start
        # and its warmup; a step soon after a scale-in meets half the capacity, not a fraction of it). The next
        # window, on the same evidence, gives back more.
        halved = max(replicas, math.ceil(in_force.replicas / 2))
        if halved > replicas:
            replicas = halved
            scale_note = f"; at most half the replicas given back at once ({in_force.replicas} -> {replicas})"
    drain_note = ""
    if r.backlog > 0:
        # (Never a scale-in under a backlog: above.) A pod's queue stays on that pod: a scale-out drains it only by
        # taking new arrivals away from it. The fullest pod holds at least its share of the backlog.
        per_pod = max(obs.pending_max or 0.0, r.backlog / in_force.replicas)
        demand = max(ahead, r.demand_rps)
        draining_count = drain_replicas(target.capacity_rps, per_pod, demand, policy)
        if draining_count > in_force.replicas:
            # New replicas take a cold start (as long as the last ones took; an interval before any was measured)
            # while the queue goes on growing on the pods in force.
            startup_s = st.startup_seconds if st.startup_seconds is not None else policy.interval_seconds
            per_pod += max(0.0, obs.queue_growth_rps or 0.0) / in_force.replicas * startup_s
            draining_count = drain_replicas(target.capacity_rps, per_pod, demand, policy)
        if draining_count > replicas:
            drain_note = (
                f"; the {per_pod:.0f} requests queued on the fullest pod by the time new replicas are ready drain "
                f"within {DRAIN_INTERVALS} intervals only with {draining_count} replica(s)"
            )
            replicas = draining_count
    # Said only on evidence: the aim broken, a queue growing at the limits, or a demand beyond what the bounds can
    # drain at all. A plan short of its margin while the SLO holds is no alarm, just no room to grow.
    at_limits = r.saturated and in_force.replicas >= policy.replicas_max
    infeasible = stuck or (
        not plan.feasible and (r.over or at_limits or r.demand_rps > policy.replicas_max * plan.candidate.capacity_rps)
    )
    why = _explain(plan, load, curve, policy, alarm=infeasible) + kept_note + scale_note + drain_note
    if stuck:
        why = (
            f"the SLO breaks at {r.demand_rps:.0f} req/s and no config within the bounds holds it with the model "
            f"erring as it does on the config in force (x{st.calibration:.2f}); {why}"
        )
    unchanged = (target.max_batch, target.delay_us, replicas) == (
        in_force.batching.max_batch_size,
        in_force.batching.max_queue_delay_microseconds,
        in_force.replicas,
    )
    if unchanged and relieve and (r.saturated or r.overloaded) and replicas < policy.replicas_max:
        # The model says the config in force suffices, yet requests pile up: trust the queue.
        replicas += 1
        why += "; requests still queue up: one more replica"
    if (target.max_batch, target.delay_us, replicas) == (
        in_force.batching.max_batch_size,
        in_force.batching.max_queue_delay_microseconds,
        in_force.replicas,
    ):
        code = SLO_INFEASIBLE if infeasible else AT_LIMITS if relieve else SETTLED
        return hold(
            st, in_force, code, f"{seen}: {why}", infeasible=infeasible, demand_rps=r.demand_rps, capacity_rps=cap_total
        )
    batching = _batching(target.max_batch, target.delay_us, policy)
    code = _change_code(in_force, batching, replicas)
    reason = f"{seen}: {why}; {_describe(in_force.batching, in_force.replicas)} -> {_describe(batching, replicas)}"
    new = InForce(batching=batching, replicas=replicas, changed_at=now, reason=reason, rolled=in_force.rolled)
    st = st.model_copy(update={"bad_windows": 0, "good_windows": 0, "last_reason_code": code})
    if relieve and broken and (target.max_batch, target.delay_us) != (mb, delay):
        # Left for confirmed bad windows past the SLO: not planned again at this demand (or more) for a while. So
        # too where nothing holds the SLO (a share plan): every config breaks it there, and the model's ranking of
        # two alike configs flips with the calibration the one in force gives, so a move back is churn.
        gone = RejectedConfig(batching=in_force.batching, demand_rps=r.demand_rps, at=now, reason=f"{seen}: {why}")
        st = st.model_copy(update={"rejected": (*st.rejected, gone)[-MAX_REJECTED:]})
    if replicas > in_force.replicas:
        few = TooFewReplicas(replicas=in_force.replicas, demand_rps=r.demand_rps, at=now)
        st = st.model_copy(update={"too_few": (*st.too_few, few)[-MAX_REJECTED:], "scaled_out_at": now})
    return Decision(
        action="change",
        in_force=new,
        reason=reason,
        reason_code=code,
        state=st,
        infeasible=infeasible,
        demand_rps=r.demand_rps,
        capacity_rps=cap_total,
    )


def _idle(st: TunerState, in_force: InForce, policy: Policy, now: datetime) -> Decision:
    """No traffic: the cheapest moment for a reload."""
    return _unfragile(st, in_force, policy, now, 0.0, NO_TRAFFIC, "no requests in the window; holding the config")


def _unfragile(
    st: TunerState, in_force: InForce, policy: Policy, now: datetime, demand_rps: float, code: str, why: str
) -> Decision:
    """Without a window to judge (no traffic, or one that predates the change): move to the most robust batching
    the measured curve gives when the one in force is fragile (or below the warmup batch), with the replicas
    the demand takes (never fewer); else hold with `code` and `why`."""
    curve = Curve(merged(policy.build_curve, st.live))
    cooling = in_force.changed_at is not None and now - in_force.changed_at < timedelta(seconds=policy.cooldown_seconds)
    if not curve or cooling:
        return hold(st, in_force, code, why)
    # Without traffic any config a canary rejected lately stays out, whatever load it failed at.
    avoid = rejected_now(st, demand_rps if demand_rps > 0 else None, now)
    plan = best_plan(curve, demand_rps * policy.demand_margin, policy, 1.0, backlog=False, avoid=avoid)
    b = in_force.batching
    current = candidate(curve, b.max_batch_size, b.max_queue_delay_microseconds, policy, 1.0)
    best = plan.candidate
    if not is_fragile(curve, current, policy) or (best.max_batch, best.delay_us) == (
        b.max_batch_size,
        b.max_queue_delay_microseconds,
    ):
        return hold(st, in_force, code, why)
    replicas = max(in_force.replicas, min(plan.replicas, policy.replicas_max))
    batching = _batching(best.max_batch, best.delay_us, policy)
    load = f"{demand_rps:.0f} req/s" if demand_rps > 0 else "no traffic"
    reason = (
        f"{load}: max batch {best.max_batch} carries {best.carries():.0f} req/s per replica within the aim "
        f"by the measured curve, {b.max_batch_size} only {current.carries():.0f}; "
        f"{_describe(b, in_force.replicas)} -> {_describe(batching, replicas)}"
    )
    code = _change_code(in_force, batching, replicas)
    new = in_force.model_copy(update={"batching": batching, "replicas": replicas, "changed_at": now, "reason": reason})
    st = st.model_copy(update={"last_reason_code": code})
    return Decision(action="change", in_force=new, reason=reason, reason_code=code, state=st)


def _choose(
    plan: Plan,
    current: Candidate,
    in_force: InForce,
    r: _Reading,
    relieve: bool,
    policy: Policy,
    avoid: frozenset[tuple[int, int]] = frozenset(),
    current_share: float = 0.0,
    peak_need_rps: float = 0.0,
) -> tuple[Candidate, int, bool]:
    """The config to move to: the plan, unless the config in force already does the job, and never a cut
    in capacity under a backlog. Short of the SLO everywhere, the batching in force stays unless the plan's
    answers a good deal more of the demand within the SLO (`current_share`: the share it answers). While the SLO
    holds, no batching change takes the capacity below `peak_need_rps` where the config in force has it (the
    third value says the batching in force was kept for that)."""
    target, replicas = plan.candidate, plan.replicas
    keep = not _avoided(current.max_batch, current.delay_us, avoid) and current.max_batch >= policy.warmup_max
    if plan.share is not None:
        # Short of the SLO whatever the config: a reload only for a good deal more goodput, or for a batching
        # that keeps up with the planned load by what full batches drain where the one in force does not (its
        # batches past the most efficient one run away at the first burst: the model's share, a normal spread
        # around where batches settle, misses those excursions).
        # (Every config breaks the SLO here: one left earlier for breaking it is no worse for that.)
        runs_away = _outrun(current, target, plan.load_rps, replicas)
        gained = _share_gained(plan.share, target, current_share, current, policy)
        if current.max_batch >= policy.warmup_max and not runs_away and not gained:
            target = current
    else:
        # The load per replica at the count that will be in force: no scale-in while relieving bad windows, under
        # a backlog, or on a plan that keeps only the SLO (see `decide`), so not the plan's count then.
        kept = max(replicas, in_force.replicas) if (relieve or r.saturated or plan.within_slo_only) else replicas
        per = plan.load_rps / max(1, kept)
        holding = not (r.over or r.saturated)
        carries_it = (
            current.carries() >= per
            or (not plan.feasible and not r.saturated)
            # Observed within the aim and planned to carry nearly the load with margin: a reload for a few
            # percent of robustness is not worth its cost.
            or (holding and not relieve and current.carries() * SWITCH_GAIN >= per)
        )
        # Where nothing keeps the aim, a config in force that carries the planned load within the SLO with room to
        # spare (and holds it) has nothing to gain from a reload: with a latency floor near the SLO, how much more
        # load another carries within it swings with a percent of calibration.
        spare = plan.within_slo_only and r.p_ms <= policy.slo_ms and current.carries() >= SWITCH_GAIN * per
        # A burst beyond the plan is served by what full batches drain: a tenth more of it, at no loss of
        # robustness, is worth a reload (a property of the curve alone, free of the windows' noise).
        sturdier = target.burst_rps >= BURST_GAIN * current.burst_rps and target.carries() >= current.carries()
        # Scaling out, the new replicas relieve the pressure: a reload on every pod besides (a pause each, while
        # the new ones are not ready yet) only for a batching in force that does not carry its share of the
        # demand at the new count (the margin, and a sturdier batching, can wait for a later window).
        adding = replicas > in_force.replicas
        scaling_out = adding and current.carries() * replicas >= r.demand_rps
        # ... but until the new replicas are ready (a cold start and warmup: a window or so) the pods in force carry
        # the whole load: where the batching in force does not keep up with it there by what full batches drain
        # and the plan's does, the reload goes with the scale-out (else batches run away while the new pods start).
        bridges = adding and _outrun(current, target, plan.load_rps, in_force.replicas)
        # Under a backlog a reload is for capacity alone: a batching no sturdier drains the queue no faster (its
        # edge in latency shows once the queue is gone).
        if (
            keep
            and not bridges
            and (
                scaling_out
                or (
                    not sturdier
                    and (r.saturated or spare or (carries_it and current.carries() * SWITCH_GAIN >= target.carries()))
                )
            )
        ):
            # The batching in force carries the planned load and nothing is much more robust: no reload.
            target = current
    # The batching's analogue of the scale-in rule: while the SLO holds, a change never takes the capacity below
    # what the highest demand of the stabilization window needs with its margin, where the config in force has
    # it (a burst like the last ones must find a config that keeps up; a move for the aim alone is not worth one
    # that runs away at the next burst). Nor, whatever the latency, below that demand itself: a config that holds
    # the SLO between bursts and cannot keep up with the next one loses the burst and the windows its backlog
    # drains through (a share plan keeps up with it by construction).
    n = max(replicas, in_force.replicas)
    cut = n * target.capacity_rps < peak_need_rps <= n * current.capacity_rps
    overrun = n * target.capacity_rps < peak_need_rps / policy.demand_margin <= n * current.capacity_rps
    held = (
        keep
        and (overrun or (cut and r.p_ms <= policy.slo_ms))
        and (target.max_batch, target.delay_us) != (current.max_batch, current.delay_us)
    )
    if held:
        target = current
    if r.saturated or r.backlog > 0:
        old_cap = in_force.replicas * current.capacity_rps
        if replicas * target.capacity_rps < old_cap:
            replicas = max(replicas, min(policy.replicas_max, math.ceil(old_cap / target.capacity_rps)))
        if replicas * target.capacity_rps < old_cap and current.max_batch >= policy.warmup_max:
            target, replicas = current, max(replicas, in_force.replicas)
    if not relieve:
        # Comfortable: give back replicas, never reach for more without evidence of pressure.
        replicas = min(replicas, in_force.replicas) if not plan.feasible else replicas
    return target, replicas, held


def _without_curve(
    st: TunerState, in_force: InForce, r: _Reading, policy: Policy, now: datetime, seen: str
) -> Decision:
    """No measured service time yet: only replicas can answer a confirmed overload."""
    if st.bad_windows < policy.bad_windows and not r.overloaded:
        return hold(
            st, in_force, CONFIRMING if r.over or r.saturated else WITHIN_BAND, f"{seen}: no service-time curve yet"
        )
    if in_force.changed_at is not None and now - in_force.changed_at < timedelta(seconds=policy.cooldown_seconds):
        return hold(st, in_force, COOLDOWN, f"{seen}: cooling down")
    if in_force.replicas >= policy.replicas_max:
        return hold(
            st,
            in_force,
            AT_LIMITS,
            f"{seen}: no service-time curve to plan batching; replicas at their maximum",
            infeasible=r.saturated,
        )
    replicas = in_force.replicas + 1
    reason = f"{seen}: no service-time curve to plan batching: one more replica"
    new = in_force.model_copy(update={"replicas": replicas, "changed_at": now, "reason": reason})
    st = st.model_copy(update={"bad_windows": 0, "good_windows": 0, "last_reason_code": SCALED_OUT})
    return Decision(
        action="change", in_force=new, reason=reason, reason_code=SCALED_OUT, state=st, demand_rps=r.demand_rps
    )


def _explain(plan: Plan, load: float, curve: Curve, policy: Policy, alarm: bool = True) -> str:
    c = plan.candidate
    bet = f" (past the largest measured batch {curve.largest}: extrapolated)" if c.extrapolated else ""
    if not plan.feasible:
        need = math.ceil(load / c.carries()) if c.carries() > 0 else math.inf
        what = "infeasible within the bounds" if alarm else "the SLO holds, with no margin left within the bounds"
        return (
            f"{what}: {load:.0f} req/s with margin needs {need} replicas at max batch "
            f"{c.max_batch} ({c.carries():.0f} req/s each within the SLO{bet}); at most {policy.replicas_max}"
        )
    target = "the SLO (no headroom left for the aim)" if plan.within_slo_only else "the aim"
    return (
        f"model: max batch {c.max_batch}{bet} carries {c.carries():.0f} req/s per replica within {target} "
        f"(capacity {c.capacity_rps:.0f}); {load:.0f} req/s with margin takes {plan.replicas}"
    )


def _batching(max_batch: int, delay_us: int, policy: Policy) -> Batching:
    preferred = [c for c in policy.preferred_candidates if c <= max_batch]
    return Batching(max_batch_size=max_batch, preferred_batch_sizes=preferred, max_queue_delay_microseconds=delay_us)


def _change_code(in_force: InForce, batching: Batching, replicas: int) -> str:
    if replicas > in_force.replicas:
        return SCALED_OUT
    if replicas < in_force.replicas:
        return SCALED_IN
    old = in_force.batching
    if (batching.max_batch_size, batching.max_queue_delay_microseconds) > (
        old.max_batch_size,
        old.max_queue_delay_microseconds,
    ):
        return BATCHING_WIDENED
    return BATCHING_TIGHTENED


def _describe(b: Batching, replicas: int) -> str:
    return f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us, {replicas} replica(s)"


def _reset(st: TunerState) -> TunerState:
    return st.model_copy(update={"bad_windows": 0, "good_windows": 0})


def hold(
    st: TunerState,
    in_force: InForce,
    code: str,
    reason: str,
    *,
    missing: bool = False,
    infeasible: bool = False,
    demand_rps: float | None = None,
    capacity_rps: float | None = None,
) -> Decision:
    """A decision that keeps the config in force, with why (the state remembers the reason code)."""
    return Decision(
        action="hold",
        in_force=in_force,
        reason=reason,
        reason_code=code,
        state=st.model_copy(update={"last_reason_code": code}),
        signal_missing=missing,
        infeasible=infeasible,
        demand_rps=demand_rps,
        capacity_rps=capacity_rps,
    )
