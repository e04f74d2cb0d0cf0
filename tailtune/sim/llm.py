"""A model of an inflight-batching LLM engine (not a GPU): the scheduler and the step time, pure and clock-free;
and a fleet simulator of replicas running it on a trace (`LlmFleet`), for `tailtune simulate --generative`.

The harness's emulated Triton model (`devkit/triton/models/emulated_llm`, through `devkit.llm.engine`) runs
the engine: `execute` only submits requests, one stepper thread calls `plan()`, sleeps the iteration's time and calls `complete()`, which says which tokens
came out; the thread streams them (the way Triton's vLLM backend runs vLLM).

One iteration, as TensorRT-LLM's inflight batcher runs it:
- admission, in arrival order (the first that does not fit waits, and so does everyone behind it), up to
  `max_batch_size` sequences, under the KV-cache budget in blocks of `tokens_per_block`:
  `guaranteed_no_evict` admits only when the whole sequence (prompt + every output token) is reserved;
  `max_utilization` admits on the blocks needed now, and when the running sequences' next tokens do not fit,
  pauses the latest admitted back to the head of the queue (its KV is dropped: its context is prefilled again
  when it resumes);
- a token budget of `max_num_tokens`: one per decoding sequence, the rest for prompts (context). Without
  chunked prefill a prompt goes in whole or waits for the next iteration; with it, a prompt takes what is
  left and goes on in the next;
- its time is a roofline: `overhead + max(2 * params * tokens / FLOP/s, (weights + KV read) / bandwidth)`,
  where tokens are the context and decode tokens of the iteration and the KV read is every scheduled
  sequence's context times the KV bytes per token. A pure prefill of P tokens is then `a + b * P` (compute
  bound), a pure decode step `alpha + beta * (weights + sum context * KV bytes)` (memory bound), as issue 39
  states them; a mixed iteration pays the slower of the two, not their sum.

The figures below are a roofline of Llama-3-8B in FP16 on an NVIDIA L4 and an H100 SXM: peak rates from the
spec sheets, so the emulated GPU is as fast as the hardware allows (a real one is slower by its efficiency).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json): 32 layers, hidden 4096, 32 query heads, 8 KV heads
# (grouped-query attention), head dim 4096 / 32 = 128, vocabulary 128256; 8.03e9 parameters.
LLAMA3_8B_PARAMS = 8.03e9
LLAMA3_8B_LAYERS = 32
LLAMA3_8B_KV_HEADS = 8
LLAMA3_8B_HEAD_DIM = 128
FP16_BYTES = 2
# K and V, per layer and KV head, head_dim values of 2 bytes: 2 * 32 * 8 * 128 * 2 = 131072 B per token.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * LLAMA3_8B_LAYERS * LLAMA3_8B_KV_HEADS * LLAMA3_8B_HEAD_DIM * FP16_BYTES
# FLOPs per token of a forward pass: 2 per parameter (one multiply-add), the usual transformer estimate.
FLOPS_PER_PARAM_PER_TOKEN = 2

# TensorRT-LLM's defaults, the engine and the Triton backend's model config:
# kv_cache_free_gpu_mem_fraction 0.9 (tensorrtllm_backend docs/model_config.md), tokens_per_block 64 (the
# backend's nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} in its README's sample), and
# trtllm-serve's max_batch_size 256 and max_num_tokens 8192 (TensorRT-LLM docs, trtllm-serve options).
TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION = 0.9
TRTLLM_TOKENS_PER_BLOCK = 64
TRTLLM_MAX_BATCH_SIZE = 256
TRTLLM_MAX_NUM_TOKENS = 8192

SchedulerPolicy = Literal["guaranteed_no_evict", "max_utilization"]
SCHEDULER_POLICIES: tuple[SchedulerPolicy, ...] = ("guaranteed_no_evict", "max_utilization")


@dataclass(frozen=True)
class Roofline:
    """One model on one GPU, as a roofline sees it: peak FLOP/s and memory bandwidth from the spec sheet."""

    name: str
    params: float
    weights_bytes: float
    kv_bytes_per_token: float
    gpu_memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    fp16_dense_flops_per_s: float

    def kv_cache_tokens(self, free_fraction: float = TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION) -> int:
        """Tokens of KV cache in the given share of the memory the weights leave free."""
        return max(
            0, math.floor(free_fraction * (self.gpu_memory_bytes - self.weights_bytes) / self.kv_bytes_per_token)
        )


def llama3_8b_fp16(gpu: str, memory_bytes: float, bandwidth_bytes_per_s: float, dense_flops_per_s: float) -> Roofline:
    """Llama-3-8B in FP16 on one GPU, from its spec sheet's memory, bandwidth and dense FP16 rate."""
    return Roofline(
        name=f"Llama-3-8B FP16 on {gpu}",
        params=LLAMA3_8B_PARAMS,
        weights_bytes=LLAMA3_8B_PARAMS * FP16_BYTES,
        kv_bytes_per_token=LLAMA3_8B_KV_BYTES_PER_TOKEN,
        gpu_memory_bytes=memory_bytes,
        memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        fp16_dense_flops_per_s=dense_flops_per_s,
    )


# NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, FP16 Tensor Core 242 TFLOPS with sparsity, so 121 dense.
LLAMA3_8B_FP16_L4 = llama3_8b_fp16("NVIDIA L4", 24e9, 300e9, 121e12)
# NVIDIA H100 datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, FP16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense.
LLAMA3_8B_FP16_H100 = llama3_8b_fp16("NVIDIA H100 SXM", 80e9, 3.35e12, 989e12)
ROOFLINES: dict[str, Roofline] = {"l4": LLAMA3_8B_FP16_L4, "h100": LLAMA3_8B_FP16_H100}


class EngineConfigError(ValueError):
    """A setting the engine cannot run with; the message names the parameter and the fix."""


@dataclass(frozen=True)
class EngineConfig:
    """What trtllm-build fixes (batch, tokens) and what the backend's model config sets (policy, KV share)."""

    roofline: Roofline = LLAMA3_8B_FP16_L4
    max_batch_size: int = TRTLLM_MAX_BATCH_SIZE
    max_num_tokens: int = TRTLLM_MAX_NUM_TOKENS
    policy: SchedulerPolicy = "guaranteed_no_evict"
    chunked_prefill: bool = False
    kv_cache_free_gpu_mem_fraction: float = TRTLLM_KV_CACHE_FREE_GPU_MEM_FRACTION
    # Overrides the KV budget the roofline's memory gives (tests that must reach the cap with few sequences).
    kv_cache_tokens: int | None = None
    tokens_per_block: int = TRTLLM_TOKENS_PER_BLOCK
    # Per-iteration time beside the roofline (kernel launches, sampling); 0: the roofline alone.
    iteration_overhead_s: float = 0.0
    max_queue_size: int = 0  # 0: unbounded

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULER_POLICIES:
            raise EngineConfigError(
                f"batch_scheduler_policy {self.policy!r}: use one of {', '.join(SCHEDULER_POLICIES)}"
            )
        for name in ("max_batch_size", "max_num_tokens", "tokens_per_block"):
            if getattr(self, name) < 1:
                raise EngineConfigError(f"{name} must be >= 1")
        if not 0 < self.kv_cache_free_gpu_mem_fraction <= 1:
            raise EngineConfigError("kv_cache_free_gpu_mem_fraction must be in (0, 1]")
        if self.total_blocks < 1:
            raise EngineConfigError(
                f"no KV cache: {self.roofline.name} leaves no memory for one block of {self.tokens_per_block} tokens"
            )

    @property
    def kv_tokens(self) -> int:
        """The KV-cache budget in tokens."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        return self.roofline.kv_cache_tokens(self.kv_cache_free_gpu_mem_fraction)

    @property
    def total_blocks(self) -> int:
        """The KV-cache budget in blocks."""
        return self.kv_tokens // self.tokens_per_block

    def blocks(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens of KV."""
        return -(-tokens // self.tokens_per_block)

    def iteration_seconds(self, compute_tokens: int, kv_tokens_read: int) -> float:
        """Roofline time of one iteration: the slower of compute and memory, plus the fixed overhead."""
        if compute_tokens == 0:
            return 0.0
        r = self.roofline
        compute = FLOPS_PER_PARAM_PER_TOKEN * r.params * compute_tokens / r.fp16_dense_flops_per_s
        memory = (r.weights_bytes + kv_tokens_read * r.kv_bytes_per_token) / r.memory_bandwidth_bytes_per_s
        return self.iteration_overhead_s + max(compute, memory)


class Refused(ValueError):
    """A request the engine cannot take; the message says why and what to change."""


@dataclass
class Sequence:
    """One request: its prompt, how many tokens it wants, and how far it got."""

    key: object
    prompt_tokens: int
    output_tokens: int
    generated: int = 0
    prefilled: int = 0  # tokens whose KV is in the cache
    pending: int = 0  # context tokens still to prefill since admission (all of them after a pause)

    @property
    def context(self) -> int:
        """Tokens the next token attends to: the prompt and what was generated."""
        return self.prompt_tokens + self.generated

    @property
    def decoding(self) -> bool:
        """Its context is in the cache: each iteration adds one token."""
        return self.pending == 0 and self.prefilled > 0


@dataclass(frozen=True)
class Iteration:
    """What one iteration runs: context chunks (sequence, tokens), decoding sequences, and its time."""

    chunks: tuple[tuple[Sequence, int], ...]
    decoding: tuple[Sequence, ...]
    seconds: float

    @property
    def context_tokens(self) -> int:
        """Prompt tokens this iteration prefills."""
        return sum(n for _, n in self.chunks)


@dataclass(frozen=True)
class Token:
    """A token that came out of an iteration: the sequence, its index (0 is the first), whether it is the last."""

    sequence: Sequence
    index: int
    last: bool


@dataclass
class Engine:
    """The inflight batcher's state: the queue, the running batch, the KV cache."""

    config: EngineConfig
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    paused: int = 0  # sequences paused (evicted) so far, max_utilization only

    def submit(self, seq: Sequence) -> None:
        """Queue a request, or raise Refused with what to change."""
        cfg = self.config
        if seq.prompt_tokens < 1 or seq.output_tokens < 1:
            raise Refused("input_ids and request_output_len must each hold at least one token")
        if not cfg.chunked_prefill and seq.prompt_tokens > cfg.max_num_tokens:
            raise Refused(
                f"a prompt of {seq.prompt_tokens} tokens exceeds max_num_tokens {cfg.max_num_tokens} without "
                "chunked prefill: enable chunked prefill or shorten the prompt"
            )
        if cfg.blocks(seq.prompt_tokens + seq.output_tokens) > cfg.total_blocks:
            raise Refused(
                f"{seq.prompt_tokens + seq.output_tokens} tokens of prompt and output exceed the whole KV cache "
                f"({cfg.kv_tokens} tokens): ask for fewer tokens"
            )
        if cfg.max_queue_size and len(self.waiting) >= cfg.max_queue_size:
            raise Refused(f"the queue holds max_queue_size {cfg.max_queue_size} requests: retry later")
        self.waiting.append(seq)

    def used_blocks(self) -> int:
        """KV blocks the running sequences hold now."""
        return sum(self.config.blocks(s.prefilled) for s in self.running)

    def _reserved_blocks(self, seq: Sequence) -> int:
        cfg = self.config
        if cfg.policy == "guaranteed_no_evict":
            return cfg.blocks(seq.prompt_tokens + seq.output_tokens)
        return cfg.blocks(seq.context + 1)

    def _admit(self) -> None:
        cfg = self.config
        reserved = sum(self._reserved_blocks(s) for s in self.running)
        while self.waiting and len(self.running) < cfg.max_batch_size:
            need = self._reserved_blocks(self.waiting[0])
            if reserved + need > cfg.total_blocks:
                break
            reserved += need
            seq = self.waiting.popleft()
            seq.pending = seq.context  # a resumed sequence's KV was dropped: all of it again
            self.running.append(seq)

    def _evict_to_fit(self) -> None:
        """max_utilization: pause the latest admitted sequences until every running one's next token fits."""
        cfg = self.config
        while len(self.running) > 1 and sum(cfg.blocks(s.context + 1) for s in self.running) > cfg.total_blocks:
            victim = self.running.pop()
            victim.prefilled = victim.pending = 0
            self.waiting.appendleft(victim)
            self.paused += 1

    def plan(self) -> Iteration | None:
        """Admit what fits and say what the next iteration runs; None when there is nothing to run."""
        cfg = self.config
        self._admit()
        if cfg.policy == "max_utilization":
            self._evict_to_fit()
        decoding = tuple(s for s in self.running if s.decoding)
        budget = cfg.max_num_tokens - len(decoding)
        chunks: list[tuple[Sequence, int]] = []
        for s in self.running:
            if s.decoding or budget <= 0:
                continue
            left = s.pending
            take = min(left, budget) if cfg.chunked_prefill else (left if left <= budget else 0)
            if take == 0:
                break  # in order: a prompt that must wait keeps the ones behind it waiting too
            chunks.append((s, take))
            budget -= take
        if not chunks and not decoding:
            return None
        kv_read = sum(s.prefilled for s in decoding) + sum(s.prefilled + n for s, n in chunks)
        seconds = cfg.iteration_seconds(len(decoding) + sum(n for _, n in chunks), kv_read)
        return Iteration(tuple(chunks), decoding, seconds)

    def complete(self, it: Iteration) -> list[Token]:
        """Apply an iteration that ran: prefilled chunks, one token per decoding sequence and per finished
        prompt; finished sequences leave the batch and free their KV."""
        out: list[Token] = []
        finished_prompts = []
        for s, n in it.chunks:
            s.prefilled += n
            s.pending -= n
            if s.pending == 0:
                finished_prompts.append(s)
        for s in it.decoding:
            s.prefilled += 1  # the KV of the token it read
        for s in (*it.decoding, *finished_prompts):
            index = s.generated
            s.generated += 1
            last = s.generated >= s.output_tokens
            out.append(Token(s, index, last))
            if last:
                self.running.remove(s)
        return out

    def stats(self) -> EngineStats:
        """The gauges TensorRT-LLM's backend exports, now."""
        return EngineStats(
            active=len(self.running),
            waiting=len(self.waiting),
            max_batch_size=self.config.max_batch_size,
            used_blocks=self.used_blocks(),
            total_blocks=self.config.total_blocks,
            tokens_per_block=self.config.tokens_per_block,
        )


@dataclass(frozen=True)
class EngineStats:
    """nv_trt_llm_request_metrics and nv_trt_llm_kv_cache_block_metrics, as values."""

    active: int
    waiting: int
    max_batch_size: int
    used_blocks: int
    total_blocks: int
    tokens_per_block: int

    @property
    def kv_fraction(self) -> float:
        """Share of the KV blocks in use."""
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0


def run_to_completion(engine: Engine, sequences: Iterable[Sequence]) -> tuple[float, dict[object, list[float]]]:
    """Submit `sequences` at time 0 and run until all finished; (total seconds, token times per key). For tests."""
    for s in sequences:
        engine.submit(s)
    now = 0.0
    times: dict[object, list[float]] = {}
    while (it := engine.plan()) is not None:
        now += it.seconds
        for tok in engine.complete(it):
            times.setdefault(tok.sequence.key, []).append(now)
    return now, times
