"""A generative InferenceService (spec.model.kind generative) in the operator: TTFT/TPOT from Prometheus into
`status.generative` and the SLOMet condition, and the generative tuner's replicas applied.

One tick (`generative_tick`, from the tuner daemon in place of the batching tuner's):
- read the window (`tailtune.tuner.prom.read_generative`: TTFT and TPOT at the spec's percentiles by
  `histogram_quantile` over the buckets summed across pods, tokens/s, running and waiting sequences, KV-cache use),
  off the event loop and before the object's lock is taken;
- `status.generative` and SLOMet (TTFT and TPOT against their targets: reason and message), in one status write,
  only when they changed; an Event when SLOMet's status or reason moves;
- the decision of `tailtune.tuner.generative.decide_generative` (pure): its replicas go in force through the same
  annotation the batching tuner writes (reconcile scales the Deployment), with an Event. A lever change (KV
  fraction, queue size, chunked prefill, scheduler policy) is a model reload; it is reported, not applied, here.

Reconcile leaves `status.generative` and SLOMet as the tick wrote them (`carry_into`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from tailtune.api.v1alpha1 import Condition, GenerativeStatus, InferenceService, InferenceServiceStatus, TargetStatus
from tailtune.operator.inforce import in_force as config_in_force
from tailtune.operator.inforce import in_force_annotation
from tailtune.operator.status import (
    NO_LATENCY_DATA,
    NO_TRAFFIC,
    PROMETHEUS_UNAVAILABLE,
    SLO_MET,
    SLO_VIOLATED,
    WITHIN_SLO,
    merge_conditions,
)
from tailtune.tuner import prom
from tailtune.tuner.generative import (
    GenDecision,
    GenInForce,
    GenObservation,
    GenPolicy,
    GenPolicyError,
    GenState,
    decide_generative,
    levers_from_spec,
)

log = logging.getLogger(__name__)

AWAITING_FIRST_READ = "no TTFT/TPOT read from Prometheus yet"


class GenCluster(Protocol):
    """What a generative tick needs from the API server (`kube.KubeCluster`)."""

    async def patch_annotations(self, meta: Any, annotations: dict[str, str]) -> None: ...
    async def patch_generative(
        self, meta: Any, generative: GenerativeStatus, conditions: list[Condition] | None
    ) -> None: ...
    async def emit_event(self, meta: Any, type_: str, reason: str, message: str) -> None: ...


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
        kv_cache_used_percent=None if sig.kv_used_fraction is None else round(100 * sig.kv_used_fraction, 1),
    )


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
    return status.model_copy(update={"conditions": conditions, "generative": isvc.status.generative})


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


def decide(isvc: InferenceService, sig: prom.GenerativeSignal, now: datetime) -> GenDecision:
    """The generative tuner's decision on this window, with the state this process keeps for the object."""
    applied = config_in_force(isvc)
    changed_at = applied.changed_at.timestamp() if applied.changed_at else None
    in_force = GenInForce(replicas=applied.replicas, levers=levers_from_spec(isvc.spec), changed_at=changed_at)
    state = _memory.get(isvc.metadata.uid, GenState())
    obs = observation(sig, isvc.status.replicas.ready)
    decision = decide_generative(state, in_force, obs, GenPolicy.from_spec(isvc.spec), now.timestamp())
    _memory[isvc.metadata.uid] = decision.state
    return decision


def forget(uid: str | None) -> None:
    """Drop an object's tuner state (deleted, or no longer this process's)."""
    if uid:
        _memory.pop(uid, None)
        _told.pop(uid, None)


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
    if isvc.status.replicas.ready < 1 or key in state.ticking:
        log.info("%s/%s generative tick skipped: %s", namespace, name,
                 "a tick in flight" if key in state.ticking else "no ready replica in status")  # fmt: skip
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
            await _record(state.cluster, isvc, sig, problem, now)
            if sig is None or not isvc.spec.tuning.enabled:
                return interval
            try:
                decision = await asyncio.to_thread(decide, isvc, sig, now)
            except GenPolicyError as exc:  # a spec the tuner cannot follow: said once, held, never a crash
                if _told.get(isvc.metadata.uid) != str(exc):
                    _told[isvc.metadata.uid] = str(exc)
                    await state.cluster.emit_event(isvc.metadata, "Warning", "GenerativeTunerHolds", str(exc))
                return interval
            if await _apply(state.cluster, isvc, decision, now):
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
    generative = generative_status(isvc, sig) if sig is not None else isvc.status.generative
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
    """Put the decision's replicas in force (the annotation reconcile scales the Deployment by); True when it did."""
    applied = config_in_force(isvc)
    meta = isvc.metadata
    if decision.replicas != applied.replicas:
        reason = f"generative tuner: {decision.describe()}"
        new = applied.model_copy(update={"replicas": decision.replicas, "changed_at": now, "reason": reason})
        await cluster.patch_annotations(meta, in_force_annotation(new))
        await cluster.emit_event(meta, "Normal", decision.reason_code or "TunerChange", reason)
        log.info("%s/%s generative tuner: replicas %d -> %d: %s", meta.namespace, meta.name, applied.replicas,
                 decision.replicas, decision.describe())  # fmt: skip
        return True
    if decision.changed:  # levers only: a reload, not applied in this operator yet
        log.info("%s/%s generative tuner (levers not applied): %s", meta.namespace, meta.name, decision.describe())
    return False


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
    decision = None
    if sig is not None:
        obs = observation(sig, isvc.status.replicas.ready)
        in_force = GenInForce(replicas=applied.replicas, levers=levers_from_spec(isvc.spec))
        try:
            decision = decide_generative(GenState(), in_force, obs, GenPolicy.from_spec(isvc.spec), now.timestamp())
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
    if decision is not None:
        out.append(f"next       {decision.describe()} -> {decision.replicas} replicas")
    elif problem and sig is not None:
        out.append(f"next       the tuner holds: {problem}")
    return code, "\n".join(out)
