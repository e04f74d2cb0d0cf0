"""The Triton model config of an InferenceService: spec + engine I/O + batching in force → config input."""

from __future__ import annotations

from tailtune.api.v1alpha1 import Batching, InferenceService, QueuePolicy
from tailtune.operator.observed import EngineInfo
from tailtune.triton.config import InstanceGroup, ModelConfigInput, render_json, render_pbtxt


class EngineIOUnknown(ValueError):
    """Neither the build report nor the spec says what the engine's inputs and outputs are."""


def model_config_input(isvc: InferenceService, batching: Batching, info: EngineInfo | None) -> ModelConfigInput:
    """The typed config input. Spec overrides of the I/O win over what the build reported."""
    spec = isvc.spec
    inputs = tuple(spec.model.inputs or ()) or (info.inputs if info else ())
    outputs = tuple(spec.model.outputs or ()) or (info.outputs if info else ())
    if not inputs or not outputs:
        raise EngineIOUnknown(
            "the engine's inputs/outputs are unknown (no build report); set spec.model.inputs and spec.model.outputs"
        )
    queue_policy = spec.serving.queue_policy
    return ModelConfigInput(
        name=isvc.model_name,
        runtime="tensorrt_plan" if spec.engine.backend == "tensorrt" else "onnxruntime",
        inputs=inputs,
        outputs=outputs,
        batching=batching,
        engine_max_batch=spec.engine.optimization_profile.max,
        instance_groups=(InstanceGroup(kind="KIND_GPU", count=spec.serving.instances_per_gpu),),
        queue_policy=None if queue_policy == QueuePolicy() else queue_policy,
        warmup=spec.warmup,
    )


def model_config_pbtxt(isvc: InferenceService, batching: Batching, info: EngineInfo | None) -> str:
    """`config.pbtxt` for the ConfigMap."""
    return render_pbtxt(model_config_input(isvc, batching, info))


def model_config_json(isvc: InferenceService, batching: Batching, info: EngineInfo | None) -> str:
    """The same config as JSON, for a hot load-with-override."""
    return render_json(model_config_input(isvc, batching, info))
