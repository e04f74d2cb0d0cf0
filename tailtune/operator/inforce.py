"""What the tuner keeps on the object: the config in force (`tailtune.io/applied`, its one annotation) and the
tuner's memory (`tailtune.io/tuner-state`), each parsed here and nowhere else. Pure.

The model is `tailtune.tuner.types.InForce` (batching, replicas, when and why it last changed, whether a
failed hot reload rolled the pods). The tuner decides from it and returns the next one; reconcile renders
the ConfigMap, scales the Deployment and fills `status.batching` from it. Nothing else keeps these facts.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from tailtune.api.keys import APPLIED_ANNOTATION, TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService
from tailtune.tuner.types import InForce, TunerState


def spec_start(isvc: InferenceService) -> InForce:
    """The config before the tuner's first change: the spec's batching and its smallest replica count."""
    spec = isvc.spec
    replicas = min(max(spec.serving.replicas.min, 1), spec.serving.replicas.max)
    return InForce(batching=spec.serving.batching, replicas=replicas)


def in_force(isvc: InferenceService) -> InForce:
    """The config in force: the tuner's, when it fits the current spec, else the spec's starting point."""
    start = spec_start(isvc)
    spec = isvc.spec
    raw = isvc.metadata.annotations.get(APPLIED_ANNOTATION)
    if not raw or not spec.tuning.enabled:
        return start
    try:
        kept = InForce.from_annotation(raw)
    except ValueError:
        return start
    bounds = spec.tuning.max_batch_size
    fits = (
        bounds.min <= kept.batching.max_batch_size <= min(bounds.max, spec.engine.optimization_profile.max)
        and spec.serving.replicas.min <= kept.replicas <= spec.serving.replicas.max
    )
    return kept if fits else start


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
