"""A generative InferenceService (spec.model.kind generative) in the operator: TTFT/TPOT from Prometheus into
`status.generative` and the SLOMet condition, and the generative tuner's replicas applied.

One tick (`generative_tick`, from the tuner daemon in place of the batching tuner's):
- read the window (`tailtune.tuner.prom.read_generative`: TTFT and TPOT at the spec's percentiles by
  `histogram_quantile` over the buckets summed across pods, tokens/s, running and waiting sequences, KV-cache use),
  off the event loop and before the object's lock is taken;
- `status.generative` and SLOMet (TTFT and TPOT against their targets: reason and message), in one status write,
  only when they changed; an Event when SLOMet's status or reason moves;
- the decision of `tailtune.tuner.generative.decide_generative` (pure): its replicas go in force through the same
  annotation the batching tuner writes (reconcile scales the Deployment), with an Event;
- its lever change (KV share, queue size, chunked prefill, scheduler policy: the tensorrt_llm settings Triton reads
  at model load) is a reload. In hot mode it goes through the batching tuner's canary (`rollout`, carrying the
  settings): one pod reloaded with the tensorrt_llm config `modelconfig.model_config_json` renders from them, judged
  after a window (the spec's) on its reload, its readiness and its own TTFT and TPOT percentiles
  (`prom.read_pod_generative`: `histogram_quantile` over that pod's buckets; `rollout.judge_llm_canary`), then the
  other pods one at a time, or rolled back (a Warning Event CanaryRejected naming the figure; the law remembers the
  levers as rejected at that demand, `tuner.generative.remember_rejected`). A window with too few requests to judge
  waits (an Event says so), and is rolled back, unjudged, two windows after the reload. The settings go in force
  (`InForce.llm`, rendered into the ConfigMap by reconcile) when the canary is promoted; an Event at the start and at
  the end; `status.generative.serving`/`servingReason` say what is in force and why, `status.rollout.llm` what the
  canary runs. In rolling mode the change goes in force at once and
  reconcile rolls the pods. Either way the law's own guards bound it: the cooldown after any change and the reload
  budget, which counts the reloads kept on the config in force (`InForce.llm_reloads`), so a restart keeps it.

Reconcile leaves `status.generative` and SLOMet as the tick wrote them (`carry_into`), with the settings in force.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from tailtune.api.keys import GRPC_PORT, ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import (
    Condition,
    GenerativeStatus,
    InferenceService,
    InferenceServiceStatus,
    LlmServing,
    TargetStatus,
)
from tailtune.operator import metrics
from tailtune.operator.inforce import in_force as config_in_force
from tailtune.operator.inforce import in_force_annotation, llm_in_force
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.rollout import (
    CANARY_PROMOTED,
    CANARY_REJECTED,
    CANARY_STARTED,
    CANARY_WAITING,
    PodObservation,
    RolloutPolicy,
    RolloutState,
    RolloutStep,
    advance_rollout,
    describe,
    describe_llm,
    pod_observation,
    reload_fits,
    start_rollout,
)
from tailtune.operator.status import (
    NO_LATENCY_DATA,
    NO_TRAFFIC,
    PROMETHEUS_UNAVAILABLE,
    SLO_MET,
    SLO_VIOLATED,
    WITHIN_SLO,
    merge_conditions,
)
from tailtune.triton.config import ConfigError
from tailtune.triton.control import ApplyError, get_model_config_json, is_model_ready, load_model
from tailtune.triton.trtllm_config import llm_serving_from_config
from tailtune.tuner import prom
from tailtune.tuner.generative import (
    HOLD,
    LEVERS_CHANGED,
    MIN_REQUESTS,
    REJECTION_MEMORY_SECONDS,
    RELOAD_BUDGET_SECONDS,
    GenDecision,
    GenInForce,
    GenObservation,
    GenPolicy,
    GenPolicyError,
    GenState,
    decide_generative,
    levers_of,
    remember_rejected,
    serving_with,
)
from tailtune.tuner.types import InForce

log = logging.getLogger(__name__)
T = TypeVar("T")

AWAITING_FIRST_READ = "no TTFT/TPOT read from Prometheus yet"


class GenCluster(Protocol):
    """What a generative tick needs from the API server (`kube.KubeCluster`)."""

    async def patch_annotations(self, meta: Any, annotations: dict[str, str]) -> None: ...
    async def patch_generative(
        self, meta: Any, generative: GenerativeStatus, conditions: list[Condition] | None
    ) -> None: ...
    async def emit_event(self, meta: Any, type_: str, reason: str, message: str) -> None: ...
    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]: ...


class GenTickState(Protocol):
    """The operator's process state a tick uses (`handlers.State`)."""

    @property
    def cluster(self) -> Any: ...
    @property
    def locks(self) -> Mapping[tuple[str, str], asyncio.Lock]: ...
    @property
    def ticking(self) -> set[tuple[str, str]]: ...

    async def current(self, namespace: str, name: str) -> dict[str, Any] | None: ...


# The tuner's state between ticks, per object uid, in this process (a restart starts it afresh: it holds only the
# law's run counts and calibration, relearnt within a few windows).
_memory: dict[str, GenState] = {}
# The last spec problem told as an Event per object (told once, not every tick).
_told: dict[str, str] = {}
# The canary told as waiting for enough requests to judge, per object (told once per canary, not every tick).
_told_waiting: dict[str, str] = {}


def is_generative(isvc: InferenceService) -> bool:
    """A generative service: judged by TTFT/TPOT, tuned by `decide_generative`."""
    return isvc.spec.model.kind == "generative"


# ----------------------------------------------------------------------------------------------------- reading


def read_window(isvc: InferenceService, now: datetime) -> prom.GenerativeSignal:
    """The generative window ending `now` from the spec's Prometheus (raises `prom.PrometheusUnavailable`)."""
    spec = isvc.spec
    ttft, tpot = spec.slo.ttft, spec.slo.tpot
    assert ttft is not None and tpot is not None  # the API refuses a generative spec without them
    client = prom.HttpPromClient(spec.metrics.prometheus_url, spec.metrics.timeout_seconds)
    target = prom.Target(namespace=isvc.metadata.namespace, name=isvc.metadata.name, model=isvc.model_name)
    return prom.read_generative(
        client.query, target, ttft.percentile, tpot.percentile, float(spec.slo.window_seconds), now
    )


# ------------------------------------------------------------------------------------------------------ status


def _r(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def _target(percentile: float, target_ms: float, observed: float | None, above: bool) -> TargetStatus:
    met = None if observed is None and not above else (not above and observed is not None and observed <= target_ms)
    return TargetStatus(percentile=percentile, target_ms=target_ms, observed_ms=_r(observed), met=met)


def _summary(t: TargetStatus, above: bool) -> str:
    shown = ">max bucket" if above else "-" if t.observed_ms is None else f"{t.observed_ms:g}"
    verdict = "" if t.met is None else " ok" if t.met else " MISSED"
    return f"P{t.percentile:g} {shown}/{t.target_ms:g}{verdict}"


def generative_status(isvc: InferenceService, sig: prom.GenerativeSignal) -> GenerativeStatus:
    """status.generative from one window. Pure."""
    ttft_spec, tpot_spec = isvc.spec.slo.ttft, isvc.spec.slo.tpot
    assert ttft_spec is not None and tpot_spec is not None
    ttft = _target(ttft_spec.percentile, ttft_spec.target_ms, sig.ttft_ms, sig.above_range_ttft)
    tpot = _target(tpot_spec.percentile, tpot_spec.target_ms, sig.tpot_ms, sig.above_range_tpot)
    return GenerativeStatus(
        ttft=ttft,
        tpot=tpot,
        ttft_summary=_summary(ttft, sig.above_range_ttft),
        tpot_summary=_summary(tpot, sig.above_range_tpot),
        tokens_per_second=_r(sig.tokens_per_second),
        running_sequences=None if sig.running is None else round(sig.running),
        waiting_sequences=None if sig.waiting is None else round(sig.waiting),
        # At most 100: a pod's used and total blocks are two gauges, scraped apart (a figure over 100 must not fail
        # the status write, which would leave status.generative as it was).
        kv_cache_used_percent=None
        if sig.kv_used_fraction is None
        else min(100.0, round(100 * sig.kv_used_fraction, 1)),
        **serving_status(isvc),
    )


SPEC_SERVING_REASON = "spec.serving.llm (no lever change by the tuner)"


def serving_status(isvc: InferenceService) -> dict[str, Any]:
    """status.generative's `serving` and `servingReason`: the tensorrt_llm settings in force and why. Pure."""
    return {"serving": llm_in_force(isvc), "serving_reason": config_in_force(isvc).llm_reason or SPEC_SERVING_REASON}


def _cond(ok: bool | None, reason: str, message: str) -> Condition:
    status = "Unknown" if ok is None else "True" if ok else "False"
    return Condition(type=SLO_MET, status=status, reason=reason, message=message)


def slo_condition(isvc: InferenceService, sig: prom.GenerativeSignal | None, problem: str | None = None) -> Condition:
    """SLOMet of a generative service: TTFT and TPOT against their targets over the window. Pure.

    Unknown without a figure (Prometheus unavailable, no traffic, no histogram yet); False naming each target
    missed; True when both hold."""
    if sig is None:
        return _cond(None, PROMETHEUS_UNAVAILABLE, f"TTFT/TPOT not judged: {problem or 'no read'}")
    window = f"over the last {sig.span_seconds:g} s"
    if not sig.request_rate:
        return _cond(None, NO_TRAFFIC, f"no requests {window}: TTFT/TPOT not judged")
    status = generative_status(isvc, sig)
    assert status.ttft is not None and status.tpot is not None
    if status.ttft.met is None or status.tpot.met is None:
        missing = [n for n, t in (("TTFT", status.ttft), ("TPOT", status.tpot)) if t.met is None]
        return _cond(None, NO_LATENCY_DATA, f"no {' or '.join(missing)} histogram data from Prometheus {window}")
    message = f"TTFT {status.ttft_summary}, TPOT {status.tpot_summary} (ms) {window}"
    missed = [n for n, t in (("TTFT", status.ttft), ("TPOT", status.tpot)) if not t.met]
    if missed:
        return _cond(False, SLO_VIOLATED, f"{' and '.join(missed)} over target: {message}")
    return _cond(True, WITHIN_SLO, f"TTFT and TPOT within their targets: {message}")


def carry_into(isvc: InferenceService, status: InferenceServiceStatus) -> InferenceServiceStatus:
    """Reconcile's status with the tick's `status.generative` and SLOMet kept (reconcile computes SLOMet from
    status.latency, which a generative service has none of). Pure."""
    if not is_generative(isvc):
        return status
    old = next((c for c in isvc.status.conditions if c.type == SLO_MET), None)
    computed = next((c for c in status.conditions if c.type == SLO_MET), None)
    kept = old or (
        computed
        and computed.model_copy(update={"status": "Unknown", "reason": NO_LATENCY_DATA, "message": AWAITING_FIRST_READ})
    )
    conditions = [kept if c.type == SLO_MET and kept else c for c in status.conditions]
    generative = isvc.status.generative
    if generative is not None:  # the settings in force as the config in force says now (a promotion moved them)
        generative = generative.model_copy(update=serving_status(isvc))
    return status.model_copy(update={"conditions": conditions, "generative": generative})


# ------------------------------------------------------------------------------------------------------- tuner


def observation(sig: prom.GenerativeSignal, ready: int) -> GenObservation:
    """The tuner's window from the read (missing figures are None for the latencies, 0 for the loads)."""
    end = sig.window_end.timestamp()
    rate = sig.request_rate or 0.0
    return GenObservation(
        window_start=end - sig.span_seconds,
        window_end=end,
        ttft_ms=float("inf") if sig.above_range_ttft else sig.ttft_ms,
        tpot_ms=float("inf") if sig.above_range_tpot else sig.tpot_ms,
        request_rate=rate,
        prompt_tokens_per_s=sig.prompt_tokens_per_second or 0.0,
        output_tokens_per_s=sig.tokens_per_second or 0.0,
        running=sig.running or 0.0,
        waiting=sig.waiting or 0.0,
        kv_use=sig.kv_used_fraction or 0.0,
        replicas_ready=ready,
        requests=round(rate * sig.span_seconds),
    )


def gen_in_force(isvc: InferenceService) -> GenInForce:
    """What is in force, as the generative tuner sees it: replicas, the levers of the tensorrt_llm settings in
    force, the last change and the reloads its budget counts (all kept on the config in force)."""
    applied = config_in_force(isvc)
    return GenInForce(
        replicas=applied.replicas,
        levers=levers_of(llm_in_force(isvc)),
        changed_at=applied.changed_at.timestamp() if applied.changed_at else None,
        reloads=tuple(t.timestamp() for t in applied.llm_reloads),
    )


def decide(isvc: InferenceService, sig: prom.GenerativeSignal, now: datetime) -> GenDecision:
    """The generative tuner's decision on this window, with the state this process keeps for the object."""
    in_force = gen_in_force(isvc)
    state = _memory.get(isvc.metadata.uid, GenState())
    obs = observation(sig, ready_replicas(isvc, sig))
    decision = decide_generative(state, in_force, obs, GenPolicy.from_spec(isvc.spec), now.timestamp())
    _memory[isvc.metadata.uid] = decision.state
    return decision


def not_serving_yet(isvc: InferenceService) -> bool:
    """No tick before the first ready replica. Once the tick has written figures it runs whatever status.replicas
    says: that count is reconcile's, written on the Deployment's events, and a tick gated on a stale 0 would stop
    status.generative for good (it then says what Prometheus sees, no traffic included)."""
    return isvc.status.replicas.ready < 1 and isvc.status.generative.ttft is None  # no read written yet


def ready_replicas(isvc: InferenceService, sig: prom.GenerativeSignal) -> int:
    """The replicas that served the window: the Deployment's ready count, or the pods Prometheus scraped when that
    count lags (both are the same pods a moment apart)."""
    return max(isvc.status.replicas.ready, sig.ready_replicas or 0)


async def _told_on_failure(cluster: GenCluster, isvc: InferenceService, part: str, work: Awaitable[T]) -> T:
    """Run `work`; a failure becomes a Warning Event (once per message: a tick that fails every interval would
    otherwise leave status as it was, silently) and is raised on to the daemon, which retries."""
    try:
        return await work
    except Exception as exc:
        message = f"the generative tick failed on its {part}: {type(exc).__name__}: {exc}"
        if _told.get(isvc.metadata.uid) != message:
            _told[isvc.metadata.uid] = message
            await cluster.emit_event(isvc.metadata, "Warning", GENERATIVE_TICK_FAILED, message)
        raise


GENERATIVE_TICK_FAILED = "GenerativeTickFailed"


def held(isvc: InferenceService, why: str) -> GenDecision:
    """A decision that keeps what is in force (replicas and levers)."""
    return GenDecision(config_in_force(isvc).replicas, levers_of(llm_in_force(isvc)), HOLD, why)


def forget(uid: str | None) -> None:
    """Drop an object's tuner state (deleted, or no longer this process's)."""
    if uid:
        _memory.pop(uid, None)
        _told.pop(uid, None)
        _told_waiting.pop(uid, None)


# -------------------------------------------------------------------------------------------------------- tick


async def generative_tick(
    state: GenTickState,
    namespace: str,
    name: str,
    parse: Callable[[dict[str, Any]], InferenceService | None],
    reconciled: Callable[[dict[str, Any]], Awaitable[None]],
) -> float:
    """One tick of a generative service; returns the seconds to the next one (`spec.tuning.intervalSeconds`)."""
    key = (namespace, name)
    raw = await state.current(namespace, name)
    isvc = parse(raw) if raw else None
    if isvc is None or not is_generative(isvc):
        return 0.0
    interval = float(isvc.spec.tuning.interval_seconds)
    if not_serving_yet(isvc) or key in state.ticking:
        log.info("%s/%s generative tick skipped: %s", namespace, name,
                 "a tick in flight" if key in state.ticking else "no ready replica yet")  # fmt: skip
        return interval
    state.ticking.add(key)
    try:
        now = datetime.now(UTC)
        sig: prom.GenerativeSignal | None
        try:
            sig, problem = await asyncio.to_thread(read_window, isvc, now), None
        except prom.PrometheusUnavailable as exc:
            sig, problem = None, str(exc)
        async with state.locks[key]:
            raw = await state.current(namespace, name)
            isvc = parse(raw) if raw else None
            if isvc is None or not is_generative(isvc):
                return interval
            await _told_on_failure(state.cluster, isvc, "status write", _record(state.cluster, isvc, sig, problem, now))
            if not isvc.spec.tuning.enabled:
                return interval
            if sig is None or ready_replicas(isvc, sig) < 1:
                # No window to decide on; a lever rollout in flight still goes on (its per-pod read is its own: without
                # one the canary waits, then is rolled back unjudged), so pods are never left split for want of a read.
                decision = held(isvc, "no window to decide on")
            else:
                try:
                    decision = await asyncio.to_thread(decide, isvc, sig, now)
                except GenPolicyError as exc:  # a spec the tuner cannot follow: said once, held, never a crash
                    if _told.get(isvc.metadata.uid) != str(exc):
                        _told[isvc.metadata.uid] = str(exc)
                        await state.cluster.emit_event(isvc.metadata, "Warning", "GenerativeTunerHolds", str(exc))
                    decision = held(isvc, str(exc))
            if (decision.changed or llm_rollout(isvc) is not None) and await _told_on_failure(
                state.cluster, isvc, "decision's apply", _apply(state.cluster, isvc, decision, now)
            ):
                fresh = await state.current(namespace, name)
                if fresh:
                    await reconciled(fresh)
    finally:
        state.ticking.discard(key)
    return interval


async def _record(
    cluster: GenCluster, isvc: InferenceService, sig: prom.GenerativeSignal | None, problem: str | None, now: datetime
) -> None:
    """status.generative and SLOMet in one write, only when either moved; an Event when SLOMet's verdict moves."""
    if sig is not None:
        generative = generative_status(isvc, sig)
    else:  # no read: the last figures stay, the settings in force are this object's
        generative = (isvc.status.generative or GenerativeStatus()).model_copy(update=serving_status(isvc))
    cond = slo_condition(isvc, sig, problem)
    old = next((c for c in isvc.status.conditions if c.type == SLO_MET), None)
    cond_moved = old is None or (old.status, old.reason, old.message) != (cond.status, cond.reason, cond.message)
    if generative == isvc.status.generative and not cond_moved:
        return
    conditions = None
    if cond_moved:
        merged = merge_conditions(isvc.status.conditions, [cond], now=now, generation=isvc.metadata.generation)[0]
        conditions = [merged if c.type == SLO_MET else c for c in isvc.status.conditions]
        if old is None:
            conditions.append(merged)
    await cluster.patch_generative(isvc.metadata, generative, conditions)
    log.debug("%s/%s status.generative: TTFT %s, TPOT %s; SLOMet %s %s", isvc.metadata.namespace, isvc.metadata.name,
             generative.ttft_summary, generative.tpot_summary, cond.status, cond.reason)  # fmt: skip
    if (old is None or (old.status, old.reason) != (cond.status, cond.reason)) and cond.status != "Unknown":
        kind = "Normal" if cond.status == "True" else "Warning"
        await cluster.emit_event(isvc.metadata, kind, cond.reason or SLO_MET, f"SLOMet={cond.status}: {cond.message}")


async def _apply(cluster: GenCluster, isvc: InferenceService, decision: GenDecision, now: datetime) -> bool:
    """Put the decision in force: its replicas through the annotation reconcile scales the Deployment by, its lever
    change through a reload (`_levers`); the annotations in one patch. True when the config in force moved (then the
    caller reconciles: ConfigMap, Deployment, status)."""
    applied = config_in_force(isvc)
    meta = isvc.metadata
    new = applied
    if decision.replicas != applied.replicas:
        reason = f"generative tuner: {decision.describe()}"
        new = new.model_copy(update={"replicas": decision.replicas, "changed_at": now, "reason": reason})
        await cluster.emit_event(meta, "Normal", decision.reason_code or "TunerChange", reason)
        log.info("%s/%s generative tuner: replicas %d -> %d: %s", meta.namespace, meta.name, applied.replicas,
                 decision.replicas, decision.describe())  # fmt: skip
    new, annotations = await _levers(cluster, isvc, decision, new, now)
    if new != applied:
        annotations |= in_force_annotation(new)
    if annotations:
        await cluster.patch_annotations(meta, annotations)
    return new != applied or ROLLOUT_ANNOTATION in annotations


# How long one pod's reload may take before it counts as failed: Triton loads the engine again and the backend
# allocates the KV cache (design value, as the batching tuner's reload: `triton.control.apply_config`'s 300 s).
LLM_RELOAD_TIMEOUT_SECONDS = 300.0
# How often a reloaded pod's readiness is polled (design value: short beside a reload's seconds).
READY_POLL_SECONDS = 0.1


# Reason code of a lever change applied by rolling the pods (the batching tuner's name for the same fallback).
HOT_RELOAD_NO_ROOM = "HotReloadNoRoom"


def no_room_to_reload(isvc: InferenceService, now: datetime) -> bool:
    """Whether some pod's GPU has no room for a second copy of the engine (`rollout.reload_fits` on Triton's GPU memory
    gauges over the window, the engine's size from the build): Triton loads the new copy before it unloads the old
    one, and TensorRT-LLM's KV cache has taken its share of the memory the engine left. Unknown (no GPU gauges, as on
    the emulated engine, or Prometheus unreadable) is not "no room": the canary's reload then says. Blocking."""
    spec = isvc.spec
    client = prom.HttpPromClient(spec.metrics.prometheus_url, spec.metrics.timeout_seconds)
    target = prom.Target(namespace=isvc.metadata.namespace, name=isvc.metadata.name, model=isvc.model_name)
    try:
        windows = prom.read_pod_windows(client.query, target, spec.slo.percentile, float(spec.slo.window_seconds), now)
    except prom.PrometheusUnavailable:
        return False
    engine_bytes = isvc.status.engine.engine_bytes
    return any(reload_fits(engine_bytes, w.gpu_used_bytes, w.gpu_total_bytes) is False for w in windows.values())


def llm_rollout(isvc: InferenceService) -> RolloutState | None:
    """The lever rollout in flight on a generative service (hot mode), or None."""
    if isvc.spec.tuning.mode != "hot":
        return None
    record = RolloutState.from_annotations(isvc.metadata.annotations)
    return record if record is not None and record.llm_target is not None else None


def _budget(reloads: tuple[datetime, ...], now: datetime) -> tuple[datetime, ...]:
    """The reloads the budget still counts at `now` (its hour), with this one."""
    return (*(t for t in reloads if (now - t).total_seconds() < RELOAD_BUDGET_SECONDS), now)


async def _levers(
    cluster: GenCluster, isvc: InferenceService, decision: GenDecision, new: InForce, now: datetime
) -> tuple[InForce, dict[str, str]]:
    """The lever change of `decision` (or the rollout in flight): the config in force `new` after it, and the rollout
    annotation to write. Rolling mode puts the settings in force at once (reconcile rolls the pods); hot mode starts or
    advances a canary and puts them in force when it is promoted. A rollout in flight is finished before another
    lever change starts (the replicas still follow the law: pods started meanwhile are reloaded when promoted)."""
    meta = isvc.metadata
    current = llm_in_force(isvc)
    wanted = serving_with(decision.levers, current)
    rollout = llm_rollout(isvc)
    if rollout is None and wanted == current:
        return new, {}
    if rollout is None:
        why = f"generative tuner: {decision.describe()}"
        reloads = _budget(new.llm_reloads, now)
        if isvc.spec.tuning.mode != "hot":
            message = f"{describe_llm(current)} -> {describe_llm(wanted)}: {why}"
            await cluster.emit_event(meta, "Normal", decision.reason_code or LEVERS_CHANGED, message)
            update = {"llm": wanted, "llm_reason": message, "llm_reloads": reloads, "changed_at": now}
            return new.model_copy(update=update), {}
        if new.rolled or await asyncio.to_thread(no_room_to_reload, isvc, now):
            # A second copy of the engine does not fit beside the first (its KV cache took its share of what the
            # engine left): the pods roll instead, one at a time behind readiness, each starting on the new settings.
            message = f"no GPU memory for a second copy of the engine; rolling the pods one at a time: {why}"
            await cluster.emit_event(meta, "Normal", HOT_RELOAD_NO_ROOM, message)
            update = {"llm": wanted, "llm_reason": message, "llm_reloads": reloads, "changed_at": now, "rolled": True}
            return new.model_copy(update=update), {}
        ips = await cluster.ready_pod_ips(isvc)
        rollout = start_rollout(new.batching, new.batching, ips, now, None, why, llm=(wanted, current))
        if rollout is None:
            await cluster.emit_event(meta, "Warning", "NoReadyPod", f"no ready pod to reload: {why}")
            return new, {}
        # The reload is spent now (the budget counts it whatever the verdict); the cooldown starts with it.
        new = new.model_copy(update={"llm_reloads": reloads, "changed_at": now})
        message = f"canary {rollout.canary}: {describe_llm(wanted)} (from {describe_llm(current)}): {why}"
        await cluster.emit_event(meta, "Normal", CANARY_STARTED, message)
    step = await _advance(cluster, isvc, rollout, new, now)
    record = step.state.to_annotation()[ROLLOUT_ANNOTATION] if step.state is not None else ""
    # The record is written when it moved (a canary waiting its window writes nothing), and cleared when it ended.
    moved = step.state is None or record != meta.annotations.get(ROLLOUT_ANNOTATION, "")
    annotations = {ROLLOUT_ANNOTATION: record} if moved else {}
    assert rollout.llm_target is not None
    if step.code == CANARY_WAITING and step.unjudged:
        told = f"{rollout.canary} {rollout.started.isoformat()}"
        if _told_waiting.get(meta.uid) != told:
            _told_waiting[meta.uid] = told
            await cluster.emit_event(meta, "Normal", CANARY_WAITING, step.message)
    if step.outcome == "promoted":
        reason = f"{rollout.reason}; {step.message}"
        await cluster.emit_event(meta, "Normal", CANARY_PROMOTED, step.message)
        new = new.model_copy(update={"llm": rollout.llm_target, "llm_reason": reason, "changed_at": now})
    elif step.outcome == "rejected":
        message = step.message
        state = _memory.get(meta.uid, GenState())
        if not step.unjudged and state.load is not None:
            # Judged bad (its figures, a refused reload, a readiness drop): not proposed again at this demand.
            _memory[meta.uid] = remember_rejected(state, levers_of(rollout.llm_target), now.timestamp())
            message += (
                f"; not proposed again at {state.load.rate:.2f} req/s of {state.load.prompt_mean:.0f}-token prompts "
                f"for {REJECTION_MEMORY_SECONDS / 60:.0f} min"
            )
        await cluster.emit_event(meta, "Warning", CANARY_REJECTED, message)
        reason = f"{describe_llm(current)} stays: {message}"
        new = new.model_copy(update={"llm_reason": reason, "changed_at": now})
    return new, annotations


async def _advance(
    cluster: GenCluster, isvc: InferenceService, rollout: RolloutState, new: InForce, now: datetime
) -> RolloutStep:
    """Run the rollout to its next resting point: reloads with the tensorrt_llm config, each pod observed through
    Triton (readiness, the live settings) and Prometheus (its own TTFT/TPOT over the canary's window); the record is
    kept on the object before each reload."""
    ips = await cluster.ready_pod_ips(isvc)
    policy = canary_policy(isvc)
    window = policy.window_seconds
    loop = asyncio.get_running_loop()
    model = isvc.model_name
    kept = in_force_annotation(new) if new != config_in_force(isvc) else {}

    def keep(record: RolloutState) -> None:  # the record (and the reload spent) go on the object before its reloads
        patch = cluster.patch_annotations(isvc.metadata, {**kept, **record.to_annotation()})
        asyncio.run_coroutine_threadsafe(patch, loop).result()

    def reload(ip: str, _: Any) -> str:  # only a generative rollout runs here; its reloads go through reload_llm
        return "not a tensorrt_llm reload"

    def reload_llm(ip: str, llm: LlmServing) -> str:
        return reload_llm_pod(isvc, ip, llm)

    def observe() -> dict[str, PodObservation]:  # each pod's own window, read as the pods are observed
        return observe_llm_pods(ips, model, read_pod_tokens(isvc, window, datetime.now(UTC)))

    return await asyncio.to_thread(advance_rollout, rollout, observe, reload, policy, now, keep, None, reload_llm)


def canary_policy(isvc: InferenceService) -> RolloutPolicy:
    """How a generative canary is judged: its own TTFT and TPOT at the spec's percentiles against the spec's targets,
    over the spec's window (the histograms' quantile is exact over any window: no 60 s summary to wait for), on at
    least the law's MIN_REQUESTS requests. Pure."""
    ttft, tpot = isvc.spec.slo.ttft, isvc.spec.slo.tpot
    assert ttft is not None and tpot is not None  # the API refuses a generative spec without them
    return RolloutPolicy(
        slo_ms=ttft.target_ms,
        window_seconds=float(isvc.spec.slo.window_seconds),
        min_samples=MIN_REQUESTS,
        tpot_slo_ms=tpot.target_ms,
        percentile=ttft.percentile,
        tpot_percentile=tpot.percentile,
    )


def read_pod_tokens(isvc: InferenceService, window_seconds: float, now: datetime) -> dict[str, prom.PodTokenWindow]:
    """Each pod's own TTFT/TPOT over the window ending `now`, keyed by pod IP; empty when Prometheus cannot answer
    (the canary then waits for a read, and is rolled back unjudged after two windows). Blocking."""
    spec = isvc.spec
    ttft, tpot = spec.slo.ttft, spec.slo.tpot
    assert ttft is not None and tpot is not None
    client = prom.HttpPromClient(spec.metrics.prometheus_url, spec.metrics.timeout_seconds)
    target = prom.Target(namespace=isvc.metadata.namespace, name=isvc.metadata.name, model=isvc.model_name)
    try:
        return prom.read_pod_generative(client.query, target, ttft.percentile, tpot.percentile, window_seconds, now)
    except prom.PrometheusUnavailable as exc:
        log.warning("%s/%s per-pod TTFT/TPOT unread: %s", isvc.metadata.namespace, isvc.metadata.name, exc)
        return {}


def live_llm(url: str, model: str) -> LlmServing | None:
    """The tensorrt_llm settings a pod's Triton serves `model` with now; None when it cannot tell. Blocking."""
    try:
        return llm_serving_from_config(get_model_config_json(url, model))
    except Exception:  # unreadable: unknown, the rollout neither counts the pod done nor rolls it back
        return None


def observe_llm_pods(
    ready_ips: tuple[str, ...], model: str, tokens: Mapping[str, prom.PodTokenWindow] | None = None
) -> dict[str, PodObservation]:
    """Per ready pod: the model's readiness and its live tensorrt_llm settings, from Triton, and its own TTFT/TPOT
    window (`tokens`, by pod IP; a pod without one has no figure). Reads only."""
    pods: dict[str, PodObservation] = {}
    for ip in ready_ips:
        url = f"{ip}:{GRPC_PORT}"
        ready = is_model_ready(url, model)
        live = live_llm(url, model) if ready else None
        window = (tokens or {}).get(ip, prom.PodTokenWindow())
        pods[ip] = pod_observation(ready, None, None, 0.0, llm=live, tokens=window)
    return pods


def reload_llm_pod(isvc: InferenceService, ip: str, llm: LlmServing, clock: Callable[[], float] | None = None) -> str:
    """Reload one pod's model with the tensorrt_llm config of `llm` (Triton swaps when the new copy is ready), wait
    for it to be ready and read the settings back; "" or why it failed (Triton keeps the old model on a refusal).
    Blocking."""
    tick = clock or time.monotonic
    url, model = f"{ip}:{GRPC_PORT}", isvc.model_name
    outcome = "failed"
    try:
        config = model_config_json(isvc, isvc.spec.serving.batching, None, llm)
        start = tick()
        load_model(url, model, config, LLM_RELOAD_TIMEOUT_SECONDS)
        while not is_model_ready(url, model):
            if tick() - start > LLM_RELOAD_TIMEOUT_SECONDS:
                return f"{model!r} on {ip} loaded but not ready after {LLM_RELOAD_TIMEOUT_SECONDS:.0f} s"
            time.sleep(READY_POLL_SECONDS)
        live = live_llm(url, model)
        if live != llm:
            shown = "unreadable" if live is None else describe_llm(live)
            return f"{model!r} on {ip} serves {shown} after the reload, not {describe_llm(llm)}"
        outcome = "ok"
        return ""
    except (ApplyError, ConfigError, OSError) as exc:
        return str(exc)
    except Exception as exc:  # tritonclient raises its own exception types for transport errors
        return f"{type(exc).__name__}: {exc}"
    finally:
        metrics.CONFIG_RELOADS.labels(isvc.metadata.namespace, isvc.metadata.name, "hot", outcome).inc()


# ----------------------------------------------------------------------------------------------------- explain


def explain_generative(isvc: InferenceService, now: datetime, *, as_json: bool = False) -> tuple[int, str]:
    """`tailtune explain` of a generative service: TTFT and TPOT against their targets over the window, the engine's
    load, the verdict, the replicas in force and what the tuner would decide on this window (from a fresh tuner
    state: the operator's run counts live in its process). (exit code, text): 3 when Prometheus is unreachable.
    Blocking (reads Prometheus)."""
    try:
        sig: prom.GenerativeSignal | None = read_window(isvc, now)
        problem = None
    except prom.PrometheusUnavailable as exc:
        sig, problem = None, str(exc)
    cond = slo_condition(isvc, sig, problem)
    applied = config_in_force(isvc)
    serving, rollout = serving_status(isvc), llm_rollout(isvc)
    decision = None
    if sig is not None:
        obs = observation(sig, ready_replicas(isvc, sig))
        try:
            decision = decide_generative(
                GenState(), gen_in_force(isvc), obs, GenPolicy.from_spec(isvc.spec), now.timestamp()
            )
        except GenPolicyError as exc:
            problem = str(exc)
    gen = generative_status(isvc, sig) if sig is not None else None
    code = 3 if sig is None else 0
    if as_json:
        doc: dict[str, Any] = {
            "namespace": isvc.metadata.namespace, "name": isvc.metadata.name, "model": isvc.model_name,
            "kind": "generative", "slo": isvc.spec.slo.model_dump(by_alias=True, mode="json", exclude_none=True),
            "generative": gen.model_dump(by_alias=True, mode="json", exclude_none=True) if gen else None,
            "sloMet": cond.model_dump(by_alias=True, mode="json", exclude_none=True),
            "replicasInForce": applied.replicas,
            "servingInForce": serving["serving"].model_dump(by_alias=True, mode="json"),
            "servingReason": serving["serving_reason"],
            "rollout": None if rollout is None else {"canary": rollout.canary, "stage": rollout.stage,
                                                     "target": describe(rollout)},
            "next": None if decision is None else {"reasonCode": decision.reason_code, "message": decision.message,
                                                   "replicas": decision.replicas, "boundBy": decision.bound_by},
        }  # fmt: skip
        if problem:
            doc["problem"] = problem
        return code, json.dumps(doc, indent=2)
    ttft, tpot = isvc.spec.slo.ttft, isvc.spec.slo.tpot
    assert ttft is not None and tpot is not None
    out = [
        f"InferenceService {isvc.metadata.namespace}/{isvc.metadata.name} (model {isvc.model_name}, generative)",
        "",
        f"targets    P{ttft.percentile:g} TTFT <= {ttft.target_ms:g} ms, P{tpot.percentile:g} TPOT <= "
        f"{tpot.target_ms:g} ms over {isvc.spec.slo.window_seconds} s",
    ]
    if gen is None or sig is None:
        out.append(f"TTFT/TPOT  not read: {problem}")
    else:
        out.append(f"TTFT       {gen.ttft_summary} ms")
        out.append(f"TPOT       {gen.tpot_summary} ms")
        rate = "-" if sig.request_rate is None else f"{sig.request_rate:.2f}"
        out.append(f"load       {rate} req/s, {gen.tokens_per_second} tokens/s, running {gen.running_sequences}, "
                   f"waiting {gen.waiting_sequences}, KV {gen.kv_cache_used_percent} % (fullest pod)")  # fmt: skip
    out.append(f"SLOMet     {cond.status} ({cond.reason}): {cond.message}")
    out.append(f"in force   {applied.replicas} replicas" + (f" ({applied.reason})" if applied.reason else ""))
    out.append(f"serving    {describe_llm(serving['serving'])} ({serving['serving_reason']})")
    if rollout is not None:
        out.append(f"rollout    canary {rollout.canary} ({rollout.stage}): {describe(rollout)}")
    if decision is not None:
        out.append(f"next       {decision.describe()} -> {decision.replicas} replicas")
    elif problem and sig is not None:
        out.append(f"next       the tuner holds: {problem}")
    return code, "\n".join(out)
