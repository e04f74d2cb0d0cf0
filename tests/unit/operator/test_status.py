"""Conditions: one table per condition function, plus Ready's derivation and transition times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tailtune.api.v1alpha1 import Condition, LatencyStatus
from tailtune.operator import status as st
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tests.unit.factories import make_isvc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
QUOTA = 'pods "t-1" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1'


@pytest.mark.parametrize(
    ("job", "status", "reason", "needle"),
    [
        (None, "False", st.ENGINE_BUILD_PENDING, "not created"),
        (JobObservation(), "False", st.ENGINE_BUILD_RUNNING, "running"),  # exists, not finished
        (JobObservation(unschedulable="0/3 nodes"), "False", st.ENGINE_BUILD_UNSCHEDULABLE, "product=NVIDIA-L4"),
        (JobObservation(failed=True, message="digest mismatch"), "False", st.ENGINE_BUILD_FAILED, "digest mismatch"),
        (JobObservation(failed=True), "False", st.ENGINE_BUILD_FAILED, "without a termination message"),
        (JobObservation(succeeded=True), "True", st.ENGINE_BUILT, "built"),
    ],
)
def test_engine_condition(job: JobObservation | None, status: str, reason: str, needle: str) -> None:
    c = st.compute_engine_condition(make_isvc().obj(), Observed(job=job))
    assert (c.status, c.reason) == (status, reason)
    assert needle in c.message


@pytest.mark.parametrize(
    ("engine_ready", "dep", "problem", "status", "reason", "needle"),
    [
        (False, None, None, "False", st.WAITING_FOR_ENGINE, "engine"),
        (True, None, None, "False", st.DEPLOYMENT_PENDING, "not created"),
        (True, None, ("EngineIOUnknown", "set spec.model.inputs"), "False", "EngineIOUnknown", "spec.model.inputs"),
        (True, DeploymentObservation(replicas=2), None, "False", st.PODS_NOT_READY, "warmup"),
        (
            True,
            DeploymentObservation(replicas=1, unschedulable="0/3 nodes are available: 3 node(s) didn't match"),
            None,
            "False",
            st.UNSCHEDULABLE,
            "nvidia.com/gpu.product=NVIDIA-L4",
        ),
        (True, DeploymentObservation(replicas=1, not_ready_reason="triton: CrashLoopBackOff"), None, "False",
         st.PODS_NOT_READY, "CrashLoopBackOff"),
        (True, DeploymentObservation(replicas=2, ready_replicas=1), None, "True", st.SERVING_AVAILABLE, "1/2"),
        # The ReplicaSet cannot create pods (the Deployment's ReplicaFailure): none serving, or some.
        (True, DeploymentObservation(replicas=1, replica_failure=QUOTA), None, "False", st.PODS_NOT_CREATED,
         "0/1 Triton pods ready; the Deployment cannot create pods: pods \"t-1\" is forbidden: exceeded quota"),
        (True, DeploymentObservation(replicas=2, ready_replicas=1, replica_failure=QUOTA), None, "True",
         st.SERVING_DEGRADED, "1/2 Triton pods ready; the Deployment cannot create pods: pods \"t-1\" is forbidden"),
        # Failing to create outranks a pod's own reason: the message names the cause, not a symptom.
        (True, DeploymentObservation(replicas=1, replica_failure=QUOTA, not_ready_reason="x"), None, "False",
         st.PODS_NOT_CREATED, "exceeded quota"),
    ],
)  # fmt: skip
def test_serving_condition(
    engine_ready: bool,
    dep: DeploymentObservation | None,
    problem: tuple[str, str] | None,
    status: str,
    reason: str,
    needle: str,
) -> None:
    c = st.compute_serving_condition(make_isvc().obj(), Observed(deployment=dep), engine_ready, problem)
    assert (c.status, c.reason) == (status, reason)
    assert needle in c.message


@pytest.mark.parametrize(
    ("observed", "status", "reason"),
    [(None, "Unknown", st.NO_LATENCY_DATA), (29.9, "True", st.WITHIN_SLO), (30.1, "False", st.SLO_VIOLATED)],
)
def test_slo_condition(observed: float | None, status: str, reason: str) -> None:
    c = st.compute_slo_condition(make_isvc().obj(), LatencyStatus(observed_ms=observed))
    assert (c.status, c.reason) == (status, reason)


def test_ready_takes_the_first_failing_component() -> None:
    ok = Condition(type="EngineReady", status="True", reason="EngineBuilt")
    bad = Condition(type="ServingReady", status="False", reason="Unschedulable", message="no node")
    ready = st.compute_ready_condition(ok, bad)
    assert (ready.status, ready.reason, ready.message) == ("False", "Unschedulable", "no node")
    assert st.compute_ready_condition(ok, ok.model_copy(update={"type": "ServingReady"})).status == "True"


def test_transition_time_kept_while_status_holds() -> None:
    first = st.merge_conditions([], [Condition(type="Ready", status="False", reason="A")], now=T0, generation=1)
    same = st.merge_conditions(first, [Condition(type="Ready", status="False", reason="B")], now=T1, generation=2)
    flipped = st.merge_conditions(same, [Condition(type="Ready", status="True", reason="C")], now=T1, generation=2)
    assert first[0].last_transition_time == "2026-01-01T00:00:00Z"
    assert same[0].last_transition_time == "2026-01-01T00:00:00Z"
    assert same[0].observed_generation == 2
    assert flipped[0].last_transition_time == "2026-01-01T00:05:00Z"


PVC_MISSING = '0/3 nodes are available: persistentvolumeclaim "tailtune-engines" not found. not found'


@pytest.mark.parametrize(
    ("scheduler", "needles", "absent"),
    [
        (PVC_MISSING, ["'tailtune-engines'", "spec.engine.store.pvc", "does not exist"], ["gpu.product"]),
        ('0/3 nodes are available: persistentvolumeclaim "models" not found.', ["'models'", "spec.model.uri"], []),
        ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes "
         "are available: 3 Preemption is not helpful for scheduling.", ["nvidia.com/gpu.product=NVIDIA-L4"],
         ["preemption"]),
        ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", ["GPUs taken"], []),
        ("0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: ml}.", ["spec.serving.tolerations"], []),
        ("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.", ["not bound"], []),
    ],
)  # fmt: skip
def test_unschedulable_names_the_real_cause_once(scheduler: str, needles: list[str], absent: list[str]) -> None:
    c = st.compute_engine_condition(make_isvc().obj(), Observed(job=JobObservation(unschedulable=scheduler)))
    assert c.reason == st.ENGINE_BUILD_UNSCHEDULABLE
    for needle in needles:
        assert needle in c.message, c.message
    for needle in absent:
        assert needle not in c.message, c.message
    assert c.message.count("not found") <= 1, c.message


def test_scheduler_detail_drops_repeats_and_the_preemption_postscript() -> None:
    assert (
        st.scheduler_detail(PVC_MISSING)
        == '0/3 nodes are available: persistentvolumeclaim "tailtune-engines" not found'
    )
    assert st.scheduler_detail("a. b. a. preemption: x") == "a. b"


def test_refused_job_holds_engine_and_ready_back() -> None:
    isvc = make_isvc().obj()
    status = st.compute_status(
        isvc, Observed(), engine_info=isvc.status.engine, batching=isvc.status.batching, desired_replicas=1,
        latency=isvc.status.latency, now=T0, engine_rejected="the API server refused Job x: ...; fix spec.a",
    )  # fmt: skip
    conditions = {c.type: (c.status, c.reason) for c in status.conditions}
    assert conditions["EngineReady"] == conditions["Ready"] == ("False", st.CHILD_REJECTED)
    assert status.endpoints.http is None


def test_endpoints_only_when_the_service_exists() -> None:
    isvc = make_isvc().obj()
    observed = Observed(
        job=JobObservation(succeeded=True), deployment=DeploymentObservation(replicas=1, ready_replicas=1)
    )
    kwargs = dict(engine_info=isvc.status.engine, batching=isvc.status.batching, desired_replicas=1,
                  latency=isvc.status.latency, now=T0)  # fmt: skip
    assert st.compute_status(isvc, observed, **kwargs).endpoints.http is None  # type: ignore[arg-type]
    served = st.compute_status(isvc, observed, service_exists=True, **kwargs)  # type: ignore[arg-type]
    assert served.endpoints.http == "http://demo.default.svc:8000"


def test_the_slo_message_follows_the_latency_window_without_a_transition() -> None:
    """The tick writes status.latency every window; SLOMet's message (which names the window) is refreshed with
    it while status and reason stand, so the two never tell different windows. A transition is left to reconcile."""
    isvc = make_isvc().obj()
    first = LatencyStatus(observed_ms=50.0, window_start="2026-11-30T19:04:11Z", window_end="2026-11-30T19:05:11Z")
    then = LatencyStatus(observed_ms=52.0, window_start="2026-11-30T19:04:17Z", window_end="2026-11-30T19:05:17Z")
    written = st.compute_slo_condition(isvc, first)
    isvc = isvc.model_copy(update={"status": isvc.status.model_copy(update={"conditions": [written]})})
    refreshed = st.refresh_slo_message(isvc, then)
    assert refreshed is not None and len(refreshed) == 1
    (c,) = refreshed
    assert (c.status, c.reason) == (written.status, written.reason)
    assert "19:04:17Z" in c.message and "19:05:17Z" in c.message and "52.0 ms" in c.message
    assert st.refresh_slo_message(isvc, first) is None  # nothing moved
    within = LatencyStatus(observed_ms=10.0, window_start="2026-11-30T19:04:17Z", window_end="2026-11-30T19:05:17Z")
    assert st.refresh_slo_message(isvc, within) is None  # a transition: reconcile's, with its Event
