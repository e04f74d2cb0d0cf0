"""The rollout state machine: promote, reject (worse P99, failed reload, readiness drop, no data), roll back,
resume after a restart; the per-pod Prometheus read; the law skipping a rejected config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tailtune.api.v1alpha1 import Batching
from tailtune.operator.rollout import (
    CANARY_PROMOTED,
    CANARY_REJECTED,
    PodObservation,
    RolloutPolicy,
    RolloutState,
    advance_rollout,
    decide_rollout,
    reload_fits,
    start_rollout,
)
from tailtune.tuner.law import best_plan, rejected_now
from tailtune.tuner.prom import Target, read_pod_windows
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import Policy, RejectedConfig, TunerState

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
OLD = Batching(max_batch_size=4)
NEW = Batching(max_batch_size=8, max_queue_delay_microseconds=500)
POLICY = RolloutPolicy(slo_ms=100.0, window_seconds=60.0)
IPS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


@dataclass
class Pods:
    """Three fake Triton pods: live batching, readiness, P99 per config, and reloads that may fail."""

    live: dict[str, Batching] = field(default_factory=lambda: dict.fromkeys(IPS, OLD))
    ready: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(IPS, True))
    p_ms: dict[int, float] = field(default_factory=lambda: {4: 40.0, 8: 35.0})
    refuse: set[str] = field(default_factory=set)
    reloads: list[tuple[str, int]] = field(default_factory=list)

    def observe(self) -> Mapping[str, PodObservation]:
        return {
            ip: PodObservation(self.ready[ip], b, self.p_ms[b.max_batch_size], 0.0, 500) for ip, b in self.live.items()
        }

    def reload(self, ip: str, batching: Batching) -> str:
        self.reloads.append((ip, batching.max_batch_size))
        if ip in self.refuse:
            return "Triton refused to load 'm': bad config"
        self.live[ip] = batching
        return ""


def started() -> RolloutState:
    state = start_rollout(NEW, OLD, IPS, T0, 120.0, "the law's reason")
    assert state is not None and state.canary == "10.0.0.1" and state.since is None
    return state


def run(state: RolloutState, pods: Pods, at: datetime, policy: RolloutPolicy = POLICY) -> Any:
    kept: list[RolloutState] = []
    step = advance_rollout(state, pods.observe, pods.reload, policy, at, kept.append)
    return step, kept


def test_good_change_goes_to_the_canary_then_after_one_window_to_the_rest_one_at_a_time() -> None:
    pods = Pods()
    step, kept = run(started(), pods, T0)
    assert pods.reloads == [("10.0.0.1", 8)] and step.outcome == ""
    assert step.state is not None and step.state.since == T0 and kept[0].since is None  # kept before the reload
    waiting, _ = run(step.state, pods, T0 + timedelta(seconds=30))
    assert waiting.code == "CanaryWaiting" and len(pods.reloads) == 1
    done, kept = run(step.state, pods, T0 + timedelta(seconds=61))
    assert done.outcome == "promoted" and done.code == CANARY_PROMOTED and done.state is None
    assert pods.reloads[1:] == [("10.0.0.2", 8), ("10.0.0.3", 8)]
    assert [k.stage for k in kept] == ["promoting", "promoting"]  # a record before each bounded batch
    assert all(b == NEW for b in pods.live.values())


def test_canary_over_the_slo_is_rolled_back_on_that_pod_only() -> None:
    pods = Pods(p_ms={4: 40.0, 8: 250.0})
    step, _ = run(started(), pods, T0)
    assert step.state is not None
    end, _ = run(step.state, pods, T0 + timedelta(seconds=61))
    assert end.outcome == "rejected" and end.code == CANARY_REJECTED and "over the SLO" in end.message
    assert pods.reloads == [("10.0.0.1", 8), ("10.0.0.1", 4)]
    assert all(b == OLD for b in pods.live.values())


def test_canary_worse_than_the_other_pods_by_the_margin_is_rejected_within_the_slo() -> None:
    pods = Pods(p_ms={4: 20.0, 8: 60.0})  # under the 100 ms SLO, three times the others
    step, _ = run(started(), pods, T0)
    assert step.state is not None
    end, _ = run(step.state, pods, T0 + timedelta(seconds=61))
    assert end.outcome == "rejected" and "worse than the other pods" in end.message


def test_the_margin_over_the_other_pods_is_at_the_slos_scale() -> None:
    # The other pods as three demo pods on one config read in one window (Triton's summaries): 15.2 and 15.9 ms.
    state = started().model_copy(update={"since": T0})

    def stage(canary_ms: float, policy: RolloutPolicy) -> str:
        p_ms = {IPS[0]: canary_ms, IPS[1]: 15.2, IPS[2]: 15.9}
        pods = {ip: PodObservation(True, NEW if ip == IPS[0] else OLD, p_ms[ip], 0.0, 500) for ip in IPS}
        step = decide_rollout(state, pods, policy, T0 + timedelta(seconds=61))
        assert step.state is not None
        return step.state.stage

    wide, tight = RolloutPolicy(slo_ms=300.0, window_seconds=60.0), RolloutPolicy(slo_ms=30.0, window_seconds=60.0)
    assert wide.margin_floor_ms == 15.0 and tight.margin_floor_ms == 2.0
    assert stage(19.4, wide) == stage(19.4, tight) == "promoting"  # the third pod of the same config
    # 25 ms against 15.9: noise at a 300 ms SLO (bound 34 ms), a regression at a 30 ms one (bound 21 ms).
    assert stage(25.0, wide) == "promoting" and stage(25.0, tight) == "rolling-back"
    assert stage(25.0, replace(wide, margin_ms=2.0)) == "rolling-back"  # an explicit margin stands
    assert stage(40.0, wide) == "rolling-back"  # 2.5 times the others stays a regression within the SLO


def test_canary_with_more_errors_is_rejected() -> None:
    state = started().model_copy(update={"since": T0})
    pods = {ip: PodObservation(True, NEW if ip == "10.0.0.1" else OLD, 30.0, 0.0, 500) for ip in IPS}
    pods["10.0.0.1"] = replace(pods["10.0.0.1"], error_rate=0.05)
    step = decide_rollout(state, pods, POLICY, T0 + timedelta(seconds=61))
    assert step.state is not None and step.state.stage == "rolling-back" and "error rate" in step.state.verdict
    assert step.reloads == (("10.0.0.1", OLD),)


def test_reload_triton_refuses_on_the_canary_rejects_at_once() -> None:
    pods = Pods(refuse={"10.0.0.1"})
    step, _ = run(started(), pods, T0)
    assert step.outcome == "rejected" and "refused the reload" in step.message
    assert pods.reloads == [("10.0.0.1", 8)]  # Triton keeps the old model serving: nothing to roll back
    assert all(b == OLD for b in pods.live.values())


def test_canary_readiness_drop_rolls_back() -> None:
    pods = Pods()
    step, _ = run(started(), pods, T0)
    assert step.state is not None
    pods.ready["10.0.0.1"] = False
    end, _ = run(step.state, pods, T0 + timedelta(seconds=10))
    assert end.outcome == "rejected" and "no longer ready" in end.message


def test_a_pod_refusing_during_promotion_rolls_everything_back() -> None:
    pods = Pods(refuse={"10.0.0.3"})
    step, _ = run(started(), pods, T0)
    assert step.state is not None
    end, _ = run(step.state, pods, T0 + timedelta(seconds=61))
    assert end.outcome == "rejected" and "10.0.0.3" in end.message
    assert all(b == OLD for b in pods.live.values())


def test_canary_without_latency_for_two_windows_is_rolled_back() -> None:
    state = started().model_copy(update={"since": T0})
    pods = {ip: PodObservation(True, NEW if ip == "10.0.0.1" else OLD) for ip in IPS}
    assert decide_rollout(state, pods, POLICY, T0 + timedelta(seconds=90)).code == "CanaryWaiting"
    late = decide_rollout(state, pods, POLICY, T0 + timedelta(seconds=121))
    assert late.state is not None and late.state.stage == "rolling-back" and "two windows" in late.state.verdict
    # Without a per-pod latency reader the canary is judged on its reload and readiness.
    blind = replace(POLICY, latency_required=False)
    assert decide_rollout(state, pods, blind, T0 + timedelta(seconds=61)).code == "Promoting"


def test_restart_resumes_from_the_record_and_what_the_pods_show() -> None:
    # Died after the canary reload but before the record said so: the record was kept just before that reload,
    # so the window counts from its start, not from the resume (a restart adds no window to the split).
    pods = Pods()
    pods.live["10.0.0.1"] = NEW
    record = RolloutState.from_annotations(started().to_annotation())
    assert record is not None
    step, _ = run(record, pods, T0 + timedelta(seconds=5))
    assert step.state is not None and step.state.since == T0 and pods.reloads == []
    assert step.code == "CanaryWaiting" and "55 s" in step.message
    late = Pods()
    late.live["10.0.0.1"] = NEW
    assert run(record, late, T0 + timedelta(seconds=61))[0].outcome == "promoted"  # judged at once
    # Died in the middle of promoting: the next operator reloads only the pods still on the old config.
    pods.live["10.0.0.2"] = NEW
    promoting = step.state.model_copy(update={"stage": "promoting", "verdict": "ok"})
    resumed = RolloutState.from_annotations(promoting.to_annotation())
    assert resumed is not None
    end, _ = run(resumed, pods, T0 + timedelta(seconds=200))
    assert end.outcome == "promoted" and pods.reloads == [("10.0.0.3", 8)]
    # A canary judged long after its window (the operator was away) is judged at once, not waited for again.
    away = started().model_copy(update={"since": T0})
    fresh = Pods()
    fresh.live["10.0.0.1"] = NEW
    assert run(away, fresh, T0 + timedelta(hours=1))[0].outcome == "promoted"


def test_rollback_resumes_and_ends_rejected() -> None:
    pods = Pods()
    pods.live["10.0.0.1"] = NEW
    pods.live["10.0.0.2"] = NEW
    back = started().model_copy(update={"stage": "rolling-back", "since": T0, "verdict": "P99 over the SLO"})
    end, kept = run(back, pods, T0 + timedelta(seconds=70))
    assert end.outcome == "rejected" and "P99 over the SLO" in end.message
    assert sorted(pods.reloads) == [("10.0.0.1", 4), ("10.0.0.2", 4)] and kept
    assert all(b == OLD for b in pods.live.values())


def test_record_that_does_not_parse_is_no_rollout() -> None:
    assert RolloutState.from_annotations({}) is None
    assert RolloutState.from_annotations({"tailtune.io/rollout": ""}) is None
    assert RolloutState.from_annotations({"tailtune.io/rollout": "{not json"}) is None
    assert start_rollout(NEW, OLD, (), T0, None, "") is None


def test_memory_check() -> None:
    gib = 1 << 30
    assert reload_fits(2 * gib, 10 * gib, 24 * gib) is True
    assert reload_fits(None, 14 * gib, 24 * gib) is False  # without the engine size, what is used stands in
    assert reload_fits(2 * gib, 23 * gib, 24 * gib) is False
    assert reload_fits(2 * gib, None, None) is None


def test_per_pod_windows_from_prometheus() -> None:
    asked: list[str] = []

    def query(promql: str, at: datetime) -> list[dict[str, Any]]:
        asked.append(promql)
        if "summary" in promql:
            return [
                {"metric": {"instance": "10.0.0.1:8002"}, "value": [0, "42.5"]},
                {"metric": {"instance": "10.0.0.2:8002"}, "value": [0, "NaN"]},
            ]
        if "success" in promql:
            return [{"metric": {"instance": "10.0.0.1:8002"}, "value": [0, "9"]}]
        if "failure" in promql:
            return [{"metric": {"instance": "10.0.0.1:8002"}, "value": [0, "1"]}]
        return []

    w = read_pod_windows(query, Target("ns", "svc", "m"), 99.0, 60.0, T0)
    assert w["10.0.0.1"].p_ms == 42.5 and w["10.0.0.1"].error_rate == 0.1 and w["10.0.0.2"].p_ms is None
    assert any('quantile="0.99"' in q and "by (instance)" in q for q in asked)


def test_law_skips_a_config_rejected_at_this_load_for_a_while() -> None:
    curve = Curve(tuple(CurvePoint(batch=b, ms=2.0 + 0.5 * b) for b in (1, 2, 4, 8, 16)))
    policy = Policy(slo_ms=50.0, batch_max=16, replicas_max=4)
    plan = best_plan(curve, 200.0, policy)
    bad = Batching(max_batch_size=plan.candidate.max_batch, max_queue_delay_microseconds=plan.candidate.delay_us)
    state = TunerState(rejected=(RejectedConfig(batching=bad, demand_rps=200.0, at=T0, reason="canary"),))
    avoid = rejected_now(state, 210.0, T0 + timedelta(minutes=5))
    assert avoid == {(bad.max_batch_size, bad.max_queue_delay_microseconds)}
    other = best_plan(curve, 200.0, policy, avoid=avoid)
    assert (other.candidate.max_batch, other.candidate.delay_us) != (
        bad.max_batch_size,
        bad.max_queue_delay_microseconds,
    )
    # What failed at a load fails at more; at a clearly lower load it may be tried again.
    assert rejected_now(state, 500.0, T0 + timedelta(minutes=5)) == avoid
    assert rejected_now(state, 100.0, T0 + timedelta(minutes=5)) == frozenset()
    assert rejected_now(state, 200.0, T0 + timedelta(hours=1)) == frozenset()  # long ago
    assert TunerState.from_dict(state.to_dict()) == state


def test_a_generative_rollout_judges_the_live_settings_and_rolls_back_to_the_previous_ones() -> None:
    """A rollout of tensorrt_llm settings (batching unchanged): a pod runs the target when its live settings equal
    it; a canary that drops out of readiness is rolled back with the previous settings, never the batching reload
    (caught: the batching's equality made every pod look on target, since the batching does not move)."""
    from tailtune.api.v1alpha1 import LlmServing

    old, new = LlmServing(), LlmServing(enable_chunked_context=True)
    live = dict.fromkeys(IPS, old)
    ready = dict.fromkeys(IPS, True)
    reloads: list[tuple[str, LlmServing]] = []

    def observe() -> Mapping[str, PodObservation]:
        return {ip: PodObservation(ready[ip], OLD, llm=live[ip]) for ip in IPS}

    def reload_llm(ip: str, settings: LlmServing) -> str:
        reloads.append((ip, settings))
        live[ip] = settings
        return ""

    def batching_reload(ip: str, b: Batching) -> str:
        raise AssertionError("a generative rollout reloads its settings, not the batching")

    policy = RolloutPolicy(slo_ms=500.0, window_seconds=60.0, latency_required=False)
    state = start_rollout(OLD, OLD, IPS, T0, None, "TTFT binds", llm=(new, old))
    assert state is not None
    step = advance_rollout(state, observe, batching_reload, policy, T0, reload_llm=reload_llm)
    assert reloads == [("10.0.0.1", new)] and step.state is not None and step.state.since == T0
    ready["10.0.0.1"] = False  # the canary drops out of readiness: rejected, the pods on the target go back
    live["10.0.0.2"] = new  # a pod restarted onto the target meanwhile
    step = advance_rollout(
        step.state, observe, batching_reload, policy, T0 + timedelta(seconds=30), reload_llm=reload_llm
    )
    assert reloads[1:] == [("10.0.0.2", old)]
    assert step.outcome == "rejected" and step.state is None and "no longer ready" in step.message


def test_a_batching_rollouts_record_carries_no_generative_fields() -> None:
    import json

    from tailtune.api.keys import ROLLOUT_ANNOTATION

    record = json.loads(started().to_annotation()[ROLLOUT_ANNOTATION])
    assert "llm_target" not in record and "llm_previous" not in record
    assert RolloutState.from_annotations(started().to_annotation()) == started()
