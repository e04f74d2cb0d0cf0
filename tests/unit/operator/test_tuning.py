"""The operator's tuner plumbing: state kept on the object, missing signal, rolling mode, SLOMet refresh."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from tailtune.api.keys import APPLIED_ANNOTATION, TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import Batching, Condition, InferenceService, LatencyStatus, ObjectMeta
from tailtune.operator.inforce import in_force, in_force_annotation
from tailtune.operator.inforce import tuner_state as state_for
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tailtune.operator.tuning import slo_condition_moved, tune_step
from tailtune.tuner.servicetime import BatchSample
from tailtune.tuner.types import InForce, Observation, TunerState
from tests.unit.factories import IsvcBuilder, make_isvc

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakeTunerCluster:
    """Records the tuner's writes; serves a fixed observation of the children."""

    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        self.annotations: dict[str, str] = {}
        self.latency: LatencyStatus | None = None
        self.events: list[tuple[str, str]] = []

    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed:
        return self.observed

    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]:
        return self.observed.deployment.ready_pod_ips if self.observed.deployment else ()

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None:
        self.annotations.update(annotations)

    async def patch_latency(
        self, meta: ObjectMeta, latency: LatencyStatus, conditions: list[Condition] | None = None
    ) -> None:
        self.latency = latency
        self.conditions = conditions

    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason))


class FixedReader:
    def __init__(self, obs: Observation | Exception) -> None:
        self.obs = obs

    def read(self, window_end: datetime) -> Observation:
        if isinstance(self.obs, Exception):
            raise self.obs
        return self.obs


SERVING = Observed(
    job=JobObservation(succeeded=True),
    deployment=DeploymentObservation(replicas=1, ready_replicas=1, ready_pod_ips=("127.0.0.1",)),
)


def serving_isvc() -> IsvcBuilder:
    """An InferenceService whose status says a Triton pod is ready."""
    return make_isvc().set("status", {"replicas": {"desired": 1, "ready": 1}})


def test_nothing_is_read_before_pods_serve() -> None:
    cluster = FakeTunerCluster(Observed(job=JobObservation(succeeded=True)))
    reader = FixedReader(AssertionError("must not read"))
    assert asyncio.run(tune_step(make_isvc().obj(), cluster, reader, NOW)) is None
    assert cluster.annotations == {}


def test_prometheus_down_holds_and_reports_missing_latency() -> None:
    cluster = FakeTunerCluster(SERVING)
    isvc = serving_isvc().obj()
    decision = asyncio.run(tune_step(isvc, cluster, FixedReader(ConnectionError("refused")), NOW))
    assert decision is not None and not decision.changed and decision.signal_missing
    assert cluster.latency is not None and cluster.latency.observed_ms is None
    assert APPLIED_ANNOTATION not in cluster.annotations
    # Still missing on the next tick, latency already recorded as missing: nothing to write at all.
    seen_raw = serving_isvc().set("status.latency", cluster.latency.model_dump(by_alias=True, mode="json"))
    for key, value in cluster.annotations.items():
        seen_raw.annotate(key, value)
    seen = seen_raw.obj()
    quiet = FakeTunerCluster(SERVING)
    asyncio.run(tune_step(seen, quiet, FixedReader(ConnectionError("refused")), NOW.replace(minute=1)))
    assert quiet.annotations == {} and quiet.latency is None


def test_rolling_mode_records_without_touching_pods() -> None:
    isvc = (
        serving_isvc()
        .set("spec.tuning.mode", "rolling")
        .set("spec.tuning.cooldownSeconds", 0)
        .set("spec.serving.replicas", {"min": 1, "max": 3})
        .obj()
    )
    cluster = FakeTunerCluster(SERVING)
    # Far over the SLO with a deep queue, several windows in a row: the law must act.
    state_raw = None
    for i in range(6):
        obs = Observation(
            window_end=NOW.replace(minute=i * 2), span_seconds=60, p_latency_ms=120.0, request_rate=800.0,
            queue_ms=90.0, compute_ms=10.0, avg_batch=8.0, ready_replicas=1, sample_count=48000,
            batch_stats=(BatchSample(batch=8, count=6000, ms=10.0),),
        )  # fmt: skip
        if state_raw:
            isvc = isvc.model_copy(
                update={"metadata": isvc.metadata.model_copy(update={"annotations": dict(cluster.annotations)})}
            )
        decision = asyncio.run(tune_step(isvc, cluster, FixedReader(obs), NOW.replace(minute=i * 2)))
        state_raw = cluster.annotations.get(TUNER_STATE_ANNOTATION)
        if decision is not None and decision.changed:
            break
    assert decision is not None and decision.changed, "the law never acted on a sustained violation"
    applied = json.loads(cluster.annotations[APPLIED_ANNOTATION])
    assert applied["reason"] == decision.reason and applied["rolled"] is False
    assert ("Normal", decision.reason_code) in cluster.events


def test_the_config_in_force_has_one_home_clamped_to_the_spec() -> None:
    isvc = make_isvc().obj()
    assert in_force(isvc).batching == isvc.spec.serving.batching  # no annotation: the spec's start
    kept = InForce(batching=Batching(max_batch_size=4), replicas=1, changed_at=NOW, reason="tuned")
    tuned = make_isvc().annotate(APPLIED_ANNOTATION, in_force_annotation(kept)[APPLIED_ANNOTATION]).obj()
    assert in_force(tuned) == kept
    # A config the spec no longer allows (max batch above the engine's profile) is clamped to it, not dropped.
    too_big = kept.model_copy(update={"batching": Batching(max_batch_size=4096)})
    moved = make_isvc().annotate(APPLIED_ANNOTATION, too_big.to_annotation()).obj()
    assert in_force(moved).batching == Batching(max_batch_size=moved.spec.engine.optimization_profile.max)
    broken = make_isvc().annotate(APPLIED_ANNOTATION, "{not json").obj()
    assert in_force(broken).batching == broken.spec.serving.batching
    # The tuner state holds no config: it survives a config change, and a broken one starts fresh.
    state = TunerState(bad_windows=2, calibration=1.5)
    with_state = make_isvc().annotate(TUNER_STATE_ANNOTATION, json.dumps(state.to_dict())).obj()
    assert state_for(with_state) == state
    assert state_for(make_isvc().annotate(TUNER_STATE_ANNOTATION, "[]").obj()) == TunerState()


def test_slo_condition_moved() -> None:
    isvc = make_isvc().obj()  # no conditions yet
    assert slo_condition_moved(isvc, 10.0)
    raw = make_isvc().dict()
    raw["status"] = {"conditions": [{"type": "SLOMet", "status": "True", "reason": "WithinSLO"}]}
    within = InferenceService.model_validate(raw)
    assert not slo_condition_moved(within, 12.0)
    assert slo_condition_moved(within, 45.0)


def test_the_decision_runs_off_the_event_loop() -> None:
    """A decision is CPU work (seconds on a curve measured at every size of a large engine): while it runs, the
    operator's other coroutines (other resources' handlers, watches, the health probe) keep running."""
    from tailtune.operator import tuning

    real = tuning.tune_once

    def slow(*args: Any) -> Any:
        time.sleep(0.5)
        return real(*args)

    obs = Observation(
        window_end=NOW, span_seconds=60, p_latency_ms=10.0, request_rate=100.0, queue_ms=1.0, compute_ms=5.0,
        avg_batch=2.0, ready_replicas=1, sample_count=6000,
    )  # fmt: skip

    async def both() -> int:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        await tune_step(serving_isvc().obj(), FakeTunerCluster(SERVING), FixedReader(obs), NOW)
        done.set()
        await task
        return ticks

    with mock.patch.object(tuning, "tune_once", slow):
        ticks = asyncio.run(both())
    assert ticks >= 10, f"the event loop ran {ticks} times in a 0.5 s decision: it was blocked"
