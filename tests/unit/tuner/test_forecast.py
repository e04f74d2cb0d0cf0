"""The seasonal forecast (`tailtune.tuner.forecast`): a period is found where the demand repeats and nowhere else, the
floor it sets never lowers the law's replicas, and in the simulator a spike shorter than a pod start that repeats is
met by replicas ready at its start with the forecast, not without."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta

import numpy as np
import pytest

from tailtune.api.v1alpha1 import Batching, Replicas, Slo, Tuning
from tailtune.offline.whatif import Run, Setup, run_policy
from tailtune.operator.atrest import state_moved
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner.forecast import (
    FALSE_PERIOD_CHANCE,
    HELD_FOR_FORECAST,
    HISTORY_BINS,
    SCALED_OUT_AHEAD,
    ahead,
    detect_period,
    predict,
    record,
    window_demand,
)
from tailtune.tuner.law import candidate, decide, hold
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import Decision, DemandHistory, InForce, Observation, Policy, TunerState
from tests.sampling import cases
from tests.unit.tuner.families import NOW, make_case

STEP = 30.0


def _spikes(rng: np.random.Generator, period: float, n: int, width: int, phase: float, height: float) -> np.ndarray:
    """A base demand with noise and a spike of `width` bins every `period` bins from `phase`."""
    x = 100.0 * (1 + 0.1 * rng.standard_normal(n))
    t = phase
    while t < n:
        for w in range(width):
            if int(t) + w < n:
                x[int(t) + w] += height
        t += period
    return x


def _bursts(rng: np.random.Generator, n: int) -> np.ndarray:
    """A base demand with bursts of 1-2 bins at random times (no period)."""
    x = 100.0 * (1 + 0.1 * rng.standard_normal(n))
    chance = float(rng.uniform(0.03, 0.2))
    for i in range(n):
        if rng.uniform() < chance:
            x[i : i + int(rng.integers(1, 3))] += 500.0
    return x


def _history(x: np.ndarray, end: datetime = NOW) -> DemandHistory:
    """The rates as a history whose last bin holds the window that ended at `end`."""
    start = end - timedelta(seconds=(len(x) - 0.5) * STEP)
    return DemandHistory(start=start, step_seconds=STEP, rates=tuple(float(v) for v in x))


def test_the_period_is_found_on_periodic_spikes_of_any_period_and_phase() -> None:
    """Spikes of 1-2 bins every 2 to 40 bins, at any phase, over 3.2 to 8 periods: the period found is theirs.
    Caught: without the trough rule the lag of 1 (adjacent bins of a 2-bin spike) won; without pairwise
    normalization long periods fell under the threshold."""
    rng = np.random.default_rng(5)
    for i in range(cases(300)):
        period = int(rng.integers(2, 41))
        n = min(HISTORY_BINS, int(period * float(rng.uniform(3.2, 8.0))))
        width = int(rng.integers(1, 3)) if period > 3 else 1
        x = _spikes(rng, period, n, width, int(rng.integers(0, period)), float(rng.uniform(2, 10)) * 100)
        found = detect_period(tuple(x), STEP)
        assert found is not None and found.bins == period, (i, period, n, width, found)
        assert found.seconds == period * STEP and found.correlation <= 1.0


def test_the_period_of_a_compressed_day_is_found() -> None:
    """A sine (a diurnal shape) of 8 to 60 bins with noise: found within a bin."""
    rng = np.random.default_rng(6)
    for i in range(cases(100)):
        period = int(rng.integers(8, 61))
        n = min(HISTORY_BINS, int(period * float(rng.uniform(3.2, 6.0))))
        t = np.arange(n) + int(rng.integers(0, period))
        x = 100 + 60 * np.sin(2 * math.pi * t / period) + 10 * rng.standard_normal(n)
        found = detect_period(tuple(x), STEP)
        assert found is not None and abs(found.bins - period) <= 1, (i, period, found)


def test_no_period_in_noise_random_bursts_walks_trends_or_steps() -> None:
    """Non-periodic demand: at most FALSE_PERIOD_CHANCE of the series show a period (the test size the significance
    line is set for). Caught: without the trough rule every trend and random walk had one."""
    rng = np.random.default_rng(7)
    kinds = {
        "noise": lambda n: 100 * (1 + 0.2 * rng.standard_normal(n)),
        "bursts": lambda n: _bursts(rng, n),
        "walk": lambda n: 100 + np.cumsum(5 * rng.standard_normal(n)),
        "trend": lambda n: 100 + np.arange(n) * float(rng.uniform(0.1, 3)) + 10 * rng.standard_normal(n),
        "step": lambda n: (
            np.where(np.arange(n) < n * float(rng.uniform(0.2, 0.8)), 100, 300) + 10 * rng.standard_normal(n)
        ),
    }
    found = total = 0
    for kind, make in kinds.items():
        for _ in range(cases(200)):
            n = int(rng.integers(20, HISTORY_BINS + 1))
            found += detect_period(tuple(make(n)), STEP) is not None
            total += 1
        assert found <= FALSE_PERIOD_CHANCE * total, kind


def test_a_period_seen_twice_is_no_period_and_a_flat_demand_has_none() -> None:
    """Fewer than MIN_REPEATS periods in the history, or nothing that varies: no forecast."""
    rng = np.random.default_rng(8)
    x = _spikes(rng, 10, 29, 1, 3, 800)
    assert detect_period(tuple(x), STEP) is None
    assert detect_period(tuple(_spikes(rng, 10, 31, 1, 3, 800)), STEP) is not None
    assert detect_period((50.0,) * 100, STEP) is None
    assert detect_period((None, 10.0) * 3, STEP) is None


def test_the_history_is_binned_bounded_and_restarted_on_a_new_interval() -> None:
    """One bin per interval (the most of two in one bin), gaps as None, at most HISTORY_BINS with the start moved
    on, a new history when the interval changes."""
    h = record(None, NOW, 10.0, STEP)
    assert h.rates == (10.0,) and h.start == NOW - timedelta(seconds=STEP / 2)
    h = record(h, NOW + timedelta(seconds=29), 12.0, STEP)  # a tick a little late stays in the next bin
    h = record(h, NOW + timedelta(seconds=33), 11.0, STEP)
    h = record(h, NOW + timedelta(seconds=120), 7.12345, STEP)
    assert h.rates == (10.0, 12.0, None, None, 7.12)
    for k in range(HISTORY_BINS + 10):
        h = record(h, NOW + timedelta(seconds=150 + STEP * k), 1.0, STEP)
    assert len(h.rates) == HISTORY_BINS and h.rates[-1] == 1.0
    assert h.start + timedelta(seconds=STEP * (HISTORY_BINS - 1)) <= NOW + timedelta(seconds=150 + STEP * k)
    assert record(h, NOW + timedelta(days=1), 5.0, 60.0).rates == (5.0,)


def test_a_spike_within_a_window_is_recorded_at_its_rate() -> None:
    """A window of 30 s whose first 20 s carried 300 req/s and its last 10 s 20 req/s: recorded as 300, not the
    window's 207 (the two parts of the window, the tail and the rest)."""
    whole = (20 * 300 + 10 * 20) / 30
    obs = Observation(window_end=NOW, span_seconds=30, request_rate=whole, tail_demand_rps=20.0)
    assert window_demand(obs) == pytest.approx(300.0)
    assert window_demand(obs.model_copy(update={"tail_demand_rps": 300.0})) == 300.0
    assert window_demand(Observation(window_end=NOW, span_seconds=30)) is None


def test_the_prediction_reads_ahead_never_the_phase_of_now() -> None:
    """A spike in the window that just ended, at the phase it had in each cycle: no prediction of it (it is here,
    the law's to see); a window before it, the spike is predicted. Caught: a slack of a bin back scaled out after
    each spike."""
    rng = np.random.default_rng(9)
    x = _spikes(rng, 10, 60, 1, 9, 900)  # spikes at bins 9, 19, ..., 59 (the last, now)
    assert max(x[-1:]) > 800
    p = predict(_history(x), NOW, 60.0)
    assert p is not None and p.demand_rps < 200
    before = predict(_history(x[:-1]), NOW, 60.0)
    assert before is not None and before.demand_rps > 800 and before.period.bins == 10


def test_one_burst_at_a_phase_is_no_season() -> None:
    """A period of spikes of 300 and, once, a burst of 700 at the phase coming next: predicted at the level the
    spikes repeat at, not the one burst's (caught: the most of the last cycles scaled out for a burst seen once)."""
    rng = np.random.default_rng(12)
    x = _spikes(rng, 10, 59, 1, 9, 200)  # spikes of ~300 at bins 9, 19, ..., 49; the next at 59
    x[39] = 700.0
    p = predict(_history(x), NOW, 60.0)
    assert p is not None and p.demand_rps < 400


def _policy(replicas_max: int = 8) -> Policy:
    build = tuple(CurvePoint(batch=b, ms=ms, source="build") for b, ms in ((1, 10.0), (2, 12.0), (4, 16.0), (8, 24.0)))
    return Policy(slo_ms=60, batch_max=8, replicas_max=replicas_max, build_curve=build, forecast=True)


def _with_history(decision: Decision, x: np.ndarray) -> Decision:
    return decision.model_copy(update={"state": decision.state.model_copy(update={"demand_history": _history(x)})})


def test_the_floor_never_lowers_the_laws_replicas() -> None:
    """On the law's decisions over a seeded family of cases, with periodic and non-periodic histories: never fewer
    replicas than the law's, never more than replicas.max, and without a period the law's decision as it was."""
    rng = np.random.default_rng(10)
    raised = 0
    for i in range(cases(200)):
        case = make_case(rng)
        policy = case.policy.model_copy(update={"forecast": True})
        decision = decide(case.state, case.in_force, case.obs, policy, NOW)
        periodic = rng.uniform() < 0.6
        height = float(rng.uniform(0, 5)) * max(case.demand, 1.0)
        x = _spikes(rng, 8, 40, 1, 0, height) if periodic else _bursts(rng, 40)  # next spike: next bin
        out = ahead(_with_history(decision, x), case.in_force, case.obs, policy, NOW)
        assert decision.replicas <= out.replicas <= max(decision.replicas, policy.replicas_max), i
        if out.replicas > decision.replicas:
            raised += 1
            assert out.changed and out.reason_code in (SCALED_OUT_AHEAD, decision.reason_code)
        if detect_period(out.state.demand_history.rates if out.state.demand_history else (), STEP) is None:
            assert (out.action, out.in_force, out.reason) == (decision.action, decision.in_force, decision.reason)
    assert raised >= 1


def test_a_predicted_rise_scales_out_and_keeps_replicas_the_law_gives_back() -> None:
    """A hold at 1 replica before a predicted spike of ~900 req/s scales out to the count the model takes for the
    level two of the last three spikes reached, with the law's margin (the reason says the demand, when, the period
    and the pod start); a scale-in from that count is held at it; a scale-in from two more stops at it, the law's
    code kept."""
    rng = np.random.default_rng(11)
    x = _spikes(rng, 10, 59, 1, 9, 800)  # the next spike comes in the next bin
    policy = _policy()
    one = InForce(batching=Batching(max_batch_size=8), replicas=1)
    obs = Observation(window_end=NOW, span_seconds=30, request_rate=100.0)
    st = TunerState(startup_seconds=45.0)
    out = ahead(_with_history(hold(st, one, "WithinBand", "within the band"), x), one, obs, policy, NOW)
    carries = candidate(Curve(policy.build_curve), 8, 0, policy, 1.0).carries()
    # The level two of the last three spikes (bins 49, 39, 29; the next comes at 59) reached.
    level = sorted(float(max(x[c - 1 : c + 2])) for c in (49, 39, 29))[-2]
    need = math.ceil(level * policy.demand_margin / carries)
    assert out.changed and out.reason_code == SCALED_OUT_AHEAD and out.replicas == need > 1
    assert f"forecast: {level:.0f} req/s at " in out.reason and "period of 300 s" in out.reason
    assert "measured pod start 45 s" in out.reason and out.state.scaled_out_at == NOW
    scale_in = Decision(
        action="change",
        in_force=one.model_copy(update={"changed_at": NOW}),
        reason="fewer",
        reason_code="ScaledIn",
        state=st,
    )
    held = ahead(_with_history(scale_in, x), one.model_copy(update={"replicas": need}), obs, policy, NOW)
    assert not held.changed and held.replicas == need and held.reason_code == HELD_FOR_FORECAST
    more = one.model_copy(update={"replicas": need + 2})
    partial = ahead(_with_history(scale_in, x), more, obs, policy, NOW)
    assert partial.changed and partial.replicas == need and partial.reason_code == "ScaledIn"


def test_the_history_alone_is_not_worth_a_checkpoint_write() -> None:
    """The history moves every window: with only it moved the at-rest rule writes nothing (caught: a write per tick
    with the forecast on)."""
    st = TunerState()
    assert not state_moved(st, st.model_copy(update={"demand_history": _history(np.ones(5))}), 3)


def test_the_spec_switch_is_off_by_default_and_reaches_the_policy() -> None:
    slo, replicas = Slo(latency_ms=30), Replicas(min=1, max=4)
    assert not Policy.from_spec(slo, Tuning(), replicas, 32).forecast
    assert Policy.from_spec(slo, Tuning.model_validate({"forecast": {"enabled": True}}), replicas, 32).forecast


def _ready_at(run: Run, t: float, pod_start: float) -> int:
    """Replicas serving at t: requested at least a pod start before it, and not let go since."""

    def count(at: float) -> int:
        return [k[3] for k in run.knobs if k[0] <= at][-1]

    return min(count(t - pod_start), count(t))


def test_a_repeating_spike_shorter_than_a_pod_start_is_met_with_the_forecast_and_not_without() -> None:
    """A 20 s spike of 300 req/s every 120 s over 20 req/s (the pod start is 30 s): the law alone sees each spike
    once it has passed and never has a second replica ready; with the forecast, after three periods, two replicas
    are ready when the fourth spike starts and its window is answered within the SLO."""
    curve = PiecewiseCurve(((1, 10.0), (2, 12.0), (4, 16.0), (8, 24.0)), "small")
    period, spike, low, high = 120.0, 20.0, 20.0, 300.0
    segs: list[tuple[float, float, float]] = [(0.0, 60.0, low)]
    for k in range(4):
        a = 60.0 + k * period
        segs += [(a, a + spike, high), (a + spike, a + period, low)]
    segs[-1] = (segs[-1][0], 450.0, low)
    setup = Setup(
        curve=curve,
        segments=tuple(segs),
        slo_ms=60,
        replicas=1,
        replicas_max=2,
        interval_s=30,
        start_max_batch=8,
        seed=5,
    )
    fourth = 60.0 + 3 * period
    reactive, predictive = run_policy(setup, "tailtune"), run_policy(setup, "predictive")
    assert _ready_at(reactive, fourth, setup.pod_start_s) == 1
    assert _ready_at(predictive, fourth, setup.pod_start_s) == 2
    assert any(code == SCALED_OUT_AHEAD for _, code, _ in predictive.codes)

    def late(run: Run) -> int:
        spiked = (run.arrivals >= fourth) & (run.arrivals < fourth + spike)
        return int(np.sum(run.latency[spiked] * 1000 > setup.slo_ms))

    assert late(predictive) < late(reactive)
    spiked = (predictive.arrivals >= fourth) & (predictive.arrivals < fourth + spike)
    assert np.percentile(predictive.latency[spiked], 99) * 1000 <= setup.slo_ms


def test_the_operator_tick_keeps_the_history_in_memory_without_a_write_per_tick() -> None:
    """spec.tuning.forecast.enabled through the operator's tick: on a steady signal the history grows by a bin per
    tick in the tuner's memory while the writes stop, as without the forecast (caught: the history in the
    checkpoint rule wrote the annotation on every tick)."""
    from tailtune.operator.atrest import TunerMemory
    from tailtune.operator.inforce import tuner_state
    from tailtune.operator.tuning import tune_step
    from tests.unit.operator.test_atrest import NOW as START
    from tests.unit.operator.test_atrest import _steady
    from tests.unit.operator.test_tuning import SERVING, FakeTunerCluster, FixedReader, serving_isvc

    memory = TunerMemory()
    isvc = serving_isvc().set("spec.tuning.mode", "rolling").set("spec.tuning.forecast.enabled", True).obj()
    assert isvc.spec.tuning.forecast.enabled
    writes: list[int] = []
    for i in range(12):
        cluster = FakeTunerCluster(SERVING)
        now = START + timedelta(seconds=30 * i + 1)
        asyncio.run(tune_step(isvc, cluster, FixedReader(_steady(i, 10.0)), now, memory=memory))
        writes.append(len(cluster.annotations) + (cluster.latency is not None))
        annotations = {**isvc.metadata.annotations, **cluster.annotations}
        status = isvc.status if cluster.latency is None else isvc.status.model_copy(update={"latency": cluster.latency})
        isvc = isvc.model_copy(
            update={"metadata": isvc.metadata.model_copy(update={"annotations": annotations}), "status": status}
        )
    assert sum(writes[-6:]) == 0, writes
    history = memory.recall(isvc, tuner_state(isvc)).demand_history
    assert history is not None and len(history.rates) == 12 and set(history.rates) == {100.0}
