"""One reconcile: observe → desire (pure) → apply (server-side) → status (pure, written once)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from tailtune.api.v1alpha1 import (
    BatchingStatus,
    Condition,
    InferenceService,
    InferenceServiceStatus,
    ObjectMeta,
    RolloutStatus,
)
from tailtune.operator import status as st
from tailtune.operator.builders.common import Manifest
from tailtune.operator.builders.engine_job import build_engine_job
from tailtune.operator.builders.triton import (
    build_deployment,
    build_model_configmap,
    build_service,
    config_hash,
    serving_digest,
)
from tailtune.operator.engine import (
    build_points,
    engine_cache_key,
    engine_info,
    engine_status,
    report_recorded,
    service_time_status,
)
from tailtune.operator.generative import carry_into
from tailtune.operator.inforce import chosen_before_serving, in_force_annotation, llm_in_force, tuner_state
from tailtune.operator.inforce import in_force as config_in_force
from tailtune.operator.modelconfig import EngineIOUnknown, TensorMismatch, model_config_pbtxt
from tailtune.operator.observed import ChildRejected, DeploymentObservation, EngineInfo, JobObservation, Observed
from tailtune.operator.rollout import RolloutState
from tailtune.operator.spec_checks import check_spec, describe_rejection, describe_validation_error
from tailtune.triton.config import ConfigError
from tailtune.tuner.types import InForce

log = logging.getLogger(__name__)


class ClusterPort(Protocol):
    """What reconcile needs from the API server (`kube.KubeCluster` in production)."""

    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed: ...
    async def apply(self, manifest: Manifest) -> None: ...  # raises ChildRejected when the server refuses it
    async def write_status(self, meta: ObjectMeta, status: InferenceServiceStatus) -> None: ...
    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None: ...
    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None: ...
    async def delete_obsolete_jobs(self, isvc: InferenceService, keep: str) -> list[str]: ...


@dataclass(frozen=True)
class Desired:
    """The children a reconcile applies and the values its status reports."""

    objects: list[Manifest]
    cache_key: str
    applied: InForce
    engine_info: EngineInfo | None
    serving_problem: tuple[str, str] | None = None  # (reason, message) when serving cannot be built
    serving_hash: str = ""  # digest of the serving objects, "" when there are none


def desired_state(isvc: InferenceService, observed: Observed) -> Desired:
    """Pure: the children for what was observed. Serving objects wait for the engine."""
    cache_key = engine_cache_key(isvc)
    applied = config_in_force(isvc)
    job = observed.job
    # Until the Job has succeeded there is no engine, whatever an earlier build of this key recorded.
    info = engine_info(isvc, cache_key, job) if job is not None and job.succeeded else None
    objects: list[Manifest] = []
    if job is None:
        # The Job's template is immutable and its name is the cache key: once it exists it is never re-applied.
        objects.append(build_engine_job(isvc, cache_key))
    elif job.succeeded:
        try:
            in_force = model_config_pbtxt(isvc, applied.batching, info, llm_in_force(isvc))
            # Hot mode reloads batching in place: only the spec's start config (or a failed hot apply) rolls pods.
            rolls = isvc.spec.tuning.mode == "rolling" or applied.rolled or not isvc.spec.tuning.enabled
            rolling_basis = in_force if rolls else model_config_pbtxt(isvc, isvc.spec.serving.batching, info)
        except EngineIOUnknown as exc:
            problem = (st.ENGINE_IO_UNKNOWN, str(exc))
            return Desired(objects, cache_key, applied, info, serving_problem=problem)
        except TensorMismatch as exc:
            # No serving object applied: every pod would fail to load the model, and its ReplicaSet would spin.
            # A Deployment already there keeps the last config applied (its ConfigMap is not touched either).
            problem = (st.TENSOR_MISMATCH, str(exc))
            return Desired(objects, cache_key, applied, info, serving_problem=problem)
        except ConfigError as exc:
            problem = (st.INVALID_MODEL_CONFIG, f"Triton model config: {exc}")
            return Desired(objects, cache_key, applied, info, serving_problem=problem)
        configmap, service = build_model_configmap(isvc, in_force), build_service(isvc)
        deployment = functools.partial(
            build_deployment,
            isvc,
            cache_key=cache_key,
            replicas=applied.replicas,
            config_digest=config_hash(rolling_basis),
        )
        digest = serving_digest([configmap, deployment(), service])
        # The Deployment carries the digest and goes last: a digest on it means every serving object applied.
        objects += [configmap, service, deployment(desired_hash=digest)]
        return Desired(objects, cache_key, applied, info, serving_hash=digest)
    return Desired(objects=objects, cache_key=cache_key, applied=applied, engine_info=info)


def batching_status(applied: InForce) -> BatchingStatus:
    """status.batching from the config in force."""
    b = applied.batching
    return BatchingStatus(
        max_batch_size=b.max_batch_size,
        preferred_batch_sizes=list(b.preferred_batch_sizes),
        max_queue_delay_microseconds=b.max_queue_delay_microseconds,
        last_change_time=applied.changed_at.strftime("%Y-%m-%dT%H:%M:%SZ") if applied.changed_at else None,
        reason=applied.reason or "initial config from spec.serving.batching",
    )


def rollout_status(isvc: InferenceService) -> RolloutStatus:
    """status.rollout from the rollout record: the canary and the config it runs (empty without one)."""
    r = RolloutState.from_annotations(isvc.metadata.annotations) if isvc.spec.tuning.mode == "hot" else None
    if r is None or not isvc.spec.tuning.enabled:
        return RolloutStatus()
    return RolloutStatus(
        canary=r.canary,
        stage=r.stage,
        max_batch_size=r.target.max_batch_size,
        preferred_batch_sizes=list(r.target.preferred_batch_sizes),
        max_queue_delay_microseconds=r.target.max_queue_delay_microseconds,
        since=r.since.strftime("%Y-%m-%dT%H:%M:%SZ") if r.since else None,
        reason=r.reason or None,
        llm=r.llm_target,
    )


def transitions(old: list[Condition], new: list[Condition]) -> list[Condition]:
    """Conditions whose status or reason changed: each becomes an Event."""
    before = {c.type: (c.status, c.reason) for c in old}
    return [c for c in new if before.get(c.type) != (c.status, c.reason)]


def _one_event_each(moved: tuple[Condition, ...]) -> list[Condition]:
    """One Event per transition: Ready mirrors the component that holds it back (told once, by that component),
    serving waiting for the engine is the engine's story, and an Unknown (no data yet) is not news."""
    told = {c.reason for c in moved if c.type != st.READY}
    return [
        c
        for c in moved
        if (c.type != st.READY or c.reason not in told) and c.reason != st.WAITING_FOR_ENGINE and c.status != "Unknown"
    ]


def _lenient_status(raw: dict[str, Any]) -> InferenceServiceStatus:
    try:
        return InferenceServiceStatus.model_validate(raw.get("status") or {})
    except ValidationError:
        return InferenceServiceStatus()


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did, for the caller's metrics: the parsed object (None if invalid) and transitions."""

    isvc: InferenceService | None
    status: InferenceServiceStatus | None = None
    transitions: tuple[Condition, ...] = ()


async def reconcile(raw: dict[str, Any], cluster: ClusterPort, now: datetime, *, force: bool = False) -> Outcome:
    """Bring one InferenceService's children and status in line with its spec. Never raises on bad input.

    Serving objects whose digest matches the one on the live Deployment are not re-applied, unless `force`
    (the periodic resync, which also repairs hand edits of the children).
    """
    try:
        isvc = InferenceService.model_validate(raw)
    except ValidationError as exc:
        await _report_invalid(raw, cluster, describe_validation_error(exc), now)
        return Outcome(None)
    problem = check_spec(isvc)
    if problem:
        await _report_invalid(raw, cluster, problem, now)
        return Outcome(None)

    key = engine_cache_key(isvc)
    observed = await cluster.observe(isvc, key, job_report=not report_recorded(isvc, key))
    if observed.job is None and engine_info(isvc, key, None) is not None:
        # The Job went (ttlSecondsAfterFinished) after an earlier reconcile recorded its report: the engine is in
        # the store, so it is not built again.
        observed = replace(observed, job=JobObservation(succeeded=True))
    desired = desired_state(isvc, observed)
    if observed.deployment is None and desired.serving_hash:
        isvc, desired = await _choose_before_serving(isvc, observed, desired, cluster, now)
    dep = observed.deployment
    unchanged = (
        dep is not None
        and bool(desired.serving_hash)
        and dep.desired_hash == desired.serving_hash
        and dep.replicas == desired.applied.replicas  # a `kubectl scale` leaves the digest as it was
    )
    rejected = await _apply_children(isvc, desired.objects, cluster, skip_serving=unchanged and not force)
    engine_rejected = rejected if rejected and rejected[0] == "Job" else None
    serving_rejected = rejected if rejected and rejected[0] != "Job" else None
    # Created just now: say so, not "not created yet" in the same breath.
    if observed.job is None and engine_rejected is None:
        observed = replace(observed, job=JobObservation())
    if observed.deployment is None and desired.serving_hash and serving_rejected is None:
        observed = replace(observed, deployment=DeploymentObservation(replicas=desired.applied.replicas))
    serving_problem = desired.serving_problem or (
        (st.CHILD_REJECTED, serving_rejected[1]) if serving_rejected else None
    )

    store = isvc.spec.engine.store.pvc
    status = st.compute_status(
        isvc,
        observed,
        engine_info=engine_status(desired.cache_key, store, desired.engine_info, isvc.status.engine),
        batching=batching_status(desired.applied),
        rollout=rollout_status(isvc),
        desired_replicas=desired.applied.replicas,
        latency=isvc.status.latency,
        service_time=service_time_status(
            desired.cache_key, desired.engine_info, isvc.status.service_time, now, live=tuner_state(isvc).live
        ),
        serving_problem=serving_problem,
        engine_rejected=engine_rejected[1] if engine_rejected else None,
        # A spec that cannot be served rolls nothing out: a Deployment already there (applied after its Service)
        # keeps serving the last config applied, at the same endpoints.
        service_exists=(bool(desired.serving_hash) and serving_problem is None)
        or (desired.serving_problem is not None and observed.deployment is not None),
        now=now,
    )
    status = carry_into(isvc, status)  # a generative service's SLOMet and figures are its tick's
    moved = await _write_if_changed(isvc, status, cluster)
    engine_ready = any(c.type == st.ENGINE_READY and c.status == "True" for c in status.conditions)
    if engine_ready and (force or any(c.type == st.ENGINE_READY for c in moved)):
        # Once the engine in force is built, builds of earlier specs (running or done) are of no use.
        for name in await cluster.delete_obsolete_jobs(isvc, keep=desired.cache_key):
            log.info("%s/%s: deleted obsolete build Job %s", isvc.metadata.namespace, isvc.metadata.name, name)
    return Outcome(isvc, status, moved)


async def _choose_before_serving(
    isvc: InferenceService, observed: Observed, desired: Desired, cluster: ClusterPort, now: datetime
) -> tuple[InferenceService, Desired]:
    """Before the first Triton pod is created: where the build's measured curve shows the spec's start batching
    fragile, the tuner's choice (`inforce.chosen_before_serving`) is recorded as the config in force (the same
    annotation the tuner keeps) and rendered, so the first pods start with it and no reload lands on the first
    requests; one Event says so. Unchanged otherwise."""
    info = desired.engine_info
    decision = chosen_before_serving(isvc, build_points(info.service_time if info is not None else ()), now)
    if decision is None:
        return isvc, desired
    # The Event first, as for a condition's transition: a kill between the two makes the resumed operator choose
    # and tell again (nothing recorded yet), never leaves the choice untold.
    message = f"before the first pod serves: {decision.reason}"
    await cluster.emit_event(isvc.metadata, "Normal", decision.reason_code, message)
    annotations = in_force_annotation(decision.in_force)
    await cluster.patch_annotations(isvc.metadata, annotations)
    meta = isvc.metadata.model_copy(update={"annotations": {**isvc.metadata.annotations, **annotations}})
    isvc = isvc.model_copy(update={"metadata": meta})
    return isvc, desired_state(isvc, observed)


async def _apply_children(
    isvc: InferenceService, objects: list[Manifest], cluster: ClusterPort, *, skip_serving: bool
) -> tuple[str, str] | None:
    """Apply in order and stop at the first child the API server refuses: (its kind, what to fix), else None.

    A refusal is not retried here: the status says what to change, and a spec change (or the resync) retries.
    """
    for obj in objects:
        if obj["kind"] != "Job" and skip_serving:
            continue
        try:
            await cluster.apply(obj)
        except ChildRejected as exc:
            meta = isvc.metadata
            log.warning("%s/%s: %s %s refused: %s", meta.namespace, meta.name, exc.kind, exc.name, exc.message)
            return exc.kind, describe_rejection(isvc, exc.kind, exc.name, exc.message, exc.fields)
    return None


async def _write_if_changed(
    isvc: InferenceService, status: InferenceServiceStatus, cluster: ClusterPort
) -> tuple[Condition, ...]:
    """Tell each condition's transition as an Event, then write the status.

    Events go first: a transition is told from the status it changes, so an operator killed between the two
    writes meets the same transition again when it resumes and tells it again (at least once). Written the other
    way round, the kill would lose the Event for good: the status already holds the new condition.
    """
    if status == isvc.status:
        return ()
    moved = tuple(transitions(isvc.status.conditions, status.conditions))
    for c in _one_event_each(moved):
        normal = (c.status == "True" and c.reason not in st.WARNING_REASONS) or c.type == st.SLO_MET
        kind = "Normal" if normal else "Warning"
        await cluster.emit_event(isvc.metadata, kind, c.reason or c.type, f"{c.type}={c.status}: {c.message}")
    await cluster.write_status(isvc.metadata, status)
    return moved


async def _report_invalid(raw: dict[str, Any], cluster: ClusterPort, message: str, now: datetime) -> None:
    """Ready=False/InvalidSpec, no children; written only when it changes, so a bad spec costs no hot loop."""
    meta = ObjectMeta.model_validate(raw.get("metadata", {}))
    old = _lenient_status(raw)
    status = st.invalid_spec_status(old, message, generation=meta.generation, now=now)
    log.warning("%s/%s: invalid spec: %s", meta.namespace, meta.name, message)
    if status != old:  # the Event first, as in _write_if_changed: a kill between the two repeats it, loses nothing
        await cluster.emit_event(meta, "Warning", st.INVALID_SPEC, message)
        await cluster.write_status(meta, status)
