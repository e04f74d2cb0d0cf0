"""The Triton model config of an InferenceService: spec + engine I/O + batching in force → config input."""

from __future__ import annotations

from collections.abc import Sequence

from tailtune.api.v1alpha1 import Batching, InferenceService, LlmServing, QueuePolicy, TensorSpec
from tailtune.operator.builders.triton import llm_engine_dir
from tailtune.operator.observed import EngineInfo
from tailtune.triton.config import InstanceGroup, ModelConfigInput, render_json, render_pbtxt
from tailtune.triton.trtllm_config import TrtllmConfigInput, render_trtllm_json, render_trtllm_pbtxt
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.shedding import shed_timeout_us


class EngineIOUnknown(ValueError):
    """Neither the build report nor the spec says what the engine's inputs and outputs are."""


class TensorMismatch(ValueError):
    """The spec declares tensors the engine does not have: Triton would fail to load every pod."""


def tensor_mismatch(isvc: InferenceService, info: EngineInfo | None) -> str | None:
    """What in spec.model.inputs/outputs disagrees with the tensors the build reported, with the fix; None if none.

    Both sides leave out the batch dim (the build drops it, Triton's config lists dims without it). A -1
    (dynamic) dim on either side matches any size. A declared tensor the report does not name is not judged: the
    report leaves out tensors whose rank the model does not give, which is what declaring them is for. An engine
    input the spec leaves out is a mismatch (Triton needs every input of the engine); an output is not.
    """
    if info is None:
        return None
    problems: list[str] = []
    for kind, declared, built in (
        ("inputs", isvc.spec.model.inputs, info.inputs),
        ("outputs", isvc.spec.model.outputs, info.outputs),
    ):
        if declared and built:
            problems += _mismatches(kind, declared, built)
    if not problems:
        return None
    return "; ".join(problems)


def _mismatches(kind: str, declared: Sequence[TensorSpec], built: Sequence[TensorSpec]) -> list[str]:
    """One 'field: what differs; fix' per disagreement between the declared and the engine's tensors of `kind`."""
    engine = {t.name: t for t in built}
    omit = f"or omit spec.model.{kind} so the engine's are used"
    out: list[str] = []
    for i, t in enumerate(declared):
        e = engine.get(t.name)
        if e is None:
            continue
        field = f"spec.model.{kind}[{i}]"
        if t.data_type != e.data_type:
            out.append(
                f"{field}.dataType: {kind[:-1]} {t.name!r} is declared {t.data_type} but the engine's is "
                f"{e.data_type}; declare {e.data_type} {omit}"
            )
        if not _dims_match(t.dims, e.dims):
            batch = " (dims leave out the batch dim)" if len(t.dims) == len(e.dims) + 1 else ""
            out.append(
                f"{field}.dims: {kind[:-1]} {t.name!r} is declared {t.dims} but the engine built from the model "
                f"has {e.dims}{batch}; declare {e.dims} {omit}"
            )
    if kind == "inputs":
        names = {t.name for t in declared}
        for e in built:
            if e.name not in names:
                out.append(
                    f"spec.model.inputs: the engine has input {e.name!r} ({e.data_type} {e.dims}) that it does not "
                    f"list; add it {omit}"
                )
    return out


def _dims_match(declared: Sequence[int], engine: Sequence[int]) -> bool:
    """Same rank, and equal wherever neither side is dynamic (-1)."""
    return len(declared) == len(engine) and all(d == e or -1 in (d, e) for d, e in zip(declared, engine, strict=True))


def model_config_input(isvc: InferenceService, batching: Batching, info: EngineInfo | None) -> ModelConfigInput:
    """The typed config input. Spec overrides of the I/O win over what the build reported, and must agree with it
    (`TensorMismatch` otherwise: a config Triton cannot load is never rendered)."""
    mismatch = tensor_mismatch(isvc, info)
    if mismatch:
        raise TensorMismatch(f"the declared tensors disagree with the engine's (status.engine): {mismatch}")
    spec = isvc.spec
    inputs = tuple(spec.model.inputs or ()) or (info.inputs if info else ())
    outputs = tuple(spec.model.outputs or ()) or (info.outputs if info else ())
    if not inputs or not outputs:
        raise EngineIOUnknown(
            "the engine's inputs/outputs are unknown (no build report); set spec.model.inputs and spec.model.outputs"
        )
    queue_policy = queue_policy_in_force(isvc, batching, info)
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
        warmup_dims=_warmup_dims(inputs, info.inputs if info else ()),
    )


def queue_policy_in_force(isvc: InferenceService, batching: Batching, info: EngineInfo | None) -> QueuePolicy:
    """spec.serving.queuePolicy, its timeout set from the SLO under `batching` when spec.serving.shedding is on.

    The service time is the build's curve at the max batch in force (`info.service_time`): measured once per engine,
    so the timeout moves only with the batching, never with a live reading between two reloads.
    """
    serving = isvc.spec.serving
    if not serving.shedding.enabled:
        return serving.queue_policy
    points = info.service_time if info is not None else ()
    curve = Curve([CurvePoint(batch=p.batch, ms=p.ms, samples=p.samples, source="build") for p in points])
    service_ms = (curve.ms(1), curve.ms(batching.max_batch_size)) if curve else None
    timeout = shed_timeout_us(isvc.spec.slo.latency_ms, batching, service_ms, serving.instances_per_gpu)
    return serving.queue_policy.model_copy(update={"timeout_microseconds": timeout})


def _warmup_dims(inputs: Sequence[TensorSpec], built: Sequence[TensorSpec]) -> dict[str, tuple[int, ...]]:
    """Warmup sizes for declared dynamic dims the engine fixes (the engine accepts only that size there)."""
    engine = {t.name: t.dims for t in built}
    out: dict[str, tuple[int, ...]] = {}
    for t in inputs:
        e = engine.get(t.name)
        if -1 in t.dims and e is not None and _dims_match(t.dims, e):
            sizes = tuple(d if d != -1 else s for d, s in zip(t.dims, e, strict=True))
            if -1 not in sizes:
                out[t.name] = sizes
    return out


def trtllm_config_input(isvc: InferenceService, llm: LlmServing | None = None) -> TrtllmConfigInput:
    """The tensorrt_llm config input of a generative model: the engine's folder in the pod, its max batch size,
    and the load-time settings `llm` (default spec.serving.llm, or the backend's defaults where it is unset)."""
    spec = isvc.spec
    return TrtllmConfigInput(
        name=isvc.model_name,
        engine_dir=llm_engine_dir(isvc),
        max_batch_size=spec.llm_engine().max_batch_size,
        serving=llm or spec.llm_serving(),
    )


def model_config_pbtxt(
    isvc: InferenceService, batching: Batching, info: EngineInfo | None, llm: LlmServing | None = None
) -> str:
    """`config.pbtxt` for the ConfigMap: Triton's tensorrt_llm model for a generative model (`batching` does not
    apply: TensorRT-LLM batches in flight; `llm` are its load-time settings), else the engine's with `batching`."""
    if isvc.spec.model.kind == "generative":
        return render_trtllm_pbtxt(trtllm_config_input(isvc, llm))
    return render_pbtxt(model_config_input(isvc, batching, info))


def model_config_json(
    isvc: InferenceService, batching: Batching, info: EngineInfo | None, llm: LlmServing | None = None
) -> str:
    """The same config as JSON, for a hot load-with-override."""
    if isvc.spec.model.kind == "generative":
        return render_trtllm_json(trtllm_config_input(isvc, llm))
    return render_json(model_config_input(isvc, batching, info))
