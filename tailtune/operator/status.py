"""Pure status computation: one function per condition, `Ready` derived from them."""

from __future__ import annotations

import re
from datetime import datetime

from tailtune.api.keys import GRPC_PORT, HTTP_PORT
from tailtune.api.v1alpha1 import (
    BatchingStatus,
    Condition,
    Endpoints,
    EngineStatus,
    InferenceService,
    InferenceServiceStatus,
    LatencyStatus,
    ReplicaStatus,
    RolloutStatus,
    ServiceTimeStatus,
    TargetStatus,
)
from tailtune.engine_builder.errors import Failure
from tailtune.operator.builders.common import service_name
from tailtune.operator.builders.engine_job import FINISHED_JOB_TTL_S
from tailtune.operator.observed import Observed
from tailtune.tuner.judge import JUDGED
from tailtune.tuner.law import SIGNAL_MISSING

ENGINE_READY, SERVING_READY, SLO_MET, READY = "EngineReady", "ServingReady", "SLOMet", "Ready"

# Reasons (CamelCase constants).
INVALID_SPEC = "InvalidSpec"
ENGINE_BUILD_PENDING = "EngineBuildPending"
ENGINE_BUILD_RUNNING = "EngineBuildRunning"
ENGINE_BUILD_UNSCHEDULABLE = "EngineBuildUnschedulable"
ENGINE_BUILD_FAILED = "EngineBuildFailed"
ENGINE_BUILT = "EngineBuilt"
WAITING_FOR_ENGINE = "WaitingForEngine"
ENGINE_IO_UNKNOWN = "EngineIOUnknown"
INVALID_MODEL_CONFIG = "InvalidModelConfig"
TENSOR_MISMATCH = "TensorMismatch"
DEPLOYMENT_PENDING = "DeploymentPending"
UNSCHEDULABLE = "Unschedulable"
PODS_NOT_READY = "PodsNotReady"
PODS_NOT_CREATED = "PodsNotCreated"
MODEL_LOAD_FAILED = "ModelLoadFailed"
PODS_FAILING = "PodsFailing"
SERVING_DEGRADED = "ServingDegraded"
SERVING_AVAILABLE = "ServingAvailable"
NO_LATENCY_DATA = "NoLatencyData"
SLO_VIOLATED = "SLOViolated"
WITHIN_SLO = "WithinSLO"
SETTLING = "Settling"
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
QUERY_AMBIGUOUS = "QueryAmbiguous"
NO_TRAFFIC = "NoTraffic"
SLO_INFEASIBLE = "SLOInfeasible"
ALL_READY = "AllComponentsReady"
CHILD_REJECTED = "ChildRejected"
ENGINE_BUILD_POD_NOT_CREATED = "EngineBuildPodNotCreated"
# The builder's reason for bytes other than spec.model.sha256 pins (the first word of its termination message).
DIGEST_MISMATCH = Failure.DIGEST_MISMATCH.reason
# A condition that is True and still a warning: its Event is a Warning, not Normal.
WARNING_REASONS = frozenset({SERVING_DEGRADED})
# ServingReady reasons that the pods move without a change of the Deployment to react to (a container that
# exits, a pod evicted, a pod placed): looked at again within seconds, not at the resync.
SERVING_WATCHED = frozenset(
    {DEPLOYMENT_PENDING, UNSCHEDULABLE, PODS_NOT_READY, PODS_NOT_CREATED, MODEL_LOAD_FAILED, PODS_FAILING,
     SERVING_DEGRADED}
)  # fmt: skip
# Serving problems found before any child is applied: a Deployment already there keeps its pods and config.
_NOT_ROLLED = frozenset({TENSOR_MISMATCH, INVALID_MODEL_CONFIG, ENGINE_IO_UNKNOWN})

_MISSING_PVC = re.compile(r'persistentvolumeclaim "([^"]+)" not found', re.IGNORECASE)
_UNBOUND_PVC = re.compile(r"unbound (immediate )?PersistentVolumeClaims", re.IGNORECASE)


def scheduler_detail(message: str) -> str:
    """The scheduler's message with repeated sentences and its preemption postscript dropped."""
    sentences: list[str] = []
    for part in re.split(r"\.\s+", message.split(" preemption:")[0].strip().rstrip(".")):
        part = part.strip()
        if part and part not in sentences and not any(part in s for s in sentences):
            sentences.append(part)
    return ". ".join(sentences)


def unschedulable_cause(isvc: InferenceService, message: str, pod: str) -> str:
    """Why a pod cannot be placed, named by its real cause (a missing claim is not a missing GPU), with the fix."""
    ns, product = isvc.metadata.namespace, isvc.spec.serving.gpu.product
    detail = scheduler_detail(message)
    missing = _MISSING_PVC.search(message)
    if missing:
        claim = missing.group(1)
        field = "spec.engine.store.pvc" if claim == isvc.spec.engine.store.pvc else "spec.model.uri"
        cause = (
            f"PersistentVolumeClaim {claim!r} ({field}) does not exist in namespace {ns}: create it "
            f"(the chart's engineStore values) or set {field} to an existing claim"
        )
    elif _UNBOUND_PVC.search(message):
        cause = f"a PersistentVolumeClaim of the {pod} is not bound to a volume"
    elif "Insufficient nvidia.com/gpu" in message:
        cause = f"every node with nvidia.com/gpu.product={product} has all its GPUs taken"
    elif "untolerated taint" in message:
        cause = f"the nodes have taints the {pod} does not tolerate (spec.serving.tolerations)"
    elif "node affinity/selector" in message or "node(s) didn't match" in message:
        cause = (
            f"no node with nvidia.com/gpu.product={product} matches "
            "(spec.serving.gpu.product, spec.serving.nodeSelector, spec.serving.affinity)"
        )
    else:
        cause = f"no node can take the {pod} (it needs nvidia.com/gpu.product={product})"
    return f"{cause}; scheduler: {detail}" if detail else cause


def _cond(type_: str, ok: bool | None, reason: str, message: str) -> Condition:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type=type_, status=status, reason=reason, message=message)


def compute_engine_condition(
    isvc: InferenceService, observed: Observed, rejected: str | None = None, engine: EngineStatus | None = None
) -> Condition:
    """EngineReady from the build Job (or the API server's refusal of it). `engine` is status.engine for this
    reconcile: the built engine's message names the model digest it was built from, a failed one how to retry."""
    if rejected is not None:
        return _cond(ENGINE_READY, False, CHILD_REJECTED, rejected)
    engine = engine or EngineStatus()
    job = observed.job
    if job is None:
        return _cond(ENGINE_READY, False, ENGINE_BUILD_PENDING, "engine build Job not created yet")
    if job.succeeded:
        return _cond(ENGINE_READY, True, ENGINE_BUILT, built_message(isvc, engine))
    if job.failed:
        detail = job.message.strip() or "the build Job failed without a termination message"
        message = f"engine build failed: {detail}; {retry_hint(isvc, engine, detail)}"
        return _cond(ENGINE_READY, False, ENGINE_BUILD_FAILED, message)
    if job.not_created:
        message = f"the build Job cannot create its pod: {job.not_created}"
        return _cond(ENGINE_READY, False, ENGINE_BUILD_POD_NOT_CREATED, message)
    if job.unschedulable:
        message = f"build pod cannot be scheduled: {unschedulable_cause(isvc, job.unschedulable, 'build pod')}"
        return _cond(ENGINE_READY, False, ENGINE_BUILD_UNSCHEDULABLE, message)
    return _cond(ENGINE_READY, False, ENGINE_BUILD_RUNNING, "engine build Job is running")


def built_message(isvc: InferenceService, engine: EngineStatus) -> str:
    """EngineBuilt's message: the model bytes the engine was built from, and, unpinned, how to rebuild from new ones.

    Like an image tag, an unpinned spec.model.uri is read once: replacing the file there changes nothing until
    spec.model.revision (or a spec.model.sha256 pin) names the new bytes."""
    pinned = isvc.spec.model.sha256
    digest = engine.model_digest or (f"sha256:{pinned}" if pinned else None)
    built = f"engine built and stored, from model {digest}" if digest else "engine built and stored"
    if pinned:
        return f"{built} (pinned by spec.model.sha256)"
    return (
        f"{built}; spec.model.uri is not read again: after replacing the file there, set spec.model.revision to "
        "a new value to rebuild from the new bytes (or pin them with spec.model.sha256)"
    )


def retry_hint(isvc: InferenceService, engine: EngineStatus, detail: str) -> str:
    """How to build again after a failed build. The Job is named after the cache key, so while it stays the
    operator never builds that key again (`ttlSecondsAfterFinished` removes it after a day, and then it does);
    deleting it retries the same key, and a new pin or revision is a new key, built at once."""
    job = f"kubectl delete job -n {isvc.metadata.namespace} {engine.job_name or '<status.engine.jobName>'}"
    if detail.startswith(f"{DIGEST_MISMATCH}:"):
        return (
            "spec.model.uri serves other bytes than spec.model.sha256 pins: to build from them, set "
            f"spec.model.sha256 to their digest; to keep the pinned model, restore the file, then `{job}`"
        )
    retry = (
        f"fix the cause, then `{job}` to retry (the operator builds again at once; by itself only when the "
        f"failed Job expires, {FINISHED_JOB_TTL_S // 3600} h after it ended)"
    )
    if isvc.spec.model.sha256:
        return f"{retry}; a new model file needs its digest in spec.model.sha256, which starts a build by itself"
    return f"{retry}; after replacing the file at spec.model.uri, setting spec.model.revision to a new value does too"


def compute_serving_condition(
    isvc: InferenceService, observed: Observed, engine_ready: bool, problem: tuple[str, str] | None = None
) -> Condition:
    """ServingReady from the Deployment and its pods (or why it could not be built)."""
    if not engine_ready:
        return _cond(SERVING_READY, False, WAITING_FOR_ENGINE, "waiting for the engine")
    dep = observed.deployment
    if problem is not None:
        reason, message = problem
        if reason in _NOT_ROLLED and dep is not None:
            message += (
                f"; not rolled out: the Triton Deployment keeps its pods on the last config applied "
                f"({dep.ready_replicas}/{dep.replicas} ready) until the spec is fixed"
            )
        return _cond(SERVING_READY, False, reason, message)
    if dep is None:
        return _cond(SERVING_READY, False, DEPLOYMENT_PENDING, "Triton Deployment not created yet")
    counts = f"{dep.ready_replicas}/{dep.replicas} Triton pods ready"
    if dep.replica_failure:
        # Pods the ReplicaSet cannot create: some still serving is degraded, none is not serving.
        detail = f"{counts}; the Deployment cannot create pods: {dep.replica_failure}"
        if dep.ready_replicas > 0:
            return _cond(SERVING_READY, True, SERVING_DEGRADED, detail)
        return _cond(SERVING_READY, False, PODS_NOT_CREATED, detail)
    if dep.ready_replicas > 0:
        # Pods that ended Failed are history once every replica serves again; live pods failing are not.
        failing = dep.failing or (dep.failed if dep.ready_replicas < dep.replicas else "")
        if failing:
            return _cond(SERVING_READY, True, SERVING_DEGRADED, f"{counts}; {failing}")
        return _cond(SERVING_READY, True, SERVING_AVAILABLE, counts)
    failing_reason = MODEL_LOAD_FAILED if dep.model_load_failed else PODS_FAILING
    if dep.failing:
        return _cond(SERVING_READY, False, failing_reason, f"{counts}; {dep.failing}")
    if dep.unschedulable:
        cause = unschedulable_cause(isvc, dep.unschedulable, "Triton pod")
        return _cond(SERVING_READY, False, UNSCHEDULABLE, f"{counts}; pods cannot be scheduled: {cause}")
    if dep.failed:
        return _cond(SERVING_READY, False, failing_reason, f"{counts}; {dep.failed}")
    detail = f"; {dep.not_ready_reason}" if dep.not_ready_reason else "; waiting for model load and warmup"
    return _cond(SERVING_READY, False, PODS_NOT_READY, counts + detail)


def compute_slo_condition(isvc: InferenceService, latency: LatencyStatus) -> Condition:
    """SLOMet from the last read of the latency signal (`status.latency`, written by the tuner); see `_slo_verdict`.
    A figure the tuner holds on for want of signal (SignalMissing: no request rate, too few samples) is judged, and
    the message says that the tuner holds and why."""
    cond = _slo_verdict(isvc, latency)
    if latency.problem == SIGNAL_MISSING:
        held = f"; the tuner holds ({SIGNAL_MISSING}): {latency.message}" if latency.message else ""
        cond = cond.model_copy(update={"message": cond.message + held})
    return cond


def _slo_verdict(isvc: InferenceService, latency: LatencyStatus) -> Condition:
    """SLOMet's verdict on the figure.

    Unknown while the figure cannot be judged (Prometheus unavailable, ambiguous query, no traffic, no data, a
    window the tuner's judge refused: ClockSkew, SignalStale, SignalImplausible) or while its window still reaches
    back before the last change (Settling: never False on stale traffic).
    """
    slo = isvc.spec.slo
    label = f"P{slo.percentile:g}"
    detail = f": {latency.message}" if latency.message else ""
    if latency.problem in (PROMETHEUS_UNAVAILABLE, QUERY_AMBIGUOUS, NO_TRAFFIC):
        return _cond(SLO_MET, None, latency.problem, f"{label} not judged{detail}")
    if latency.problem in JUDGED:
        return _cond(SLO_MET, None, latency.problem, f"{label} not judged{detail}; the tuner holds")
    if latency.observed_ms is None and not latency.above_range:
        return _cond(SLO_MET, None, NO_LATENCY_DATA, f"no {label} latency data from Prometheus yet{detail}")
    shown = "above every histogram bucket" if latency.above_range else f"{latency.observed_ms:.1f} ms"
    message = f"{label} {shown} vs SLO {slo.latency_ms:g} ms"
    others = [t for t in latency.targets if t.percentile != slo.percentile]
    if others:
        message += "".join(f", {_target_text(t)}" for t in others)
    if latency.window_start and latency.window_end:
        message += f" over {latency.window_start} to {latency.window_end}"
    if latency.overlaps_change:
        clean = "" if latency.clean_ms is None else f"; last clean window {latency.clean_ms:.1f} ms"
        return _cond(SLO_MET, None, SETTLING, f"{message}, which reaches back before the last change{clean}")
    missed = [f"P{t.percentile:g}" for t in others if t.met is False]
    primary_met = not latency.above_range and latency.observed_ms is not None and latency.observed_ms <= slo.latency_ms
    if not primary_met:
        missed.insert(0, label)
    if not missed:
        return _cond(SLO_MET, True, WITHIN_SLO, message)
    if others:  # name which of several targets are missed
        message = f"{' and '.join(missed)} missed: {message}"
    if latency.infeasible:
        return _cond(SLO_MET, False, SLO_INFEASIBLE, f"{message}; {latency.infeasible}")
    return _cond(SLO_MET, False, SLO_VIOLATED, message)


def _target_text(t: TargetStatus) -> str:
    """'P50 6.1 ms vs 8 ms' (or why it has no figure)."""
    if t.met is None:
        return f"P{t.percentile:g} no data vs {t.target_ms:g} ms"
    shown = "above every bucket" if t.observed_ms is None else f"{t.observed_ms:.1f} ms"
    return f"P{t.percentile:g} {shown} vs {t.target_ms:g} ms"


def compute_ready_condition(engine: Condition, serving: Condition) -> Condition:
    """Ready: the engine is built and Triton serves it. SLOMet is reported beside it, not gating it."""
    for c in (engine, serving):
        if c.status != "True":
            return _cond(READY, False, c.reason, c.message)
    return _cond(READY, True, ALL_READY, "engine built and Triton serving")


def refresh_slo_message(isvc: InferenceService, latency: LatencyStatus) -> list[Condition] | None:
    """The conditions with SLOMet's message told from this latency when only the message moved (the window, the
    figure), so the condition never tells an older window than `status.latency`; None when nothing to refresh.
    A change of status or reason is reconcile's to write, with its Event."""
    new = compute_slo_condition(isvc, latency)
    out, moved = [], False
    for c in isvc.status.conditions:
        if c.type == SLO_MET and (c.status, c.reason) == (new.status, new.reason) and c.message != new.message:
            c, moved = c.model_copy(update={"message": new.message}), True
        out.append(c)
    return out if moved else None


def merge_conditions(old: list[Condition], new: list[Condition], *, now: datetime, generation: int) -> list[Condition]:
    """Stamp observedGeneration; keep lastTransitionTime where the status did not change."""
    previous = {c.type: c for c in old}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    merged = []
    for c in new:
        before = previous.get(c.type)
        ltt = before.last_transition_time if before and before.status == c.status else stamp
        merged.append(c.model_copy(update={"last_transition_time": ltt, "observed_generation": generation}))
    return merged


def invalid_spec_status(
    old: InferenceServiceStatus, message: str, *, generation: int, now: datetime
) -> InferenceServiceStatus:
    """Status for a spec only the operator could judge invalid: Ready=False, InvalidSpec, no children."""
    ready = _cond(READY, False, INVALID_SPEC, message)
    conditions = merge_conditions(old.conditions, [ready], now=now, generation=generation)
    return old.model_copy(update={"observed_generation": generation, "conditions": conditions})


def compute_status(
    isvc: InferenceService,
    observed: Observed,
    *,
    engine_info: EngineStatus,
    batching: BatchingStatus,
    desired_replicas: int,
    latency: LatencyStatus,
    now: datetime,
    service_time: ServiceTimeStatus | None = None,
    serving_problem: tuple[str, str] | None = None,
    engine_rejected: str | None = None,
    service_exists: bool = False,
    rollout: RolloutStatus | None = None,
) -> InferenceServiceStatus:
    """The whole status for one reconcile, written once by the caller.

    Endpoints are named only when the Service exists (`service_exists`: its apply went through).
    """
    engine = compute_engine_condition(isvc, observed, engine_rejected, engine_info)
    serving = compute_serving_condition(isvc, observed, engine.status == "True", serving_problem)
    slo = compute_slo_condition(isvc, latency)
    ready = compute_ready_condition(engine, serving)
    generation = isvc.metadata.generation
    conditions = merge_conditions(isvc.status.conditions, [engine, serving, slo, ready], now=now, generation=generation)
    ns, svc = isvc.metadata.namespace, service_name(isvc)
    dep = observed.deployment
    return InferenceServiceStatus(
        observed_generation=generation,
        conditions=conditions,
        engine=engine_info,
        endpoints=(
            Endpoints(http=f"http://{svc}.{ns}.svc:{HTTP_PORT}", grpc=f"{svc}.{ns}.svc:{GRPC_PORT}")
            if service_exists
            else Endpoints()
        ),
        replicas=ReplicaStatus(desired=desired_replicas, ready=dep.ready_replicas if dep else 0),
        batching=batching,
        rollout=rollout or RolloutStatus(),
        latency=latency,
        service_time=isvc.status.service_time if service_time is None else service_time,
    )
