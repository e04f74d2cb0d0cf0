"""The generative tuner (`tailtune.tuner.generative`): the model and each guard (the sampled property against a
Dynamo-style planner on generated traces: tests/loop/test_generative_planner.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tailtune.sim.llm import ROOFLINES, EngineConfig
from tailtune.tuner.generative import (
    COOLDOWN,
    INFEASIBLE,
    LEVERS_CHANGED,
    REJECTION_MEMORY_SECONDS,
    SAME_DEMAND_SHARE,
    SCALED_IN,
    SCALED_OUT,
    GenEngineModel,
    GenInForce,
    GenLevers,
    GenObservation,
    GenPolicy,
    GenPolicyError,
    GenState,
    Load,
    aims_ms,
    capacity_rps,
    decide_generative,
    erlang_c,
    holds_aim,
    levers_of,
    needed_replicas,
    predict,
    rejected_at,
    remember_rejected,
    same_demand,
    scale_in_target,
    serving_with,
    slots,
)
from tests.sampling import cases, floor
from tests.unit.factories import make_isvc

L4 = EngineConfig(roofline=ROOFLINES["l4"])
MODEL = GenEngineModel.from_engine(L4)
POLICY = GenPolicy(ttft_target_ms=2000, tpot_target_ms=100, engine=MODEL, replicas_min=1, replicas_max=8)
NOW = 10_000.0


def obs(
    rate: float = 2.0,
    ttft: float = 400.0,
    tpot: float = 70.0,
    waiting: float = 0.0,
    ready: int = 2,
    end: float = NOW,
    requests: int = 100,
) -> GenObservation:
    """A window of `rate` req/s of 600-token prompts and 200-token answers."""
    return GenObservation(
        window_start=end - 30,
        window_end=end,
        ttft_ms=ttft,
        tpot_ms=tpot,
        request_rate=rate,
        prompt_tokens_per_s=600 * rate,
        output_tokens_per_s=200 * rate,
        waiting=waiting,
        replicas_ready=ready,
        requests=requests,
    )


def test_erlang_c_by_hand() -> None:
    """One server: an arrival waits with probability rho; two servers at offered load 1: 1/3."""
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(4, 0.0) == 0.0


def test_the_model_slows_the_step_with_load_and_saturates() -> None:
    """More load per replica: more running sequences and a longer decode step (TPOT); past the KV cache's slots
    the queue grows without bound. The light load's step is the roofline's weight read."""
    light = predict(MODEL, GenLevers(), Load(0.1, 600, 200), 99)
    heavy = predict(MODEL, GenLevers(), Load(2.0, 600, 200), 99)
    assert light.tpot_s == pytest.approx(MODEL.decode_base_s, rel=0.05)
    assert heavy.running > light.running and heavy.tpot_s > light.tpot_s and heavy.wait_s >= light.wait_s
    assert predict(MODEL, GenLevers(), Load(50.0, 600, 200), 99).saturated


def test_max_utilization_admits_more_sequences_than_guaranteed_no_evict() -> None:
    """It reserves what a sequence holds now, not its whole length; a smaller KV share admits fewer."""
    load = Load(1.0, 600, 400)
    no_evict = slots(MODEL, GenLevers(), load)
    assert slots(MODEL, GenLevers(batch_scheduler_policy="max_utilization"), load) > no_evict
    assert slots(MODEL, GenLevers(kv_cache_free_gpu_mem_fraction=0.5), load) < no_evict


def test_needed_replicas_grow_with_demand() -> None:
    """Twice the demand never needs fewer replicas; a demand past every bound needs none within it."""
    counts = [needed_replicas(POLICY, GenLevers(), Load(r, 600, 200), GenState()) for r in (0.5, 1, 2, 4, 8)]
    assert all(c is not None for c in counts)
    assert counts == sorted(counts) and counts[-1] > counts[0]  # type: ignore[type-var]
    assert needed_replicas(POLICY, GenLevers(), Load(200, 600, 200), GenState()) is None


def test_a_stale_window_holds() -> None:
    """The same window twice: nothing new to decide on."""
    d = decide_generative(GenState(last_window_end=NOW), GenInForce(2), obs(), POLICY, NOW)
    assert not d.changed and d.bound_by == "stale-window"


def test_a_rise_scales_out_at_once_even_in_the_cooldown() -> None:
    """A scale-out asks only for what the demand needs beyond what is in force: the cooldown does not hold it."""
    d = decide_generative(GenState(), GenInForce(1, changed_at=NOW - 5), obs(rate=6, ready=1), POLICY, NOW)
    assert d.reason_code == SCALED_OUT and d.replicas > 1 and d.changed
    assert "replicas hold the aim" in d.describe()


def test_a_window_over_target_the_model_does_not_explain_adds_one() -> None:
    """Light demand by the model, TTFT over its target measured: one replica more (measured-over-model)."""
    d = decide_generative(GenState(), GenInForce(3), obs(rate=0.5, ttft=2500, ready=3), POLICY, NOW)
    assert d.replicas == 4 and d.bound_by == "measured-over-model"


def test_a_backlog_is_the_drains_not_measured_over_model() -> None:
    """TTFT over target with sequences waiting: the drain term sizes it, no blind extra replica."""
    d = decide_generative(GenState(), GenInForce(3), obs(rate=0.5, ttft=2500, waiting=30, ready=3), POLICY, NOW)
    assert d.bound_by != "measured-over-model"


# Generated windows with a waiting backlog on the pods in force (the suite draws `cases(DRAIN_FAMILY)` of them).
DRAIN_FAMILY = 400


def drain_case(rng: random.Random) -> tuple[int, float, float, float | None]:
    """Replicas ready (all in force), arrivals (req/s, from well within what they carry to twice past it), waiting
    sequences and the pod start measured (None: none yet)."""
    ready = rng.randint(1, 4)
    return ready, rng.uniform(0.5, 5.0) * ready, ready + rng.uniform(2.0, 150.0), rng.choice([None, 10, 30, 60, 120])


def test_one_scale_out_drains_the_backlog_within_the_bound_and_holds_the_aim() -> None:
    """Generated arrivals, backlogs and pod starts: the count one decision asks serves, within the drain bound (a pod
    start, at least the TTFT target) after the replicas asked are ready, the queue they find (what waits beyond a
    sequence a pod now, plus what the pods ready fall behind the arrivals by over the pod start at the model's
    capacity) with capacity beyond the arrivals, and holds the aim at the arrivals plus that drain; one replica fewer
    does not (caught: the backlog was spread over 4 intervals and its growth over the pod start not sized, so the law
    asked one replica an interval while the queue stayed on the pods in force)."""
    policy = replace(POLICY, replicas_max=64)
    rng = random.Random(39)
    out = 0
    for _ in range(cases(DRAIN_FAMILY)):
        ready, rate, waiting, start = drain_case(rng)
        o = obs(rate=rate, ttft=5000, waiting=waiting, ready=ready)
        d = decide_generative(GenState(start_seconds=start), GenInForce(ready), o, policy, NOW)
        n = d.replicas
        assert n < policy.replicas_max, (ready, rate, waiting, start, d.describe())  # the family stays feasible
        start_s = start if start is not None else policy.interval_seconds
        within = max(start_s, policy.ttft_target_ms / 1000)
        arrivals = Load(rate, 600, 200)
        capacity = capacity_rps(MODEL, GenLevers(), arrivals)
        queued = (waiting - ready) + max(0.0, rate - ready * capacity) * start_s
        case = (ready, rate, waiting, start, n, d.describe())
        assert n * capacity - rate >= queued / within, case
        drained = replace(arrivals, rate=rate + queued / within)
        assert holds_aim(policy, GenLevers(), drained, n, d.state), case
        if n > ready:
            out += 1
            assert d.reason_code == SCALED_OUT and not holds_aim(policy, GenLevers(), drained, n - 1, d.state), case
    assert out >= floor(200, DRAIN_FAMILY)


def test_a_longer_queue_never_asks_fewer() -> None:
    """The queue the replicas asked find grows with what waits now: the count asked never falls with it, and a queue
    the pods in force cannot drain within the bound asks more than the arrivals alone need."""
    o = obs(rate=6.0, ttft=5000, waiting=0, ready=2)
    alone = decide_generative(GenState(), GenInForce(2), o, POLICY, NOW).replicas
    by_queue = [
        decide_generative(GenState(), GenInForce(2), replace(o, waiting=w), POLICY, NOW).replicas
        for w in (10, 40, 120, 300)
    ]
    assert by_queue == sorted(by_queue) and by_queue[-1] > by_queue[0] >= alone, (alone, by_queue)


def test_a_drains_replicas_are_not_held_by_the_stabilization_once_the_queue_is_gone() -> None:
    """The stabilization keeps the arrivals' need, not the drain's: a scale-out the backlog sized leaves the
    arrivals' count in `needed`, so once the queue is gone and the windows are within the aim the scale-in goes
    back to that count, not to the drain's (no scale-in under the backlog itself)."""
    o = obs(rate=6.0, ttft=5000, waiting=120, ready=2)
    d = decide_generative(GenState(), GenInForce(2), o, POLICY, NOW)
    alone = needed_replicas(POLICY, GenLevers(), Load(6.0, 600, 200), GenState())
    assert alone is not None and d.replicas > alone and d.bound_by == "backlog-drain", d.describe()
    assert d.state.needed[-1] == (NOW, alone)
    good = replace(d.state, good_windows=5)
    assert scale_in_target(d.replicas, alone, good, obs(rate=6.0, ready=d.replicas), POLICY, NOW + 60)[0] == max(
        alone, d.replicas - d.replicas // 2
    )
    assert scale_in_target(d.replicas, alone, good, o, POLICY, NOW + 60) == (d.replicas, "no-scale-in-under-backlog")


def test_the_pod_start_is_measured_from_the_scale_out_to_the_window_that_sees_it_ready() -> None:
    """A scale-out at t; a window at t + 30 with the new replicas still starting asks no more (their count was
    sized for the queue they find) and measures nothing; the window at t + 60 that sees them ready measures a 60 s
    start, which the next backlog is sized with."""
    policy = replace(POLICY, replicas_max=16)
    d = decide_generative(GenState(), GenInForce(1), obs(rate=5.0, ttft=6000, waiting=40, ready=1), policy, NOW)
    assert d.reason_code == SCALED_OUT and d.state.scale_out_at == NOW and d.state.start_seconds is None
    inf = GenInForce(1).after(d, NOW)
    later = obs(rate=5.0, ttft=9000, waiting=80, ready=1, end=NOW + 30)
    d2 = decide_generative(d.state, inf, later, policy, NOW + 30)
    assert d2.replicas == d.replicas and not d2.changed and d2.state.start_seconds is None, d2.describe()
    ready = obs(rate=5.0, ttft=1500, ready=d.replicas, end=NOW + 60)
    d3 = decide_generative(d2.state, inf.after(d2, NOW + 30), ready, policy, NOW + 60)
    assert d3.state.start_seconds == 60 and d3.state.scale_out_at is None


def test_a_backlog_window_sizes_on_the_output_length_measured_without_one() -> None:
    """Output length is read as tokens out per arrival: a window that queues under-reads it (its waiting sequences
    arrived with no token out). Under a backlog the law sizes on the length of the windows without one; without a
    backlog on the window's own."""
    calm = decide_generative(
        GenState(), GenInForce(2), replace(obs(rate=2.0), output_tokens_per_s=400 * 2.0), POLICY, NOW
    )
    assert calm.state.output_mean == pytest.approx(400)
    short = replace(obs(rate=5.0, ttft=6000, waiting=30, ready=2, end=NOW + 30), output_tokens_per_s=150 * 5.0)
    long = replace(short, output_tokens_per_s=400 * 5.0)
    remembered = decide_generative(calm.state, GenInForce(2), short, POLICY, NOW + 30)
    as_read = decide_generative(calm.state, GenInForce(2), long, POLICY, NOW + 30)
    assert (
        remembered.replicas
        == as_read.replicas
        > decide_generative(GenState(), GenInForce(2), short, POLICY, NOW).replicas
    )
    quiet = replace(obs(rate=2.0, end=NOW + 30), output_tokens_per_s=150 * 2.0)
    assert "+150 tokens" in decide_generative(calm.state, GenInForce(2), quiet, POLICY, NOW + 30).message


def test_the_window_after_a_drain_is_sized_is_the_drains_not_measured_over_model() -> None:
    """TTFT over target right after a window whose backlog raised the count (the drain sized for it): its first
    tokens are that queue's; no blind extra replica (caught: one more asked as the backlog drained). After a window
    whose backlog the count already carried, measured-over-model still adds one."""
    after = decide_generative(GenState(drain_sized=True), GenInForce(3), obs(rate=0.5, ttft=2500, ready=3), POLICY, NOW)
    assert after.bound_by != "measured-over-model" and after.replicas == 3
    assert decide_generative(GenState(), GenInForce(3), obs(rate=0.5, ttft=2500, ready=3), POLICY, NOW).replicas == 4


def test_the_aim_keeps_the_floor_replicas_do_not_move() -> None:
    """The headroom applies above the hardware's floor: TPOT's aim is the weight read plus the headroom's share of
    the rest; a target under the floor is aimed at as it is."""
    _, tpot_aim = aims_ms(POLICY, Load(1.0, 600, 200), GenState())
    floor = 1000 * MODEL.decode_base_s
    assert tpot_aim == pytest.approx(floor + POLICY.headroom * (100 - floor))
    assert aims_ms(replace(POLICY, tpot_target_ms=floor / 2), None, GenState())[1] == pytest.approx(floor / 2)


def test_scale_in_waits_for_windows_within_the_aim() -> None:
    """Little demand on 6 replicas: held until GOOD_WINDOWS_TO_SCALE_IN windows within the aim, then in."""
    st, inf = GenState(), GenInForce(6)
    codes = []
    for k in range(4):
        d = decide_generative(st, inf, obs(rate=1.0, ready=6, end=NOW + 30 * k), POLICY, NOW + 30 * k)
        st, inf = d.state, inf.after(d, NOW + 30 * k)
        codes.append((d.reason_code, d.bound_by))
    assert codes[0][1] == "scale-in-confirming" and codes[1][1] == "scale-in-confirming"
    assert codes[2][0] == SCALED_IN


def test_scale_in_guards() -> None:
    """No scale-in under a backlog; never below the stabilization's highest need; at most half at once."""
    good = GenState(good_windows=5)
    assert scale_in_target(6, 1, good, obs(waiting=20, ready=6), POLICY, NOW) == (6, "no-scale-in-under-backlog")
    recent = replace(good, needed=((NOW - 100, 4),))
    assert scale_in_target(6, 1, recent, obs(ready=6), POLICY, NOW) == (4, "scale-in-stabilization")
    old = replace(good, needed=((NOW - 1000, 4),))
    assert scale_in_target(8, 1, old, obs(ready=8), POLICY, NOW) == (4, "scale-in-by-half")


def test_the_cooldown_holds_a_scale_in() -> None:
    """Within spec.tuning.cooldownSeconds of the last change a scale-in waits."""
    d = decide_generative(
        GenState(good_windows=5), GenInForce(6, changed_at=NOW - 10), obs(rate=0.5, ready=6), POLICY, NOW
    )
    assert d.reason_code == COOLDOWN and d.bound_by == "cooldown" and not d.changed


def test_at_the_bound_a_lever_moves_and_the_reload_budget_limits_it() -> None:
    """Over TTFT at the most replicas: the levers move (one reload); with the hour's reloads spent they do not."""
    policy = replace(POLICY, replicas_max=2)
    o = obs(rate=8, ttft=5000, ready=2)
    d = decide_generative(GenState(), GenInForce(2), o, policy, NOW)
    assert d.reason_code == LEVERS_CHANGED and d.levers != GenLevers() and d.replicas == 2
    spent = GenInForce(2, reloads=tuple(NOW - 60 * k for k in range(1, policy.reloads_per_hour + 1)))
    d = decide_generative(GenState(), spent, o, policy, NOW)
    assert d.reason_code == INFEASIBLE and d.bound_by == "reload-budget" and d.levers == GenLevers()


def test_levers_a_canary_rejected_are_not_proposed_again_at_that_demand() -> None:
    """Over TTFT at the bound, the law proposes a lever change; its canary is rejected (`remember_rejected` on the
    state the decision kept): at the same demand (within SAME_DEMAND_SHARE) the law proposes the next change of its
    order, never the rejected one; at a demand twice as high, or once REJECTION_MEMORY_SECONDS have passed, the first
    is proposed again; with every change rejected it says so (bound by canary-rejected) (caught: the rejected levers
    were proposed again at the next window)."""
    policy = replace(POLICY, replicas_max=2, cooldown_seconds=0)
    o = obs(rate=8, ttft=5000, ready=2)
    first = decide_generative(GenState(), GenInForce(2), o, policy, NOW)
    assert first.reason_code == LEVERS_CHANGED and first.state.load is not None
    st = remember_rejected(first.state, first.levers, NOW + 60)
    assert rejected_at(st, first.state.load, o.requests, NOW + 60) == {first.levers}
    later = NOW + 120
    nearby = obs(rate=8 * (1 + SAME_DEMAND_SHARE / 2), ttft=5000, ready=2, end=later)
    second = decide_generative(st, GenInForce(2), nearby, policy, later)
    assert second.reason_code == LEVERS_CHANGED and second.levers not in (first.levers, GenLevers()), second.describe()
    busier = obs(rate=16, ttft=5000, ready=2, end=later)
    assert decide_generative(st, GenInForce(2), busier, policy, later).levers == first.levers
    past = NOW + 60 + REJECTION_MEMORY_SECONDS
    assert decide_generative(st, GenInForce(2), obs(rate=8, ttft=5000, ready=2, end=past), policy, past).levers == (
        first.levers
    )
    every = st
    for k in range(1, 9):  # reject each proposal in turn at this demand, a window apart
        at = later + 30 * k
        d = decide_generative(every, GenInForce(2), replace(o, window_end=at), policy, at)
        if d.reason_code != LEVERS_CHANGED:
            break
        every = remember_rejected(d.state, d.levers, at)
    assert d.reason_code == INFEASIBLE and d.bound_by == "canary-rejected" and d.levers == GenLevers(), d.describe()


def test_one_demand_is_rates_and_prompts_within_their_noise_or_the_share() -> None:
    """Within SAME_DEMAND_SHARE, or within the noise of the windows' request counts where that is wider (two windows
    of 20 requests at 4 and 5.6 req/s are one demand; of 1000 requests, 4 and 2 req/s are not)."""
    base = Load(4.0, 1000, 24)
    assert same_demand(base, 1000, Load(4.0 * (1 - SAME_DEMAND_SHARE) + 0.01, 1000, 24), 1000)
    assert not same_demand(base, 1000, Load(2.0, 1000, 24), 1000)
    assert not same_demand(base, 1000, Load(4.0, 256, 24), 1000)
    assert same_demand(base, 20, Load(5.6, 1000, 24), 20) and not same_demand(base, 1000, Load(5.6, 1000, 24), 1000)
    assert remember_rejected(GenState(), GenLevers(), NOW).rejected == ()  # no demand read yet: nothing to key it by


def test_calibration_follows_a_slower_engine_and_never_goes_below_the_roofline() -> None:
    """TPOT measured at twice the model's step: the scale moves up; faster than the roofline: it stays 1."""
    step_ms = 1000 * predict(MODEL, GenLevers(), Load(1.0, 600, 200), 99).tpot_s
    slow = decide_generative(GenState(), GenInForce(2), obs(tpot=min(99, 2 * step_ms)), POLICY, NOW)
    assert slow.state.tpot_scale > 1
    fast = decide_generative(GenState(), GenInForce(2), obs(tpot=step_ms / 2), POLICY, NOW)
    assert fast.state.tpot_scale == 1.0


def test_policy_from_spec_reads_the_targets_and_names_an_unknown_gpu() -> None:
    """spec.slo.ttft/tpot and the replicas land in the policy; a GPU without a roofline is refused by field."""
    isvc = (
        make_isvc()
        .backend("tensorrt")
        .set("spec.model.kind", "generative")
        .set("spec.slo.ttft", {"targetMs": 500, "percentile": 99})
        .set("spec.slo.tpot", {"targetMs": 30, "percentile": 95})
        .set("spec.serving.replicas", {"min": 1, "max": 4})
        .obj()
    )
    p = GenPolicy.from_spec(isvc.spec)
    assert (p.ttft_target_ms, p.tpot_target_ms, p.tpot_percentile, p.replicas_max) == (500, 30, 95, 4)
    assert levers_of(isvc.spec.llm_serving()) == GenLevers()  # unset: the backend's defaults, the tuner's too
    moved = GenLevers(0.7, 8, True, "max_utilization")
    assert levers_of(serving_with(moved, isvc.spec.llm_serving())) == moved
    with pytest.raises(GenPolicyError, match=r"spec\.serving\.gpu\.product"):
        GenPolicy.from_spec(
            isvc.spec.model_copy(
                update={
                    "serving": isvc.spec.serving.model_copy(
                        update={"gpu": isvc.spec.serving.gpu.model_copy(update={"product": "NVIDIA-T4"})}
                    )
                }
            )
        )


def test_the_planner_baseline_sizes_on_demand_every_180_s() -> None:
    """Dynamo-style: replicas = ceil(the interval's asked output tokens/s / the profile), only every 180 s, and
    from what the arrivals ask for, not what a saturated replica let out."""
    from tailtune.offline.generative import PLANNER_INTERVAL_SECONDS, PlannerController
    from tailtune.sim.llm import FleetWindow

    def window(end: float) -> FleetWindow:
        # 30 s asking 3000 tokens/s of output, while one saturated replica let out 500/s.
        return FleetWindow(end - 30, end, (), (), 60, 0, 15_000, 90_000, 40.0, 100, 1.0, 1, 0)

    planner = PlannerController(600.0, 1, 1, 12, GenLevers())
    counts = [planner(window(30.0 * k), 30.0 * k)[0] for k in range(1, 8)]
    assert PLANNER_INTERVAL_SECONDS == 180.0
    assert counts[:5] == [1] * 5 and counts[5] == 5 and counts[6] == 5  # 3000 / 600 at the 180 s mark
