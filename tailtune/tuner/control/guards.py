"""The guards: pure functions that can only hold the config in force or limit the plan, each named (the name lands
in `Decision.bound_by`) and with one line of why. In the order `law.decide` applies them:

- holds (the window asks for nothing yet): `hysteresis_band`, `backlog_draining`, `cooldown`;
- the batching (a proposal is the plan's batching and count, then limited): `reload_budget`, `stabilized_batching`;
- the count: `no_cut_under_backlog`, `no_scale_out_without_pressure`, then a scale-in's `scale_in_within_slo`,
  `scale_in_above_too_few`, `no_scale_in_under_pressure`, `scale_in_by_half`; a backlog's `drain_floor`; and
  `queue_over_model`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tailtune.tuner.control.assess import Tick
from tailtune.tuner.control.decision import BACKLOG_DRAINING, CONFIRMING, COOLDOWN, WITHIN_BAND, hold
from tailtune.tuner.control.gates import cooling
from tailtune.tuner.control.objective import (
    BURST_GAIN,
    DRAIN_INTERVALS,
    NO_HEADROOM,
    SWITCH_GAIN,
    Candidate,
    Plan,
    applies,
    avoided,
    candidate,
    drain_replicas,
    keeps_warmup,
    outrun,
    share_gained,
)
from tailtune.tuner.control.reading import Reading, partial
from tailtune.tuner.types import Decision, InForce, Policy

# A divisor that keeps a per-replica load finite where the model gives a candidate no load within the aim
# (requests per second; far below any load a replica serves).
NO_LOAD_RPS = 1e-9
# Most of the replicas a scale-in gives back at once (design value: a step soon after a scale-in meets half the
# capacity, not a fraction of it).
SCALE_IN_MOST_SHARE = 0.5


@dataclass(frozen=True)
class Proposal:
    """The batching and count a decision moves to, as the guards leave it."""

    target: Candidate
    replicas: int
    bound_by: str = ""  # the last guard that changed it ("": the plan as made)
    notes: tuple[str, ...] = ()  # what the guards that changed it add to the reason

    def limited(
        self, guard: str, target: Candidate | None = None, replicas: int | None = None, note: str = ""
    ) -> Proposal:
        """This proposal with `guard`'s change (named only where the batching or the count changed)."""
        new_target = self.target if target is None else target
        new_replicas = self.replicas if replicas is None else replicas
        changed = (new_target.max_batch, new_target.delay_us, new_replicas) != (
            self.target.max_batch,
            self.target.delay_us,
            self.replicas,
        )
        return dataclasses.replace(
            self,
            target=new_target,
            replicas=new_replicas,
            bound_by=guard if changed else self.bound_by,
            notes=(*self.notes, note) if note else self.notes,
        )


def may_stay(current: Candidate, avoid: frozenset[tuple[int, int]], policy: Policy) -> bool:
    """Whether the batching in force may be kept: not one the law left, and not below the warmup batch (Triton
    refuses a max batch below it)."""
    return not avoided(current.max_batch, current.delay_us, avoid) and keeps_warmup(current.max_batch, policy)


# Holds.


def _held(t: Tick, code: str, why: str, guard: str) -> Decision:
    """A hold of the config in force by `guard`, with the window's reading and the plan's capacity."""
    return hold(
        t.st,
        t.in_force,
        code,
        f"{t.w.seen}: {why}",
        demand_rps=t.r.demand_rps,
        capacity_rps=t.capacity_rps,
        bound_by=guard,
    )


def hysteresis_band(t: Tick) -> Decision | None:
    """No move while the window asks for nothing: bad windows not yet confirmed (noise), or a latency inside the
    band between the aim and the comfort line, unless the config in force is at risk while the latency holds or
    the plan gives back replicas after calm windows (`band_keeps_batching` then keeps the batching)."""
    if t.relieve or t.relax or t.scale_in_due or (t.at_risk and not t.w.bad):
        return None
    if t.w.bad:
        return _held(t, CONFIRMING, f"bad window {t.st.bad_windows}/{t.policy.bad_windows}", "hysteresis-band")
    return _held(t, WITHIN_BAND, "within the band", "hysteresis-band")


def backlog_draining(t: Tick) -> Decision | None:
    """A backlog that drains within a few intervals at the config in force is waited for, not answered."""
    if not (t.relieve and t.r.draining):
        return None
    return _held(t, BACKLOG_DRAINING, "the backlog drains; waiting for it", "backlog-draining")


def cooldown(t: Tick) -> Decision | None:
    """No change within the cooldown of the last one (spec.tuning.cooldownSeconds): its effect is not measured yet."""
    changed_at = t.in_force.changed_at
    if changed_at is None or not cooling(t.in_force, t.policy, t.now):
        return None
    left = t.policy.cooldown_seconds - (t.now - changed_at).total_seconds()
    return _held(t, COOLDOWN, f"cooling down, {left:.0f} s left", "cooldown")


HOLDS = (hysteresis_band, backlog_draining, cooldown)


def band_keeps_batching(p: Proposal, t: Tick) -> Proposal:
    """Inside the hysteresis band a window asks only for the replicas the model does not need: the batching in
    force stays (a reload for the aim alone waits for comfortable windows, `hysteresis_band`)."""
    if t.relieve or t.relax or (t.at_risk and not t.w.bad):
        return p
    return p.limited("hysteresis-band", target=t.current)


# The batching and the count.


def reload_budget(
    p: Proposal,
    plan: Plan,
    current: Candidate,
    in_force: InForce,
    r: Reading,
    relieve: bool,
    policy: Policy,
    avoid: frozenset[tuple[int, int]] = frozenset(),
    current_share: float = 0.0,
) -> Proposal:
    """A reload pauses every pod: the batching in force stays unless the plan's is worth that (much more robust,
    sturdier in a burst, or, short of the SLO everywhere, answering a good deal more of the demand within it)."""
    target, replicas = p.target, p.replicas
    if plan.share is not None:
        # Short of the SLO whatever the config: a reload only for a good deal more goodput, or for a batching
        # that keeps up with the planned load by what full batches drain where the one in force does not (its
        # batches past the most efficient one run away at the first burst: the model's share, a normal spread
        # around where batches settle, misses those excursions).
        # (Every config breaks the SLO here: one left earlier for breaking it is no worse for that.)
        runs_away = outrun(current, target, plan.load_rps, replicas)
        gained = share_gained(plan.share, target, current_share, current, policy)
        if keeps_warmup(current.max_batch, policy) and not runs_away and not gained:
            return p.limited("reload-budget", target=current)
        return p
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
    # robustness, is worth a reload (a property of the curve alone, free of the windows' noise). Under a backlog
    # the queue is drained by capacity alone: the robustness within the aim is no measure there.
    sturdier = target.burst_rps >= BURST_GAIN * current.burst_rps and (
        r.saturated or target.carries() >= current.carries()
    )
    # Scaling out, the new replicas relieve the pressure: a reload on every pod besides (a pause each, while
    # the new ones are not ready yet) only for a batching in force that does not carry its share of the
    # demand at the new count (the margin, and a sturdier batching, can wait for a later window).
    adding = replicas > in_force.replicas
    scaling_out = adding and current.carries() * replicas >= r.demand_rps
    # ... but until the new replicas are ready (a cold start and warmup: a window or so) the pods in force carry
    # the whole load: where the batching in force does not keep up with it there by what full batches drain
    # and the plan's does, the reload goes with the scale-out (else batches run away while the new pods start).
    bridges = adding and outrun(current, target, plan.load_rps, in_force.replicas)
    # Under a backlog a reload is for capacity alone: a batching no sturdier drains the queue no faster (its
    # edge in latency shows once the queue is gone).
    if (
        may_stay(current, avoid, policy)
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
        return p.limited("reload-budget", target=current)
    return p


def stabilized_batching(
    p: Proposal,
    current: Candidate,
    in_force: InForce,
    r: Reading,
    policy: Policy,
    avoid: frozenset[tuple[int, int]],
    peak_need_rps: float,
) -> tuple[Proposal, bool]:
    """The batching's analogue of the scale-in stabilization: no batching change takes the capacity below what the
    highest demand of the stabilization window needs (a burst like the last ones must find a config that keeps
    up). The second value says the batching in force was kept for that."""
    # While the SLO holds, never below that demand with its margin, where the config in force has it (a move for
    # the aim alone is not worth one that runs away at the next burst). Nor, whatever the latency, below that
    # demand itself: a config that holds the SLO between bursts and cannot keep up with the next one loses the
    # burst and the windows its backlog drains through (a share plan keeps up with it by construction).
    target = p.target
    n = max(p.replicas, in_force.replicas)
    cut = n * target.capacity_rps < peak_need_rps <= n * current.capacity_rps
    overrun = n * target.capacity_rps < peak_need_rps / policy.demand_margin <= n * current.capacity_rps
    held = (
        may_stay(current, avoid, policy)
        and (overrun or (cut and r.p_ms <= policy.slo_ms))
        and (target.max_batch, target.delay_us) != (current.max_batch, current.delay_us)
    )
    if not held:
        return p, False
    note = (
        f"; max batch {target.max_batch} would not keep up with the {peak_need_rps / policy.demand_margin:.0f} "
        f"req/s seen in the last {policy.scale_in_window_seconds:.0f} s: the batching stays"
    )
    return p.limited("stabilized-batching", target=current, note=note), True


def no_cut_under_backlog(p: Proposal, current: Candidate, in_force: InForce, r: Reading, policy: Policy) -> Proposal:
    """Never less capacity while requests are queued: at least the replicas that match the capacity in force, else
    the batching in force at no fewer replicas."""
    if not (r.saturated or r.backlog > 0):
        return p
    target, replicas = p.target, p.replicas
    old_cap = in_force.replicas * current.capacity_rps
    if replicas * target.capacity_rps < old_cap:
        replicas = max(replicas, min(policy.replicas_max, math.ceil(old_cap / target.capacity_rps)))
    if replicas * target.capacity_rps < old_cap and keeps_warmup(current.max_batch, policy):
        target, replicas = current, max(replicas, in_force.replicas)
    return p.limited("no-cut-under-backlog", target=target, replicas=replicas)


def no_scale_out_without_pressure(p: Proposal, plan: Plan, in_force: InForce, relieve: bool) -> Proposal:
    """Comfortable, a plan short of its margin reaches for no more replicas: a scale-out needs evidence of
    pressure (the plan gives back replicas all the same)."""
    if relieve or plan.feasible:
        return p
    return p.limited("no-scale-out-without-pressure", replicas=min(p.replicas, in_force.replicas))


def choose(
    plan: Plan,
    current: Candidate,
    in_force: InForce,
    r: Reading,
    relieve: bool,
    policy: Policy,
    avoid: frozenset[tuple[int, int]] = frozenset(),
    current_share: float = 0.0,
    peak_need_rps: float = 0.0,
) -> tuple[Proposal, bool]:
    """The plan's batching and count as the batching and count guards leave them (the second value: the batching
    in force was kept for the stabilization window's peak)."""
    p = Proposal(plan.candidate, plan.replicas)
    p = reload_budget(p, plan, current, in_force, r, relieve, policy, avoid, current_share)
    p, held = stabilized_batching(p, current, in_force, r, policy, avoid, peak_need_rps)
    p = no_cut_under_backlog(p, current, in_force, r, policy)
    return no_scale_out_without_pressure(p, plan, in_force, relieve), held


# A scale-in (each applies only while the proposal still gives replicas back).


def scale_in_within_slo(p: Proposal, t: Tick) -> Proposal:
    """A scale-in only to a count the model holds within the SLO at the demand's upper bound over the lead time
    (`limits.upper_demand_rps`), with the model erring as it does on the config in force if that is worse: a replica
    given back is back only a pod start after the demand needs it again, and until then the demand is at most that
    bound. The bound is the worst the demand did within a lead time over its memory: the aim's headroom and the
    demand's margin, which the plan keeps for the variation of the demand it cannot bound, are not stacked on it
    (the same variation counted twice). Once the replica is back the plan's aim and margin hold again."""
    n = t.in_force.replicas
    if p.replicas >= n:
        return p
    at_slo = t.policy.model_copy(update={"headroom": NO_HEADROOM})
    planned = candidate(t.curve, p.target.max_batch, p.target.delay_us, at_slo, t.mild)
    calm = candidate(t.curve, p.target.max_batch, p.target.delay_us, at_slo, max(t.mild, t.st.calibration))
    carried = min(planned.carries(), calm.carries())
    replicas = max(p.replicas, min(n, math.ceil(t.upper_rps / max(carried, NO_LOAD_RPS))))
    note = (
        f"; {replicas} replica(s) hold the SLO at {t.upper_rps:.0f} req/s, the demand's upper bound over the "
        f"{t.lim.lead_s:.0f} s a replica given back takes to return"
        if replicas > p.replicas
        else ""
    )
    return p.limited("scale-in-within-slo", replicas=replicas, note=note)


def scale_in_above_too_few(p: Proposal, t: Tick) -> Proposal:
    """Never a scale-in to a count scaled out of lately at this demand or a quarter less (`REJECTED_DEMAND_SHARE`):
    hysteresis on the count, as the band is on the latency: a demand that wanders about a plan's step, or walks
    back up, finds the count it needed there."""
    n = t.in_force.replicas
    if p.replicas >= n:
        return p
    floor = max((x.replicas + 1 for x in t.st.too_few if applies(x.at, x.demand_rps, t.r.demand_rps, t.now)), default=0)
    return p.limited("scale-in-above-too-few", replicas=max(p.replicas, min(n, floor)))


def no_scale_in_under_pressure(p: Proposal, t: Tick) -> Proposal:
    """No scale-in while the latency is bad, on a plan that keeps only the SLO (no headroom), in a window a crowd
    entered part way through (its demand understates the present one, and the rise it makes is not yet in the
    demand's upper bound), or before the demand's history covers its memory (how far it rises within a lead time
    is not known yet)."""
    n = t.in_force.replicas
    if p.replicas >= n:
        return p
    r = t.r
    span = (t.obs.window_end - t.w.recent[0][0]).total_seconds() + t.policy.interval_seconds
    if r.saturated or t.relieve or t.plan.within_slo_only or partial(t.obs, r, t.w.rising) or span < t.lim.memory_s:
        return p.limited("no-scale-in-under-pressure", replicas=n)
    return p


def scale_in_by_half(p: Proposal, t: Tick) -> Proposal:
    """Down slowly: at most half the replicas go at once (a replica given back comes back through a cold start and
    its warmup; a step soon after a scale-in meets half the capacity, not a fraction of it). The next window, on
    the same evidence, gives back more."""
    n = t.in_force.replicas
    if p.replicas >= n:
        return p
    halved = max(p.replicas, math.ceil(n * SCALE_IN_MOST_SHARE))
    if halved <= p.replicas:
        return p
    note = f"; at most half the replicas given back at once ({n} -> {halved})"
    return p.limited("scale-in-by-half", replicas=halved, note=note)


SCALE_IN = (scale_in_within_slo, scale_in_above_too_few, no_scale_in_under_pressure, scale_in_by_half)


def drain_floor(p: Proposal, t: Tick) -> Proposal:
    """Under a backlog, at least the replicas at which the fullest pod drains its queue within DRAIN_INTERVALS: a
    pod's queue stays on that pod, and a scale-out drains it only by taking new arrivals away from it."""
    r, obs, in_force = t.r, t.obs, t.in_force
    if r.backlog <= 0:
        return p
    # (Never a scale-in under a backlog: above.) The fullest pod holds at least its share of the backlog.
    per_pod = max(obs.pending_max or 0.0, r.backlog / in_force.replicas)
    demand = max(t.ahead_rps, r.demand_rps)
    count = drain_replicas(p.target.capacity_rps, per_pod, demand, t.policy)
    if count > in_force.replicas:
        # New replicas take a cold start (as long as the last ones took; an interval before any was measured)
        # while the queue goes on growing on the pods in force.
        startup_s = t.st.startup_seconds if t.st.startup_seconds is not None else t.policy.interval_seconds
        per_pod += max(0.0, obs.queue_growth_rps or 0.0) / in_force.replicas * startup_s
        count = drain_replicas(p.target.capacity_rps, per_pod, demand, t.policy)
    if count <= p.replicas:
        return p
    note = (
        f"; the {per_pod:.0f} requests queued on the fullest pod by the time new replicas are ready drain "
        f"within {DRAIN_INTERVALS} intervals only with {count} replica(s)"
    )
    return p.limited("drain-floor", replicas=count, note=note)


def queue_over_model(p: Proposal, t: Tick) -> Proposal:
    """The model says the config in force suffices, yet requests pile up: trust the queue, one more replica."""
    b, n = t.in_force.batching, t.in_force.replicas
    unchanged = (p.target.max_batch, p.target.delay_us, p.replicas) == (
        b.max_batch_size,
        b.max_queue_delay_microseconds,
        n,
    )
    if unchanged and t.relieve and (t.r.saturated or t.r.overloaded) and p.replicas < t.policy.replicas_max:
        return p.limited(
            "queue-over-model", replicas=p.replicas + 1, note="; requests still queue up: one more replica"
        )
    return p
