"""The tuner's plumbing in the operator: Prometheus in, Triton model control and the object out.

The law is pure (`tailtune.tuner.law`); this module gives it its three sides for one InferenceService:
- reader: `tailtune.tuner.prom` (the only module that talks to Prometheus),
- applier: hot mode rolls a batching change out safely (`rollout`): one pod first (the canary, reloaded with
  a config override), judged on its own window, then the rest a pod at a time, or rolled back and recorded as
  rejected. The config in force (an annotation) changes when the rollout is promoted, so reconcile updates the
  ConfigMap (restarted pods come back with it); the replica count changes at once. Without room on the GPU
  for a second copy of the engine the pods are rolled instead. Rolling mode only records, and reconcile
  rolls the Deployment.
- recorder: the tuner state (annotation, survives restarts), `status.latency`, and an Event on a change.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from tailtune.api.keys import GRPC_PORT, ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import (
    BatchCount,
    Batching,
    Condition,
    InferenceService,
    LatencyBreakdown,
    LatencyStatus,
    ObjectMeta,
    TargetStatus,
)
from tailtune.operator import metrics
from tailtune.operator.atrest import TunerMemory, latency_moved, state_moved
from tailtune.operator.conform import SpecConform, conform_reloads, decide_conform
from tailtune.operator.engine import build_curve, engine_cache_key, engine_info, io_known
from tailtune.operator.inforce import in_force as config_in_force
from tailtune.operator.inforce import in_force_annotation, policy_for, tuner_state, tuner_state_annotation
from tailtune.operator.modelconfig import TensorMismatch, model_config_json
from tailtune.operator.observed import EngineInfo, Observed
from tailtune.operator.rollout import (
    CANARY_PROMOTED,
    CANARY_REJECTED,
    CANARY_STARTED,
    PodObservation,
    PodReader,
    RolloutPolicy,
    RolloutState,
    RolloutStep,
    advance_rollout,
    pod_observation,
    reload_fits,
    start_rollout,
)
from tailtune.operator.status import (
    NO_LATENCY_DATA,
    NO_TRAFFIC,
    PROMETHEUS_UNAVAILABLE,
    QUERY_AMBIGUOUS,
    SLO_MET,
    compute_slo_condition,
    refresh_slo_message,
)
from tailtune.triton.config import batching_from_config
from tailtune.triton.control import ApplyError, apply_config, get_model_config_json, is_model_ready
from tailtune.tuner import prom
from tailtune.tuner.judge import judge_signal
from tailtune.tuner.law import MAX_REJECTED, SIGNAL_MISSING, hold
from tailtune.tuner.loop import ObservationReader, tune_once
from tailtune.tuner.prom import TRITON_SUMMARY_QUANTILES, PrometheusUnavailable, Signal, quantile_label
from tailtune.tuner.servicetime import BatchSample, Curve, learn, merged
from tailtune.tuner.types import (
    Decision,
    InForce,
    Observation,
    RejectedConfig,
    TunerState,
    judged_window_seconds,
)

log = logging.getLogger(__name__)


class TunerCluster(Protocol):
    """What the tuner needs from the API server (`kube.KubeCluster`)."""

    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed: ...
    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]: ...
    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None: ...
    async def patch_latency(
        self, meta: ObjectMeta, latency: LatencyStatus, conditions: list[Condition] | None = None
    ) -> None: ...
    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class LatencyRead:
    """One read of the latency signal, or why there is none (read before the per-object lock is taken).

    A problem beside a signal is the judge's (`tuner.judge`): the window was read and is not to be used."""

    signal: Signal | None
    problem: str = ""
    message: str = ""
    # The operator's clock when it read: what the samples' times are judged against.
    at: datetime | None = None


def read_latency(reader: ObservationReader | SignalReader, now: datetime) -> LatencyRead:
    """Read the window ending now; a failure becomes a problem status shows, never an exception. Blocking."""
    try:
        if isinstance(reader, SignalReader):
            return LatencyRead(reader.read_signal(now), at=now)
        return LatencyRead(Signal(observation=reader.read(now), source="userQuery"), at=now)
    except Exception as exc:  # a reader of another kind: its failure is the signal's failure
        return failed_read(exc, now)


def failed_read(exc: Exception, now: datetime) -> LatencyRead:
    """A read that ended with `exc`, as status says it: which Prometheus and why, or the reader's own error."""
    if isinstance(exc, PrometheusUnavailable):
        return LatencyRead(
            None, PROMETHEUS_UNAVAILABLE, f"Prometheus at {exc.url} unavailable ({exc.kind}): {exc.detail}", now
        )
    return LatencyRead(None, PROMETHEUS_UNAVAILABLE, f"latency signal unavailable: {type(exc).__name__}: {exc}", now)


def judge_read(
    read: LatencyRead, isvc: InferenceService, observation: Observation | None = None, now: datetime | None = None
) -> LatencyRead:
    """The read with its window judged (`tuner.judge`): a problem named beside the signal when the window is not to
    be used (clocks, stale data, impossible figures); the read unchanged otherwise. `observation`: the window as the
    tuner sees it (the Deployment's ready count, this tick's batch statistics); `now`: the clock when `read.at` is
    unknown. Pure."""
    if read.signal is None or read.problem:
        return read
    obs = read.signal.observation if observation is None else observation
    state, applied = tuner_state(isvc), config_in_force(isvc)
    policy = policy_for(isvc, build_curve(isvc))
    curve = Curve(merged(policy.build_curve, learn(state.live, obs.batch_stats)))
    # Pods that may have served the window: those ready now, or those in force before a scale-in took effect.
    pods = max(obs.ready_replicas or 0, isvc.status.replicas.ready, applied.replicas)
    instances = pods * isvc.spec.serving.gpu.count * isvc.spec.serving.instances_per_gpu
    at = read.at or now or obs.window_end
    problem = judge_signal(obs, at, policy, curve, instances)
    return read if problem is None else replace(read, problem=problem.code, message=problem.message)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def latency_status(
    read: LatencyRead | Observation,
    isvc: InferenceService | float,
    now: datetime,
    decision: Decision | None = None,
    batch_stats: tuple[BatchSample, ...] = (),
) -> LatencyStatus:
    """status.latency from one read: the figure, the window it covers and its source, whether it reaches back
    before the last change (then `cleanMs` stays empty: the config in force has no clean window yet), why
    it cannot be judged when it cannot, every target against its figure, and where the time goes."""
    if isinstance(read, Observation):  # a bare observation: no source or problem known
        read = LatencyRead(Signal(observation=read, source="userQuery"))
    percentile = isvc if isinstance(isvc, float | int) else isvc.spec.slo.percentile
    infeasible = decision.reason if decision is not None and decision.infeasible else None
    if read.signal is None:
        return LatencyStatus(
            percentile=percentile, observed_at=_stamp(now), problem=read.problem, message=read.message,
            infeasible=infeasible,
        )  # fmt: skip
    signal, obs = read.signal, read.signal.observation
    if read.problem:
        # Judged unusable: the window and why, never its figures as if they were real (the message has them).
        return LatencyStatus(
            percentile=percentile, observed_at=_stamp(now), window_start=_stamp(obs.window_start),
            window_end=_stamp(obs.window_end), source=signal.source, problem=read.problem, message=read.message,
        )  # fmt: skip
    p = obs.p_latency_ms
    observed = None if p is None or math.isinf(p) else round(p, 2)
    changed_at = None if isinstance(isvc, float | int) else config_in_force(isvc).changed_at
    overlaps = changed_at is not None and obs.window_start < changed_at
    problem, message = "", ""
    if signal.ambiguous:
        problem, message = QUERY_AMBIGUOUS, f"{signal.ambiguous}: {signal.latency_query}"
    elif p is None and obs.request_rate == 0:
        problem, message = NO_TRAFFIC, "no requests in the window"
    elif p is None:
        problem, message = NO_LATENCY_DATA, _no_data_message(signal, percentile)
    elif decision is not None and decision.reason_code == SIGNAL_MISSING:
        # A figure, but not enough signal to act on (no request rate, too few samples): the tuner holds, and says so.
        problem, message = SIGNAL_MISSING, decision.reason
    elif not isinstance(isvc, float | int):
        message = _window_note(isvc, obs.span_seconds)
    targets = [] if isinstance(isvc, float | int) else _target_statuses(isvc, obs, signal.above_range)
    return LatencyStatus(
        observed_ms=observed,
        percentile=percentile,
        throughput_rps=None if obs.request_rate is None else round(obs.request_rate, 2),
        observed_at=_stamp(now),
        window_start=_stamp(obs.window_start),
        window_end=_stamp(obs.window_end),
        source=signal.source,
        overlaps_change=overlaps,
        above_range=signal.above_range or None,
        clean_ms=None if overlaps else observed,
        clean_window_end=None if overlaps or observed is None else _stamp(obs.window_end),
        problem=problem or None,
        message=message or None,
        infeasible=infeasible,
        targets=targets,
        targets_summary=_targets_summary(targets) if len(targets) > 1 else None,
        breakdown=_breakdown(signal, obs, batch_stats),
    )


def _target_statuses(isvc: InferenceService, obs: Observation, above_range: bool) -> list[TargetStatus]:
    """Every target of spec.slo (the primary first) against its figure over the window."""
    seen = {(isvc.spec.slo.percentile): math.inf if above_range else obs.p_latency_ms, **dict(obs.other_percentiles)}
    out = []
    for percentile, target in isvc.spec.slo.all_targets():
        ms = seen.get(percentile)
        out.append(
            TargetStatus(
                percentile=percentile,
                target_ms=target,
                observed_ms=None if ms is None or math.isinf(ms) else round(ms, 2),
                met=None if ms is None else ms <= target,
            )
        )
    return out


def _targets_summary(targets: list[TargetStatus]) -> str:
    """'P50 6.1/8 ok, P99 24/30 ok, P99.9 >bkt/80 MISSED' (observed/target ms): the wide printer column."""
    parts = []
    for t in targets:
        shown = "-" if t.met is None else (f"{t.observed_ms:.3g}" if t.observed_ms is not None else "inf")
        verdict = "?" if t.met is None else ("ok" if t.met else "MISSED")
        parts.append(f"P{t.percentile:g} {shown}/{t.target_ms:g} {verdict}")
    return ", ".join(parts)


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 3)


def _breakdown(signal: Signal, obs: Observation, batch_stats: tuple[BatchSample, ...]) -> LatencyBreakdown | None:
    """Where the time goes over the window (Triton's counters), the batch sizes executed, and the part outside
    Triton when the SLO's figure is the user's end-to-end query."""
    b = signal.breakdown
    if b is None and not batch_stats and signal.server_ms is None:
        return None
    server = _r(signal.server_ms)
    e2e = obs.p_latency_ms
    outside = None if server is None or e2e is None or math.isinf(e2e) else round(e2e - server, 3)
    return LatencyBreakdown(
        queue_ms=_r(b.queue_ms) if b else None,
        compute_input_ms=_r(b.input_ms) if b else None,
        compute_infer_ms=_r(b.infer_ms) if b else None,
        compute_output_ms=_r(b.output_ms) if b else None,
        rest_ms=_r(b.rest_ms) if b else None,
        request_ms=_r(b.request_ms) if b else None,
        mean_batch=_r(obs.avg_batch),
        batches=[
            BatchCount(batch=s.batch, count=s.count, ms=_r(s.ms)) for s in sorted(batch_stats, key=lambda s: s.batch)
        ],
        server_ms=server if signal.source == "userQuery" else None,
        outside_ms=outside if signal.source == "userQuery" else None,
    )


def _no_data_message(signal: Signal, percentile: float) -> str:
    if signal.source == "tritonSummary" and quantile_label(percentile) not in TRITON_SUMMARY_QUANTILES:
        return (
            f"Triton's summaries carry only their configured quantiles ({', '.join(TRITON_SUMMARY_QUANTILES)} by "
            f"default); quantile {quantile_label(percentile)} needs --metrics-config summary_quantiles=... on the "
            "server, a latency histogram, or metrics.latencyQuery"
        )
    return f"the latency query returned no series: {signal.latency_query}"


def _window_note(isvc: InferenceService, span_seconds: float) -> str:
    """Says so when the tuner reads more often than its source's window moves on (windows overlap)."""
    interval = isvc.spec.tuning.interval_seconds
    if interval >= span_seconds:
        return ""
    return (
        f"tuning every {interval} s reads a {span_seconds:g} s window: consecutive windows overlap, and each is "
        "judged once per new scrape"
    )


@dataclass
class HotApplyReport:
    """What a hot apply did: seconds per pod, and the failures that force a rolling update."""

    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def hot_apply(pod_ips: tuple[str, ...], model: str, config_json: str) -> HotApplyReport:
    """Reload the model with the new config in each given pod, in order (Triton swaps when the new copy is
    READY). The rollout calls it for one pod at a time."""
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


def observe_pods(
    ready_ips: tuple[str, ...], model: str, windows: Mapping[str, prom.PodWindow], window_seconds: float
) -> dict[str, PodObservation]:
    """What the rollout judges, per ready pod: model readiness and live batching from Triton, its own window
    from Prometheus. Reads only."""
    pods: dict[str, PodObservation] = {}
    for ip in ready_ips:
        url = f"{ip}:{GRPC_PORT}"
        ready = is_model_ready(url, model)
        try:
            live = batching_from_config(get_model_config_json(url, model)) if ready else None
        except Exception:  # unreadable config: unknown, the rollout neither counts it done nor rolls it back
            live = None
        pods[ip] = pod_observation(ready, live, windows.get(ip), window_seconds)
    return pods


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


@runtime_checkable
class SignalReader(Protocol):
    """A reader that also says where its figure comes from (`tailtune.tuner.prom.PrometheusReader`)."""

    def read_signal(self, at: datetime) -> Signal: ...


class BatchStats(Protocol):
    """Triton's per-batch-size statistics of the ready pods since the last read (`triton.stats`)."""

    def read(self, addresses: list[str]) -> tuple[tuple[int, int, float], ...]: ...


async def tune_step(
    isvc: InferenceService,
    cluster: TunerCluster,
    reader: ObservationReader | SignalReader | LatencyRead,
    now: datetime,
    batch_stats: BatchStats | None = None,
    pods: PodReader | None = None,
    memory: TunerMemory | None = None,
) -> Decision | None:
    """One tuner tick for one InferenceService: read, decide (`tailtune.tuner.loop.tune_once`, the loop the
    simulator and the benchmark run), apply (hot or rolling), record.

    Returns None without reading anything while no Triton pod serves (nothing to tune yet). Writes only what
    moved (`tailtune.operator.atrest`): a tick that holds on a steady (or steadily missing) signal costs no API
    write. With a `memory` the tuner state goes on between ticks in this process and the annotation is written as
    a checkpoint when it moves materially; without one the annotation is the only home and every change of it is
    written.
    """
    if isvc.status.replicas.ready < 1:
        return None
    applied = config_in_force(isvc)
    checkpoint = tuner_state(isvc)
    state = memory.recall(isvc, checkpoint) if memory is not None else checkpoint
    # The read normally happens before the caller takes the per-object lock (a slow Prometheus holds no one up).
    read = reader if isinstance(reader, LatencyRead) else await asyncio.to_thread(read_latency, reader, now)
    if read.signal is None:  # the law holds on missing data, never blind; status says why
        log.warning("%s/%s: %s", isvc.metadata.namespace, isvc.metadata.name, read.message)
        observation = Observation(window_end=now, span_seconds=float(isvc.spec.slo.window_seconds))
    else:
        observation = read.signal.observation
    # Prometheus counts the pods it scraped; the Deployment knows how many serve.
    observation = observation.model_copy(
        update={
            "ready_replicas": isvc.status.replicas.ready,
            "batch_stats": await _live_batch_stats(isvc, cluster, batch_stats),
        }
    )
    read = judge_read(read, isvc, observation, now)
    rollout = RolloutState.from_annotations(isvc.metadata.annotations) if isvc.spec.tuning.mode == "hot" else None
    # A spec change the config in force or the rollout in flight no longer fits: the pods conform first, and the law
    # plans within the new bounds from the next window.
    conform = decide_conform(isvc, rollout, now)
    if conform is not None:
        decision = hold(state, applied, conform.code, conform.message)
        new_state = decision.state
    elif read.signal is not None and read.problem:
        # A window judged unusable (clocks, stale data, impossible figures) is never acted on; status says why.
        log.warning("%s/%s: %s: %s", isvc.metadata.namespace, isvc.metadata.name, read.problem, read.message)
        decision = judged_hold(state, applied, observation, read)
        new_state, new_in_force = decision.state, decision.in_force
    else:
        deferred = _Deferred()
        policy = policy_for(isvc, build_curve(isvc))
        # The decision is CPU work (seconds on a curve measured at every size of a large engine): off the event
        # loop, so the other resources' handlers, watches and the health probe go on meanwhile.
        new_state, new_in_force, decision = await asyncio.to_thread(
            tune_once, _Window(observation), deferred, deferred, state, applied, policy, now
        )
    annotations: dict[str, str] = {}
    if conform is not None:
        hot = await _apply_conform(isvc, cluster, conform, decision)
        new_state, decision = hot.decision.state, hot.decision
        annotations |= hot.annotations
    elif rollout is not None or (decision.changed and isvc.spec.tuning.mode == "hot"):
        # A rollout in flight is finished before the law changes anything again.
        hot = await _apply_hot(isvc, cluster, decision, applied, state, rollout, pods, now)
        new_state, decision = hot.decision.state, hot.decision
        annotations |= hot.annotations
    elif decision.changed:
        annotations |= in_force_annotation(new_in_force)
        metrics.CONFIG_RELOADS.labels(isvc.metadata.namespace, isvc.metadata.name, "rollout", "ok").inc()
        await cluster.emit_event(isvc.metadata, "Normal", decision.reason_code or "TunerChange", decision.reason)
    elif decision.infeasible and state.last_reason_code != decision.reason_code:
        await cluster.emit_event(isvc.metadata, "Warning", decision.reason_code, decision.reason)
    metrics.TUNER_DECISIONS.labels(isvc.metadata.namespace, isvc.metadata.name, decision.reason_code).inc()
    if memory is None:
        moved = _memory(new_state) != _memory(state)
    else:
        moved = state_moved(checkpoint, new_state, policy_for(isvc).good_windows)
    if decision.changed or moved:
        annotations |= tuner_state_annotation(new_state)
    if annotations:
        await cluster.patch_annotations(isvc.metadata, annotations)
    if memory is not None:
        memory.keep(isvc, annotations, new_state)
    latency = latency_status(read, isvc, now, decision, observation.batch_stats)
    metrics.record_latency(isvc.metadata.namespace, isvc.metadata.name, latency)
    if latency_moved(isvc.status.latency, latency):
        await cluster.patch_latency(isvc.metadata, latency, refresh_slo_message(isvc, latency))
    return decision


def judged_hold(state: TunerState, applied: InForce, observation: Observation, read: LatencyRead) -> Decision:
    """The tuner's decision on a window the judge refused: hold the config in force, with the judge's reason. Runs of
    bad or good windows start over (they count consecutive usable windows); the window is not remembered as judged
    (a clock ahead would block the windows after it is fixed); Triton's own batch statistics are still learnt."""
    st = state.model_copy(
        update={"bad_windows": 0, "good_windows": 0, "live": learn(state.live, observation.batch_stats)}
    )
    return hold(st, applied, read.problem, f"{read.message}; holding the config, never acting on it", missing=True)


# The last reason each object's batch statistics were unavailable ((namespace, name) -> the error's text).
_STATS_UNAVAILABLE: dict[tuple[str, str], str] = {}


def forget_stats_unavailable(key: tuple[str, str]) -> None:
    """The object's statistics were read again, or it is gone: its next failure is said again."""
    _STATS_UNAVAILABLE.pop(key, None)


async def _live_batch_stats(
    isvc: InferenceService, cluster: TunerCluster, batch_stats: BatchStats | None
) -> tuple[BatchSample, ...]:
    """The live service-time samples of the ready pods (none when unavailable: the build's curve stands). The pods
    are the cluster's list at the Deployment's version (`watched.PodIps`): no API request at rest."""
    if batch_stats is None:
        return ()
    key = (isvc.metadata.namespace, isvc.metadata.name)
    try:
        ips = await cluster.ready_pod_ips(isvc)
        deltas = await asyncio.to_thread(batch_stats.read, [f"{ip}:{GRPC_PORT}" for ip in ips])
    except Exception as exc:  # statistics are a refinement: without them the build's curve stands
        said = str(exc)
        # Said once per object while the reason stays (at 1,000 objects a line per tick buried the log).
        level = logging.DEBUG if _STATS_UNAVAILABLE.get(key) == said else logging.INFO
        _STATS_UNAVAILABLE[key] = said
        log.log(level, "%s/%s: Triton batch statistics unavailable (the build's curve stands): %s", *key, said)
        return ()
    forget_stats_unavailable(key)
    return tuple(BatchSample(batch=b, count=n, ms=ms) for b, n, ms in deltas if n > 0 and ms > 0)


def _memory(state: TunerState) -> dict[str, object]:
    """The state that matters across restarts; window bookkeeping alone is not worth a write."""
    return state.model_dump(exclude={"last_window_end", "missing_windows", "recent_demand", "demand_history"})


@dataclass
class _HotOutcome:
    """What a hot tick did: the decision to report (the law's, or the rollout's) and the annotations to write."""

    decision: Decision
    annotations: dict[str, str] = field(default_factory=dict)


async def _apply_hot(
    isvc: InferenceService,
    cluster: TunerCluster,
    decision: Decision,
    applied: InForce,
    state: TunerState,
    rollout: RolloutState | None,
    pods: PodReader | None,
    now: datetime,
) -> _HotOutcome:
    """Hot mode: start a rollout for a batching change (or roll the pods when the GPU has no room for a
    second copy of the engine), or advance the one in flight; promote or reject it when it ends."""
    ns, name = isvc.metadata.namespace, isvc.metadata.name
    if rollout is None and decision.batching == applied.batching:
        # A replica change only: reconcile scales the Deployment.
        await cluster.emit_event(isvc.metadata, "Normal", decision.reason_code or "TunerChange", decision.reason)
        return _HotOutcome(decision, in_force_annotation(decision.in_force))
    key = engine_cache_key(isvc)
    observed = await cluster.observe(isvc, key, job_report=not io_known(isvc, key), pod_ips=True)
    info = engine_info(isvc, key, observed.job)
    ips = observed.deployment.ready_pod_ips if observed.deployment else ()
    window = judged_window_seconds(float(isvc.spec.slo.window_seconds))
    try:
        windows = dict(await asyncio.to_thread(pods.read, now)) if pods is not None else {}
    except Exception as exc:  # no per-pod latency: the canary is judged late, then rolled back
        log.warning("%s/%s: per-pod latency unavailable: %s", ns, name, exc)
        windows = {}
    annotations: dict[str, str] = {}
    if rollout is None:
        engine_bytes = info.engine_bytes if info is not None else None  # the build's size; else what is used
        if any(reload_fits(engine_bytes, w.gpu_used_bytes, w.gpu_total_bytes) is False for w in windows.values()):
            # No room for a second copy of the engine: roll the pods (maxSurge 1, maxUnavailable 0, warm first).
            metrics.CONFIG_RELOADS.labels(ns, name, "rollout", "ok").inc()
            await cluster.emit_event(
                isvc.metadata, "Normal", "HotReloadNoRoom",
                "no GPU memory for a second copy of the engine; rolling the pods one at a time: " + decision.reason,
            )  # fmt: skip
            return _HotOutcome(decision, in_force_annotation(decision.in_force.model_copy(update={"rolled": True})))
        rollout = start_rollout(decision.batching, applied.batching, ips, now, decision.demand_rps, decision.reason)
        if rollout is None:
            return _HotOutcome(_held(decision, applied, state, "NoReadyPod", "no ready pod to reload"))
        # Replicas follow the law at once; the batching in force changes when the canary is promoted.
        applied = decision.in_force.model_copy(update={"batching": applied.batching})
        state = decision.state
        annotations |= in_force_annotation(applied)
        await cluster.emit_event(isvc.metadata, "Normal", CANARY_STARTED, f"canary {rollout.canary}: {decision.reason}")
    policy = RolloutPolicy(
        slo_ms=isvc.spec.slo.latency_ms,
        window_seconds=window,
        min_samples=policy_for(isvc).min_samples,
        latency_required=pods is not None,
    )
    model = isvc.model_name
    loop = asyncio.get_running_loop()

    def reload(ip: str, batching: Batching) -> str:
        return reload_pod(isvc, info, ip, batching)

    def keep(record: RolloutState) -> None:  # the record goes on the object before its reloads
        patch = cluster.patch_annotations(isvc.metadata, {**annotations, **record.to_annotation()})
        asyncio.run_coroutine_threadsafe(patch, loop).result()

    step: RolloutStep = await asyncio.to_thread(
        advance_rollout, rollout, lambda: observe_pods(ips, model, windows, window), reload, policy, now, keep
    )
    annotations |= step.state.to_annotation() if step.state is not None else {ROLLOUT_ANNOTATION: ""}
    outcome = await _ended(isvc, cluster, decision, applied, state, rollout, step, now)
    if outcome.changed:
        annotations |= in_force_annotation(outcome.in_force)
    return _HotOutcome(outcome, annotations)


def reload_pod(isvc: InferenceService, info: EngineInfo | None, ip: str, batching: Batching) -> str:
    """Hot-reload one pod with `batching`; "" or why it failed. Blocking."""
    try:
        config = model_config_json(isvc, batching, info)
    except TensorMismatch as exc:  # never load a config the engine refuses; the caller fails with why
        return str(exc)
    report = hot_apply((ip,), isvc.model_name, config)
    outcome = "failed" if report.failures else "ok"
    metrics.CONFIG_RELOADS.labels(isvc.metadata.namespace, isvc.metadata.name, "hot", outcome).inc()
    return report.failures.get(ip, "")


async def _apply_conform(
    isvc: InferenceService, cluster: TunerCluster, conform: SpecConform, held: Decision
) -> _HotOutcome:
    """A spec change conformed to: in hot mode every ready pod on another batching is reloaded to the clamped one now
    (a reload that fails rolls the pods instead); the clamped config goes in force, the rollout it aborts ends, and
    one Event names each field moved. Rolling mode only records: reconcile rolls the pods."""
    in_force, message = conform.in_force, conform.message
    annotations = {ROLLOUT_ANNOTATION: ""} if conform.aborted is not None else {}
    kind = "Normal"
    if conform.reload and isvc.spec.tuning.mode == "hot" and not in_force.rolled:
        key = engine_cache_key(isvc)
        observed = await cluster.observe(isvc, key, job_report=not io_known(isvc, key), pod_ips=True)
        info = engine_info(isvc, key, observed.job)
        ips = observed.deployment.ready_pod_ips if observed.deployment else ()
        pods = await asyncio.to_thread(observe_pods, ips, isvc.model_name, {}, float(isvc.spec.slo.window_seconds))
        failures: dict[str, str] = {}
        for ip, batching in conform_reloads(pods, in_force.batching):
            if err := await asyncio.to_thread(reload_pod, isvc, info, ip, batching):
                failures[ip] = err
        if failures:
            message += f"; the reload failed on {', '.join(sorted(failures))}: rolling the pods instead"
            in_force, kind = in_force.model_copy(update={"rolled": True}), "Warning"
    in_force = in_force.model_copy(update={"reason": message})
    await cluster.emit_event(isvc.metadata, kind, conform.code, message)
    decision = Decision(action="change", in_force=in_force, reason=message, reason_code=conform.code, state=held.state)
    return _HotOutcome(decision, annotations | in_force_annotation(in_force))


async def _ended(
    isvc: InferenceService,
    cluster: TunerCluster,
    decision: Decision,
    applied: InForce,
    state: TunerState,
    rollout: RolloutState,
    step: RolloutStep,
    now: datetime,
) -> Decision:
    """The decision a rollout step reports: promoted (the target in force), rejected (recorded), or a hold."""
    if step.outcome == "promoted":
        await cluster.emit_event(isvc.metadata, "Normal", CANARY_PROMOTED, step.message)
        in_force = applied.model_copy(update={"batching": rollout.target, "changed_at": now, "reason": rollout.reason})
        st = state.model_copy(update={"last_reason_code": CANARY_PROMOTED})
        return Decision(action="change", in_force=in_force, reason=step.message, reason_code=CANARY_PROMOTED, state=st)
    if step.outcome == "rejected":
        await cluster.emit_event(isvc.metadata, "Warning", CANARY_REJECTED, step.message)
        rejected = RejectedConfig(batching=rollout.target, demand_rps=rollout.demand_rps, at=now, reason=step.message)
        kept = (*state.rejected, rejected)[-MAX_REJECTED:]
        st = state.model_copy(update={"rejected": kept, "last_reason_code": CANARY_REJECTED})
        # changed_at moves: the law waits for a clean window of the config in force before it plans again.
        in_force = applied.model_copy(update={"changed_at": now, "reason": step.message})
        return Decision(action="change", in_force=in_force, reason=step.message, reason_code=CANARY_REJECTED, state=st)
    return _held(decision, applied, state, step.code, step.message)


def _held(decision: Decision, applied: InForce, state: TunerState, code: str, reason: str) -> Decision:
    """A hold while a rollout is in flight: the law's change waits for it."""
    return hold(state, applied, code, reason, demand_rps=decision.demand_rps, capacity_rps=decision.capacity_rps)


def slo_condition_moved(isvc: InferenceService, latency: LatencyStatus | float | None) -> bool:
    """Whether SLOMet would change with this latency status (then the caller reconciles to write it)."""
    status = latency if isinstance(latency, LatencyStatus) else LatencyStatus(observed_ms=latency)
    new = compute_slo_condition(isvc, status)
    old = next((c for c in isvc.status.conditions if c.type == SLO_MET), None)
    return old is None or (old.status, old.reason) != (new.status, new.reason)


def parse_isvc(raw: dict[str, Any]) -> InferenceService | None:
    """The object, or None when it does not parse (reconcile reports that; the tuner just waits)."""
    try:
        return InferenceService.model_validate(raw)
    except ValidationError:
        return None
