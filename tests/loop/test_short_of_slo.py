"""The law where no config holds the SLO (goodput first), and on ramps (planned where the demand will be).

The goodput cases run the law against the simulator (`whatif`) on a generated family of TensorRT-style stepwise
curves overloaded at one replica: the batches a large max batch settles at take longer than the SLO, so a config
that keeps up with the most capacity answers almost nothing in time while a small one answers most of the demand.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import numpy as np

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner import law
from tailtune.tuner.model import chained, predict, settle
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import InForce, Policy, TunerState
from tests.sampling import cases, enough, floor, wanted
from tests.unit.tuner.families import NOW, SPAN, in_force_share, steady_window, stepwise_edge


def test_a_steep_edge_carries_the_batcher_to_the_plateau_above() -> None:
    """On a plateau-edge-plateau curve, batches that start at the low fixed point reach the edge within the hour
    and settle at the fixed point above it: `settle` and `predict` say so, and the simulator agrees."""
    from tailtune.sim import SimCluster, poisson

    rng = np.random.default_rng(77)
    for i in range(4):
        curve = stepwise_edge(rng)
        a = curve.ms(1)
        rate = 0.8 * 1000.0 * 4 / a
        b = settle(curve.ms, 64, 0, rate)
        assert b is not None and b > 8, (i, b)  # past the edge, not the plateau's ~3
        trace = poisson(rate, 130.0, i)
        sim = SimCluster(curve, trace.arrivals, Batching(max_batch_size=64), 1, engine_max_batch=64, seed=i)
        sim.advance(130.0)
        arr, lat = sim.outcomes()
        p99 = float(np.percentile(lat[arr >= 10.0], 99)) * 1000
        pred = predict(curve.ms, 64, 0, 1, rate).p_ms
        assert 0.5 <= pred / p99 <= 2.0, (i, pred, p99)


def _recent(demands: list[float]) -> tuple[tuple[object, float], ...]:
    return tuple((NOW - timedelta(seconds=30 * (len(demands) - 1 - k)), d) for k, d in enumerate(demands))


def test_a_sustained_ramp_is_a_trend_and_a_step_or_noise_is_not() -> None:
    rng = np.random.default_rng(5)
    for i in range(cases(200)):
        base = float(rng.uniform(50, 5000))
        rise = base * float(rng.uniform(0.08, 0.3))  # per 30 s window
        ramp = [base + float(x) for x in np.cumsum([0.0, *(rise * rng.uniform(0.8, 1.2, size=3))])]
        slope = law.ramp_rps_per_s(_recent(ramp))  # type: ignore[arg-type]
        assert slope > 0, (i, ramp)
        assert abs(slope - (ramp[-1] - ramp[-3]) / 60) < 1e-6 * base, (i, ramp, slope)
        flat = [base * float(rng.uniform(0.97, 1.03)) for _ in range(4)]
        step = [*flat[:3], base * float(rng.uniform(1.5, 5.0))]
        assert law.ramp_rps_per_s(_recent(flat)) == 0.0, (i, flat)  # type: ignore[arg-type]
        assert law.ramp_rps_per_s(_recent(step)) == 0.0, (i, step)  # type: ignore[arg-type]


def test_a_scale_out_keeps_the_batching_that_carries_its_share() -> None:
    """Relieving bad windows by a replica more, the law does not also reload a batching in force that carries the
    per-replica load at the new count (bench scenario 004: max batch 4 -> 3 with 2 -> 3 replicas paused every pod
    while the third was not ready, and broke the SLO for that window)."""
    ladder = [(b, 2.0 + 0.4 * b**1.3) for b in (1, 2, 4, 8, 16, 32, 64)]
    policy = Policy(
        slo_ms=8.96, batch_max=64, replicas_max=3, build_curve=tuple(CurvePoint(batch=b, ms=ms) for b, ms in ladder)
    )
    in_force = InForce(batching=Batching(max_batch_size=4), replicas=2, changed_at=NOW - timedelta(minutes=5))
    seen = 0
    for p99 in (7.5, 7.9, 8.5):
        for calibration in (0.8, 1.0, 1.2, 1.4):
            obs = steady_window(p99, 1111.0, replicas=2, queue_ms=1.0, compute_ms=4.0)
            state = TunerState(last_window_end=NOW - timedelta(seconds=30), bad_windows=1, calibration=calibration)
            d = law.decide(state, in_force, obs, policy, NOW)
            if not (d.changed and d.replicas > in_force.replicas):
                continue
            # Whether the model (at the share of the updated calibration a candidate gets) has max batch 4 carry
            # the demand at the new count.
            mild = min(law.CANDIDATE_CALIBRATION[1], max(law.CANDIDATE_CALIBRATION[0], d.state.calibration))
            carries = law.candidate(Curve(policy.build_curve), 4, 0, policy, mild).carries() * d.replicas >= 1111.0
            if carries:
                seen += 1
                assert d.batching.max_batch_size == 4, (p99, calibration, d.reason)
    assert seen >= 2, seen


def test_short_of_the_slo_a_batching_whose_full_batches_fall_behind_is_left() -> None:
    """Short of the SLO whatever the config, the law keeps the batching in force unless another answers a good
    deal more within the SLO; but not one whose full batches drain less than the planned load where the plan's
    drain it: on a superlinear curve its batches run away at the first burst, which the model's share (a normal
    spread around where batches settle) misses. Bench seed 11's 041 (measured curve, a step to 495 req/s): max
    batch 8 kept at 0.87 of the oracle's goodput, max batch 4 (the oracle's) 1.00."""
    rng = np.random.default_rng(1209)
    checked = 0
    for i in range(cases(80)):
        a = float(rng.uniform(1.5, 6.0))
        c, p = a / float(rng.uniform(3.0, 12.0)), float(rng.uniform(1.2, 1.7))
        ladder = [(b, round(a + c * b**p, 4)) for b in (1, 2, 4, 8, 16, 32, 64)]
        best = max((b for b, _ in ladder), key=lambda b: b / (a + c * b**p))
        big = int(rng.choice([b for b, _ in ladder if b > best][:2]))
        t_best, t_big = a + c * best**p, a + c * big**p
        slo = round(float(rng.uniform(1.2, 2.0)) * t_best, 2)
        policy = Policy(
            slo_ms=slo, batch_max=64, replicas_max=1, build_curve=tuple(CurvePoint(batch=b, ms=ms) for b, ms in ladder)
        )
        # A demand whose margin lies between what full batches of `big` drain and what full batches of `best` do.
        lo, hi = 1000.0 * big / t_big, 1000.0 * best / t_best
        load = float(rng.uniform(lo, hi))
        rate = load / policy.demand_margin
        in_force = InForce(batching=Batching(max_batch_size=big), replicas=1, changed_at=NOW - timedelta(minutes=5))
        obs = steady_window(slo * float(rng.uniform(1.5, 4.0)), rate, replicas=1, queue_ms=0.5, compute_ms=t_best)
        state = TunerState(last_window_end=NOW - timedelta(seconds=30), bad_windows=1)
        d = law.decide(state, in_force, obs, policy, NOW)
        curve = Curve(policy.build_curve)
        mild = min(law.CANDIDATE_CALIBRATION[1], max(law.CANDIDATE_CALIBRATION[0], d.state.calibration))
        plan = law.best_plan(curve, load, policy, mild, backlog=False, peak_rps=load)
        if plan.share is None or plan.candidate.burst_rps < load:
            continue  # not short of the SLO everywhere, or the plan's batching falls behind too
        checked += 1
        after = law.candidate(curve, d.batching.max_batch_size, d.batching.max_queue_delay_microseconds, policy, mild)
        assert after.burst_rps >= load, (i, ladder, slo, rate, d.reason)
    assert checked >= floor(10, 80), checked


def test_where_nothing_keeps_the_aim_a_config_holding_the_slo_with_room_is_kept() -> None:
    """With a latency floor (a queue delay's window of about t(B), then the execution) just under the SLO and over
    the aim, the load the model has a config carry within the SLO swings by a third with a percent of calibration: a
    ranking that flips from window to window. A config in force that holds the SLO and carries the planned load with
    room to spare stays unless another's full batches drain a good deal more (in-sample 024: max batch 32 -> 24 ->
    32 -> 19 -> 32 -> 22 within the SLO, six reloads for nothing)."""
    points = ((1, 3.9958), (2, 4.0459), (4, 4.1462), (8, 4.3467), (12, 4.5472), (16, 4.7478), (24, 5.1488))
    points += ((32, 5.5499),)
    # Two instances on the device form a delay's batches apart while it keeps up: only a delay of about t(B) holds
    # this SLO at the load drawn, and nothing holds the aim.
    policy = Policy(
        slo_ms=12.5, batch_max=32, instances=2, build_curve=tuple(CurvePoint(batch=b, ms=ms) for b, ms in points)
    )
    curve = Curve(policy.build_curve)
    at_slo = policy.model_copy(update={"headroom": 1.0})
    rng = np.random.default_rng(1211)
    kept = 0
    for i in range(cases(40)):
        mb = int(rng.choice([16, 19, 22, 24, 32]))
        delay = max(law.candidate_delays(curve, mb, policy))
        in_force = InForce(
            batching=Batching(max_batch_size=mb, max_queue_delay_microseconds=delay),
            replicas=1,
            changed_at=NOW - timedelta(minutes=5),
        )
        rate = float(rng.uniform(1100.0, 1400.0))
        calibration = float(rng.uniform(0.96, 1.04))
        p99 = float(rng.uniform(policy.aim_ms * 1.05, policy.slo_ms * 0.97))
        obs = steady_window(p99, rate, replicas=1, queue_ms=0.3, compute_ms=5.0)
        state = TunerState(last_window_end=NOW - timedelta(seconds=30), bad_windows=1, calibration=calibration)
        d = law.decide(state, in_force, obs, policy, NOW)
        mild = min(law.CANDIDATE_CALIBRATION[1], max(law.CANDIDATE_CALIBRATION[0], d.state.calibration))
        load = rate * policy.demand_margin
        if not law.best_plan(curve, load, policy, mild, backlog=False, peak_rps=load).within_slo_only:
            continue  # the aim is in reach at this calibration
        current = law.candidate(curve, mb, delay, at_slo, mild)
        if current.carries() < law.SWITCH_GAIN * load:
            continue
        kept += 1
        after = (d.batching.max_batch_size, d.batching.max_queue_delay_microseconds)
        if after != (mb, delay):
            # Only for a batching whose full batches drain a good deal more (a property of the curve alone).
            target = law.candidate(curve, *after, at_slo, mild)
            assert target.burst_rps >= law.BURST_GAIN * current.burst_rps, (i, d.reason)
    assert kept >= floor(20, 40), kept


def test_a_foretold_break_where_nothing_holds_the_slo_is_left_after_one_window_for_much_more_goodput() -> None:
    """Where nothing holds the SLO at the demand, a window past the SLO that the model foretold for the config in
    force is acted on at once when the plan answers a good deal more of the demand within it (SHARE_GAIN, and
    SWITCH_GAIN times as much unless both shares come from the queue-length chain) and the demand did not just
    rise, or rose before the window (its tail shows no more demand than the whole: a crowd that entered part way
    through shows more there); else it is a bad window to confirm. Generated: stepwise curves (a plateau, a steep
    profile edge), a large max batch in force, a demand nothing carries within
    the SLO."""
    acted = confirmed = by_gain = 0
    for i in range(300):
        if enough(acted, 10) and enough(confirmed, 3) and enough(by_gain, 1):
            break  # the suite's sample of each kind (the benchmark runs all 300)
        rng = np.random.default_rng((1212, i))  # one generator per case: a case replays by its number alone
        ladder = list(stepwise_edge(rng).points)
        a = ladder[0][1]
        slo = round(float(rng.uniform(1.5, 4.0)) * a, 2)
        policy = Policy(
            slo_ms=slo, batch_max=64, replicas_max=1, build_curve=tuple(CurvePoint(batch=b, ms=ms) for b, ms in ladder)
        )
        curve = Curve(policy.build_curve)
        big = int(rng.choice([16, 32, 64]))
        most = law.candidate(curve, big, 0, policy, 1.0).capacity_rps
        rate = float(rng.uniform(0.3, 0.8)) * most
        in_force = InForce(batching=Batching(max_batch_size=big), replicas=1, changed_at=NOW - timedelta(minutes=5))
        per_ms = predict(curve.ms, big, 0, 1, rate, 99.0).p_ms
        if per_ms <= slo:
            continue  # not foretold
        obs = steady_window(per_ms * float(rng.uniform(0.9, 1.3)), rate, replicas=1, queue_ms=0.5, compute_ms=a)
        if (obs.p_latency_ms or 0.0) <= slo:
            continue
        d = law.decide(TunerState(last_window_end=NOW - timedelta(seconds=30)), in_force, obs, policy, NOW)
        # Planned as the law plans: with the share of the window's calibration other configs get.
        mild = min(law.CANDIDATE_CALIBRATION[1], max(law.CANDIDATE_CALIBRATION[0], d.state.calibration))
        plan = law.best_plan(curve, rate * policy.demand_margin, policy, mild, backlog=False, peak_rps=rate)
        if plan.share is None:
            continue  # something holds the SLO at the demand (with or without the margin): other rules
        in_share = in_force_share(curve, in_force.batching, policy, mild, rate, plan.replicas)
        # The ratio too, unless both shares come from the queue-length chain (one instance, no queue delay).
        ratio = in_share * law.SWITCH_GAIN * 1.2 < plan.share
        exact = chained(plan.candidate.max_batch, plan.candidate.delay_us, 1) and chained(big, 0, 1)
        if plan.share - in_share >= 1.2 * law.SHARE_GAIN and (ratio or exact):
            acted += 1
            by_gain += not ratio
            assert d.action == "change" and d.reason_code != law.CONFIRMING, (i, ladder, slo, rate, d.reason)
            assert d.batching.max_batch_size < big, (i, d.reason)
            # ... but not in a window whose demand just rose (a crowd's first understates it): confirmed first.
            before = (obs.window_end - timedelta(seconds=SPAN), 0.5 * rate)
            risen = TunerState(last_window_end=NOW - timedelta(seconds=30), recent_demand=(before,))
            d2 = law.decide(risen, in_force, obs, policy, NOW)
            assert (d2.action, d2.reason_code) == ("hold", law.CONFIRMING), (i, d2.reason)
            # ... nor where the window's tail shows more demand than the whole (the crowd entered part way) ...
            part = obs.model_copy(update={"tail_demand_rps": (1 + 2 * law.GROWTH_SHARE) * rate})
            d3 = law.decide(risen, in_force, part, policy, NOW)
            assert (d3.action, d3.reason_code) == ("hold", law.CONFIRMING), (i, d3.reason)
            # ... but where the tail shows the window's demand, the rise held across the window: acted on at once.
            whole = obs.model_copy(update={"tail_demand_rps": rate * float(rng.uniform(0.9, 1.0 + law.GROWTH_SHARE))})
            d4 = law.decide(risen, in_force, whole, policy, NOW)
            assert d4.action == "change" and d4.batching == d.batching, (i, d4.reason)
        elif plan.share - in_share < 0.8 * law.SHARE_GAIN:
            confirmed += 1
            assert (d.action, d.reason_code) == ("hold", law.CONFIRMING), (i, ladder, slo, rate, d.reason)
    assert acted >= wanted(10) and confirmed >= wanted(3) and by_gain >= wanted(1), (acted, confirmed, by_gain)


def test_the_ratio_of_shares_guards_only_the_normal_spread() -> None:
    """A share gain of SHARE_GAIN is enough where both shares come from the queue-length chain (one instance, no
    queue delay: its error stays under that gain); where either comes from the normal spread (two instances, a
    queue delay), whose error runs to half the demand, the plan must also answer SWITCH_GAIN times as much."""
    c = law.Candidate(max_batch=4, delay_us=0, capacity_rps=600.0, robust_rps=400.0, extrapolated=False)
    current = dataclasses.replace(c, max_batch=8, capacity_rps=900.0)
    one, two = Policy(slo_ms=12.0, instances=1), Policy(slo_ms=12.0, instances=2)
    # 0.81 -> 0.93: a gain of 0.12 at a ratio of 1.148.
    assert law._share_gained(0.93, c, 0.81, current, one)
    assert not law._share_gained(0.93, c, 0.81, current, two)
    assert not law._share_gained(0.93, c, 0.81, dataclasses.replace(current, delay_us=500), one)
    assert not law._share_gained(0.93, c, 0.84, current, one)  # a gain under SHARE_GAIN
    assert law._share_gained(0.93, c, 0.5, current, two)  # a gain and a ratio
    assert not law._share_gained(None, c, 0.1, current, one)  # no share: nothing gained


def test_a_foretold_break_is_left_after_one_window_for_a_config_holding_the_slo_at_the_demand() -> None:
    """Where no config holds the SLO with the margin but one holds it at the measured demand itself, a window past
    the SLO that the model foretold for the config in force is acted on at once (before: a second window, a window
    more of the goodput lost; out-of-sample seed 23's 044 lost a crowd's first window so), unless a crowd entered
    the window part way through (its demand rose, and its tail shows more than the whole) or the rise is a burst
    like one that came and went before: the move a second window would make, a window sooner. Generated: power-law
    and stepwise curves, a large max batch in force, one replica, a demand past what the most robust config carries
    within the aim. Where the plan falls short of the demand too, at once only for a good deal more of it answered
    within the SLO."""
    rng = np.random.default_rng(1303)
    acted = by_gain = confirmed = 0
    for i in range(200):
        if enough(acted, 15) and enough(confirmed, 3):
            break  # the suite's sample of each kind (the benchmark runs all 200)
        if i % 2:
            ladder = list(stepwise_edge(rng).points)
        else:
            a, c, e = float(rng.uniform(2.0, 8.0)), float(rng.uniform(0.1, 1.0)), float(rng.uniform(1.1, 1.6))
            ladder = [(b, round(a + c * b**e, 3)) for b in (1, 2, 4, 8, 16, 32, 64)]
        slo = round(float(rng.uniform(2.0, 5.0)) * ladder[0][1], 2)
        policy = Policy(
            slo_ms=slo, batch_max=64, replicas_max=1, build_curve=tuple(CurvePoint(batch=b, ms=ms) for b, ms in ladder)
        )
        curve = Curve(policy.build_curve)
        big = int(rng.choice([32, 64]))
        # About where the most robust config runs out of the aim: past it, within the SLO or not.
        top = law.best_plan(curve, 1e9, policy, 1.0, backlog=False)
        rate = top.candidate.carries() * float(rng.uniform(1.0, 1.6))
        plan = law.best_plan(curve, rate * policy.demand_margin, policy, 1.0, backlog=False, peak_rps=rate)
        if plan.feasible or plan.share is not None:
            continue  # not this rule's case: the plan holds the margin, or nothing holds the SLO at the demand
        if (plan.candidate.max_batch, plan.candidate.delay_us) == (big, 0):
            continue
        at_demand = plan.candidate.carries() >= rate
        per_ms = predict(curve.ms, big, 0, 1, rate, 99.0).p_ms
        if per_ms <= slo or rate >= law.candidate(curve, big, 0, policy, 1.0).capacity_rps:
            continue  # not foretold, or a backlog (other rules)
        # The latency the model foretold (a model erring on the config in force is another rule's: evidence).
        obs = steady_window(per_ms, rate, 1, 0.5, ladder[0][1])
        in_force = InForce(batching=Batching(max_batch_size=big), replicas=1, changed_at=NOW - timedelta(minutes=5))
        before = (obs.window_end - timedelta(seconds=SPAN), 0.5 * rate)
        risen = TunerState(last_window_end=NOW - timedelta(seconds=30), recent_demand=(before,))
        # The move the law makes once the bad window is confirmed by a second one (none: not this rule's case).
        seen = TunerState(
            last_window_end=NOW - timedelta(seconds=30),
            bad_windows=policy.bad_windows - 1,
            last_bad_window_end=obs.window_start,
        )
        later = law.decide(seen, in_force, obs, policy, NOW)
        if later.action != "change":
            continue
        d = law.decide(TunerState(last_window_end=NOW - timedelta(seconds=30)), in_force, obs, policy, NOW)
        if not at_demand:
            # Short of the demand too: at once only for a good deal more of it answered within the SLO.
            gain, ratio = _gain(curve, plan, in_force.batching, policy, rate)
            exact = chained(plan.candidate.max_batch, plan.candidate.delay_us, 1) and chained(big, 0, 1)
            if gain < 0.8 * law.SHARE_GAIN:
                confirmed += 1
                assert (d.action, d.reason_code) == ("hold", law.CONFIRMING), (i, ladder, slo, rate, d.reason)
            if gain < 1.2 * law.SHARE_GAIN or not (exact or ratio > 1.2 * law.SWITCH_GAIN):
                continue
            by_gain += 1
        acted += 1
        assert d.action == "change" and d.reason_code != law.CONFIRMING, (i, ladder, slo, rate, d.reason)
        assert (d.batching, d.replicas) == (later.batching, later.replicas), (i, d.reason, later.reason)
        new = law.decide(risen, in_force, obs.model_copy(update={"tail_demand_rps": rate}), policy, NOW)
        assert new.action == "change" and new.batching == d.batching, (i, new.reason)
        part = obs.model_copy(update={"tail_demand_rps": 1.5 * rate})
        # A burst: the demand reached this level before within the stabilization window and fell back since.
        came = (obs.window_end - timedelta(seconds=2 * SPAN), rate)
        bursts = risen.model_copy(update={"recent_demand": (came, before)})
        whole = obs.model_copy(update={"tail_demand_rps": rate})
        # A crowd part way through, no tail figure, a burst like one before.
        for state, o in ((risen, part), (risen, obs), (bursts, whole)):
            held = law.decide(state, in_force, o, policy, NOW)
            assert (held.action, held.reason_code) == ("hold", law.CONFIRMING), (i, held.reason)
    # (The family has no case short of the demand with a clear gain: the next test has one.)
    assert acted >= wanted(15) and confirmed >= wanted(3), (acted, by_gain, confirmed)


def _gain(curve: Curve, plan: law.Plan, batching: Batching, policy: Policy, rate: float) -> tuple[float, float]:
    """(gain, ratio) of the share of `rate` the model answers within the SLO with the plan's config over the one
    in force (judged against the SLO, as the plan's candidates)."""
    now = in_force_share(curve, batching, policy, 1.0, rate, plan.replicas)
    then = law.share(curve, plan.candidate, rate, policy, 1.0, plan.replicas)
    return then - now, then / max(now, 1e-9)
