"""Safe rollout of a batching change, or of a generative model's tensorrt_llm load-time settings: one pod first
(the canary), judged against the SLO, then promoted to the rest a bounded number of pods at a time, or rolled back.

`decide_rollout(state, pods, policy, now) -> RolloutStep` is pure: it reads the rollout record kept on the
object (`tailtune.io/rollout`) and what each pod shows now (readiness, the batching Triton reports live, its
own P99 and error rate over the last window) and says which pods to reload with which config next. It is
driven by what the pods show, not by the record alone: after an operator restart the live configs say how
far the rollout got. `advance_rollout` runs it to a resting point with the reload and the observation
passed in, so the operator and the real-Triton tests drive the same steps.

Timeline: the canary is reloaded; one window later (the canary's own P99 then covers only the new config)
it is judged: P99 over the SLO, worse than the other pods by the margin, more errors, a failed reload or a
readiness drop each reject it (rolled back on that pod); otherwise the rest are reloaded, `max_unavailable`
at a time, each batch waited for. A canary that cannot be judged within two windows is rolled back, so
pods never stay split between configs for longer than that, restart or not. A restart between the canary's
reload and the record's update counts the window from the record's start (kept just before that reload).

A generative rollout (tensorrt_llm settings) is judged the same way on the canary's own TTFT and TPOT over its window
(`judge_llm_canary`, each pod's read `tuner.prom.read_pod_generative`): over a target, or worse than the other pods
past the noise their sample sizes allow (`quantile_relative_error`, `CANARY_NOISE_Z`), rejects it; too few requests
in its window waits, and rolls back after two windows saying so (`unjudged`: its settings are not known bad).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from tailtune.api.keys import ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import Batching, LlmServing
from tailtune.triton.config import batching_equivalent
from tailtune.tuner.prom import PodTokenWindow, PodWindow
from tailtune.tuner.types import judged_window_seconds

# Reason codes (Events, the tuner's last decision).
CANARY_STARTED = "CanaryStarted"
CANARY_WAITING = "CanaryWaiting"
CANARY_PROMOTED = "CanaryPromoted"
CANARY_REJECTED = "CanaryRejected"
ROLLING_BACK = "RollingBack"
PROMOTING = "Promoting"

Stage = Literal["canary", "promoting", "rolling-back"]


class RolloutState(BaseModel):
    """The rollout in flight, kept on the object so a restarted or new operator resumes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: Batching
    previous: Batching
    canary: str  # the canary pod's IP
    stage: Stage = "canary"
    # When the canary took the target (None: its reload is still to be done); the window counts from here.
    since: datetime | None = None
    started: datetime
    demand_rps: float | None = None
    reason: str = ""  # the law's reason for the change
    verdict: str = ""  # why the canary was rejected (rolling back) or promoted
    # A generative service's rollout: the tensorrt_llm load-time settings tried and those before (its batching
    # stays as it is; a pod runs the target when its live settings equal `llm_target`).
    llm_target: LlmServing | None = None
    llm_previous: LlmServing | None = None
    # Rolled back for want of a reading (too few requests, no read within two windows), not on one: the settings
    # tried are not known bad (a generative tuner does not remember them as rejected).
    unjudged: bool = False

    def reloads_to(self, stage: Stage) -> tuple[Batching, LlmServing | None]:
        """The config a pod is reloaded with at `stage`: the previous one when rolling back, else the target."""
        if stage == "rolling-back":
            return self.previous, self.llm_previous
        return self.target, self.llm_target

    def to_annotation(self) -> dict[str, str]:
        """The annotation patch that keeps this rollout (a batching rollout's as before: no generative fields)."""
        doc = self.model_dump(mode="json")
        for key in ("llm_target", "llm_previous"):
            if doc[key] is None:
                doc.pop(key)
        if not doc["unjudged"]:
            doc.pop("unjudged")
        return {ROLLOUT_ANNOTATION: json.dumps(doc, sort_keys=True)}

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> RolloutState | None:
        """The rollout in flight, or None (none, or a value that does not parse: nothing to resume)."""
        raw = annotations.get(ROLLOUT_ANNOTATION)
        if not raw:
            return None
        try:
            return cls.model_validate(json.loads(raw))
        except (ValueError, ValidationError, TypeError):
            return None


@dataclass(frozen=True)
class PodObservation:
    """One pod now: readiness, the batching Triton reports (None: unknown), its own window of latency (a generative
    model's: `p_ms` and `samples` are its TTFT's, `tpot_ms` and `tpot_samples` its TPOT's)."""

    ready: bool
    batching: Batching | None = None
    p_ms: float | None = None
    error_rate: float | None = None  # failed / all requests over the window
    samples: int | None = None
    reload_error: str = ""  # set by the driver when the reload it was told to do failed
    llm: LlmServing | None = None  # the tensorrt_llm settings Triton reports live (a generative model; None: unknown)
    tpot_ms: float | None = None
    tpot_samples: int | None = None


class PodReader(Protocol):
    """Each Triton pod's own window, keyed by pod IP (`tailtune.tuner.prom.read_pod_windows`)."""

    def read(self, at: datetime) -> Mapping[str, PodWindow]: ...


def pod_observation(
    ready: bool,
    live: Batching | None,
    window: PodWindow | None,
    window_seconds: float,
    llm: LlmServing | None = None,
    tokens: PodTokenWindow | None = None,
) -> PodObservation:
    """One pod's observation from Triton's word (readiness, live batching or tensorrt_llm settings) and its
    Prometheus window (a generative model's: `tokens`, its own TTFT/TPOT; a quantile above every bucket is +inf)."""
    if tokens is not None:
        ttft = math.inf if tokens.above_range_ttft else tokens.ttft_ms
        tpot = math.inf if tokens.above_range_tpot else tokens.tpot_ms
        return PodObservation(
            ready, live, ttft, None, _count(tokens.ttft_requests), llm=llm, tpot_ms=tpot,
            tpot_samples=_count(tokens.tpot_requests),
        )  # fmt: skip
    w = window or PodWindow()
    samples = None if w.success_rps is None else round(w.success_rps * window_seconds)
    return PodObservation(ready, live, w.p_ms, w.error_rate, samples, llm=llm)


def _count(requests: float | None) -> int | None:
    return None if requests is None else round(requests)


def runs_target(state: RolloutState, pod: PodObservation) -> bool:
    """The pod runs the rollout's target: its live tensorrt_llm settings for a generative rollout, else its batching."""
    if state.llm_target is not None:
        return pod.llm is not None and pod.llm == state.llm_target
    return pod.batching is not None and batching_equivalent(pod.batching, state.target)


def config_known(state: RolloutState, pod: PodObservation) -> bool:
    """Triton told the pod's live config (of the kind this rollout changes)."""
    return (pod.llm if state.llm_target is not None else pod.batching) is not None


@dataclass(frozen=True)
class RolloutPolicy:
    """How a canary is judged and how fast the rest follow."""

    slo_ms: float
    window_seconds: float
    # The canary may be this much slower than the slowest other pod before it is worse: a share, plus an absolute
    # floor at the SLO's scale (None: 5 % of the SLO, at least 2 ms). Pods on one config differ by noise: three
    # demo pods read 15.2, 15.9 and 19.4 ms P99 in one window (300 ms SLO), 1.7 ms short of a 20 % + 2 ms bound.
    margin_share: float = 0.2
    margin_ms: float | None = None
    # Error share the canary may add over the other pods.
    error_margin: float = 0.01
    min_samples: int = 20
    # Pods reloaded at a time once the canary is promoted (the PodDisruptionBudget-like bound).
    max_unavailable: int = 1
    # False when no per-pod latency can be read: the canary is then judged on its reload and readiness.
    latency_required: bool = True
    # A generative rollout: `slo_ms` is the TTFT target at `percentile`, this the TPOT target at `tpot_percentile`;
    # the canary is then judged by `judge_llm_canary` (None: a batching rollout, `judge_canary`).
    tpot_slo_ms: float | None = None
    percentile: float = 99.0
    tpot_percentile: float = 99.0

    @property
    def margin_floor_ms(self) -> float:
        """The absolute part of the margin over the other pods, milliseconds."""
        return self.margin_ms if self.margin_ms is not None else max(2.0, 0.05 * self.slo_ms)


@dataclass(frozen=True)
class RolloutStep:
    """What to do next: reloads (pod IP, batching), the record to keep (None: the rollout ended), and the
    outcome when it ended (`promoted` / `rejected`), with a reason code and message for an Event."""

    reloads: tuple[tuple[str, Batching], ...]
    state: RolloutState | None
    code: str
    message: str
    outcome: Literal["", "promoted", "rejected"] = ""
    # The canary's window ended without a reading to judge it on (waiting for one, or rolled back for want of it).
    unjudged: bool = False


def start_rollout(
    target: Batching,
    previous: Batching,
    ready_pods: tuple[str, ...],
    now: datetime,
    demand_rps: float | None,
    reason: str,
    llm: tuple[LlmServing, LlmServing] | None = None,
) -> RolloutState | None:
    """A new rollout with the first ready pod (by IP) as the canary; None without a ready pod. `llm`: the
    (target, previous) tensorrt_llm settings of a generative rollout."""
    if not ready_pods:
        return None
    return RolloutState(
        target=target,
        previous=previous,
        canary=sorted(ready_pods)[0],
        started=now,
        demand_rps=demand_rps,
        reason=reason,
        llm_target=llm[0] if llm else None,
        llm_previous=llm[1] if llm else None,
    )


def decide_rollout(
    state: RolloutState, pods: Mapping[str, PodObservation], policy: RolloutPolicy, now: datetime
) -> RolloutStep:
    """The next step of a rollout from what the pods show now. Pure. See the module docstring."""
    if state.stage == "rolling-back":
        return _roll_back(state, pods, state.verdict)
    canary = pods.get(state.canary)
    if state.stage == "promoting":
        return _promote(state, pods, policy)
    if canary is not None and canary.reload_error:
        return _roll_back(state, pods, f"the canary {state.canary} refused the reload: {canary.reload_error}")
    if canary is None or not canary.ready:
        return _roll_back(state, pods, f"the canary {state.canary} is no longer ready")
    on_target = runs_target(state, canary)
    if state.since is None:
        if on_target:
            # Reloaded, then a restart lost the record's update. The record was kept just before that reload, so
            # the canary has run the target since about `started`: its window counts from there, and a restart
            # does not add a window of its own to the time the pods stay split.
            resumed = state.model_copy(update={"since": min(state.started, now)})
            return decide_rollout(resumed, pods, policy, now)
        return RolloutStep(
            ((state.canary, state.target),), state, CANARY_STARTED, f"reloading the canary {state.canary}"
        )
    if config_known(state, canary) and not on_target:
        return _roll_back(state, pods, f"the canary {state.canary} no longer runs the target (restarted?)")
    waited = (now - state.since).total_seconds()
    if waited < policy.window_seconds:
        left = policy.window_seconds - waited
        return RolloutStep((), state, CANARY_WAITING, f"canary {state.canary}: {left:.0f} s of its window left")
    if state.llm_target is not None and policy.tpot_slo_ms is not None:
        bad, why = judge_llm_canary(state, pods, policy)
        if bad is None:
            if waited >= 2 * policy.window_seconds:
                unjudged = state.model_copy(update={"unjudged": True})
                return _roll_back(unjudged, pods, f"canary {state.canary} not judged within two windows: {why}")
            message = f"canary {state.canary}: {why}; waiting (rolled back if still so two windows after its reload)"
            return RolloutStep((), state, CANARY_WAITING, message, unjudged=True)
    else:
        verdict = judge_canary(state, pods, policy)
        if verdict is None:
            if waited >= 2 * policy.window_seconds:
                return _roll_back(state, pods, f"no latency of the canary {state.canary} within two windows")
            return RolloutStep((), state, CANARY_WAITING, f"canary {state.canary}: waiting for its latency")
        bad, why = verdict
    if bad:
        return _roll_back(state, pods, why)
    return _promote(state.model_copy(update={"stage": "promoting", "verdict": why}), pods, policy)


def judge_canary(
    state: RolloutState, pods: Mapping[str, PodObservation], policy: RolloutPolicy
) -> tuple[bool, str] | None:
    """(worse, why) for the canary after its window, or None while its latency is not known."""
    canary = pods[state.canary]
    if not policy.latency_required and canary.p_ms is None:
        return False, f"canary {state.canary} reloaded and stayed ready (no per-pod latency to judge)"
    if canary.p_ms is None or (canary.samples is not None and canary.samples < policy.min_samples):
        return None
    others = [p for ip, p in pods.items() if ip != state.canary and p.ready and p.p_ms is not None]
    c_err = canary.error_rate or 0.0
    o_err = max((p.error_rate or 0.0 for p in others), default=0.0)
    if canary.p_ms > policy.slo_ms:
        return True, f"canary {state.canary} P99 {canary.p_ms:.1f} ms over the SLO {policy.slo_ms:g} ms"
    if others:
        worst = max(p.p_ms for p in others if p.p_ms is not None)
        bound = worst * (1 + policy.margin_share) + policy.margin_floor_ms
        if canary.p_ms > bound:
            return True, (
                f"canary {state.canary} P99 {canary.p_ms:.1f} ms worse than the other pods' {worst:.1f} ms "
                f"(bound {bound:.1f} ms)"
            )
    if c_err > o_err + policy.error_margin:
        return True, f"canary {state.canary} error rate {c_err:.2%} against {o_err:.2%} on the other pods"
    return False, f"canary {state.canary} P99 {canary.p_ms:.1f} ms within the SLO and the other pods"


# How far past the other pods' figure the canary's may read before it is worse, in standard errors of the difference
# of two sample percentiles: one-sided 95 % (the normal's 1.645), so a canary no worse than the rest is rejected for
# the noise of its window once in twenty judged windows at most.
CANARY_NOISE_Z = 1.645


def quantile_relative_error(percentile: float, samples: int) -> float:
    """Relative standard error of a sample percentile of `samples` requests, under an exponential tail (the law's
    model of a wait, `tuner.generative.predict`). A sample p-quantile's standard error is sqrt(p (1 - p) / n) / f(x_p)
    (asymptotic order statistics); an exponential of rate l has f(x_p) = l (1 - p) and x_p = ln(1 / (1 - p)) / l, so
    relative to x_p it is sqrt(p / (n (1 - p))) / ln(1 / (1 - p)): at P99, 0.48 on 20 requests, 0.22 on 100, 0.07 on
    1000. Pure."""
    p = min(percentile / 100, 1 - 1e-9)
    return math.sqrt(p / (max(1, samples) * (1 - p))) / math.log(1 / (1 - p))


def noise_margin(percentile: float, canary_samples: int, other_samples: int) -> float:
    """The share by which two pods' percentiles over their windows may differ by noise alone: CANARY_NOISE_Z standard
    errors of their difference (the two windows' errors add in quadrature). Pure."""
    a, b = quantile_relative_error(percentile, canary_samples), quantile_relative_error(percentile, other_samples)
    return CANARY_NOISE_Z * math.sqrt(a * a + b * b)


def judge_llm_canary(
    state: RolloutState, pods: Mapping[str, PodObservation], policy: RolloutPolicy
) -> tuple[bool | None, str]:
    """(worse, why) for a generative canary after its window, on its own TTFT and TPOT percentiles; worse None (with
    why) while its window holds too few requests to judge (fewer than `policy.min_samples` behind either figure).

    Worse where a figure is over its target, unless every other pod (on the settings in force) is over it too and the
    canary's is below each of theirs past the noise (the change helps: rejecting it keeps what is worse); or where a
    figure is above every other pod's past the noise their sample sizes allow (`noise_margin`). Other pods with too
    few requests are not compared. Pure."""
    assert policy.tpot_slo_ms is not None
    canary = pods[state.canary]
    figures: tuple[tuple[str, float, float, Callable[[PodObservation], tuple[float | None, int | None]]], ...] = (
        ("TTFT", policy.percentile, policy.slo_ms, _ttft),
        ("TPOT", policy.tpot_percentile, policy.tpot_slo_ms, _tpot),
    )
    for name, _, _, get in figures:
        ms, n = get(canary)
        if ms is None or n is None:
            return None, f"no {name} read for the canary's window"
        if n < policy.min_samples:
            return None, f"{n} requests with a {name} in the canary's window, {policy.min_samples} needed to judge it"
    shown: list[str] = []
    for name, pct, target, get in figures:
        ms, n = get(canary)
        assert ms is not None and n is not None
        figure = f"{name} P{pct:g} {ms:.1f} ms"
        others = [
            (ip, o_ms, noise_margin(pct, n, o_n))
            for ip, p in sorted(pods.items())
            if ip != state.canary and p.ready
            for o_ms, o_n in (get(p),)
            if o_ms is not None and o_n is not None and o_n >= policy.min_samples
        ]
        if ms > target:
            helps = bool(others) and all(ms * (1 + m) < o_ms for _, o_ms, m in others)
            if not helps:
                return True, f"canary {state.canary} {figure} over the target {target:g} ms ({n} requests)"
            best = min(o_ms for _, o_ms, _ in others)
            shown.append(f"{figure} over the target {target:g} ms but below every other pod's (best {best:.1f} ms)")
            continue
        if others:
            ip, o_ms, m = max(others, key=lambda o: o[1] * (1 + o[2]))
            bound = o_ms * (1 + m)
            if ms > bound:
                return True, (
                    f"canary {state.canary} {figure} worse than the other pods' (pod {ip} {o_ms:.1f} ms) past the "
                    f"noise of its {n} requests (bound {bound:.1f} ms)"
                )
        shown.append(f"{figure} <= {target:g} ms")
    return False, f"canary {state.canary} on its own window: {', '.join(shown)}"


def _ttft(p: PodObservation) -> tuple[float | None, int | None]:
    return p.p_ms, p.samples


def _tpot(p: PodObservation) -> tuple[float | None, int | None]:
    return p.tpot_ms, p.tpot_samples


def _promote(state: RolloutState, pods: Mapping[str, PodObservation], policy: RolloutPolicy) -> RolloutStep:
    failed = {ip: p.reload_error for ip, p in pods.items() if p.reload_error}
    if failed:
        ip, err = sorted(failed.items())[0]
        return _roll_back(state, pods, f"pod {ip} refused the reload while promoting: {err}")
    todo = sorted(ip for ip, p in pods.items() if p.ready and not runs_target(state, p))
    if not todo:
        return RolloutStep((), None, CANARY_PROMOTED, f"{describe(state)} promoted: {state.verdict}", "promoted")
    batch = todo[: max(1, policy.max_unavailable)]
    return RolloutStep(tuple((ip, state.target) for ip in batch), state, PROMOTING, f"promoting to {', '.join(batch)}")


def _roll_back(state: RolloutState, pods: Mapping[str, PodObservation], why: str) -> RolloutStep:
    back = state.model_copy(update={"stage": "rolling-back", "verdict": why})
    todo = sorted(ip for ip, p in pods.items() if p.ready and runs_target(state, p) and not p.reload_error)
    if not todo:
        message = f"{describe(state)} rejected: {why}"
        return RolloutStep((), None, CANARY_REJECTED, message, "rejected", unjudged=state.unjudged)
    message = f"rolling back: {why}"
    return RolloutStep(tuple((ip, state.previous) for ip in todo), back, ROLLING_BACK, message, unjudged=state.unjudged)


def advance_rollout(
    state: RolloutState,
    observe: Callable[[], Mapping[str, PodObservation]],
    reload: Callable[[str, Batching], str],
    policy: RolloutPolicy,
    now: datetime,
    keep: Callable[[RolloutState], None] | None = None,
    clock: Callable[[], datetime] | None = None,
    reload_llm: Callable[[str, LlmServing], str] | None = None,
) -> RolloutStep:
    """Run `decide_rollout` until it waits or ends: each reload (`reload(ip, batching)`, or for a generative
    rollout `reload_llm(ip, settings)`, returns "" or the error) is followed by a fresh `observe()`. `keep` is
    called with each record before its reloads, so a restart resumes from the last one. The canary's window starts
    when its reload ended (`clock()`, else `now`): the reload's own stall is not the config's latency. No I/O of its
    own."""

    def _reload(record: RolloutState, ip: str, batching: Batching) -> str:
        if record.llm_target is None:
            return reload(ip, batching)
        llm = record.reloads_to(record.stage)[1]
        if reload_llm is None or llm is None:  # a caller's mistake, failed as a reload so the rollout ends
            return "a generative rollout without a tensorrt_llm reload or settings"
        return reload_llm(ip, llm)

    step = decide_rollout(state, observe(), policy, now)
    for _ in range(64):  # bounded: every pass reloads a pod or ends
        if not step.reloads or step.state is None:
            return step
        if keep is not None:
            keep(step.state)
        errors = {ip: err for ip, batching in step.reloads if (err := _reload(step.state, ip, batching))}
        pods = dict(observe())
        for ip, err in errors.items():
            if ip in pods:
                pods[ip] = _with_error(pods[ip], err)
        current = step.state
        if current.stage == "canary" and current.since is None and not errors:
            current = current.model_copy(update={"since": clock() if clock is not None else now})
        if current.stage == "rolling-back" and errors:
            # A rollback Triton refuses leaves the old model serving on that pod only if it never took the
            # target; otherwise the pod is restarted by the caller (reconcile rolls it). End the rollout here.
            message = f"{current.verdict}; rollback failed on {sorted(errors)}"
            return RolloutStep((), None, CANARY_REJECTED, message, "rejected", unjudged=current.unjudged)
        step = decide_rollout(current, pods, policy, now)
    return step


def _with_error(p: PodObservation, err: str) -> PodObservation:
    return replace(p, reload_error=err)


def describe(state: RolloutState) -> str:
    """The config a rollout tries, in a few words."""
    if state.llm_target is not None:
        return describe_llm(state.llm_target)
    b = state.target
    return f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us"


def describe_llm(s: LlmServing) -> str:
    """tensorrt_llm load-time settings in a few words."""
    queue = f"queue {s.max_queue_size}" if s.max_queue_size else "queue unbounded"
    chunked = "chunked prefill" if s.enable_chunked_context else "no chunked prefill"
    return f"{s.batch_scheduler_policy}, KV share {s.kv_cache_free_gpu_mem_fraction:g}, {chunked}, {queue}"


def reload_fits(engine_bytes: int | None, used_bytes: float | None, total_bytes: float | None) -> bool | None:
    """Whether the GPU has room for a second copy of the engine during a reload; None when unknown.

    `engine_bytes` is the built engine's size (the build report's `engineBytes`, status.engine.engineBytes):
    the second copy Triton loads before it swaps. Without it, the memory used now (engine, context,
    activations) stands in for it: a reload needs at most that much again.
    """
    if used_bytes is None or total_bytes is None or total_bytes <= 0:
        return None
    need = float(engine_bytes) if engine_bytes else used_bytes
    return total_bytes - used_bytes >= need * 1.1  # 10 % for activations and the allocator


def rollout_window(window_seconds: float) -> timedelta:
    """The canary's window: the SLO window, at least Triton's 60 s latency summary."""
    return timedelta(seconds=judged_window_seconds(window_seconds))
