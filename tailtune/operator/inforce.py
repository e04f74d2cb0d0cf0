"""What the tuner keeps on the object: the config in force (`tailtune.io/applied`, its one annotation) and the
tuner's memory (`tailtune.io/tuner-state`), each parsed here and nowhere else. Pure.

The model is `tailtune.tuner.types.InForce` (batching, replicas, when and why it last changed, whether a
failed hot reload rolled the pods). The tuner decides from it and returns the next one; reconcile renders
the ConfigMap, scales the Deployment and fills `status.batching` from it. Nothing else keeps these facts.
A recorded config the spec no longer allows is clamped to the new bounds field by field (`clamp_to_spec`).
"""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import ValidationError

from tailtune.api.keys import APPLIED_ANNOTATION, TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import Batching, InferenceService, LlmServing
from tailtune.tuner.control.gates import before_serving
from tailtune.tuner.servicetime import CurvePoint
from tailtune.tuner.types import Decision, InForce, Policy, TunerState, max_batch_cap


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
        shedding=spec.serving.shedding.enabled,
    )


def chosen_before_serving(isvc: InferenceService, curve: tuple[CurvePoint, ...], now: datetime) -> Decision | None:
    """Where the tuner has recorded no config and no pod serves yet: the law's choice of the batching the first pods
    start with (`gates.before_serving`: a start batching the engine build's measured curve shows fragile is left
    before any request meets it), or None where the spec's start stands (tuning off, spec.tuning.keepSpecStart, a
    generative model, a config already recorded, no measured curve)."""
    tuning = isvc.spec.tuning
    if not tuning.enabled or tuning.keep_spec_start or isvc.spec.model.kind == "generative" or not curve:
        return None
    if isvc.metadata.annotations.get(APPLIED_ANNOTATION):
        return None
    decision = before_serving(spec_start(isvc), policy_for(isvc, curve), now)
    return decision if decision.changed else None


def spec_start(isvc: InferenceService) -> InForce:
    """The config before the tuner's first change: the spec's batching and its smallest replica count."""
    spec = isvc.spec
    replicas = min(max(spec.serving.replicas.min, 1), spec.serving.replicas.max)
    return InForce(batching=spec.serving.batching, replicas=replicas)


def recorded(isvc: InferenceService) -> InForce | None:
    """The config in force as the tuner recorded it, before any clamp; None: none, or tuning is off."""
    raw = isvc.metadata.annotations.get(APPLIED_ANNOTATION)
    if not raw or not isvc.spec.tuning.enabled:
        return None
    try:
        return InForce.from_annotation(raw)
    except ValueError:
        return None


def in_force(isvc: InferenceService) -> InForce:
    """The config in force: the tuner's, clamped to the current spec field by field (a spec change never sends it
    back to the spec's start, nor the replicas to their minimum); the spec's start when the tuner has none."""
    kept = recorded(isvc)
    if kept is None:
        return spec_start(isvc)
    clamped, notes = clamp_to_spec(kept, isvc)
    if not notes:
        return kept
    return clamped.model_copy(update={"reason": clamp_message(notes)})


# The tensorrt_llm settings the generative tuner moves (its levers); the rest of spec.serving.llm is the spec's alone.
LLM_LEVER_FIELDS = (
    "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction",
    "enable_chunked_context",
    "max_queue_size",
)


def llm_in_force(isvc: InferenceService) -> LlmServing:
    """A generative model's tensorrt_llm load-time settings in force: spec.serving.llm with the tuner's levers over it
    (its last promoted change, kept on the config in force); the spec's alone when the tuner has none."""
    spec = isvc.spec.llm_serving()
    kept = in_force(isvc).llm
    if kept is None:
        return spec
    return spec.model_copy(update={f: getattr(kept, f) for f in LLM_LEVER_FIELDS})


def clamp_to_spec(config: InForce, isvc: InferenceService) -> tuple[InForce, tuple[str, ...]]:
    """`config` with each field the spec now forbids moved to its nearest bound, and one note per field moved
    (`maxBatchSize 8 -> 4 (tuning.maxBatchSize.max 4)`). Pure."""
    batching, notes = clamp_batching(config.batching, isvc)
    spec = isvc.spec.serving.replicas
    lo, hi = min(max(spec.min, 1), spec.max), spec.max
    replicas = min(max(config.replicas, lo), hi)
    if replicas != config.replicas:
        bound = f"serving.replicas.min {spec.min}" if config.replicas < lo else f"serving.replicas.max {hi}"
        notes += (f"replicas {config.replicas} -> {replicas} ({bound})",)
    return config.model_copy(update={"batching": batching, "replicas": replicas}), notes


def clamp_batching(b: Batching, isvc: InferenceService) -> tuple[Batching, tuple[str, ...]]:
    """`b` within the spec's tuning bounds, field by field, with a note per field moved. Pure."""
    tuning, engine_max = isvc.spec.tuning, isvc.spec.engine.optimization_profile.max
    notes: list[str] = []
    hi = max_batch_cap(tuning, engine_max)
    lo = max(1, min(tuning.max_batch_size.min, hi))
    size = min(max(b.max_batch_size, lo), hi)
    if size != b.max_batch_size:
        if b.max_batch_size < lo:
            bound = f"tuning.maxBatchSize.min {tuning.max_batch_size.min}"
        elif hi < tuning.max_batch_size.max:
            bound = f"engine.optimizationProfile.max {engine_max}"
        else:
            bound = f"tuning.maxBatchSize.max {tuning.max_batch_size.max}"
        notes.append(f"maxBatchSize {b.max_batch_size} -> {size} ({bound})")
    preferred = [s for s in b.preferred_batch_sizes if s <= size]
    if preferred != b.preferred_batch_sizes:
        notes.append(f"preferredBatchSizes {b.preferred_batch_sizes} -> {preferred} (each <= maxBatchSize {size})")
    bounds = tuning.queue_delay_microseconds
    delay = min(max(b.max_queue_delay_microseconds, bounds.min), bounds.max)
    if delay != b.max_queue_delay_microseconds:
        edge = f"min {bounds.min}" if delay == bounds.min else f"max {bounds.max}"
        was = b.max_queue_delay_microseconds
        notes.append(f"maxQueueDelayMicroseconds {was} -> {delay} (tuning.queueDelayMicroseconds.{edge})")
    if not notes:
        return b, ()
    update = {"max_batch_size": size, "preferred_batch_sizes": preferred, "max_queue_delay_microseconds": delay}
    return b.model_copy(update=update), tuple(notes)


def clamp_message(notes: tuple[str, ...]) -> str:
    """The reason a clamped config in force carries: every field moved and the bound that moved it."""
    return "clamped to the spec's bounds: " + "; ".join(notes)


def in_force_annotation(config: InForce) -> dict[str, str]:
    """The annotation patch that records `config` as the config in force."""
    return {APPLIED_ANNOTATION: config.to_annotation()}


def tuner_state(isvc: InferenceService) -> TunerState:
    """The kept tuner state, or a fresh one when there is none or it does not parse."""
    raw = isvc.metadata.annotations.get(TUNER_STATE_ANNOTATION)
    if not raw:
        return TunerState()
    try:
        return TunerState.from_dict(json.loads(raw))
    except (ValueError, ValidationError, TypeError):
        return TunerState()


def tuner_state_annotation(state: TunerState) -> dict[str, str]:
    """The annotation patch that keeps `state`."""
    return {TUNER_STATE_ANNOTATION: json.dumps(state.to_dict(), sort_keys=True)}
