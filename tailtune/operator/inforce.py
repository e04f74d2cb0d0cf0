"""The config in force, read from and written to its one annotation (`tailtune.io/applied`). Pure.

The model is `tailtune.tuner.types.InForce` (batching, replicas, when and why it last changed, whether a
failed hot reload rolled the pods). The tuner decides from it and returns the next one; reconcile renders
the ConfigMap, scales the Deployment and fills `status.batching` from it. Nothing else keeps these facts.
"""

from __future__ import annotations

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService
from tailtune.tuner.types import InForce


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
