"""The plan for one window and how the config in force measures up to it, computed once per tick into one value
(`Tick`) that the guards and the act read: the load to plan for (the demand with its margin, a ramp's projection
and a backlog's drain), the plan (the one objective, `objective.best_plan`, with evidence over the model), the
config in force as the model and the window have it, and whether the window asks for relief."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tailtune.tuner.control.limits import Limits, limits, measured_margin, upper_demand_rps
from tailtune.tuner.control.objective import (
    CANDIDATE_CALIBRATION,
    DRAIN_INTERVALS,
    NO_HEADROOM,
    Candidate,
    Plan,
    avoided,
    best_plan,
    candidate,
    is_fragile,
    rejected_now,
    share,
    share_gained,
)
from tailtune.tuner.control.reading import (
    RAMP_HORIZON_INTERVALS,
    Reading,
    Window,
    as_delivered,
    partial,
    ramp_rps_per_s,
    recurs,
)
from tailtune.tuner.servicetime import Curve
from tailtune.tuner.types import InForce, Observation, Policy, TunerState


@dataclass(frozen=True)
class Tick:
    """Everything the guards and the act read, computed once per tick."""

    st: TunerState
    in_force: InForce
    obs: Observation
    policy: Policy
    now: datetime
    w: Window
    lim: Limits  # the SLO, the aim and the tick's limits
    ahead_rps: float  # the demand where a sustained ramp will be once a change shows and is confirmed
    load_rps: float  # planned for: the demand (or the ramp's projection) with margin, plus a backlog's drain
    mild: float  # the share of the calibration candidates other than the config in force get
    avoid: frozenset[tuple[int, int]]  # configs left out of the plan (rejected, or left for bad windows)
    plan: Plan
    stuck: bool  # the SLO breaks and no config holds it with the model erring as on the config in force
    current: Candidate  # the config in force as the plan's candidates are judged
    at_risk: bool  # the config in force does not carry the load as observed, or is fragile
    relax: bool  # enough good windows in a row to re-plan while the latency holds
    # Enough windows in a row within the aim, and the plan gives back replicas: a scale-in alone is due (the
    # batching stays within the band).
    scale_in_due: bool
    relieve: bool  # the window asks for relief (confirmed bad windows, or a foretold break the plan mends)
    in_share: float  # short of the SLO: the share of the demand the config in force answers within it
    peak_need_rps: float  # the highest demand of the stabilization window with its margin (the batching keeps up)
    # The demand's upper bound over the lead time a scale-in must cover (`limits.upper_demand_rps`).
    upper_rps: float
    capacity_rps: float  # the plan's total capacity

    @property
    def r(self) -> Reading:
        """The window's reading."""
        return self.w.r

    @property
    def curve(self) -> Curve:
        """The measured service-time curve."""
        return self.w.curve


def assess(st: TunerState, in_force: InForce, obs: Observation, policy: Policy, now: datetime, w: Window) -> Tick:
    """The plan for this window and the config in force weighed against it (see the module docstring)."""
    r, curve, recent = w.r, w.curve, w.recent
    lim = limits(policy, st)
    # The demand's margin, from its own variability where its history measures it: the tick's policy carries it.
    policy = policy.model_copy(update={"measured_margin": measured_margin(recent, lim, policy)})
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
    foretold = r.p_ms > policy.slo_ms and not r.draining and w.predicted_ms * w.calibration_before > policy.slo_ms
    confirmed = st.bad_windows >= policy.bad_windows or r.overloaded
    # Fixing bad windows: what failed at about this demand (or less) stays out; re-optimizing while the latency
    # holds: whatever failed lately stays out (a move back is churn).
    avoid = rejected_now(st, r.demand_rps if (confirmed or foretold) else None, now)
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
    stuck = False
    # Confirmed by distinct windows at a steady queue: an overload or a backlog is a capacity problem (a burst
    # also inflates the calibration), not evidence that the model misjudges the config in force.
    misjudged = st.bad_windows >= policy.bad_windows and not (r.saturated or r.overloaded)
    if misjudged and r.p_ms > policy.slo_ms and st.calibration > CANDIDATE_CALIBRATION[1]:
        away = avoid | {(mb, delay)}
        alt = best_plan(curve, load, policy, st.calibration, backlog=r.saturated, avoid=away, peak_rps=peak)
        c = alt.candidate
        holds = alt.replicas * c.carries() >= r.demand_rps
        # Never a bet on a config that could not keep up with the planned load by what full batches drain,
        # nor on a fragile one: the evidence is against the one in force, not for any other.
        sturdy = alt.replicas * c.burst_rps >= load and not is_fragile(curve, c, policy)
        if not avoided(c.max_batch, c.delay_us, away) and sturdy and holds:
            plan, avoid = alt, away
        else:
            stuck = True
    # The config in force as observed (full calibration) decides whether it carries the load; compared with
    # the candidates it gets their share, so a switch is never an artefact of the calibration.
    observed = candidate(curve, mb, delay, policy, st.calibration)
    current = candidate(curve, mb, delay, policy, mild)
    # A window whose demand rose past noise may have been entered by a crowd part way through: its completions mix
    # the calm before with the backlog after and understate what the config in force drains. Nor do those of a
    # window that the pods in force served only in part (some were starting): per replica, they understate what
    # the config in force drains.
    unjudged = w.rising or (st.ready_at is not None and obs.window_start < st.ready_at)
    if not unjudged:
        observed, current = as_delivered(observed, r, in_force), as_delivered(current, r, in_force)
    at_risk = in_force.replicas * observed.carries() < load or is_fragile(curve, current, policy)
    if plan.within_slo_only:
        # The plan's candidates were judged against the SLO, not the aim: so is the config in force here.
        at_slo = policy.model_copy(update={"headroom": NO_HEADROOM})
        current = candidate(curve, mb, delay, at_slo, mild)
        current = current if unjudged else as_delivered(current, r, in_force)
    # (A share plan is made only without a backlog: `current` is the config in force as the model has it.)
    in_share = 0.0 if plan.share is None else share(curve, current, r.demand_rps, policy, mild, plan.replicas)
    relieve = confirmed or (foretold and _foretold_mended(w, obs, policy, plan, current, in_share, mild))
    return Tick(
        st=st,
        in_force=in_force,
        obs=obs,
        policy=policy,
        now=now,
        w=w,
        lim=lim,
        ahead_rps=ahead,
        load_rps=load,
        mild=mild,
        avoid=avoid,
        plan=plan,
        stuck=stuck,
        current=current,
        at_risk=at_risk,
        relax=st.good_windows >= policy.good_windows,
        scale_in_due=st.calm_windows >= policy.good_windows and plan.replicas < in_force.replicas,
        relieve=relieve,
        in_share=in_share,
        peak_need_rps=max(d for _, d in recent) * policy.demand_margin,
        upper_rps=upper_demand_rps(recent, lim),
        capacity_rps=plan.replicas * plan.candidate.capacity_rps,
    )


def _foretold_mended(
    w: Window, obs: Observation, policy: Policy, plan: Plan, current: Candidate, in_share: float, mild: float
) -> bool:
    """Whether a break of the SLO the model foretold is relieved in its first window: where the plan holds the SLO
    with the margin; else, where nothing within the bounds does, only where the plan holds the SLO at the demand
    itself (without the margin) or answers a good deal more of it within the SLO (a second window there is a
    window more of the goodput lost), and not on a rise that may not last the plan: one that entered the window
    part way through (the window's tail shows more than the whole), or that came and went before within the
    stabilization window (bursts: a plan made for one is undone when it passes)."""
    if plan.feasible:
        return True
    r = w.r
    sudden = partial(obs, r, w.rising) or (w.rising and recurs(w.recent, policy.fixed_margin))
    if sudden:
        return False
    if plan.share is None and plan.replicas * plan.candidate.carries() >= r.demand_rps:
        return True
    # (Whichever way the plan was made: a share plan, or the most load within the SLO short of the demand.)
    target_share, now_share = plan.share, in_share
    if target_share is None:
        target_share = share(w.curve, plan.candidate, r.demand_rps, policy, mild, plan.replicas)
        now_share = share(w.curve, current, r.demand_rps, policy, mild, plan.replicas)
    return share_gained(target_share, plan.candidate, now_share, current, policy)
