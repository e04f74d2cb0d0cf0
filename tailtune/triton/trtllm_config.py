"""Triton's `tensorrt_llm` model config of a generative model, rendered with Triton's protobuf schema.

The layout follows the TensorRT-LLM backend's own template (triton-inference-server/tensorrtllm_backend,
all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt; its parameters in docs/model_config.md): backend
`tensorrtllm`, decoupled (`model_transaction_policy`, needed to stream tokens), one KIND_CPU instance (the backend
places the engine on the GPUs itself), `gpt_model_type` inflight_fused_batching, `gpt_model_path` the engine's
folder, and the serving settings of spec.serving.llm: `batch_scheduler_policy`, `kv_cache_free_gpu_mem_fraction`,
`enable_chunked_context` as parameters, `max_queue_delay_microseconds` and `max_queue_size` in dynamic_batching
(`default_queue_policy.max_queue_size`), where the template puts them. Every one is read at model load: a change
is a reload. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from google.protobuf import text_format
from pydantic import BaseModel, ConfigDict, Field
from tritonclient.grpc import model_config_pb2

from tailtune.api.v1alpha1 import DataType, LlmServing
from tailtune.triton.config import ConfigError, ModelConfig, config_from_json, config_to_json

BACKEND = "tensorrtllm"
BATCHING_STRATEGY = "inflight_fused_batching"
# Logits come back in FP32, the template's usual `logits_datatype`.
LOGITS: DataType = "TYPE_FP32"


class TrtllmTensor(BaseModel):
    """One tensor of the tensorrt_llm model, as the backend's template declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    data_type: DataType
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch: requests of different lengths batch together
    scalar: bool = False  # reshape: { shape: [ ] }: one value per request


def _t(name: str, data_type: DataType, dims: tuple[int, ...], **flags: bool) -> TrtllmTensor:
    return TrtllmTensor(name=name, data_type=data_type, dims=dims, **flags)


# The template's request inputs a text-generation client sends (ids, lengths, output length, sampling, streaming),
# with its types, shapes and flags. Multimodal, LoRA, speculative and encoder-decoder inputs are left out.
INPUTS: tuple[TrtllmTensor, ...] = (
    _t("input_ids", "TYPE_INT32", (-1,), ragged=True, optional=True),
    _t("input_lengths", "TYPE_INT32", (1,), scalar=True),
    _t("request_output_len", "TYPE_INT32", (1,), scalar=True),
    _t("end_id", "TYPE_INT32", (1,), scalar=True, optional=True),
    _t("pad_id", "TYPE_INT32", (1,), scalar=True, optional=True),
    _t("stop_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    _t("bad_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    _t("beam_width", "TYPE_INT32", (1,), scalar=True, optional=True),
    _t("temperature", "TYPE_FP32", (1,), scalar=True, optional=True),
    _t("runtime_top_k", "TYPE_INT32", (1,), scalar=True, optional=True),
    _t("runtime_top_p", "TYPE_FP32", (1,), scalar=True, optional=True),
    _t("len_penalty", "TYPE_FP32", (1,), scalar=True, optional=True),
    _t("repetition_penalty", "TYPE_FP32", (1,), scalar=True, optional=True),
    _t("min_tokens", "TYPE_INT32", (1,), scalar=True, optional=True),
    _t("presence_penalty", "TYPE_FP32", (1,), scalar=True, optional=True),
    _t("frequency_penalty", "TYPE_FP32", (1,), scalar=True, optional=True),
    _t("seed", "TYPE_UINT64", (1,), scalar=True, optional=True),
    _t("return_log_probs", "TYPE_BOOL", (1,), scalar=True, optional=True),
    _t("return_context_logits", "TYPE_BOOL", (1,), scalar=True, optional=True),
    _t("return_generation_logits", "TYPE_BOOL", (1,), scalar=True, optional=True),
    _t("exclude_input_in_output", "TYPE_BOOL", (1,), scalar=True, optional=True),
    _t("stop", "TYPE_BOOL", (1,), scalar=True, optional=True),
    _t("streaming", "TYPE_BOOL", (1,), scalar=True, optional=True),
)
OUTPUTS: tuple[TrtllmTensor, ...] = (
    _t("output_ids", "TYPE_INT32", (-1, -1)),
    _t("sequence_length", "TYPE_INT32", (-1,)),
    _t("cum_log_probs", "TYPE_FP32", (-1,)),
    _t("output_log_probs", "TYPE_FP32", (-1, -1)),
    _t("context_logits", LOGITS, (-1, -1)),
    _t("generation_logits", LOGITS, (-1, -1, -1)),
    _t("batch_index", "TYPE_INT32", (1,)),
    _t("sequence_index", "TYPE_INT32", (1,)),
)


class TrtllmConfigInput(BaseModel):
    """Everything the tensorrt_llm model config is made of, typed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(description="Model name inside Triton.")]
    engine_dir: Annotated[str, Field(description="gpt_model_path: the engine folder as the serving pod sees it.")]
    max_batch_size: Annotated[
        int, Field(description="Triton max_batch_size: the engine's max batch size (spec.engine.llm.maxBatchSize).")
    ]
    serving: Annotated[LlmServing, Field(description="The load-time settings (spec.serving.llm).")] = LlmServing()


def validate_trtllm(inp: TrtllmConfigInput) -> None:
    """Raise `ConfigError` naming the field and the fix for a config the backend would refuse."""
    if not inp.name.strip():
        raise ConfigError("name", "must not be empty; use the model name clients call")
    if not inp.engine_dir.startswith("/"):
        raise ConfigError("engine_dir", f"{inp.engine_dir!r} must be an absolute path in the serving pod")
    if inp.max_batch_size < 1:
        raise ConfigError("max_batch_size", f"{inp.max_batch_size} must be >= 1 (the engine's max batch size)")
    fraction = inp.serving.kv_cache_free_gpu_mem_fraction
    if not 0 < fraction < 1:
        raise ConfigError("serving.kv_cache_free_gpu_mem_fraction", f"{fraction} must be within (0, 1)")


def _tensor(msg: Any, t: TrtllmTensor) -> None:
    msg.name = t.name
    msg.data_type = model_config_pb2.DataType.Value(t.data_type)
    msg.dims.extend(t.dims)
    if t.ragged:
        msg.allow_ragged_batch = True
    if t.optional:
        msg.optional = True
    if t.scalar:
        msg.reshape.SetInParent()  # reshape: { shape: [ ] }


def parameters(inp: TrtllmConfigInput) -> dict[str, str]:
    """The backend's string parameters (docs/model_config.md names)."""
    s = inp.serving
    return {
        "gpt_model_type": BATCHING_STRATEGY,
        "gpt_model_path": inp.engine_dir,
        "batch_scheduler_policy": s.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": repr(s.kv_cache_free_gpu_mem_fraction),
        "enable_chunked_context": "true" if s.enable_chunked_context else "false",
        "max_beam_width": "1",  # the engine is built for beam width 1 (trtllm.FIXED_BUILD_OPTIONS)
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
    }


def build_trtllm_config(inp: TrtllmConfigInput) -> ModelConfig:
    """The `model_config_pb2.ModelConfig` of the tensorrt_llm model, after `validate_trtllm`."""
    validate_trtllm(inp)
    cfg = model_config_pb2.ModelConfig()
    cfg.name = inp.name
    cfg.backend = BACKEND
    cfg.max_batch_size = inp.max_batch_size
    cfg.model_transaction_policy.decoupled = True
    for t in INPUTS:
        _tensor(cfg.input.add(), t)
    for t in OUTPUTS:
        _tensor(cfg.output.add(), t)
    group = cfg.instance_group.add()
    group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")
    group.count = 1
    db = cfg.dynamic_batching
    db.preferred_batch_size.append(inp.max_batch_size)
    db.max_queue_delay_microseconds = inp.serving.max_queue_delay_microseconds
    db.default_queue_policy.max_queue_size = inp.serving.max_queue_size
    for k, v in sorted(parameters(inp).items()):
        cfg.parameters[k].string_value = v
    return cfg


def render_trtllm_pbtxt(inp: TrtllmConfigInput) -> str:
    """`config.pbtxt` text of the tensorrt_llm model (protobuf text format)."""
    return str(text_format.MessageToString(build_trtllm_config(inp)))


def render_trtllm_json(inp: TrtllmConfigInput) -> str:
    """The same config as compact JSON, for the repository API's load-with-config-override."""
    return config_to_json(build_trtllm_config(inp))


def llm_serving_from_config(cfg_json: Mapping[str, Any]) -> LlmServing:
    """The `LlmServing` a tensorrt_llm config carries (e.g. Triton's live `/v2/models/M/config`); a parameter it
    leaves out reads as the backend's default (LlmServing's)."""
    cfg = config_from_json(cfg_json)
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    default = LlmServing()
    fraction = params.get("kv_cache_free_gpu_mem_fraction")
    chunked = params.get("enable_chunked_context")
    return LlmServing.model_validate(
        {
            "batch_scheduler_policy": params.get("batch_scheduler_policy", default.batch_scheduler_policy),
            "kv_cache_free_gpu_mem_fraction": (float(fraction) if fraction else default.kv_cache_free_gpu_mem_fraction),
            "enable_chunked_context": chunked.lower() == "true" if chunked else default.enable_chunked_context,
            "max_queue_delay_microseconds": cfg.dynamic_batching.max_queue_delay_microseconds,
            "max_queue_size": cfg.dynamic_batching.default_queue_policy.max_queue_size,
        }
    )
