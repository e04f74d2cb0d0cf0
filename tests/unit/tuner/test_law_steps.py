"""The law's gates and guards one by one (`tailtune.tuner.control`): each on a hand-built case where it binds, and
one where it does not; the decision names it in `bound_by`. Small fixed cases (no families): fast."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner import law
from tailtune.tuner.control import gates, guards
from tailtune.tuner.control.assess import Tick, assess
from tailtune.tuner.control.guards import Proposal
from tailtune.tuner.control.limits import DEMAND_NOISE_Z, limits, measured_margin, upper_demand_rps
from tailtune.tuner.control.objective import Candidate, Plan
from tailtune.tuner.control.reading import Reading, read_window
from tailtune.tuner.model import predict
from tailtune.tuner.servicetime import Curve
from tailtune.tuner.types import InForce, Observation, Policy, TooFewReplicas, TunerState
from tests.unit.tuner.families import NOW, SPAN, build_points, steady_window


def _t(b: float) -> float:
    """A linear service time, ms (2 ms fixed, 0.5 ms a request)."""
    return 2.0 + 0.5 * b


POLICY = Policy(slo_ms=50.0, batch_max=32, replicas_max=8, build_curve=build_points(_t, 32))
IN_FORCE = InForce(batching=Batching(max_batch_size=16), replicas=4, changed_at=NOW - timedelta(hours=1))
CALM = steady_window(p99=20.0, rate=2000.0, replicas=4, queue_ms=1.0, compute_ms=_t(8))


def _cand(max_batch: int, robust: float, capacity: float, burst: float | None = None) -> Candidate:
    return Candidate(max_batch, 0, capacity, robust, False, capacity if burst is None else burst)


def _reading(**kw: object) -> Reading:
    base = Reading(
        p_ms=20.0,
        rate=2000.0,
        demand_rps=2000.0,
        saturated=False,
        over=False,
        comfortable=True,
        overloaded=False,
        draining=False,
        backlog=0.0,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def _tick(obs: Observation = CALM, state: TunerState | None = None, **kw: object) -> Tick:
    """The tick `decide` computes for `obs` on IN_FORCE, with fields overridden."""
    st = state or TunerState(recent_demand=tuple((NOW - timedelta(seconds=30 * i), 2000.0) for i in range(12, 0, -1)))
    assert obs.p_latency_ms is not None and obs.request_rate is not None
    st, w = read_window(st, IN_FORCE, obs, POLICY, obs.p_latency_ms, obs.request_rate)
    return dataclasses.replace(assess(st, IN_FORCE, obs, POLICY, NOW, w), **kw)  # type: ignore[arg-type]


# Gates -------------------------------------------------------------------------------------------------------------


def test_gate_window_already_seen_holds_a_window_no_newer_than_the_last() -> None:
    """Caught: the same window judged twice counts one bad window as two."""
    seen = TunerState(last_window_end=NOW)
    d = gates.window_already_seen(seen, IN_FORCE, CALM)
    assert d is not None and (d.reason_code, d.bound_by) == (law.WINDOW_ALREADY_SEEN, "window-already-seen")
    assert gates.window_already_seen(TunerState(last_window_end=NOW - timedelta(seconds=30)), IN_FORCE, CALM) is None


def test_gate_no_traffic_holds_and_leaves_only_a_fragile_batching() -> None:
    """Caught: without requests a sturdy config is reloaded for nothing; a fragile one (below the warmup batch)
    is left at the cheapest moment."""
    idle = CALM.model_copy(update={"p_latency_ms": None, "request_rate": 0.0})
    d = gates.no_traffic(TunerState(), IN_FORCE, idle, POLICY, NOW)
    assert d is not None and (d.action, d.reason_code, d.bound_by) == ("hold", law.NO_TRAFFIC, "no-traffic")
    fragile = IN_FORCE.model_copy(update={"batching": Batching(max_batch_size=1)})
    d = gates.no_traffic(TunerState(), fragile, idle, POLICY.model_copy(update={"warmup_max": 4}), NOW)
    assert d is not None and d.changed and d.batching.max_batch_size >= 4 and d.bound_by == "no-traffic"
    assert gates.no_traffic(TunerState(), IN_FORCE, CALM, POLICY, NOW) is None


def test_gate_no_traffic_leaves_a_fragile_batching_without_adding_replicas() -> None:
    """Caught: with every config short of the aim (a P99.9 past a replica's latency floor) the plan puts every
    replica the bounds allow on the SLO, and a fragile batching left without traffic took them all before any
    request."""
    policy = POLICY.model_copy(update={"slo_ms": 2.0 * _t(1), "percentile": 99.9, "replicas_min": 1, "replicas_max": 5})
    assert law.best_plan(Curve(policy.build_curve), 0.0, policy, 1.0, backlog=False).replicas == policy.replicas_max
    idle = CALM.model_copy(update={"p_latency_ms": None, "request_rate": 0.0})
    fragile = IN_FORCE.model_copy(update={"batching": Batching(max_batch_size=1), "replicas": 1, "changed_at": None})
    d = gates.no_traffic(TunerState(), fragile, idle, policy, NOW)
    assert d is not None and d.changed and d.batching.max_batch_size > 1, d and d.reason
    assert d.replicas == 1, d.reason


def test_gate_signal_missing_never_moves_blind() -> None:
    """Caught: a window without a latency, or with too few samples, read as a calm one."""
    for obs in (CALM.model_copy(update={"p_latency_ms": None}), CALM.model_copy(update={"sample_count": 3})):
        d = gates.signal_missing(TunerState(), IN_FORCE, obs, POLICY, NOW)
        assert d is not None and d.signal_missing and d.bound_by == "signal-missing"
        assert d.state.missing_windows == 1
    assert gates.signal_missing(TunerState(), IN_FORCE, CALM, POLICY, NOW) is None


def test_gate_stale_window_holds_a_window_that_began_before_the_change() -> None:
    """Caught: the latency of the config before a change judged as the new one's."""
    changed = IN_FORCE.model_copy(update={"changed_at": NOW - timedelta(seconds=SPAN / 2)})
    d = gates.stale_window(TunerState(), changed, CALM, POLICY, NOW)
    assert d is not None and (d.reason_code, d.bound_by) == (law.STALE_WINDOW, "stale-window")
    assert gates.stale_window(TunerState(), IN_FORCE, CALM, POLICY, NOW) is None


def test_gate_replicas_not_ready_holds_a_window_served_by_fewer_pods() -> None:
    """Caught: a window served by 2 of 4 pods judged as the 4's."""
    d = gates.replicas_not_ready(TunerState(), IN_FORCE, CALM.model_copy(update={"ready_replicas": 2}), POLICY, NOW)
    assert d is not None and (d.reason_code, d.bound_by) == (law.REPLICAS_NOT_READY, "replicas-not-ready")
    assert gates.replicas_not_ready(TunerState(), IN_FORCE, CALM, POLICY, NOW) is None


def test_gate_no_curve_answers_a_confirmed_overload_with_one_replica_only() -> None:
    """Caught: without a service-time curve the law planned a batching on nothing."""
    blind = POLICY.model_copy(update={"build_curve": ()})
    over = _reading(p_ms=80.0, over=True, comfortable=False, overloaded=True, saturated=True)
    d = gates.no_curve(TunerState(bad_windows=2), IN_FORCE, over, blind, NOW, "seen")
    assert (d.changed, d.replicas, d.batching, d.bound_by) == (True, 5, IN_FORCE.batching, "no-curve")
    d = gates.no_curve(TunerState(), IN_FORCE, _reading(), blind, NOW, "seen")
    assert (d.action, d.reason_code) == ("hold", law.WITHIN_BAND)


# Guards that hold --------------------------------------------------------------------------------------------------


def test_guard_hysteresis_band_holds_a_first_bad_window_and_a_calm_one() -> None:
    """Caught: one noisy window past the aim acted on; a config within the band reloaded."""
    d = guards.hysteresis_band(_tick(relieve=False, relax=False, at_risk=False))
    assert d is not None and (d.reason_code, d.bound_by) == (law.WITHIN_BAND, "hysteresis-band")
    assert guards.hysteresis_band(_tick(relieve=True)) is None
    assert guards.hysteresis_band(_tick(relieve=False, relax=True)) is None


def test_guard_backlog_draining_waits_for_a_queue_that_drains() -> None:
    """Caught: a scale-out for a backlog the replicas in force are already draining."""
    tick = _tick(relieve=True)
    draining = dataclasses.replace(tick, w=dataclasses.replace(tick.w, r=_reading(draining=True)))
    d = guards.backlog_draining(draining)
    assert d is not None and (d.reason_code, d.bound_by) == (law.BACKLOG_DRAINING, "backlog-draining")
    assert guards.backlog_draining(tick) is None


def test_guard_cooldown_holds_within_the_cooldown_of_the_last_change() -> None:
    """Caught: a second change before the first one's effect was measured."""
    recent = IN_FORCE.model_copy(update={"changed_at": NOW - timedelta(seconds=POLICY.cooldown_seconds / 2)})
    d = guards.cooldown(_tick(in_force=recent))
    assert d is not None and (d.reason_code, d.bound_by) == (law.COOLDOWN, "cooldown")
    assert guards.cooldown(_tick()) is None


# Guards on the batching and the count ------------------------------------------------------------------------------


def test_guard_reload_budget_keeps_a_batching_that_carries_the_load() -> None:
    """Caught: a reload (a pause on every pod) for a few percent of robustness."""
    current, better = _cand(16, robust=600.0, capacity=900.0), _cand(32, robust=650.0, capacity=950.0)
    plan = Plan(better, 4, True, 2000.0)
    p = guards.reload_budget(Proposal(better, 4), plan, current, IN_FORCE, _reading(), False, POLICY)
    assert (p.target, p.bound_by) == (current, "reload-budget")
    much_better = _cand(32, robust=2000.0, capacity=3000.0)
    plan = Plan(much_better, 4, True, 2000.0)
    p = guards.reload_budget(Proposal(much_better, 4), plan, current, IN_FORCE, _reading(), False, POLICY)
    assert (p.target, p.bound_by) == (much_better, "")


def test_guard_reload_budget_under_a_backlog_reloads_for_capacity_alone() -> None:
    """Caught: under a backlog that no config drains within the SLO, the reload to the batching with a quarter more
    capacity was held because it carried a little less within the aim (the robustness the aim measures), and the
    queue grew at the smaller capacity (in sample: a flash crowd past one replica's capacity, 0.969 of Triton's
    default, whose larger max batch drained it)."""
    current = _cand(24, robust=3076.0, capacity=4700.0, burst=4700.0)
    bigger = _cand(32, robust=2945.0, capacity=5800.0, burst=5800.0)
    plan = Plan(bigger, 1, False, 5058.0)
    one = IN_FORCE.model_copy(update={"replicas": 1})
    backlog = _reading(p_ms=3870.0, demand_rps=3964.0, saturated=True, over=True, comfortable=False, backlog=9e4)
    p = guards.reload_budget(Proposal(bigger, 1), plan, current, one, backlog, True, POLICY)
    assert (p.target, p.bound_by) == (bigger, "")
    # Without a backlog the same plan keeps the batching that carries more within the aim.
    calm = _reading(p_ms=20.0, demand_rps=2000.0)
    p = guards.reload_budget(Proposal(bigger, 1), Plan(bigger, 1, True, 2300.0), current, one, calm, False, POLICY)
    assert (p.target, p.bound_by) == (current, "reload-budget")


def test_guard_stabilized_batching_keeps_the_capacity_the_recent_peak_needs() -> None:
    """Caught: a batching change for the aim that cannot keep up with the burst of a minute ago."""
    current, small = _cand(16, robust=600.0, capacity=1500.0), _cand(4, robust=700.0, capacity=800.0)
    peak_need = 4 * 1000.0 * POLICY.demand_margin  # 1000 req/s a replica at the peak: 4 x 800 is short of it
    p, held = guards.stabilized_batching(
        Proposal(small, 4), current, IN_FORCE, _reading(), POLICY, frozenset(), peak_need
    )
    assert held and (p.target, p.bound_by) == (current, "stabilized-batching") and "the batching stays" in p.notes[0]
    p, held = guards.stabilized_batching(Proposal(small, 4), current, IN_FORCE, _reading(), POLICY, frozenset(), 100.0)
    assert not held and p.target == small


def test_guard_no_cut_under_backlog_keeps_the_capacity_in_force() -> None:
    """Caught: fewer replicas while requests are queued."""
    current = _cand(16, robust=600.0, capacity=900.0)
    backlog = _reading(saturated=True, backlog=500.0)
    p = guards.no_cut_under_backlog(Proposal(current, 2), current, IN_FORCE, backlog, POLICY)
    assert (p.replicas, p.bound_by) == (4, "no-cut-under-backlog")
    assert guards.no_cut_under_backlog(Proposal(current, 2), current, IN_FORCE, _reading(), POLICY).replicas == 2


def test_guard_no_scale_out_without_pressure() -> None:
    """Caught: a plan short of its margin scaled out while the latency holds."""
    c = _cand(16, robust=600.0, capacity=900.0)
    short = Plan(c, 8, False, 6000.0)
    p = guards.no_scale_out_without_pressure(Proposal(c, 8), short, IN_FORCE, relieve=False)
    assert (p.replicas, p.bound_by) == (4, "no-scale-out-without-pressure")
    assert guards.no_scale_out_without_pressure(Proposal(c, 8), short, IN_FORCE, relieve=True).replicas == 8


# A scale-in --------------------------------------------------------------------------------------------------------


def test_guard_scale_in_within_slo_keeps_what_the_upper_bound_needs() -> None:
    """Caught: a scale-in to a count that the demand's upper bound over the lead time would push past the SLO."""
    tick = _tick(upper_rps=2000.0)
    p = guards.scale_in_within_slo(Proposal(tick.current, 1), tick)
    assert 1 < p.replicas <= 4 and p.bound_by == "scale-in-within-slo" and "upper bound" in p.notes[0]
    assert guards.scale_in_within_slo(Proposal(tick.current, 4), tick).bound_by == ""


def test_scale_in_holds_the_slo_at_the_upper_bound_without_the_plans_margin() -> None:
    """Caught: on a falling demand, a scale-in held at the count that keeps the aim with the demand's margin at the
    demand's upper bound over the lead time (the rise of the morning on top of the evening's demand): the bound
    already is the worst the demand did within a lead time, and the aim and the margin on it counted that
    variation twice. The count given back to is the fewest the model holds within the SLO at the bound (erring
    as on the config in force), no fewer than the plan's."""
    # The demand rose by 1500 req/s within a lead time, held, and fell back to 2000 req/s since.
    levels = [2000.0] * 3 + [3500.0] * 4 + [2750.0, 2000.0, 2000.0, 2000.0]
    recent = tuple((NOW - timedelta(seconds=30 * (len(levels) - i)), x) for i, x in enumerate(levels))
    st = TunerState(recent_demand=recent, calm_windows=POLICY.good_windows)
    obs = steady_window(p99=15.0, rate=2000.0, replicas=4, queue_ms=1.0, compute_ms=_t(8))
    d = law.decide(st, IN_FORCE, obs, POLICY, NOW)
    upper = upper_demand_rps(d.state.recent_demand, limits(POLICY, d.state))
    curve, b = Curve(POLICY.build_curve), d.batching
    mild = min(law.CANDIDATE_CALIBRATION[1], max(law.CANDIDATE_CALIBRATION[0], d.state.calibration))
    cal = max(mild, d.state.calibration)
    at_slo = POLICY.model_copy(update={"headroom": 1.0})
    within_slo = law.candidate(curve, b.max_batch_size, b.max_queue_delay_microseconds, at_slo, cal).carries()
    within_aim = law.candidate(curve, b.max_batch_size, b.max_queue_delay_microseconds, POLICY, cal).carries()
    need_slo = math.ceil(upper / within_slo)
    # The premise: the aim with the margin at the bound keeps every replica in force; the SLO at it does not.
    assert need_slo < IN_FORCE.replicas <= math.ceil(upper * POLICY.demand_margin / within_aim), (upper, d.reason)
    assert d.changed and d.reason_code == law.SCALED_IN, d.reason
    assert d.replicas >= need_slo and d.replicas < IN_FORCE.replicas, d.reason
    p = predict(curve.ms, b.max_batch_size, b.max_queue_delay_microseconds, 1, upper / d.replicas, POLICY.percentile)
    assert p.p_ms * cal <= POLICY.slo_ms, (p.p_ms, cal, d.reason)


def test_upper_demand_bound_covers_the_lookback_peak_and_a_rise_seen_within_a_lead_time() -> None:
    """Caught: a scale-in sized on the last window alone, after a peak within the lead time or on a demand that
    rose that fast before (a replica given back is back only a lead time later)."""
    lim = limits(POLICY, TunerState())  # no pod start measured yet: one interval, and a window to see the rise
    assert lim.lead_s == 2 * POLICY.interval_seconds and lim.lookback_s == lim.lead_s
    at = [NOW - timedelta(seconds=30 * i) for i in range(6, -1, -1)]
    flat = tuple((t, 1000.0) for t in at)
    assert upper_demand_rps(flat, lim) == 1000.0
    fell = (*flat[:-2], (at[-2], 1600.0), (at[-1], 1000.0))
    assert upper_demand_rps(fell, lim) == 1600.0  # the peak 30 s ago is within the lead time
    rose_before = ((at[0], 400.0), (at[1], 1000.0), *flat[2:])
    assert upper_demand_rps(rose_before, lim) == 1600.0  # it rose by 600 within a lead time: it may again
    # The spec's stabilization window is the HPA's: the highest demand over all of it.
    hpa = limits(POLICY.model_copy(update={"scale_in_stabilization_seconds": 300.0}), TunerState())
    assert upper_demand_rps(((at[0], 1600.0), *flat[1:]), hpa) == 1600.0
    measured = limits(POLICY, TunerState(startup_seconds=90.0))
    assert measured.lead_s == POLICY.interval_seconds + 90.0


def test_measured_margin_is_the_demands_own_variability_within_the_fixed_one() -> None:
    """Caught: every plan carried the utilisation target's fixed margin (x1.18) whatever the demand did, so a
    smooth demand paid for variability it never showed. The margin is the demand's upper bound over the lead time
    over its present value or the factor it fell by within one, at least a window's Poisson noise, at most the
    fixed margin; unknown (the fixed one)
    before the history covers the demand's memory."""
    lim = limits(POLICY, TunerState())
    n = round(lim.memory_s / POLICY.interval_seconds)
    at = [NOW - timedelta(seconds=30 * i) for i in range(n, -1, -1)]
    flat = tuple((t, 1000.0) for t in at)
    noise = 1.0 + DEMAND_NOISE_Z / math.sqrt(1000.0 * POLICY.interval_seconds)
    assert measured_margin(flat, lim, POLICY) == noise < POLICY.fixed_margin
    # Short of the memory: not measured.
    assert measured_margin(flat[-3:], lim, POLICY) is None
    # A rise of 5 % within a lead time somewhere in the memory: that rise is the margin.
    wiggle = ((at[0], 1000.0), (at[1], 1050.0), *((t, 1000.0) for t in at[2:]))
    assert math.isclose(measured_margin(wiggle, lim, POLICY) or 0.0, 1.05)
    # A fall by 6 % within a lead time: it may rise as much.
    dip = ((at[0], 1060.0), (at[1], 1000.0), *((t, 1000.0) for t in at[2:]))
    assert math.isclose(measured_margin(dip, lim, POLICY) or 0.0, 1.06)
    # A rise past the fixed margin: the fixed margin (never more than v2 planned for).
    jump = ((at[0], 500.0), (at[1], 1000.0), *((t, 1000.0) for t in at[2:]))
    assert measured_margin(jump, lim, POLICY) == POLICY.fixed_margin
    # The tick plans with it: a smooth history plans less load than the fixed margin would.
    tick = _tick(state=TunerState(recent_demand=tuple((t, 2000.0) for t in at[:-1])))
    assert tick.policy.demand_margin < POLICY.fixed_margin and tick.load_rps < 2000.0 * POLICY.fixed_margin


def test_guard_scale_in_above_too_few_stops_above_a_count_that_broke_the_aim() -> None:
    """Caught: a scale-in back to 2 replicas, which broke the aim at this demand ten minutes ago."""
    few = TooFewReplicas(replicas=2, demand_rps=2000.0, at=NOW - timedelta(minutes=10))
    tick = _tick(st=TunerState(too_few=(few,)))
    p = guards.scale_in_above_too_few(Proposal(tick.current, 1), tick)
    assert (p.replicas, p.bound_by) == (3, "scale-in-above-too-few")
    assert guards.scale_in_above_too_few(Proposal(tick.current, 1), _tick()).replicas == 1


def test_guard_no_scale_in_under_pressure_or_on_a_short_history() -> None:
    """Caught: a replica given back under pressure, or before the demand's history covers the lookback."""
    tick = _tick(relieve=True)
    p = guards.no_scale_in_under_pressure(Proposal(tick.current, 2), tick)
    assert (p.replicas, p.bound_by) == (4, "no-scale-in-under-pressure")
    young = _tick(state=TunerState())
    assert guards.no_scale_in_under_pressure(Proposal(young.current, 2), young).replicas == 4
    assert guards.no_scale_in_under_pressure(Proposal(tick.current, 2), _tick()).replicas == 2


def test_guard_scale_in_by_half_gives_back_at_most_half_at_once() -> None:
    """Caught: 4 replicas down to 1 in one step (a step soon after meets a quarter of the capacity)."""
    tick = _tick()
    p = guards.scale_in_by_half(Proposal(tick.current, 1), tick)
    assert (p.replicas, p.bound_by) == (2, "scale-in-by-half") and "at most half" in p.notes[0]
    assert guards.scale_in_by_half(Proposal(tick.current, 3), tick).replicas == 3


def test_guard_band_keeps_batching_on_a_scale_in_within_the_band() -> None:
    """Caught: a reload for the aim alone slipped in with a scale-in that calm (not comfortable) windows allow."""
    other = dataclasses.replace(_tick().current, max_batch=32)
    within = _tick(relax=False, relieve=False, at_risk=False)
    p = guards.band_keeps_batching(Proposal(other, 2), within)
    assert (p.target.max_batch, p.replicas, p.bound_by) == (16, 2, "hysteresis-band")
    assert guards.band_keeps_batching(Proposal(other, 2), _tick(relax=True)).target.max_batch == 32


def test_guard_drain_floor_counts_the_replicas_that_drain_the_fullest_pod() -> None:
    """Caught: a scale-out sized on the demand alone, while the first pod's queue takes minutes to drain."""
    queued = CALM.model_copy(update={"queue_growth_rps": 400.0, "pending_max": 80_000.0, "queue_ms": 200.0})
    tick = _tick(queued)
    p = guards.drain_floor(Proposal(tick.current, 4), tick)
    assert p.replicas > 4 and p.bound_by == "drain-floor" and "fullest pod" in p.notes[0]
    assert guards.drain_floor(Proposal(tick.current, 4), _tick()).replicas == 4


def test_guard_queue_over_model_adds_a_replica_where_requests_pile_up() -> None:
    """Caught: a config the model says suffices held while its queue grows."""
    tick = _tick(relieve=True)
    piling = dataclasses.replace(tick, w=dataclasses.replace(tick.w, r=_reading(saturated=True)))
    p = Proposal(dataclasses.replace(tick.current, max_batch=16, delay_us=0), 4)
    assert guards.queue_over_model(p, piling).replicas == 5
    assert guards.queue_over_model(p, tick).replicas == 4


def test_decide_names_what_bound_it() -> None:
    """Caught: a decision that does not say which gate or guard bound it ("": the plan went through as made)."""
    d = law.decide(TunerState(last_window_end=NOW), IN_FORCE, CALM, POLICY, NOW)
    assert (d.reason_code, d.bound_by) == (law.WINDOW_ALREADY_SEEN, "window-already-seen")
    d = law.decide(TunerState(), IN_FORCE, CALM, POLICY, NOW)
    assert (d.reason_code, d.bound_by) == (law.WITHIN_BAND, "hysteresis-band")
    history = tuple((NOW - timedelta(seconds=30 * i), 2000.0) for i in range(12, 0, -1))
    calm = TunerState(recent_demand=history, good_windows=POLICY.good_windows)
    d = law.decide(calm, IN_FORCE, CALM, POLICY, NOW)
    assert (d.reason_code, d.replicas, d.bound_by) == (law.SCALED_IN, 2, "")
    eight = IN_FORCE.model_copy(update={"replicas": 8})
    d = law.decide(calm, eight, CALM.model_copy(update={"ready_replicas": 8}), POLICY, NOW)
    assert (d.reason_code, d.replicas, d.bound_by) == (law.SCALED_IN, 4, "scale-in-by-half")


def test_plan_keeps_up_with_the_demand_before_it_avoids_a_config() -> None:
    """Caught: short of the SLO at every config, the configs left for breaking it (the larger batches, which alone
    keep up) were avoided, and the plan took the most capacity among the rest: a max batch whose capacity on every
    replica allowed is below the demand, a queue that grew for minutes (seen in bench/tuner/run.py --cost, an
    on/off trace whose peak no config holds within the SLO). Avoiding a config never costs keeping up."""
    curve = Curve(POLICY.build_curve)
    policy = POLICY.model_copy(update={"replicas_max": 2})
    caps = {b: law.candidate(curve, b, 0, policy, 1.0).capacity_rps for b in (8, 16, 32)}
    demand = 2 * (caps[16] + caps[32]) / 2  # only max batch 32 keeps up on 2 replicas
    assert 2 * caps[16] < demand <= 2 * caps[32]
    avoid = frozenset({(32, 0), (24, 0)})
    plan = law.best_plan(curve, demand * policy.demand_margin, policy, 1.0, backlog=True, avoid=avoid)
    assert plan.candidate.capacity_rps * policy.replicas_max >= demand, plan
    # Where a config left in keeps up, the avoided ones stay out.
    plan = law.best_plan(curve, 0.5 * demand * policy.demand_margin, policy, 1.0, backlog=True, avoid=avoid)
    assert (plan.candidate.max_batch, plan.candidate.delay_us) not in avoid, plan
