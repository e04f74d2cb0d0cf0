"""The fast path's decision (`tailtune.tuner.surge`): invariants on a seeded sample of generated readings, and the
hand-computed edges (a queue that drains in time, a surge past the SLO, the scale-in floor the law honours)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import numpy as np

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.control.objective import NO_HEADROOM
from tailtune.tuner.law import DRAIN_INTERVALS, candidate, decide, safe_capacity
from tailtune.tuner.loop import FastPath
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.surge import (
    PANIC_WINDOW_SECONDS,
    STABLE_WINDOW_SECONDS,
    SURGE_SCALE_OUT,
    PodReading,
    SurgeState,
    decide_surge,
    read_window,
    record_scale_out,
)
from tailtune.tuner.types import InForce, Observation, Policy, TunerState
from tests.sampling import cases

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# t(b) = 2 + 0.4 b^1.3 ms: the demo's emulated device.
BUILD = tuple(CurvePoint(batch=b, ms=2.0 + 0.4 * b**1.3, source="build") for b in (1, 2, 4, 8, 16, 32))
POLICY = Policy(slo_ms=40.0, batch_max=32, replicas_min=1, replicas_max=8, build_curve=BUILD)
MB8 = Batching(max_batch_size=8, max_queue_delay_microseconds=0)


def _reads(at: datetime, pods: list[tuple[float, float]]) -> tuple[PodReading, ...]:
    return tuple(PodReading(pod=f"p{i}", at=at, pending=q, completed=c) for i, (q, c) in enumerate(pods))


def _window(before: list[tuple[float, float]], after: list[tuple[float, float]], span: float = 6.0):  # type: ignore[no-untyped-def]
    return read_window(_reads(T0, before), _reads(T0 + timedelta(seconds=span), after))


def test_a_queue_that_drains_in_time_is_no_panic() -> None:
    """A pod at 80 % of its capacity with a couple of batches queued: no panic, the replicas in force (caught: a
    panic on any queue, which scales out under normal batching)."""
    cap = safe_capacity(Curve(BUILD), 8, 0)
    w = _window([(5, 0)], [(9, 0.8 * cap * 6)])
    d = decide_surge(w, SurgeState(), InForce(batching=MB8, replicas=1), TunerState(), POLICY, T0)
    assert not d.panic and not d.scale_out and d.replicas == 1


def test_a_surge_past_the_slo_scales_out_at_once() -> None:
    """From idle to four replicas' worth on one pod: panic, and more than one replica asked at once, the count at
    which the first pod's queue (as it will be when new pods serve) drains (caught: a fast path that asks one more
    replica per check, as the law's 'one more replica' does)."""
    cap = safe_capacity(Curve(BUILD), 8, 0)
    # 6 s at 4x capacity: the pod completes `cap` a second and queues the rest.
    w = _window([(0, 0)], [(3 * cap * 6, cap * 6)])
    d = decide_surge(
        w, SurgeState(), InForce(batching=MB8, replicas=1), TunerState(), POLICY, T0 + timedelta(seconds=6)
    )
    assert d.panic and d.scale_out
    assert d.replicas >= 4
    assert "queue" in d.reason and "1 -> " in d.reason


def test_the_scale_out_says_how_long_the_fullest_pods_queue_takes_to_drain() -> None:
    """The Event says the fullest pod's queue drains within the law's drain time only where the count asked does
    that; where even the most replicas the spec allows cannot (the pod's full batches less its share of the demand
    are too few), it says in about how long (caught: an Event that said "drain in time" for every count, also where
    the drain took minutes past the planned time)."""
    cap = safe_capacity(Curve(BUILD), 8, 0)
    planned_s = DRAIN_INTERVALS * POLICY.interval_seconds
    inf = InForce(batching=MB8, replicas=1)
    at = T0 + timedelta(seconds=6)
    # 6 s at 1.5x capacity on one pod: a queue a few replicas drain within the planned time.
    small = decide_surge(_window([(0, 0)], [(0.5 * cap * 6, cap * 6)]), SurgeState(), inf, TunerState(), POLICY, at)
    assert small.scale_out and small.replicas < POLICY.replicas_max, small.reason
    assert f"drain within {planned_s:.0f} s with {small.replicas}" in small.reason, small.reason
    # 4x capacity on a pod that already holds minutes of its capacity: no count drains it that fast.
    queued = 5 * planned_s * cap
    big = decide_surge(
        _window([(queued, 0)], [(queued + 3 * cap * 6, cap * 6)]), SurgeState(), inf, TunerState(), POLICY, at
    )
    assert big.scale_out and big.replicas == POLICY.replicas_max, big.reason
    said = re.search(r"drain in about (\d+) s with (\d+), past the (\d+) s planned", big.reason)
    assert said is not None, big.reason
    demand = (3 * cap * 6 + cap * 6) / 6
    expected_s = float(said.group(1))
    assert int(said.group(2)) == POLICY.replicas_max and float(said.group(3)) == planned_s
    # What the most replicas leave the fullest pod to drain with: its full batches less its share of the demand.
    assert expected_s > planned_s
    assert abs(expected_s - _queued_then(big.reason) / (cap - demand / POLICY.replicas_max)) <= 1.0


def _queued_then(reason: str) -> float:
    """The fullest pod's queue by the time new pods serve, as the Event says it."""
    m = re.search(r"the fullest pod's (\d+) requests", reason)
    assert m is not None, reason
    return float(m.group(1))


def _t_one() -> float:
    """t(1) of BUILD, ms."""
    return BUILD[0].ms


def test_a_pod_behind_on_its_device_with_an_empty_queue_scales_out() -> None:
    """Three instances on one device: the pod falls behind on the device while the pending gauge (requests not yet
    handed to an instance) stays near zero. A demand twice what the replicas in force carry within the SLO by the
    model is a reason to panic without a growing queue; half of it is none (caught: a fast path that waits for the
    queue to grow, and one that fires at any load the queue does not show)."""
    policy = POLICY.model_copy(update={"instances": 3})
    at_slo = candidate(Curve(BUILD), 8, 0, policy.model_copy(update={"headroom": NO_HEADROOM}), 1.0).carries()
    inf = InForce(batching=MB8, replicas=1)
    past = _window([(1, 0)], [(1, 2.2 * at_slo * 6)])
    d = decide_surge(past, SurgeState(), inf, TunerState(), policy, T0 + timedelta(seconds=6))
    assert d.panic and d.scale_out and d.replicas >= 2, d.reason
    assert "within the SLO" in d.reason
    within = _window([(1, 0)], [(1, 0.9 * at_slo * 6)])
    d = decide_surge(within, SurgeState(), inf, TunerState(), policy, T0 + timedelta(seconds=6))
    assert not d.panic and not d.scale_out and d.replicas == 1, d.reason
    # A batching that holds the SLO at no load: the tick's to change, not more replicas of it.
    tight = policy.model_copy(update={"slo_ms": 0.5 * _t_one()})
    d = decide_surge(past, SurgeState(), inf, TunerState(), tight, T0 + timedelta(seconds=6))
    assert not d.scale_out and d.replicas == 1, d.reason


def test_panic_ends_after_a_stable_window_and_never_scales_in() -> None:
    """Panic holds STABLE_WINDOW_SECONDS after its last reason, asking the replicas in force (never fewer), then ends
    (caught: a panic that ends at the first calm read, as Knative's stable window forbids)."""
    cap = safe_capacity(Curve(BUILD), 8, 0)
    surge = _window([(0, 0)], [(3 * cap * 6, cap * 6)])
    inf = InForce(batching=MB8, replicas=1)
    d = decide_surge(surge, SurgeState(), inf, TunerState(), POLICY, T0)
    calm = _window([(1, 0)], [(1, 10)])
    later = InForce(batching=MB8, replicas=d.replicas)
    held = decide_surge(calm, d.state, later, TunerState(), POLICY, T0 + timedelta(seconds=STABLE_WINDOW_SECONDS - 1))
    assert held.panic and held.replicas == d.replicas and not held.scale_out
    ended = decide_surge(calm, held.state, later, TunerState(), POLICY, T0 + timedelta(seconds=STABLE_WINDOW_SECONDS))
    assert not ended.panic


def test_invariants_on_generated_readings() -> None:
    """On a seeded sample of readings (1-4 pods in force of 1-8 most, queues from empty to far past the SLO, idle to
    8x capacity): never fewer replicas than in force, never more than the most, a scale-out only in panic, and a
    pod whose queue drains within the SLO with load under its capacity never panics (caught: a count from the
    demand alone going below the replicas in force, and a cap past replicas.max)."""
    rng = np.random.default_rng(38)
    cap = safe_capacity(Curve(BUILD), 8, 0)
    seen_panic = seen_calm = 0
    for _ in range(cases(400)):
        most = int(rng.integers(1, 9))
        n = int(rng.integers(1, most + 1))
        policy = POLICY.model_copy(update={"replicas_max": most})
        load = float(rng.uniform(0.0, 8.0)) * cap * n
        pods_before = [(float(rng.integers(0, 50)), 0.0) for _ in range(n)]
        growth = float(rng.uniform(-1.0, 1.0)) * max(0.0, load - cap * n) * PANIC_WINDOW_SECONDS
        after = [(max(0.0, q + growth / n), min(load, cap * n) / n * PANIC_WINDOW_SECONDS) for q, _ in pods_before]
        w = _window(pods_before, after)
        d = decide_surge(w, SurgeState(), InForce(batching=MB8, replicas=n), TunerState(), policy, T0)
        assert n <= d.replicas <= max(n, most)
        assert not d.scale_out or (d.panic and d.replicas > n)
        drains = all(q <= cap * POLICY.slo_ms / 1000 for q, _ in after) and load <= 0.8 * cap * n
        if drains:
            assert not d.panic
            seen_calm += 1
        seen_panic += d.panic
    assert seen_panic >= 2 and seen_calm >= 1


def test_read_window_counts_a_new_pod_from_empty_and_a_restart_from_zero() -> None:
    """A pod absent from the first read counts from an empty queue; a counter that went back is a restart, not a
    negative rate (caught: a restarted pod turning the demand negative, which hides a surge)."""
    before = (PodReading("a", T0, 10, 1000),)
    after = (PodReading("a", T0 + timedelta(seconds=5), 20, 100), PodReading("b", T0 + timedelta(seconds=5), 5, 50))
    w = read_window(before, after)
    assert w is not None
    assert w.completed_rps == 0.0 and w.growth_rps == (10 + 5) / 5 and w.fullest == "a"


def _calm_windows(state: TunerState, in_force: InForce, demand: float) -> InForce:
    """The law over many calm windows at `demand` (past the stabilization window); the config it ends with."""
    for k in range(1, 16):
        end = T0 + timedelta(seconds=60 + 30 * k)
        obs = Observation(
            window_end=end,
            span_seconds=30.0,
            p_latency_ms=5.0,
            request_rate=demand,
            queue_growth_rps=0.0,
            pending_max=0.0,
            ready_replicas=in_force.replicas,
            sample_count=10_000,
        )
        dec = decide(state, in_force, obs, POLICY, end)
        state, in_force = dec.state, dec.in_force
    return in_force


def test_a_scale_out_is_a_floor_the_laws_scale_in_honours() -> None:
    """After a fast-path scale-out at a surge's demand, the law's calm windows at 80 % of it never go below the count
    asked; without the record they do (caught: a regular tick scaling in under the surge)."""
    inf = InForce(batching=MB8, replicas=1)
    cap = safe_capacity(Curve(BUILD), 8, 0)
    d = decide_surge(_window([(0, 0)], [(3 * cap * 6, cap * 6)]), SurgeState(), inf, TunerState(), POLICY, T0)
    st, new = record_scale_out(TunerState(), inf, d, T0)
    assert new.replicas == d.replicas and new.changed_at == T0 and st.last_reason_code == SURGE_SCALE_OUT
    assert st.too_few[-1].replicas == d.replicas - 1 and st.scaled_out_at == T0
    demand = 0.8 * d.demand_rps
    assert _calm_windows(st, new, demand).replicas >= new.replicas
    # The same windows from a state without the record: the law gives replicas back.
    assert _calm_windows(TunerState(), new, demand).replicas < new.replicas


def test_fast_path_check_keeps_the_panic_window() -> None:
    """FastPath.check compares each read with the oldest within PANIC_WINDOW_SECONDS and records a scale-out in
    the tuner state (caught: a window from the very first read, which dilutes a surge with minutes of calm)."""
    fp = FastPath()
    inf, st = InForce(batching=MB8, replicas=1), TunerState()
    cap = safe_capacity(Curve(BUILD), 8, 0)
    done = 0.0
    for k in range(0, 30):
        at = T0 + timedelta(seconds=2 * k)
        surge = k >= 25
        done += 2 * (cap if surge else 10)
        queue = 3 * cap * 2 * (k - 24) if surge else 0
        d, st, inf = fp.check(_reads(at, [(queue, done)]), inf, st, POLICY, at)
        if not surge:
            assert not d.panic
        if d.scale_out:
            break
    assert d.scale_out and k == 25
    assert (d.state.last_check - min(r.at for r in fp.reads[0])).total_seconds() <= PANIC_WINDOW_SECONDS
    assert inf.replicas == d.replicas and st.too_few


def test_a_batching_that_carries_nothing_within_the_aim_asks_the_most_replicas_and_says_so() -> None:
    """An SLO below what one request of the batching in force takes within the aim: a replica carries none of the
    demand, so the demand asks every replica the spec allows, and the reason says that instead of a count divided by
    zero (caught: "the demand asks 4718036879124" in the Event)."""
    policy = POLICY.model_copy(update={"slo_ms": 2.5})  # aim 2 ms, below t(1) = 2.4 ms
    assert candidate(Curve(BUILD), 8, 0, policy, 1.0).carries() == 0
    cap = safe_capacity(Curve(BUILD), 8, 0)
    w = _window([(0, 0)], [(3 * cap * 6, cap * 6)])
    d = decide_surge(
        w, SurgeState(), InForce(batching=MB8, replicas=1), TunerState(), policy, T0 + timedelta(seconds=6)
    )
    assert d.scale_out and d.replicas == policy.replicas_max
    assert f"the demand asks {policy.replicas_max}, the most allowed" in d.reason
    assert max(len(digits) for digits in re.findall(r"\d+", d.reason)) <= 6, d.reason
    idle = _window([(0, 0)], [(0, 0)])
    quiet = decide_surge(idle, SurgeState(), InForce(batching=MB8, replicas=1), TunerState(), policy, T0)
    assert not quiet.scale_out and quiet.replicas == 1
