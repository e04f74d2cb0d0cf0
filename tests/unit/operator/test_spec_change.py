"""A spec change while the tuner has a config in force or a rollout in flight: the config in force is clamped to
the new bounds field by field (never sent back to the spec's start, never fewer replicas without a reason and an
Event), a rollout whose configs the new spec forbids is aborted with every pod brought within the bounds in the same
tick, and no pod is ever left on a config the spec forbids. Triton and the per-pod windows are the fakes of
`test_tuning_rollout`."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION, ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import Batching
from tailtune.operator import handlers, tuning
from tailtune.operator.conform import CONFIG_CLAMPED, ROLLOUT_ABORTED
from tailtune.operator.inforce import clamp_to_spec, in_force
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.reconcile import batching_status, rollout_status
from tailtune.operator.rollout import CANARY_PROMOTED, CANARY_STARTED, RolloutState
from tailtune.tuner.types import InForce
from tests.unit.factories import make_isvc
from tests.unit.operator.test_schedule import body, new_state
from tests.unit.operator.test_tuning import FakeTunerCluster
from tests.unit.operator.test_tuning_rollout import (
    IPS,
    OLD,
    SERVING,
    T0,
    FakePods,
    FakeTriton,
    hot_isvc,
    on_object,
    record,
    started,
    tick,
)

B = Batching


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> FakeTriton:
    """Three fake Triton pods at max batch 1, wired into the tuner's model control."""
    fake = FakeTriton(hot_isvc().obj())
    for name in ("apply_config", "is_model_ready", "get_model_config_json"):
        monkeypatch.setattr(tuning, name, getattr(fake, name))
    return fake


@pytest.mark.parametrize(
    ("spec", "kept", "want", "named"),
    [
        # (spec changes, recorded config, clamped config, the bound each note names)
        ({"spec.tuning.maxBatchSize": {"min": 1, "max": 4}}, (B(max_batch_size=8), 2), (B(max_batch_size=4), 2),
         ["maxBatchSize 8 -> 4 (tuning.maxBatchSize.max 4)"]),
        ({"spec.tuning.maxBatchSize": {"min": 16, "max": 32}}, (B(max_batch_size=8), 2), (B(max_batch_size=16), 2),
         ["maxBatchSize 8 -> 16 (tuning.maxBatchSize.min 16)"]),
        ({"spec.engine.optimizationProfile": {"opt": 4, "max": 8}, "spec.tuning.maxBatchSize": {"min": 1, "max": 8}},
         (B(max_batch_size=16), 1), (B(max_batch_size=8), 1), ["maxBatchSize 16 -> 8 (tuning.maxBatchSize.max 8)"]),
        ({"spec.tuning.maxBatchSize": {"min": 1, "max": 4}},
         (B(max_batch_size=8, preferred_batch_sizes=[2, 8]), 1), (B(max_batch_size=4, preferred_batch_sizes=[2]), 1),
         ["maxBatchSize 8 -> 4", "preferredBatchSizes [2, 8] -> [2]"]),
        ({"spec.tuning.queueDelayMicroseconds": {"min": 0, "max": 500}},
         (B(max_batch_size=8, max_queue_delay_microseconds=2000), 1),
         (B(max_batch_size=8, max_queue_delay_microseconds=500), 1),
         ["maxQueueDelayMicroseconds 2000 -> 500 (tuning.queueDelayMicroseconds.max 500)"]),
        ({"spec.serving.replicas": {"min": 1, "max": 2}}, (B(max_batch_size=8), 3), (B(max_batch_size=8), 2),
         ["replicas 3 -> 2 (serving.replicas.max 2)"]),
        ({"spec.serving.replicas": {"min": 3, "max": 4}}, (B(max_batch_size=8), 2), (B(max_batch_size=8), 3),
         ["replicas 2 -> 3 (serving.replicas.min 3)"]),
        ({}, (B(max_batch_size=8), 1), (B(max_batch_size=8), 1), []),
    ],
)  # fmt: skip
def test_a_config_the_spec_forbids_is_clamped_field_by_field_and_each_field_named(
    spec: dict[str, object], kept: tuple[Batching, int], want: tuple[Batching, int], named: list[str]
) -> None:
    builder = make_isvc().set("spec.serving.replicas", {"min": 1, "max": 4})
    for path, value in spec.items():
        builder.set(path, value)
    clamped, notes = clamp_to_spec(InForce(batching=kept[0], replicas=kept[1]), builder.obj())
    assert (clamped.batching, clamped.replicas) == want
    assert len(notes) == len(named) and all(n.startswith(want_) for n, want_ in zip(notes, named, strict=True))


def test_the_config_in_force_is_clamped_never_sent_back_to_the_spec_start() -> None:
    # Tuned to max batch 8 on 2 replicas; the bound is patched to 4. Before: max batch 1 (the start), 1 replica.
    kept = InForce(batching=B(max_batch_size=8, max_queue_delay_microseconds=100), replicas=2, reason="law")
    isvc = (
        make_isvc()
        .set("spec.serving.replicas", {"min": 1, "max": 3})
        .set("spec.serving.batching", {"maxBatchSize": 1})
        .set("spec.tuning.maxBatchSize", {"min": 1, "max": 4})
        .annotate(APPLIED_ANNOTATION, kept.to_annotation())
        .obj()
    )
    force = in_force(isvc)
    assert force.batching == B(max_batch_size=4, max_queue_delay_microseconds=100) and force.replicas == 2
    status = batching_status(force)
    assert status.max_batch_size == 4 and "tuning.maxBatchSize.max 4" in (status.reason or "")


def test_a_canary_whose_target_the_spec_now_forbids_is_aborted_and_never_promoted(triton: FakeTriton) -> None:
    builder, cluster, target = started(triton)  # the canary runs max batch 32, the others 1
    assert target.max_batch_size > 4
    builder.set("spec.tuning.maxBatchSize", {"min": 1, "max": 4})
    reloads_before = len(triton.reloads)
    # The next tick, within the canary's window: the canary goes back to the config in force, in this tick.
    aborted = tick(builder, cluster, FakePods(triton, {target.max_batch_size: 60.0}), T0 + timedelta(seconds=30))
    assert aborted.reason_code == ROLLOUT_ABORTED and "tuning.maxBatchSize.max 4" in aborted.reason
    assert cluster.events[-1] == ("Normal", ROLLOUT_ABORTED)
    assert triton.reloads[reloads_before:] == [("10.0.0.1", OLD)]
    assert all(triton.batching(ip) == OLD for ip in IPS)
    assert record(cluster) is None and cluster.annotations[ROLLOUT_ANNOTATION] == ""
    force = in_force(on_object(builder, cluster))
    assert force.batching == OLD and force.changed_at == T0 + timedelta(seconds=30)
    # Later ticks plan within the new bounds: no pod ever loads more than 4, and nothing forbidden is promoted.
    for seconds in (61, 122, 183, 244):
        tick(builder, cluster, FakePods(triton, {}), T0 + timedelta(seconds=seconds))
        assert all(triton.batching(ip).max_batch_size <= 4 for ip in IPS)
    assert all(b.max_batch_size <= 4 for _, b in triton.reloads[reloads_before:])
    # The law planned again within them: a new canary, at the new bound, promoted to every pod.
    assert [r for _, r in cluster.events] == [CANARY_STARTED, ROLLOUT_ABORTED, CANARY_STARTED, CANARY_PROMOTED]
    assert in_force(on_object(builder, cluster)).batching.max_batch_size == 4


def test_status_shows_what_each_pod_runs_while_a_canary_runs_another_config(triton: FakeTriton) -> None:
    builder, cluster, target = started(triton)  # the canary runs the target, the other pods max batch 1
    isvc = on_object(builder, cluster)
    assert batching_status(in_force(isvc)).max_batch_size == 1  # the majority
    canary = rollout_status(isvc)
    assert (canary.canary, canary.stage, canary.max_batch_size) == ("10.0.0.1", "canary", target.max_batch_size)
    assert canary.since == "2026-01-01T12:00:00Z" and canary.reason
    # Aborted by a spec change: every pod runs status.batching again, and status.rollout is empty.
    builder.set("spec.tuning.maxBatchSize", {"min": 1, "max": 4})
    tick(builder, cluster, FakePods(triton, {}), T0 + timedelta(seconds=30))
    assert rollout_status(on_object(builder, cluster)).canary is None


def test_bounds_patched_mid_canary_keep_the_replicas_and_bring_every_pod_within_them(triton: FakeTriton) -> None:
    # Three replicas after a scale-out (min 1), max batch 2 in force, a canary to 4 in flight on 10.0.0.1.
    builder = hot_isvc().set("spec.serving.replicas", {"min": 1, "max": 3})
    kept = InForce(batching=B(max_batch_size=2), replicas=3, changed_at=T0 - timedelta(minutes=5), reason="scale-out")
    rollout = RolloutState(target=B(max_batch_size=4), previous=B(max_batch_size=2), canary="10.0.0.1", since=T0,
                           started=T0)  # fmt: skip
    cluster = FakeTunerCluster(SERVING)
    cluster.annotations = {APPLIED_ANNOTATION: kept.to_annotation(), **rollout.to_annotation()}
    on = {ip: B(max_batch_size=4 if ip == "10.0.0.1" else 2) for ip in IPS}
    triton.live = {ip: json.loads(model_config_json(builder.obj(), b, None)) for ip, b in on.items()}
    # The bounds and the starting batch are patched to 1.
    builder.set("spec.tuning.maxBatchSize", {"min": 1, "max": 1}).set("spec.serving.batching", {"maxBatchSize": 1})
    assert in_force(on_object(builder, cluster)).replicas == 3  # not the spec's start (replicas.min 1)
    done = tick(builder, cluster, FakePods(triton, {}), T0 + timedelta(seconds=20))
    assert done.reason_code == ROLLOUT_ABORTED and done.in_force.replicas == 3
    assert [reason for _, reason in cluster.events] == [ROLLOUT_ABORTED]  # no scale-in, no rejection
    assert all(triton.batching(ip).max_batch_size == 1 for ip in IPS)
    assert sorted(ip for ip, _ in triton.reloads) == sorted(IPS)  # each pod once
    applied = json.loads(cluster.annotations[APPLIED_ANNOTATION])
    assert applied["replicas"] == 3 and applied["batching"]["maxBatchSize"] == 1
    assert "maxBatchSize 2 -> 1" in applied["reason"] and record(cluster) is None


def test_replicas_the_spec_no_longer_allows_change_with_the_field_named_and_one_event(triton: FakeTriton) -> None:
    builder = hot_isvc().set("spec.serving.replicas", {"min": 1, "max": 2})  # was 3..3
    cluster = FakeTunerCluster(SERVING)
    cluster.annotations = {APPLIED_ANNOTATION: InForce(batching=OLD, replicas=3).to_annotation()}
    done = tick(builder, cluster, FakePods(triton, {}), T0)
    assert done.changed and done.reason_code == CONFIG_CLAMPED and done.in_force.replicas == 2
    assert "replicas 3 -> 2 (serving.replicas.max 2)" in done.reason
    assert cluster.events == [("Normal", CONFIG_CLAMPED)] and triton.reloads == []  # the batching was allowed
    assert json.loads(cluster.annotations[APPLIED_ANNOTATION])["replicas"] == 2
    # Recorded: the next tick does not clamp again.
    tick(builder, cluster, FakePods(triton, {}), T0 + timedelta(seconds=30))
    assert cluster.events.count(("Normal", CONFIG_CLAMPED)) == 1


def test_a_spec_change_wakes_the_tuner_before_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: list[float] = []

    async def tick(state: Any, namespace: str, name: str) -> float:
        ticks.append(time.monotonic())
        return 30.0

    monkeypatch.setattr(handlers, "tuner_tick", tick)
    monkeypatch.setenv(handlers.FAST_PATH_ENV, "0")

    async def run() -> None:
        state = new_state()
        state.see(("ml", "svc"), "u", body("svc", "u"))
        state.schedule.at(("ml", "svc"), handlers.TICK, 0.0)
        schedule = asyncio.create_task(state.schedule.run())
        await asyncio.sleep(0.1)
        assert len(ticks) == 1  # nothing changed: the next one an interval on
        state.schedule.wake(("ml", "svc"), handlers.TICK)  # the spec changed: the next tick at once
        await asyncio.sleep(0.1)
        assert len(ticks) == 2
        schedule.cancel()

    asyncio.run(run())
