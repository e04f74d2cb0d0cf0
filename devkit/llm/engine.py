"""EMULATED inflight-batching LLM engine (not a GPU), as the emulated Triton model imports it.

The model itself (scheduler, KV budget, chunked prefill, the roofline step time of Llama-3-8B FP16 on an L4 and an
H100, and the figures' sources) lives in the product's simulator, `tailtune.sim.llm`, so that `tailtune simulate
--generative` and the emulated engine inside tritonserver run one model, not two copies; this module re-exports it
under the names the harness has used.
"""

from __future__ import annotations

from tailtune.sim.llm import (
    FLOPS_PER_PARAM_PER_TOKEN,
    FP16_BYTES,
    LLAMA3_8B_FP16_H100,
    LLAMA3_8B_FP16_L4,
    LLAMA3_8B_KV_BYTES_PER_TOKEN,
    LLAMA3_8B_PARAMS,
    ROOFLINES,
    SCHEDULER_POLICIES,
    TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION,
    TRTLLM_MAX_BATCH_SIZE,
    TRTLLM_MAX_NUM_TOKENS,
    TRTLLM_TOKENS_PER_BLOCK,
    Engine,
    EngineConfig,
    EngineConfigError,
    EngineStats,
    Iteration,
    Refused,
    Roofline,
    SchedulerPolicy,
    Sequence,
    Token,
    run_to_completion,
)

__all__ = [
    "FLOPS_PER_PARAM_PER_TOKEN",
    "FP16_BYTES",
    "LLAMA3_8B_FP16_H100",
    "LLAMA3_8B_FP16_L4",
    "LLAMA3_8B_KV_BYTES_PER_TOKEN",
    "LLAMA3_8B_PARAMS",
    "ROOFLINES",
    "SCHEDULER_POLICIES",
    "TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION",
    "TRTLLM_MAX_BATCH_SIZE",
    "TRTLLM_MAX_NUM_TOKENS",
    "TRTLLM_TOKENS_PER_BLOCK",
    "Engine",
    "EngineConfig",
    "EngineConfigError",
    "EngineStats",
    "Iteration",
    "Refused",
    "Roofline",
    "SchedulerPolicy",
    "Sequence",
    "Token",
    "run_to_completion",
]
