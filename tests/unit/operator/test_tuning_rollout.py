"""The hot path through `tune_step`: the law's batching change goes to a canary (the rollout record on the object,
CanaryStarted), a clean window promotes it (CanaryPromoted, the config in force moves), a bad canary is rejected
(CanaryRejected, the config in force stays, the target recorded as rejected), a reload Triton refuses rejects at
once, an operator restart mid-rollout resumes without a second canary, and the engine's size decides whether
a reload fits on the GPU. Triton's model control and the per-pod Prometheus windows are fakes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION, ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import Batching, EngineStatus, InferenceService
from tailtune.operator import tuning
from tailtune.operator.engine import engine_cache_key, engine_info, engine_status, parse_build_report
from tailtune.operator.inforce import in_force, tuner_state
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tailtune.operator.rollout import CANARY_PROMOTED, CANARY_REJECTED, CANARY_STARTED, RolloutState
from tailtune.triton.config import batching_from_config
from tailtune.triton.control import ApplyError, ApplyResult
from tailtune.tuner.prom import PodWindow
from tailtune.tuner.types import Decision, Observation
from tests.unit.factories import IsvcBuilder, make_isvc
from tests.unit.operator.test_tuning import FakeTunerCluster, FixedReader

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
IPS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
OLD = Batching(max_batch_size=1)
GIB = 1 << 30
SERVING = Observed(
    job=JobObservation(succeeded=True),
    deployment=DeploymentObservation(replicas=3, ready_replicas=3, ready_pod_ips=IPS),
)


def hot_isvc(engine_bytes: int | None = None) -> IsvcBuilder:
    """Three ready pods at max batch 1, hot mode, replicas pinned (only batching can change), a build curve."""
    b = (
        make_isvc()
        .set("status", {"replicas": {"desired": 3, "ready": 3}})
        .set("spec.tuning.mode", "hot")
        .set("spec.tuning.cooldownSeconds", 0)
        .set("spec.serving.replicas", {"min": 3, "max": 3})
        .set("spec.serving.batching", {"maxBatchSize": 1})
        .set("spec.slo.latencyMs", 100)
    )
    key = engine_cache_key(b.obj())
    tensors = {
        "inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [16]}],
        "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [4]}],
    }
    b.set("status.engine", {"cacheKey": key, "engineBytes": engine_bytes, **tensors})
    points = [{"batch": n, "ms": 2 + 0.5 * n, "samples": 1, "source": "build"} for n in (1, 2, 4, 8, 16, 32)]
    return b.set("status.serviceTime", {"engineCacheKey": key, "points": points})


def over_the_slo(at: datetime) -> FixedReader:
    """P99 three times the 100 ms SLO with the queue backing up: the law changes the batching."""
    return FixedReader(
        Observation(
            window_end=at,
            span_seconds=60,
            p_latency_ms=300.0,
            request_rate=800.0,
            queue_ms=250.0,
            compute_ms=10.0,
            avg_batch=1.0,
            ready_replicas=3,
            sample_count=48000,
        )
    )


@dataclass
class FakeTriton:
    """Three Triton pods: the live config of each, readiness, reloads Triton refuses, the reloads done."""

    isvc: InferenceService
    live: dict[str, dict[str, object]] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    reloads: list[tuple[str, Batching]] = field(default_factory=list)

    def __post_init__(self) -> None:
        start = json.loads(model_config_json(self.isvc, OLD, None))
        self.live = {ip: dict(start) for ip in IPS}

    def batching(self, ip: str) -> Batching:
        return batching_from_config(self.live[ip])

    def apply_config(self, url: str, model: str, config_json: str, timeout: float = 300.0) -> ApplyResult:
        ip = url.split(":")[0]
        config = json.loads(config_json)
        self.reloads.append((ip, batching_from_config(config)))
        if ip in self.refuse:
            raise ApplyError(f"Triton refused to load '{model}': bad config")
        self.live[ip] = config
        return ApplyResult(seconds=0.5, live_batching=batching_from_config(config))

    def is_model_ready(self, url: str, model: str, timeout: float = 2.0) -> bool:
        return True

    def get_model_config_json(self, url: str, model: str, timeout: float = 5.0) -> dict[str, object]:
        return self.live[url.split(":")[0]]


@dataclass
class FakePods:
    """Each pod's own Prometheus window: its P99 follows the config it runs (`PodReader`)."""

    triton: FakeTriton
    p_ms: Mapping[int, float]  # by max batch size; the old config's otherwise
    gpu_used: float | None = None
    gpu_total: float | None = None
    reads: int = 0

    def read(self, at: datetime) -> Mapping[str, PodWindow]:
        self.reads += 1
        return {
            ip: PodWindow(
                p_ms=self.p_ms.get(self.triton.batching(ip).max_batch_size, 90.0),
                success_rps=100.0,
                failure_rps=0.0,
                gpu_used_bytes=self.gpu_used,
                gpu_total_bytes=self.gpu_total,
            )
            for ip in IPS
        }


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> FakeTriton:
    fake = FakeTriton(hot_isvc().obj())
    monkeypatch.setattr(tuning, "apply_config", fake.apply_config)
    monkeypatch.setattr(tuning, "is_model_ready", fake.is_model_ready)
    monkeypatch.setattr(tuning, "get_model_config_json", fake.get_model_config_json)
    return fake


def tick(builder: IsvcBuilder, cluster: FakeTunerCluster, pods: FakePods, at: datetime) -> Decision:
    """One tuner tick on the object as the API server has it now (the annotations written so far)."""
    raw = builder.dict()
    raw["metadata"]["annotations"] = {k: v for k, v in cluster.annotations.items() if v}
    decision = asyncio.run(
        tuning.tune_step(InferenceService.model_validate(raw), cluster, over_the_slo(at), at, None, pods)
    )
    assert decision is not None
    return decision


def record(cluster: FakeTunerCluster) -> RolloutState | None:
    return RolloutState.from_annotations(cluster.annotations)


def on_object(builder: IsvcBuilder, cluster: FakeTunerCluster) -> InferenceService:
    raw = builder.dict()
    raw["metadata"]["annotations"] = {k: v for k, v in cluster.annotations.items() if v}
    return InferenceService.model_validate(raw)


def started(triton: FakeTriton) -> tuple[IsvcBuilder, FakeTunerCluster, Batching]:
    """The first tick: the law's batching change goes to the canary only."""
    builder, cluster = hot_isvc(), FakeTunerCluster(SERVING)
    decision = tick(builder, cluster, FakePods(triton, {}), T0)
    state = record(cluster)
    assert state is not None, cluster.events
    assert ("Normal", CANARY_STARTED) in cluster.events
    assert state.canary == "10.0.0.1" and state.previous == OLD and state.target != OLD and state.since == T0
    assert triton.reloads == [("10.0.0.1", state.target)]
    assert [triton.batching(ip).max_batch_size for ip in IPS] == [state.target.max_batch_size, 1, 1]
    assert not decision.changed and decision.reason_code == "CanaryWaiting"
    assert in_force(on_object(builder, cluster)).batching == OLD  # in force moves only on promotion
    return builder, cluster, state.target


def test_a_batching_change_starts_a_canary_and_a_clean_window_promotes_it(triton: FakeTriton) -> None:
    builder, cluster, target = started(triton)
    # Within the window: nothing reloaded, nothing told, the law's next change waits.
    waiting = tick(builder, cluster, FakePods(triton, {target.max_batch_size: 60.0}), T0 + timedelta(seconds=30))
    assert waiting.reason_code == "CanaryWaiting" and len(triton.reloads) == 1 and len(cluster.events) == 1
    # One clean window later (canary 60 ms, the others 90 ms, SLO 100 ms): the rest, one pod at a time.
    done = tick(builder, cluster, FakePods(triton, {target.max_batch_size: 60.0}), T0 + timedelta(seconds=61))
    assert done.changed and done.reason_code == CANARY_PROMOTED
    assert ("Normal", CANARY_PROMOTED) in cluster.events
    assert triton.reloads[1:] == [("10.0.0.2", target), ("10.0.0.3", target)]
    assert all(triton.batching(ip) == target for ip in IPS)
    assert record(cluster) is None and cluster.annotations[ROLLOUT_ANNOTATION] == ""
    promoted = in_force(on_object(builder, cluster))
    assert promoted.batching == target and promoted.changed_at == T0 + timedelta(seconds=61)
    assert json.loads(cluster.annotations[APPLIED_ANNOTATION])["batching"]["maxBatchSize"] == target.max_batch_size


def test_a_bad_canary_is_rejected_on_that_pod_and_recorded(triton: FakeTriton) -> None:
    builder, cluster, target = started(triton)
    bad = FakePods(triton, {target.max_batch_size: 250.0})  # the canary's own P99 breaks the 100 ms SLO
    done = tick(builder, cluster, bad, T0 + timedelta(seconds=61))
    assert done.reason_code == CANARY_REJECTED and "over the SLO" in done.reason
    assert ("Warning", CANARY_REJECTED) in cluster.events and ("Normal", CANARY_PROMOTED) not in cluster.events
    assert triton.reloads == [("10.0.0.1", target), ("10.0.0.1", OLD)]  # rolled back on the canary only
    assert all(triton.batching(ip) == OLD for ip in IPS)
    isvc = on_object(builder, cluster)
    assert in_force(isvc).batching == OLD and record(cluster) is None
    rejected = tuner_state(isvc).rejected
    # The canary's verdict is the newest record (the config left for breaking the SLO may precede it).
    assert rejected[-1].batching == target and rejected[-1].at == T0 + timedelta(seconds=61)
    assert [r.batching for r in rejected].count(target) == 1
    # The next tick does not try the same config again at this load.
    tick(builder, cluster, bad, T0 + timedelta(seconds=180))
    assert all(b != target for _, b in triton.reloads[2:])


def test_a_reload_triton_refuses_on_the_canary_is_rejected_in_the_same_tick(triton: FakeTriton) -> None:
    triton.refuse.add("10.0.0.1")
    builder, cluster = hot_isvc(), FakeTunerCluster(SERVING)
    done = tick(builder, cluster, FakePods(triton, {}), T0)
    assert [reason for _, reason in cluster.events] == [CANARY_STARTED, CANARY_REJECTED]
    assert done.reason_code == CANARY_REJECTED and "refused the reload" in done.reason
    assert len(triton.reloads) == 1 and all(triton.batching(ip) == OLD for ip in IPS)
    assert in_force(on_object(builder, cluster)).batching == OLD and record(cluster) is None


def test_a_hot_reload_never_loads_declared_tensors_the_engine_disagrees_with(triton: FakeTriton) -> None:
    # The pods serve the engine's x [16]; the spec is patched to declare [17]: no pod is sent that config.
    builder = hot_isvc().set("spec.model.inputs", [{"name": "x", "dataType": "TYPE_FP32", "dims": [17]}])
    cluster = FakeTunerCluster(SERVING)
    done = tick(builder, cluster, FakePods(triton, {}), T0)
    assert triton.reloads == [] and all(triton.batching(ip) == OLD for ip in IPS)
    assert done.reason_code == CANARY_REJECTED and "spec.model.inputs[0].dims" in done.reason
    assert in_force(on_object(builder, cluster)).batching == OLD and record(cluster) is None


def test_a_restart_mid_rollout_resumes_without_a_second_canary(triton: FakeTriton) -> None:
    builder, first, target = started(triton)
    # A new operator (nothing in memory) reads the object with the rollout record 30 s into the window.
    second = FakeTunerCluster(SERVING)
    second.annotations = dict(first.annotations)
    clean = FakePods(triton, {target.max_batch_size: 60.0})
    resumed = tick(builder, second, clean, T0 + timedelta(seconds=30))
    assert resumed.reason_code == "CanaryWaiting" and second.events == [] and len(triton.reloads) == 1
    # The window still counts from the canary's reload: the pods are one config again one window after it.
    done = tick(builder, second, clean, T0 + timedelta(seconds=61))
    assert done.reason_code == CANARY_PROMOTED and second.events == [("Normal", CANARY_PROMOTED)]
    assert all(triton.batching(ip) == target for ip in IPS)
    assert [ip for ip, _ in triton.reloads] == list(IPS)  # each pod reloaded once


def test_a_restart_that_lost_the_record_update_after_the_canary_reload_adds_no_window(triton: FakeTriton) -> None:
    builder, first, target = started(triton)
    # The operator died after the canary's reload, before the record said so (the record kept before it).
    state = record(first)
    assert state is not None
    second = FakeTunerCluster(SERVING)
    second.annotations = dict(first.annotations) | state.model_copy(update={"since": None}).to_annotation()
    # Back 70 s later: the canary has run the target for a window already; it is judged in this tick.
    done = tick(builder, second, FakePods(triton, {target.max_batch_size: 250.0}), T0 + timedelta(seconds=70))
    assert done.reason_code == CANARY_REJECTED and CANARY_STARTED not in [r for _, r in second.events]
    assert triton.reloads == [("10.0.0.1", target), ("10.0.0.1", OLD)]  # no second canary reload
    assert all(triton.batching(ip) == OLD for ip in IPS)


def test_the_engine_size_decides_whether_a_reload_fits(triton: FakeTriton) -> None:
    # 14 GiB used of 24: a reload needing as much again would not fit, but a 2 GiB engine does.
    builder, cluster = hot_isvc(engine_bytes=2 * GIB), FakeTunerCluster(SERVING)
    tick(builder, cluster, FakePods(triton, {}, gpu_used=14 * GIB, gpu_total=24 * GIB), T0)
    assert ("Normal", CANARY_STARTED) in cluster.events and len(triton.reloads) == 1
    # 10 GiB used, 14 free, a 15 GiB engine: no room for the second copy, the pods are rolled instead.
    triton.reloads.clear()
    big, rolled = hot_isvc(engine_bytes=15 * GIB), FakeTunerCluster(SERVING)
    decision = tick(big, rolled, FakePods(triton, {}, gpu_used=10 * GIB, gpu_total=24 * GIB), T0)
    assert [r for _, r in rolled.events] == ["HotReloadNoRoom"] and triton.reloads == []
    assert decision.changed and json.loads(rolled.annotations[APPLIED_ANNOTATION])["rolled"] is True
    assert record(rolled) is None


def test_the_engine_size_travels_from_the_build_report_to_status() -> None:
    report = json.dumps({"reason": "Built", "location": "m/1/model.plan", "engineBytes": 123456, "inputs": []})
    info = parse_build_report(report)
    assert info is not None and info.engine_bytes == 123456
    status = engine_status("eng-1", "store", info, EngineStatus())
    assert status.engine_bytes == 123456
    assert status.model_dump(by_alias=True)["engineBytes"] == 123456
    for junk in ('"big"', "-1", "true"):
        bad = parse_build_report(report.replace("123456", junk))
        assert bad is not None and bad.engine_bytes is None
    # Recorded in status, it is read back without the build's report.
    isvc = hot_isvc(engine_bytes=123456).obj()
    recorded = engine_info(isvc, engine_cache_key(isvc), None)
    assert recorded is not None and recorded.engine_bytes == 123456
