"""The tuner's plumbing in the operator: Prometheus in, Triton model control and the object out.

The law is pure (`tailtune.tuner.law`); this module gives it its three sides for one InferenceService:
- reader: `tailtune.tuner.prom` (the only module that talks to Prometheus),
- applier: hot mode reloads the batching into every ready Triton pod (load with config override), then
  records the config in force in an annotation so reconcile updates the ConfigMap (restarted pods come back
  with it) and the replica count; a failed hot apply falls back to a rolling update. Rolling mode only
  records, and reconcile rolls the Deployment.
- recorder: the tuner state (annotation, survives restarts), `status.latency`, and an Event on a change.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from tailtune.api.keys import APPLIED_ANNOTATION, GRPC_PORT, TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService, LatencyStatus, ObjectMeta
from tailtune.operator import metrics
from tailtune.operator.engine import engine_cache_key, engine_info, io_known
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.observed import Observed
from tailtune.operator.spec_checks import Applied, applied_config
from tailtune.operator.status import SLO_MET, compute_slo_condition
from tailtune.triton.control import ApplyError, apply_config
from tailtune.tuner.law import decide
from tailtune.tuner.loop import ObservationReader
from tailtune.tuner.types import Decision, Observation, Policy, TunerState

log = logging.getLogger(__name__)


class TunerCluster(Protocol):
    """What the tuner needs from the API server (`kube.KubeCluster`)."""

    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed: ...
    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None: ...
    async def patch_latency(self, meta: ObjectMeta, latency: LatencyStatus) -> None: ...
    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None: ...


def policy_for(isvc: InferenceService) -> Policy:
    """The law's policy from the spec."""
    spec = isvc.spec
    return Policy.from_spec(
        spec.slo,
        spec.tuning,
        spec.serving.replicas,
        spec.engine.optimization_profile.max,
        instances=spec.serving.instances_per_gpu,
    )


def state_for(isvc: InferenceService, applied: Applied) -> TunerState:
    """The kept tuner state, or a fresh one from the config in force (also when the kept one no longer fits)."""
    raw = isvc.metadata.annotations.get(TUNER_STATE_ANNOTATION)
    fresh = TunerState.initial(applied.batching, applied.replicas)
    if not raw:
        return fresh
    try:
        kept = TunerState.from_dict(json.loads(raw))
    except (ValueError, ValidationError):
        return fresh
    if kept.batching != applied.batching or kept.replicas != applied.replicas:
        # The spec or a user moved the config under the tuner: start over from what is in force.
        return fresh
    return kept


def latency_status(observation: Observation, percentile: float, now: datetime) -> LatencyStatus:
    """status.latency from one window (None fields when the signal is missing)."""
    return LatencyStatus(
        observed_ms=None if observation.p_latency_ms is None else round(observation.p_latency_ms, 2),
        percentile=percentile,
        throughput_rps=None if observation.request_rate is None else round(observation.request_rate, 2),
        observed_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


@dataclass
class HotApplyReport:
    """What a hot apply did: seconds per pod, and the failures that force a rolling update."""

    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def hot_apply(pod_ips: tuple[str, ...], model: str, config_json: str) -> HotApplyReport:
    """Reload the model with the new config in each ready pod (Triton swaps when the new copy is READY)."""
    report = HotApplyReport()
    for ip in pod_ips:
        try:
            result = apply_config(f"{ip}:{GRPC_PORT}", model, config_json)
            report.seconds[ip] = result.seconds
        except (ApplyError, OSError, ConnectionError) as exc:
            report.failures[ip] = str(exc)
        except Exception as exc:  # tritonclient raises its own exception types for transport errors
            report.failures[ip] = f"{type(exc).__name__}: {exc}"
    return report


async def tune_step(
    isvc: InferenceService, cluster: TunerCluster, reader: ObservationReader, now: datetime
) -> Decision | None:
    """One tuner tick for one InferenceService: read, decide, apply (hot or rolling), record.

    Returns None without reading anything while no Triton pod serves (nothing to tune yet). Writes only what
    moved: a tick that holds on a steady (or steadily missing) signal costs no API write.
    """
    if isvc.status.replicas.ready < 1:
        return None
    applied = applied_config(isvc)
    state = state_for(isvc, applied)
    try:
        observation = await asyncio.to_thread(reader.read, now)
    except Exception as exc:  # Prometheus down or the query refused: the law holds on missing data, never blind
        log.warning("%s/%s: latency signal unavailable: %s", isvc.metadata.namespace, isvc.metadata.name, exc)
        observation = Observation(window_end=now, span_seconds=float(isvc.spec.slo.window_seconds))
    # Prometheus counts the pods it scraped; the Deployment knows how many serve.
    observation = observation.model_copy(update={"ready_replicas": isvc.status.replicas.ready})
    decision = decide(state, observation, policy_for(isvc), now)
    annotations: dict[str, str] = {}
    if decision.changed:
        rolled = await _apply_hot(isvc, cluster, decision, applied) if isvc.spec.tuning.mode == "hot" else False
        annotations[APPLIED_ANNOTATION] = Applied(
            batching=decision.batching,
            replicas=decision.replicas,
            changed_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            reason=decision.reason,
            rolled=rolled or applied.rolled,
        ).to_annotation()
        if isvc.spec.tuning.mode == "rolling" or rolled:
            metrics.CONFIG_RELOADS.labels(isvc.metadata.namespace, isvc.metadata.name, "rollout", "ok").inc()
        await cluster.emit_event(isvc.metadata, "Normal", decision.reason_code or "TunerChange", decision.reason)
    metrics.TUNER_DECISIONS.labels(isvc.metadata.namespace, isvc.metadata.name, decision.reason_code).inc()
    if decision.changed or _memory(decision.state) != _memory(state):
        annotations[TUNER_STATE_ANNOTATION] = json.dumps(decision.state.to_dict(), sort_keys=True)
    if annotations:
        await cluster.patch_annotations(isvc.metadata, annotations)
    latency = latency_status(observation, isvc.spec.slo.percentile, now)
    old = isvc.status.latency
    if (latency.observed_ms, latency.throughput_rps) != (
        old.observed_ms,
        old.throughput_rps,
    ) or old.observed_at is None:
        await cluster.patch_latency(isvc.metadata, latency)
    return decision


def _memory(state: TunerState) -> dict[str, object]:
    """The state that matters across restarts; window bookkeeping alone is not worth a write."""
    return state.model_dump(exclude={"last_window_end", "missing_windows"})


async def _apply_hot(isvc: InferenceService, cluster: TunerCluster, decision: Decision, applied: Applied) -> bool:
    """Reload the new batching in every ready pod; True when it failed somewhere (then the Deployment rolls)."""
    if decision.batching == applied.batching:
        return False  # a replica change only: reconcile scales the Deployment
    key = engine_cache_key(isvc)
    observed = await cluster.observe(isvc, key, job_report=not io_known(isvc, key), pod_ips=True)
    info = engine_info(isvc, key, observed.job)
    ips = observed.deployment.ready_pod_ips if observed.deployment else ()
    report = await asyncio.to_thread(hot_apply, ips, isvc.model_name, model_config_json(isvc, decision.batching, info))
    failed = bool(report.failures)
    ns, name = isvc.metadata.namespace, isvc.metadata.name
    metrics.CONFIG_RELOADS.labels(ns, name, "hot", "failed" if failed else "ok").inc()
    if failed:
        await cluster.emit_event(
            isvc.metadata, "Warning", "HotReloadFailed",
            f"hot reload failed on {sorted(report.failures)}; rolling the Deployment instead: "
            + "; ".join(report.failures.values()),
        )  # fmt: skip
    elif report.seconds:
        log.info("%s/%s: hot reload on %d pods, slowest %.2f s", ns, name, len(ips), max(report.seconds.values()))
    return failed


def slo_condition_moved(isvc: InferenceService, observation_ms: float | None) -> bool:
    """Whether SLOMet would change with this observation (then the caller reconciles to write it)."""
    new = compute_slo_condition(isvc, LatencyStatus(observed_ms=observation_ms))
    old = next((c for c in isvc.status.conditions if c.type == SLO_MET), None)
    return old is None or (old.status, old.reason) != (new.status, new.reason)


def parse_isvc(raw: dict[str, Any]) -> InferenceService | None:
    """The object, or None when it does not parse (reconcile reports that; the tuner just waits)."""
    try:
        return InferenceService.model_validate(raw)
    except ValidationError:
        return None
