"""reconcile against a recording stand-in of the API-server port (the real API server is in tests/e2e)."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService, InferenceServiceStatus, ObjectMeta
from tailtune.operator.builders.common import Manifest
from tailtune.operator.observed import ChildRejected, DeploymentObservation, JobObservation, Observed
from tailtune.operator.reconcile import reconcile
from tailtune.tuner.types import InForce
from tests.unit.factories import make_isvc

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class RecordingCluster:
    """Serves a fixed observation and records every write."""

    def __init__(self, observed: Observed, refuse: dict[str, ChildRejected] | None = None) -> None:
        self.observed = observed
        self.refuse = refuse or {}  # kind -> what the API server says
        self.applied: list[Manifest] = []
        self.statuses: list[InferenceServiceStatus] = []
        self.events: list[tuple[str, str]] = []
        self.obsolete_kept: list[str] = []  # `keep` of every delete_obsolete_jobs call
        self.annotations: list[dict[str, str]] = []

    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed:
        return self.observed

    async def apply(self, manifest: Manifest) -> None:
        if manifest["kind"] in self.refuse:
            raise self.refuse[manifest["kind"]]
        self.applied.append(manifest)

    async def write_status(self, meta: ObjectMeta, status: InferenceServiceStatus) -> None:
        self.statuses.append(status)

    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason))

    async def delete_obsolete_jobs(self, isvc: InferenceService, keep: str) -> list[str]:
        self.obsolete_kept.append(keep)
        return []

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None:
        self.annotations.append(annotations)
        self.events.append(("annotations", ""))  # in order with the Events


def _run(raw: dict[str, Any], cluster: RecordingCluster) -> None:
    asyncio.run(reconcile(raw, cluster, NOW))


def _with_status(raw: dict[str, Any], status: InferenceServiceStatus) -> dict[str, Any]:
    return {**raw, "status": status.model_dump(by_alias=True, mode="json", exclude_none=True)}


def _cond(status: InferenceServiceStatus, type_: str) -> tuple[str, str]:
    c = next(c for c in status.conditions if c.type == type_)
    return c.status, c.reason


def test_invalid_spec_creates_nothing_and_writes_once() -> None:
    raw = make_isvc().set("spec.serving.resources", {"limits": {"nvidia.com/gpu": "2"}}).dict()
    cluster = RecordingCluster(Observed())
    _run(raw, cluster)
    assert cluster.applied == []
    assert _cond(cluster.statuses[0], "Ready") == ("False", "InvalidSpec")
    assert "spec.serving.gpu.count" in cluster.statuses[0].conditions[0].message
    # Same bad spec again: nothing to write, so no hot loop of writes and events.
    _run(_with_status(raw, cluster.statuses[0]), cluster)
    assert len(cluster.statuses) == 1 and len(cluster.events) == 1


def test_schema_bypass_is_reported_with_the_field() -> None:
    raw = make_isvc().dict()
    raw["spec"]["serving"]["replicas"] = {"min": 5, "max": 1}
    cluster = RecordingCluster(Observed())
    _run(raw, cluster)
    message = cluster.statuses[0].conditions[0].message
    assert "spec.serving.replicas" in message and "min must be <= replicas.max" in message


def test_first_reconcile_applies_the_build_job() -> None:
    cluster = RecordingCluster(Observed())
    _run(make_isvc().dict(), cluster)
    assert [m["kind"] for m in cluster.applied] == ["Job"]
    status = cluster.statuses[0]
    # Created in this very reconcile: the status says the build runs, never "not created yet".
    assert _cond(status, "EngineReady") == ("False", "EngineBuildRunning")
    assert all("not created yet" not in c.message for c in status.conditions)
    assert status.engine.cache_key == cluster.applied[0]["metadata"]["name"]
    # One Event for the move, not a second one from Ready mirroring EngineReady.
    assert cluster.events.count(("Warning", "EngineBuildRunning")) == 1
    assert status.endpoints.http is None  # no Service yet: no endpoint named


def test_built_engine_and_ready_pods_make_ready_and_steady_state_writes_nothing() -> None:
    observed = Observed(
        job=JobObservation(succeeded=True),
        deployment=DeploymentObservation(replicas=1, ready_replicas=1, ready_pod_ips=("10.0.0.5",)),
    )
    cluster = RecordingCluster(observed)
    raw = make_isvc().dict()
    _run(raw, cluster)
    assert [m["kind"] for m in cluster.applied] == ["ConfigMap", "Service", "Deployment"]
    status = cluster.statuses[-1]
    assert status.endpoints.http == "http://demo.default.svc:8000"
    assert _cond(status, "Ready") == ("True", "AllComponentsReady")
    assert status.replicas.ready == 1 and status.batching.max_batch_size == 8
    assert ("Normal", "AllComponentsReady") in cluster.events
    _run(_with_status(raw, status), cluster)
    assert len(cluster.statuses) == 1  # unchanged status is not written again


def test_pods_the_replicaset_cannot_create_are_a_warning_even_while_some_serve() -> None:
    quota = 'pods "demo-triton-1" is forbidden: exceeded quota: q'
    dep = DeploymentObservation(replicas=2, ready_replicas=1, replica_failure=quota)
    cluster = RecordingCluster(Observed(job=JobObservation(succeeded=True), deployment=dep))
    raw = make_isvc().dict()
    _run(raw, cluster)
    status = cluster.statuses[-1]
    assert _cond(status, "ServingReady") == ("True", "ServingDegraded")
    assert quota in next(c.message for c in status.conditions if c.type == "ServingReady")
    assert _cond(status, "Ready") == ("True", "AllComponentsReady")  # one pod serves
    assert cluster.events.count(("Warning", "ServingDegraded")) == 1
    # None left: Ready=False, told once by ServingReady (not again by Ready mirroring it).
    cluster.observed = Observed(job=JobObservation(succeeded=True), deployment=replace(dep, ready_replicas=0))
    _run(_with_status(raw, status), cluster)
    assert _cond(cluster.statuses[-1], "Ready") == ("False", "PodsNotCreated")
    assert [e for e in cluster.events if e[1] == "PodsNotCreated"] == [("Warning", "PodsNotCreated")]


def test_failed_build_copies_the_termination_message() -> None:
    cluster = RecordingCluster(Observed(job=JobObservation(failed=True, message="sha256 mismatch: got ab, want cd")))
    _run(make_isvc().dict(), cluster)
    assert cluster.applied == []
    status = cluster.statuses[0]
    assert _cond(status, "EngineReady") == ("False", "EngineBuildFailed")
    assert "sha256 mismatch" in next(c.message for c in status.conditions if c.type == "EngineReady")
    assert ("Warning", "EngineBuildFailed") in cluster.events


def test_unchanged_serving_objects_are_not_reapplied_unless_forced() -> None:
    first = RecordingCluster(Observed(job=JobObservation(succeeded=True)))
    _run(make_isvc().dict(), first)
    digest = next(m for m in first.applied if m["kind"] == "Deployment")["metadata"]["annotations"][
        "tailtune.io/desired-hash"
    ]
    live = Observed(
        job=JobObservation(succeeded=True),
        deployment=DeploymentObservation(replicas=1, ready_replicas=1, desired_hash=digest),
    )
    steady = RecordingCluster(live)
    _run(make_isvc().dict(), steady)
    assert steady.applied == []
    forced = RecordingCluster(live)
    asyncio.run(reconcile(make_isvc().dict(), forced, NOW, force=True))
    assert [m["kind"] for m in forced.applied] == ["ConfigMap", "Service", "Deployment"]
    changed = RecordingCluster(live)
    _run(make_isvc().set("spec.serving.replicas", {"min": 2, "max": 2}).dict(), changed)
    assert [m["kind"] for m in changed.applied] == ["ConfigMap", "Service", "Deployment"]


ANNOTATION_422 = (
    'Job.batch "eng-1" is invalid: spec.template.annotations: Invalid value: "bad key!": name part must ...'
)


def test_refused_job_is_status_and_one_event_not_a_retry_loop() -> None:
    refused = ChildRejected("Job", "eng-1", ANNOTATION_422, ("spec.template.annotations",))
    cluster = RecordingCluster(Observed(), refuse={"Job": refused})
    raw = make_isvc().set("spec.engine.podAnnotations", {"bad key!": "x"}).dict()
    _run(raw, cluster)  # never raises: a refusal is the spec's problem, not a transient error
    status = cluster.statuses[0]
    assert _cond(status, "EngineReady") == _cond(status, "Ready") == ("False", "ChildRejected")
    message = next(c.message for c in status.conditions if c.type == "EngineReady")
    assert "Job eng-1" in message and "spec.template.annotations" in message
    assert "fix spec.engine.podAnnotations" in message
    assert cluster.events == [("Warning", "ChildRejected")]  # once, not again as Ready=False
    _run(_with_status(raw, status), cluster)
    assert len(cluster.statuses) == 1 and len(cluster.events) == 1  # same refusal: nothing new to say


class KilledAtStatusWrite(RecordingCluster):
    """The operator dies at its status write: the write never reaches the API server."""

    async def write_status(self, meta: ObjectMeta, status: InferenceServiceStatus) -> None:
        raise SystemExit("killed")


def test_an_operator_killed_between_event_and_status_tells_the_transition_again_when_it_resumes() -> None:
    refused = ChildRejected("Job", "eng-1", ANNOTATION_422, ("spec.template.annotations",))
    raw = make_isvc().set("spec.engine.podAnnotations", {"bad key!": "x"}).dict()
    killed = KilledAtStatusWrite(Observed(), refuse={"Job": refused})
    with pytest.raises(SystemExit):
        _run(raw, killed)
    assert killed.events == [("Warning", "ChildRejected")]  # told before the write that died
    resumed = RecordingCluster(Observed(), refuse={"Job": refused})
    _run(raw, resumed)  # the status never moved: the transition is met, and told, again
    assert resumed.events == [("Warning", "ChildRejected")]
    assert _cond(resumed.statuses[0], "Ready") == ("False", "ChildRejected")


def test_refused_service_stops_before_the_deployment_and_names_no_endpoint() -> None:
    refused = ChildRejected("Service", "res.net", 'Service "res.net" is invalid: metadata.name: Invalid value')
    cluster = RecordingCluster(Observed(job=JobObservation(succeeded=True)), refuse={"Service": refused})
    _run(make_isvc().dict(), cluster)
    assert [m["kind"] for m in cluster.applied] == ["ConfigMap"]  # the Deployment (with the digest) never went
    status = cluster.statuses[0]
    assert _cond(status, "ServingReady") == _cond(status, "Ready") == ("False", "ChildRejected")
    assert status.endpoints.http is None


def test_scaled_deployment_is_reapplied() -> None:
    first = RecordingCluster(Observed(job=JobObservation(succeeded=True)))
    _run(make_isvc().dict(), first)
    digest = first.applied[-1]["metadata"]["annotations"]["tailtune.io/desired-hash"]
    scaled = Observed(
        job=JobObservation(succeeded=True),
        deployment=DeploymentObservation(replicas=3, ready_replicas=1, desired_hash=digest),
    )
    cluster = RecordingCluster(scaled)
    _run(make_isvc().dict(), cluster)
    assert [m["kind"] for m in cluster.applied] == ["ConfigMap", "Service", "Deployment"]
    assert cluster.applied[-1]["spec"]["replicas"] == 1


def test_serving_applied_now_is_not_not_created_yet() -> None:
    cluster = RecordingCluster(Observed(job=JobObservation(succeeded=True)))
    _run(make_isvc().dict(), cluster)
    status = cluster.statuses[0]
    assert _cond(status, "ServingReady") == ("False", "PodsNotReady")
    assert all("not created yet" not in c.message for c in status.conditions)
    assert status.endpoints.http == "http://demo.default.svc:8000"


def test_engine_ready_deletes_builds_of_earlier_specs_once() -> None:
    observed = Observed(job=JobObservation(succeeded=True), deployment=DeploymentObservation(replicas=1))
    cluster = RecordingCluster(observed)
    raw = make_isvc().dict()
    _run(raw, cluster)
    key = cluster.statuses[-1].engine.cache_key
    assert cluster.obsolete_kept == [key]  # EngineReady moved to True
    _run(_with_status(raw, cluster.statuses[-1]), cluster)
    assert cluster.obsolete_kept == [key]  # not again while nothing moves
    asyncio.run(reconcile(_with_status(raw, cluster.statuses[-1]), cluster, NOW, force=True))
    assert cluster.obsolete_kept == [key, key]  # the resync looks again


def test_a_job_gone_after_its_ttl_is_not_built_again() -> None:
    report = (
        '{"inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [16]}],'
        ' "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [4]}]}'
    )
    built = RecordingCluster(Observed(job=JobObservation(succeeded=True, message=report)))
    raw = make_isvc().dict()
    _run(raw, built)
    assert built.statuses[-1].engine.inputs  # the build's report is recorded
    gone = RecordingCluster(Observed())  # ttlSecondsAfterFinished took the Job
    _run(_with_status(raw, built.statuses[-1]), gone)
    assert "Job" not in [m["kind"] for m in gone.applied]
    assert [m["kind"] for m in gone.applied] == ["ConfigMap", "Service", "Deployment"]
    assert all(_cond(s, "EngineReady") == ("True", "EngineBuilt") for s in gone.statuses)


def test_a_job_that_cannot_create_its_pod_says_why() -> None:
    quota = 'pods "eng-1-x" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=0, limited: pods=0'
    cluster = RecordingCluster(Observed(job=JobObservation(not_created=quota)))
    _run(make_isvc().dict(), cluster)
    status = cluster.statuses[0]
    assert _cond(status, "EngineReady") == ("False", "EngineBuildPodNotCreated")
    message = next(c.message for c in status.conditions if c.type == "EngineReady")
    assert message == f"the build Job cannot create its pod: {quota}"
    assert _cond(status, "Ready") == ("False", "EngineBuildPodNotCreated")


def test_declared_dims_the_engine_does_not_have_are_named_with_no_deployment_and_one_warning() -> None:
    # The model has x [16]; the spec declares [17]: Triton would fail to load it in every pod.
    report = (
        '{"inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [16]}],'
        ' "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [4]}]}'
    )
    cluster = RecordingCluster(Observed(job=JobObservation(succeeded=True, message=report)))
    raw = make_isvc().set("spec.model.inputs", [{"name": "x", "dataType": "TYPE_FP32", "dims": [17]}]).dict()
    _run(raw, cluster)
    assert cluster.applied == []  # no ConfigMap, Service or Deployment
    status = cluster.statuses[-1]
    assert _cond(status, "ServingReady") == ("False", "TensorMismatch")
    assert _cond(status, "Ready") == ("False", "TensorMismatch")
    message = next(c.message for c in status.conditions if c.type == "ServingReady")
    assert "spec.model.inputs[0].dims" in message and "'x'" in message
    assert "[17]" in message and "declare [16]" in message and "omit spec.model.inputs" in message
    assert status.engine.inputs[0].dims == [16] and status.endpoints.http is None
    assert cluster.events.count(("Warning", "TensorMismatch")) == 1
    told = list(cluster.events)
    _run(_with_status(raw, status), cluster)  # the mismatch stands: nothing applied, written or told again
    assert cluster.applied == [] and len(cluster.statuses) == 1 and cluster.events == told


# A build report whose ladder makes max batch 1 fragile: a batch of 8 takes 4 ms where one takes 2.25 (four times
# the capacity), inputs and outputs as the spec declares them.
OVERHEAD_REPORT = json.dumps(
    {
        "inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [16]}],
        "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [4]}],
        "serviceTime": [{"batch": b, "ms": 2 + 0.25 * b} for b in (1, 2, 4, 8, 16, 32)],
    }
)


def _first_deploy(raw: dict[str, Any]) -> RecordingCluster:
    cluster = RecordingCluster(Observed(job=JobObservation(succeeded=True, message=OVERHEAD_REPORT)))
    _run(raw, cluster)
    return cluster


def _rendered_max_batch(cluster: RecordingCluster) -> int:
    cm = next(m for m in cluster.applied if m["kind"] == "ConfigMap")
    text = next(iter(cm["data"].values()))
    return int(re.search(r"max_batch_size: (\d+)", text).group(1))  # type: ignore[union-attr]


def test_a_start_batching_the_build_curve_shows_fragile_is_left_before_the_first_pod_serves() -> None:
    raw = make_isvc().set("spec.serving.batching", {"maxBatchSize": 1}).dict()
    cluster = _first_deploy(raw)
    # Recorded as the config in force before any serving object, then rendered: the first pods start with it.
    assert cluster.events[0][1] == "BatchingWidened" and cluster.events[1] == ("annotations", ""), cluster.events
    kept = InForce.from_annotation(cluster.annotations[0][APPLIED_ANNOTATION])
    assert kept.batching.max_batch_size > 1 and "before the first pod serves" not in (kept.reason or "")
    assert _rendered_max_batch(cluster) == kept.batching.max_batch_size
    assert cluster.statuses[-1].batching.max_batch_size == kept.batching.max_batch_size
    assert "by the measured curve" in cluster.statuses[-1].batching.reason


def test_the_choice_before_serving_is_made_once_and_never_over_the_tuners_or_the_spec() -> None:
    raw = make_isvc().set("spec.serving.batching", {"maxBatchSize": 1}).dict()
    first = _first_deploy(raw)
    recorded = {**raw, "metadata": {**raw["metadata"], "annotations": first.annotations[0]}}
    assert _first_deploy(recorded).annotations == []  # recorded already: the tuner's from here on
    off = make_isvc().set("spec.serving.batching", {"maxBatchSize": 1}).set("spec.tuning.enabled", False).dict()
    cluster = _first_deploy(off)
    assert cluster.annotations == [] and _rendered_max_batch(cluster) == 1  # tuning off: the spec's batching
    kept = make_isvc().set("spec.serving.batching", {"maxBatchSize": 1}).set("spec.tuning.keepSpecStart", True).dict()
    cluster = _first_deploy(kept)
    assert cluster.annotations == [] and _rendered_max_batch(cluster) == 1  # spec.tuning.keepSpecStart
    sturdy = _first_deploy(make_isvc().set("spec.serving.batching", {"maxBatchSize": 16}).dict())
    assert sturdy.annotations == [] and _rendered_max_batch(sturdy) == 16  # not fragile: the spec's start stands
