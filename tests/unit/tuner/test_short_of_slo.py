"""The law where no config holds the SLO (goodput first), and on ramps (planned where the demand will be).

The goodput cases run the law against the simulator (`whatif`) on a generated family of TensorRT-style stepwise
curves overloaded at one replica: the batches a large max batch settles at take longer than the SLO, so a config
that keeps up with the most capacity answers almost nothing in time while a small one answers most of the demand.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from datetime import timedelta

import numpy as np

from tailtune.api.v1alpha1 import Batching
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner import law
from tailtune.tuner.model import chained, predict, settle
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import InForce, Policy, TunerState
from tailtune.tuner.whatif import Setup, summarize
from tests.unit.tuner.families import NOW, SPAN, in_force_share, steady_window


def _stepwise(rng: np.random.Generator) -> PiecewiseCurve:
    """A plateau up to batch 4, a steep profile edge to 8 and 12, then a gentle slope to 64."""
    a = float(rng.uniform(5.0, 9.0))
    edge = a * float(rng.uniform(1.2, 1.5))
    pts = [(1, a), (2, a), (4, a), (8, a + edge), (12, a + 2.7 * edge), (16, a + 2.9 * edge)]
    pts += [(b, a + 2.9 * edge + 0.25 * a * (b - 16) / 16) for b in (32, 48, 64)]
    return PiecewiseCurve(tuple((b, round(ms, 3)) for b, ms in pts), f"stepwise(a={a:.1f})")


def test_short_of_the_slo_everywhere_the_law_keeps_the_most_goodput() -> None:
    """Overloaded at the bounds: tailtune answers at least as many requests within the SLO as Triton's default
    (max batch = the engine's), and most of what the best small static config answers (which it has to find
    first: two windows to confirm, one to reload), on every case."""
    rng = np.random.default_rng(1207)
    ratios = []
    for i in range(4):
        curve = _stepwise(rng)
        a = curve.ms(1)
        slo = round(3.0 * a, 2)
        rate = round(float(rng.uniform(0.75, 0.85)) * 1000.0 * 4 / a, 1)  # 75-85 % of what batches of 4 drain
        setup = Setup(
            curve=curve,
            segments=((0.0, 480.0, rate),),
            slo_ms=slo,
            instances=int(rng.choice([1, 2])),
            start_max_batch=1,
            seed=50 + i,
        )
        tailtune = summarize(setup, "tailtune")["goodput_rps"]
        default = summarize(setup, "triton-default")["goodput_rps"]
        small = max(summarize(setup, f"static:{b}:0")["goodput_rps"] for b in (4, 8))
        # The family is what it says: the engine's max batch loses most of the goodput a small one keeps.
        assert default < 0.8 * small, (i, default, small)
        assert tailtune >= default - 0.01 * rate, (i, curve.name, tailtune, default)
        ratios.append(tailtune / small)
    # Known gap: with two instances sharing the device the model can still rank a large max batch above the small
    # one that holds most of the demand (case 3 here: 0.18). The law before this test stayed at max batch 64
    # on all four (under 0.1).
    assert sum(1 for r in ratios if r >= 0.8) >= 3, ratios


def test_a_steep_edge_carries_the_batcher_to_the_plateau_above() -> None:
    """On a plateau-edge-plateau curve, batches that start at the low fixed point reach the edge within the hour
    and settle at the fixed point above it: `settle` and `predict` say so, and the simulator agrees."""
    from tailtune.sim import SimCluster, poisson

    rng = np.random.default_rng(77)
    for i in range(4):
        curve = _stepwise(rng)
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
    for i in range(200):
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


# Two benchmark scenarios (bench/tuner, seed 20261130), two instances on one device, short of the SLO at the
# peak: 021, saturating curve, bursts that return every 15-60 s from Triton's default; 062, stepwise curve, a
# diurnal ramp to near what the largest max batch drains, from max batch 1.
SATURATING = ((1, 13.53), (2, 17.07), (4, 23.0), (8, 31.39), (12, 36.73), (16, 40.24), (24, 44.41), (32, 46.89))
SATURATING += ((48, 50.41), (64, 53.52))
BURSTS = (0.0, 18.4, 57.8, 107.9, 129.0, 164.0, 200.4, 239.5, 275.0, 299.6, 329.2, 347.6, 364.0, 403.3, 446.9, 471.9)
STEPWISE = ((1, 3.54), (2, 3.54), (4, 3.54), (8, 5.51), (12, 7.58), (16, 7.7), (24, 7.93), (32, 8.16), (48, 8.62))
STEPWISE += ((64, 9.08), (96, 13.24), (128, 14.62))


def _collapsed(summary: dict[str, object], slo_ms: float) -> int:
    """Windows whose P99 ran past 3x the SLO (or that left requests unanswered)."""
    timeline = summary["timeline"]
    assert isinstance(timeline, list)
    return sum(1 for w in timeline if w["p_ms"] is None or w["p_ms"] > 3 * slo_ms)


def test_short_of_the_slo_the_law_keeps_up_with_returning_bursts_and_a_rising_ramp() -> None:
    """Short of the SLO at the peak, the law trades capacity for latency only as far as the bursts seen lately
    and a ramp that goes on past its projection allow: it never lets the queue run away where Triton's default
    keeps up, and answers at least as many requests within the SLO. (With a model that rates small batches
    better, the law picked max batch 14 between bursts in 021 and max batch 37 on the ramp in 062: both
    collapsed when the demand came back or rose on, 0.915 and 0.891 of the oracle's goodput.)"""
    bursts = tuple((a, b, 687.48 if k % 2 else 187.08) for k, (a, b) in enumerate(itertools.pairwise((*BURSTS, 480.0))))
    n = 20
    ramp = tuple(
        (24.0 * k, 24.0 * (k + 1), 1430.21 + (5676.24 - 1430.21) * (1 - math.cos(2 * math.pi * (k + 0.5) / n)) / 2)
        for k in range(n)
    )
    setups = (
        Setup(PiecewiseCurve(SATURATING, "021"), bursts, 125.94, instances=2, start_max_batch=64, seed=1021),
        Setup(PiecewiseCurve(STEPWISE, "062"), ramp, 24.59, instances=2, start_max_batch=1, seed=1062),
    )
    for setup in setups:
        tailtune = summarize(setup, "tailtune")
        default = summarize(setup, "triton-default")
        offered = float(tailtune["offered_rps"])
        assert _collapsed(default, setup.slo_ms) == 0, setup.curve.name  # the scenario is what it says
        assert _collapsed(tailtune, setup.slo_ms) == 0, (setup.curve.name, tailtune["timeline"])
        assert float(tailtune["goodput_rps"]) >= float(default["goodput_rps"]) - 0.01 * offered, setup.curve.name


def test_a_lull_between_bursts_never_cuts_the_capacity_the_bursts_need() -> None:
    """Between bursts the demand reads low and a smaller max batch meets the aim there; on a linear curve it has
    less capacity, and the next burst runs it past the SLO. While the SLO holds, the law keeps what the bursts of
    the stabilization window need. (Seen out of sample on a bursts trace, seed 17's 018: max batch 64 -> 34 at a
    lull, three windows at 67-80 ms for a 42.7 ms SLO, 0.93 of Triton's default's goodput.)"""
    points = (
        (1, 7.5503),
        (2, 7.6607),
        (4, 7.8813),
        (8, 8.3226),
        (12, 8.7638),
        (16, 9.2051),
        (24, 10.0876),
        (32, 10.9701),
        (48, 12.7352),
        (64, 14.5002),
    )
    curve = PiecewiseCurve(points, "linear")
    edges = (
        0.0, 20.53743708641077, 46.552980780160354, 59.74281913232083, 100.92654313545961, 155.53935392210835,
        195.31299952681593, 213.81669262407166, 250.72163382273442, 273.7154598253185, 302.89160558031494,
        313.0176584064829, 370.96853595106865, 407.11462006325627, 445.69020949689667, 460.4257366164803,
        477.01435565512327,
    )  # fmt: skip
    bursts = tuple(
        (a, b, 6034.472179548657 if k % 2 else 2379.88404967268)
        for k, (a, b) in enumerate(itertools.pairwise((*edges, 480.0)))
    )
    setup = Setup(curve, bursts, 42.71, instances=2, replicas=2, replicas_max=2, start_max_batch=8, seed=1035)
    tailtune = summarize(setup, "tailtune")
    default = summarize(setup, "triton-default")

    def broken(summary: dict[str, object]) -> set[int]:
        timeline = summary["timeline"]
        assert isinstance(timeline, list)
        return {i for i, w in enumerate(timeline) if w["p_ms"] is None or w["p_ms"] > setup.slo_ms}

    assert not broken(default) - {0}, default["timeline"]  # the scenario is what it says: the default holds
    assert not broken(tailtune) - broken(default) - {0}, tailtune["timeline"]
    offered = float(tailtune["offered_rps"])
    assert float(tailtune["goodput_rps"]) >= float(default["goodput_rps"]) - 0.01 * offered


def test_short_of_the_slo_a_batching_whose_full_batches_fall_behind_is_left() -> None:
    """Short of the SLO whatever the config, the law keeps the batching in force unless another answers a good
    deal more within the SLO; but not one whose full batches drain less than the planned load where the plan's
    drain it: on a superlinear curve its batches run away at the first burst, which the model's share (a normal
    spread around where batches settle) misses. Bench seed 11's 041 (measured curve, a step to 495 req/s): max
    batch 8 kept at 0.87 of the oracle's goodput, max batch 4 (the oracle's) 1.00."""
    rng = np.random.default_rng(1209)
    checked = 0
    for i in range(80):
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
    assert checked >= 10, checked


def test_a_flash_crowd_finds_no_reload_that_drains_no_faster() -> None:
    """A flash crowd past what the bounds drain: the law leaves the batching alone unless another drains the queue
    faster (a reload for a few percent of latency robustness is worth nothing under a backlog), and it judges the
    config in force by the model, not by the completions, in the window the crowd entered part way through (they
    mix the calm with the backlog). Seed 7's 024 (linear curve, 3 replicas of 2 instances, a crowd at 4.5x from
    max batch 32 with a queue delay): max batch 32 -> 25 -> 32 during the crowd, 0.985 of Triton's default."""
    points = ((1, 6.4802), (2, 6.582), (4, 6.7856), (8, 7.1928), (12, 7.6), (16, 8.0072), (24, 8.8217), (32, 9.6361))
    start, base = 205.60991922393788, 2476.356831849864
    crowd = ((0.0, start, base), (start, start + 40.0, 11105.477529789301), (start + 40.0, 480.0, base))
    setup = Setup(
        PiecewiseCurve(points, "024"),
        crowd,
        26.42,
        instances=2,
        replicas=3,
        replicas_max=3,
        start_max_batch=1,
        seed=1031,
        service_noise=0.03,
    )
    tailtune = summarize(setup, "tailtune")
    default = summarize(setup, "triton-default")
    offered = float(tailtune["offered_rps"])
    assert float(tailtune["goodput_rps"]) >= float(default["goodput_rps"]) - 0.005 * offered
    timeline = tailtune["timeline"]
    assert isinstance(timeline, list)
    assert len({w["max_batch"] for w in timeline if start - 30.0 <= w["t_s"] <= start + 40.0}) == 1, timeline


def test_where_nothing_keeps_the_aim_a_config_holding_the_slo_with_room_is_kept() -> None:
    """With a latency floor (one request on a busy device) just under the SLO and over the aim, the load the model
    has a config carry within the SLO swings by a third with a percent of calibration: a ranking that flips from
    window to window. A config in force that holds the SLO and carries the planned load with room to spare stays
    unless another's full batches drain a good deal more (in-sample 024: max batch 32 -> 24 -> 32 -> 19 -> 32 -> 22
    within the SLO, six reloads for nothing)."""
    points = ((1, 3.9958), (2, 4.0459), (4, 4.1462), (8, 4.3467), (12, 4.5472), (16, 4.7478), (24, 5.1488))
    points += ((32, 5.5499),)
    policy = Policy(
        slo_ms=14.22, batch_max=32, instances=2, build_curve=tuple(CurvePoint(batch=b, ms=ms) for b, ms in points)
    )
    curve = Curve(policy.build_curve)
    at_slo = policy.model_copy(update={"headroom": 1.0})
    rng = np.random.default_rng(1211)
    kept = 0
    for i in range(40):
        mb = int(rng.choice([16, 19, 22, 24, 32]))
        delay = int(rng.choice(law.candidate_delays(curve, mb, policy)))
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
    assert kept >= 20, kept


def test_a_foretold_break_where_nothing_holds_the_slo_is_left_after_one_window_for_much_more_goodput() -> None:
    """Where nothing holds the SLO at the demand, a window past the SLO that the model foretold for the config in
    force is acted on at once when the plan answers a good deal more of the demand within it (SHARE_GAIN, and
    SWITCH_GAIN times as much unless both shares come from the queue-length chain) and the demand did not just
    rise, or rose before the window (its tail shows no more demand than the whole: a crowd that entered part way
    through shows more there); else it is a bad window to confirm. Generated: stepwise curves (a plateau, a steep
    profile edge), a large max batch in force, a demand nothing carries within
    the SLO."""
    rng = np.random.default_rng(1212)
    acted = confirmed = by_gain = 0
    for i in range(300):
        ladder = list(_stepwise(rng).points)
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
    assert acted >= 10 and confirmed >= 3 and by_gain >= 1, (acted, confirmed, by_gain)


def test_seed_7_008_a_foretold_collapse_is_left_after_one_window() -> None:
    """Bench seed 7's 008 (stepwise curve with edges at 4 and 8, 2 instances, 1 replica, 459 req/s from t = 0):
    the config in force (max batch 64) answers about a quarter of the demand within the SLO, max batch 4 about
    three quarters. The law left it after two windows (0.863 of the oracle's goodput); after one now."""
    points = ((1, 6.9628), (2, 6.9628), (4, 6.9628), (8, 16.161), (12, 26.3812), (16, 27.4033), (24, 29.4473))
    points += ((32, 31.4914), (48, 35.5794), (64, 39.6675))
    setup = Setup(
        PiecewiseCurve(points, "seed7-008"), ((0.0, 120.0, 459.37),), 21.15, instances=2, start_max_batch=64, seed=1015
    )
    tailtune = summarize(setup, "tailtune")
    timeline = tailtune["timeline"]
    assert isinstance(timeline, list)
    assert timeline[0]["max_batch"] == 64 and timeline[1]["max_batch"] < 64, timeline
    # ... for a batching that answers more within the SLO than the one left.
    assert timeline[1]["goodput_rps"] > 1.5 * timeline[0]["goodput_rps"], timeline


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
        if i % 2:
            ladder = list(_stepwise(rng).points)
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
    assert acted >= 15 and confirmed >= 3, (acted, by_gain, confirmed)


def _gain(curve: Curve, plan: law.Plan, batching: Batching, policy: Policy, rate: float) -> tuple[float, float]:
    """(gain, ratio) of the share of `rate` the model answers within the SLO with the plan's config over the one
    in force (judged against the SLO, as the plan's candidates)."""
    now = in_force_share(curve, batching, policy, 1.0, rate, plan.replicas)
    then = law.share(curve, plan.candidate, rate, policy, 1.0, plan.replicas)
    return then - now, then / max(now, 1e-9)


def test_out_of_sample_crowds_are_met_in_their_first_window() -> None:
    """Two crowds that filled their first window (the steps fall on a window's start), each from a calm that broke
    nothing: the law moves after that first window, no longer waiting for a second (out-of-sample bench seed 23's
    044, stepwise curve, 2 instances, P99 noise: 0.944 -> 0.976 of the oracle's goodput; seed 11's 041, the curve
    measured on the local tritonserver, a metrics gap right after the crowd's first window: 0.927 -> 0.985)."""
    stepwise = ((1, 8.4562), (2, 8.4562), (4, 8.4562), (8, 8.4562), (12, 17.4296), (16, 17.686), (24, 18.1987))
    stepwise += ((32, 18.7115), (48, 31.0179), (64, 33.069), (96, 51.5286), (128, 57.6818))
    measured = ((1, 2.926), (2, 3.516), (4, 6.186), (8, 14.087), (16, 36.932), (32, 105.634), (64, 313.559))
    setups = (
        Setup(
            PiecewiseCurve(stepwise, "seed23-044"),
            ((0.0, 150.0, 230.38), (150.0, 480.0, 735.37)),
            31.13,
            instances=2,
            start_max_batch=128,
            p99_noise=0.15,
            seed=1067,
        ),
        Setup(
            PiecewiseCurve(measured, "seed11-041"),
            ((0.0, 150.0, 93.21), (150.0, 480.0, 495.39)),
            12.76,
            start_max_batch=8,
            gap=(190.0, 3),
            seed=1052,
        ),
    )
    for setup in setups:
        timeline = summarize(setup, "tailtune")["timeline"]
        assert isinstance(timeline, list)
        crowd = [w for w in timeline if w["t_s"] >= 150.0]
        # The window after the crowd's first runs another batching, one that answers more of the crowd in time.
        assert crowd[1]["max_batch"] < crowd[0]["max_batch"], (setup.curve.name, timeline)
        assert crowd[1]["goodput_rps"] > crowd[0]["goodput_rps"], (setup.curve.name, timeline)


def test_a_config_short_of_the_demand_that_answers_far_more_of_it_in_time_is_taken_after_one_window() -> None:
    """Out-of-sample seed 31's 032 (a plateau to batch 16, then a profile edge; 2 replicas from max batch 32; a load
    ramping down from 3100 req/s): max batch 32 breaks the SLO as the model foretold (65 ms for 31.87), max batch 16
    answers about 98 % of the demand within it though it carries a little less than the demand within the SLO.
    The law waited a second window (0.892 of the oracle's goodput); it moves after the first now (0.926: the oracle
    knows the first window's load before it comes)."""
    points = ((1, 8.7069), (2, 8.7069), (4, 8.7069), (8, 8.7069), (12, 8.7069), (16, 8.7069), (24, 18.8394))
    points += ((32, 20.2869),)
    ramp = tuple((40.0 * k, 40.0 * (k + 1), 3102.12 - 258.47 * k) for k in range(12))
    setup = Setup(
        PiecewiseCurve(points, "seed31-032"), ramp, 31.87, replicas=2, replicas_max=2, start_max_batch=32, seed=1063
    )
    timeline = summarize(setup, "tailtune")["timeline"]
    assert isinstance(timeline, list)
    assert timeline[0]["max_batch"] == 32 and timeline[1]["max_batch"] <= 16, timeline
    assert timeline[1]["goodput_rps"] > 2 * timeline[0]["goodput_rps"], timeline


def test_a_scale_out_reloads_a_batching_that_cannot_carry_the_load_while_the_new_pods_start() -> None:
    """A scale-out keeps the batching in force where it carries its share at the new count, but until the new pod
    is ready (a cold start: 30 s here, a whole window) the pod in force carries everything. Out of sample (a
    power-law curve, exponent 1.48; a sawtooth 109 -> 234 req/s; 1 of 2 replicas from max batch 16; P95 within
    206.5 ms): max batch 16's full batches drain 195 req/s, the plan's load with its margin was 206; kept through
    the scale-out, its batches ran away on the lone pod (P95 3.6 s; 0.925 of the oracle's goodput). The reload now
    goes with the scale-out, to a batching whose full batches keep up there."""
    points = ((1, 12.4125), (2, 14.4902), (4, 20.3051), (8, 36.5788), (12, 57.4888), (16, 82.1233))
    points += ((24, 140.6429), (32, 209.5862), (48, 373.3619), (64, 566.3101))
    period, levels = 90.2262527371082, 6
    saw = tuple(
        (period * k + period / levels * i, period * k + period / levels * (i + 1), 109.1643 + 24.9501 * i)
        for k in range(6)
        for i in range(levels)
        if period * k + period / levels * i < 510.0
    )
    saw = (*saw[:-1], (saw[-1][0], 510.0, saw[-1][2]))
    setup = Setup(
        PiecewiseCurve(points, "ood-power-sawtooth"),
        saw,
        206.5,
        percentile=95.0,
        replicas=1,
        replicas_max=2,
        start_max_batch=16,
        seed=5032,
    )
    summary = summarize(setup, "tailtune")
    timeline = summary["timeline"]
    assert isinstance(timeline, list)
    out = next(w for w, row in enumerate(timeline) if row["replicas"] > 1)
    mb = timeline[out]["max_batch"]
    # The batching that came with the scale-out keeps up on the lone pod by what its full batches drain ...
    assert mb < 16 and 1000.0 * mb / setup.curve.ms(mb) > 1000.0 * 16 / setup.curve.ms(16), timeline[out]
    # ... and the run loses less than 5 % of the oracle's goodput (the oracle runs both replicas from the start; the
    # saw's top, 234 req/s, still overruns the lone pod for a few seconds before the second is ready).
    oracle = summarize(setup, "oracle")["goodput_rps"]
    assert summary["goodput_rps"] >= 0.95 * oracle, (summary["goodput_rps"], oracle, timeline)
