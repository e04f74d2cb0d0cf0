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
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from tailtune.api.keys import GRPC_PORT
from tailtune.api.v1alpha1 import Batching, InferenceService, LatencyStatus, ObjectMeta
from tailtune.operator import metrics
from tailtune.operator.engine import build_curve, engine_cache_key, engine_info, io_known
from tailtune.operator.inforce import in_force as config_in_force
from tailtune.operator.inforce import in_force_annotation, tuner_state, tuner_state_annotation
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.observed import Observed
from tailtune.operator.status import SLO_MET, compute_slo_condition
from tailtune.triton.control import ApplyError, apply_config
from tailtune.tuner.loop import ObservationReader, tune_once
from tailtune.tuner.servicetime import BatchSample, CurvePoint
from tailtune.tuner.types import Decision, InForce, Observation, Policy, TunerState

log = logging.getLogger(__name__)


class TunerCluster(Protocol):
    """What the tuner needs from the API server (`kube.KubeCluster`)."""

    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed: ...
    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None: ...
    async def patch_latency(self, meta: ObjectMeta, latency: LatencyStatus) -> None: ...
    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None: ...


def policy_for(isvc: InferenceService, build_curve: tuple[CurvePoint, ...] = ()) -> Policy:
    """The law's policy from the spec (and the build's measured service time, when known)."""
    spec = isvc.spec
    return Policy.from_spec(
        spec.slo,
        spec.tuning,
        spec.serving.replicas,
        spec.engine.optimization_profile.max,
        instances=spec.serving.instances_per_gpu,
        build_curve=build_curve,
        # Triton refuses a warmup batch above max_batch_size: the tuner never goes below the largest.
        warmup_max=max(spec.warmup.batch_sizes, default=1),
    )


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


class _Window:
    """The window already read (outside the law, with its error handling) as the loop's reader."""

    def __init__(self, observation: Observation) -> None:
        self.observation = observation

    def read(self, window_end: datetime) -> Observation:
        return self.observation


class _Deferred:
    """Applier and recorder for the shared loop: the operator applies and records asynchronously after it."""

    def __init__(self) -> None:
        self.pending: tuple[Batching, int] | None = None

    def apply(self, batching: Batching, replicas: int) -> None:
        self.pending = (batching, replicas)

    def record(self, decision: Decision, observation: Observation) -> None:
        return None


class BatchStats(Protocol):
    """Triton's per-batch-size statistics of the ready pods since the last read (`triton.stats`)."""

    def read(self, addresses: list[str]) -> tuple[tuple[int, int, float], ...]: ...


async def tune_step(
    isvc: InferenceService,
    cluster: TunerCluster,
    reader: ObservationReader,
    now: datetime,
    batch_stats: BatchStats | None = None,
) -> Decision | None:
    """One tuner tick for one InferenceService: read, decide (`tailtune.tuner.loop.tune_once`, the loop the
    simulator and the benchmark run), apply (hot or rolling), record.

    Returns None without reading anything while no Triton pod serves (nothing to tune yet). Writes only what
    moved: a tick that holds on a steady (or steadily missing) signal costs no API write.
    """
    if isvc.status.replicas.ready < 1:
        return None
    applied = config_in_force(isvc)
    state = tuner_state(isvc)
    try:
        observation = await asyncio.to_thread(reader.read, now)
    except Exception as exc:  # Prometheus down or the query refused: the law holds on missing data, never blind
        log.warning("%s/%s: latency signal unavailable: %s", isvc.metadata.namespace, isvc.metadata.name, exc)
        observation = Observation(window_end=now, span_seconds=float(isvc.spec.slo.window_seconds))
    # Prometheus counts the pods it scraped; the Deployment knows how many serve.
    observation = observation.model_copy(
        update={
            "ready_replicas": isvc.status.replicas.ready,
            "batch_stats": await _live_batch_stats(isvc, cluster, batch_stats),
        }
    )
    deferred = _Deferred()
    policy = policy_for(isvc, build_curve(isvc))
    new_state, new_in_force, decision = tune_once(_Window(observation), deferred, deferred, state, applied, policy, now)
    annotations: dict[str, str] = {}
    if decision.changed:
        rolled = await _apply_hot(isvc, cluster, decision, applied) if isvc.spec.tuning.mode == "hot" else False
        annotations |= in_force_annotation(new_in_force.model_copy(update={"rolled": rolled or applied.rolled}))
        if isvc.spec.tuning.mode == "rolling" or rolled:
            metrics.CONFIG_RELOADS.labels(isvc.metadata.namespace, isvc.metadata.name, "rollout", "ok").inc()
        await cluster.emit_event(isvc.metadata, "Normal", decision.reason_code or "TunerChange", decision.reason)
    elif decision.infeasible and state.last_reason_code != decision.reason_code:
        await cluster.emit_event(isvc.metadata, "Warning", decision.reason_code, decision.reason)
    metrics.TUNER_DECISIONS.labels(isvc.metadata.namespace, isvc.metadata.name, decision.reason_code).inc()
    if decision.changed or _memory(new_state) != _memory(state):
        annotations |= tuner_state_annotation(new_state)
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


async def _live_batch_stats(
    isvc: InferenceService, cluster: TunerCluster, batch_stats: BatchStats | None
) -> tuple[BatchSample, ...]:
    """The live service-time samples of the ready pods (none when unavailable: the build's curve stands)."""
    if batch_stats is None:
        return ()
    try:
        key = engine_cache_key(isvc)
        observed = await cluster.observe(isvc, key, job_report=False, pod_ips=True)
        ips = observed.deployment.ready_pod_ips if observed.deployment else ()
        deltas = await asyncio.to_thread(batch_stats.read, [f"{ip}:{GRPC_PORT}" for ip in ips])
    except Exception as exc:  # statistics are a refinement: without them the build's curve stands
        log.info("%s/%s: Triton batch statistics unavailable: %s", isvc.metadata.namespace, isvc.metadata.name, exc)
        return ()
    return tuple(BatchSample(batch=b, count=n, ms=ms) for b, n, ms in deltas if n > 0 and ms > 0)


def _memory(state: TunerState) -> dict[str, object]:
    """The state that matters across restarts; window bookkeeping alone is not worth a write."""
    return state.model_dump(exclude={"last_window_end", "missing_windows", "recent_demand", "last_rate"})


async def _apply_hot(isvc: InferenceService, cluster: TunerCluster, decision: Decision, applied: InForce) -> bool:
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
