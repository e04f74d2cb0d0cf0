"""A Triton pod of a generative InferenceService in the local runtime: the EMULATED LLM instead of TensorRT-LLM.

On a real cluster the pod's repository holds Triton's `tensorrt_llm` model (the operator's config) and the engine
`trtllm-build` made. Here `devkit.runtime` writes the emulated inflight-batching LLM (`devkit.llm.repository`)
under the model name the pod loads, when the pod carries `emulated-llm.dev.tailtune.io/*` annotations
(`spec.serving.podAnnotations`), which set the emulated hardware and engine limits (`EmulatedLlm`, TensorRT-LLM's
parameter names where it has them). The load-time settings (scheduler policy, KV share, chunked prefill, queue size)
are the operator's, from the pod's tensorrt_llm config (`devkit.llm.repository.with_trtllm_settings`): an annotation
for one is refused, so the spec (or the tuner's change) is the only place they are set. Pure: no I/O.

Warmup: Triton 2.51 does not send a decoupled model its `model_warmup` requests (measured: a decoupled model with
two warmup samples loads and has served no token), and TensorRT-LLM's model config has none, so the model runs its
warmup itself, through its engine and on its clock, before it turns READY: as many requests as the pod's config
counts in `model_warmup`, else `emulated-llm.dev.tailtune.io/warmup-requests`. The pod's readiness probe
(`/v2/models/<m>/ready`) then gates on it for real.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from devkit.llm.engine import ROOFLINES
from devkit.llm.repository import EmulatedLlm

LLM_ANNOTATION_PREFIX = "emulated-llm.dev.tailtune.io/"
# Annotation key (after the prefix) -> EmulatedLlm field, and how its text is read.
_FIELDS: dict[str, tuple[str, type]] = {
    "roofline": ("roofline", str),
    "time-scale": ("time_scale", float),
    "max-batch-size": ("max_batch_size", int),
    "max-num-tokens": ("max_num_tokens", int),
    "kv-cache-tokens": ("kv_cache_tokens", int),
    "iteration-overhead-ms": ("iteration_overhead_ms", float),
    "warmup-requests": ("warmup_requests", int),
}
# The load-time settings the operator's tensorrt_llm config sets (spec.serving.llm's field names).
_SERVING_FIELDS = {
    "batch-scheduler-policy": "batchSchedulerPolicy",
    "enable-chunked-context": "enableChunkedContext",
    "kv-cache-free-gpu-mem-fraction": "kvCacheFreeGpuMemFraction",
    "max-queue-size": "maxQueueSize",
}


class LlmPodError(ValueError):
    """An emulated-LLM annotation the runtime cannot take; the message names it and the fix."""


def is_llm_pod(annotations: Mapping[str, str]) -> bool:
    """The pod asks for the emulated LLM."""
    return any(k.startswith(LLM_ANNOTATION_PREFIX) for k in annotations)


def llm_from_annotations(annotations: Mapping[str, str]) -> EmulatedLlm:
    """The emulated engine the annotations set; EmulatedLlm's defaults for the rest."""
    values: dict[str, object] = {}
    for key, raw in annotations.items():
        if not key.startswith(LLM_ANNOTATION_PREFIX):
            continue
        short = key[len(LLM_ANNOTATION_PREFIX) :]
        if short in _SERVING_FIELDS:
            raise LlmPodError(
                f"annotation {key}: a load-time setting of the tensorrt_llm config; set spec.serving.llm."
                f"{_SERVING_FIELDS[short]} (the operator renders it into the pod's config) instead"
            )
        if short not in _FIELDS:
            raise LlmPodError(f"annotation {key}: unknown; use one of {', '.join(sorted(_FIELDS))}")
        name, kind = _FIELDS[short]
        try:
            if kind is bool:
                if raw.lower() not in ("true", "false"):
                    raise ValueError(raw)
                values[name] = raw.lower() == "true"
            else:
                values[name] = kind(raw)
        except ValueError:
            raise LlmPodError(f"annotation {key}={raw!r}: not a {kind.__name__}") from None
    llm = EmulatedLlm(**values)  # type: ignore[arg-type]
    if llm.roofline not in ROOFLINES:
        raise LlmPodError(
            f"annotation {LLM_ANNOTATION_PREFIX}roofline={llm.roofline!r}: use one of {', '.join(ROOFLINES)}"
        )
    if llm.time_scale <= 0:
        raise LlmPodError(f"annotation {LLM_ANNOTATION_PREFIX}time-scale={llm.time_scale!r}: must be > 0")
    return llm


def warmup_requests(config_pbtxt: str) -> int:
    """How many warmup requests the operator's config asks for: the sum of its `model_warmup` samples' counts (a
    sample without one is sent once, as Triton sends it)."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(config_pbtxt, config, allow_unknown_field=True)
    except text_format.ParseError as exc:
        raise LlmPodError(f"the pod's config.pbtxt does not parse: {exc}") from None
    return sum(max(1, w.count) for w in config.model_warmup)
