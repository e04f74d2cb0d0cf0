"""A model of an inflight-batching LLM engine (not a GPU): the scheduler and the step time, pure and clock-free;
and a fleet simulator of replicas running it on a trace (`LlmFleet`), for `tailtune simulate --generative`.

The harness's emulated Triton model (`devkit/triton/models/emulated_llm`, through `devkit.llm.engine`) runs
the engine: `execute` only submits requests, one stepper thread calls `plan()`, sleeps the iteration's time and
calls `complete()`, which says which tokens came out; the thread streams them (the way Triton's vLLM backend
runs vLLM).

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

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable
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


# The fleet: replicas of the engine behind a router, on a trace of requests.

# A new replica serves this long after it is asked for: pod start, the engine's load and warmup. The batching
# simulator's default (`tailtune.sim.cluster.SimCluster.startup_s`); an LLM's 16 GB of weights load in seconds from
# a node's cache, so the pod start dominates as it does there.
REPLICA_START_SECONDS = 30.0


@dataclass(frozen=True)
class LlmRequest:
    """One request of a trace: when it arrives, its prompt and how many tokens it asks for."""

    arrival: float
    prompt_tokens: int
    output_tokens: int


@dataclass
class RequestRecord:
    """What happened to one request: its first token and its last, or why it was refused."""

    request: LlmRequest
    first_token_at: float | None = None
    finished_at: float | None = None
    refused: str = ""

    @property
    def ttft_s(self) -> float | None:
        """Time to the first token (queue wait included)."""
        return None if self.first_token_at is None else self.first_token_at - self.request.arrival

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, as AIPerf and MLPerf count it: (last - first) / (tokens - 1);
        0 for a one-token answer."""
        if self.finished_at is None or self.first_token_at is None:
            return None
        n = self.request.output_tokens
        return (self.finished_at - self.first_token_at) / (n - 1) if n > 1 else 0.0

    def within(self, ttft_target_s: float, tpot_target_s: float) -> bool:
        """Finished within both targets (goodput counts it)."""
        ttft, tpot = self.ttft_s, self.tpot_s
        return ttft is not None and tpot is not None and ttft <= ttft_target_s and tpot <= tpot_target_s


@dataclass
class _Replica:
    rid: int
    engine: Engine
    created_at: float
    ready_at: float
    retire_at: float | None = None  # routes nothing new from then on, and leaves once empty
    gone_at: float | None = None
    current: Iteration | None = None
    scheduled: bool = False

    def serving(self, t: float) -> bool:
        return self.ready_at <= t and (self.retire_at is None or t < self.retire_at)

    def load(self) -> int:
        return len(self.engine.running) + len(self.engine.waiting)

    def empty(self) -> bool:
        return not self.engine.running and not self.engine.waiting and self.current is None


@dataclass(frozen=True)
class FleetWindow:
    """One window of the fleet, as the engine's metrics give it: token latencies of what came out in the window
    and the gauges (for `tuner.generative.GenObservation`)."""

    start: float
    end: float
    ttft_s: tuple[float, ...]  # first tokens in the window
    tpot_s: tuple[float, ...]  # requests finished in the window
    arrivals: int
    prompt_tokens: int
    output_tokens: int  # that came out in the window
    asked_output_tokens: int  # that the window's arrivals ask for (request count x their mean output length)
    running_mean: float
    waiting: int
    kv_use: float
    replicas_ready: int
    refused: int


class LlmFleet:
    """Replicas of `Engine` behind a least-loaded router (fewest running and waiting sequences, as a KV-aware
    router would pick), on one clock: `run_until(t)` plays the requests given to `offer` up to `t`."""

    def __init__(self, config: EngineConfig, replicas: int, start_seconds: float = REPLICA_START_SECONDS) -> None:
        self.config = config
        self.start_seconds = start_seconds
        self.now = 0.0
        self.replicas: list[_Replica] = []
        self.records: list[RequestRecord] = []
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0
        self._by_rid: dict[int, _Replica] = {}
        self._next_rid = 0
        self._pending: deque[LlmRequest] = deque()
        self._reset_window()
        for _ in range(replicas):
            self._add(config, ready_at=0.0)

    # Replicas and config.

    def _add(self, config: EngineConfig, ready_at: float) -> None:
        r = _Replica(self._next_rid, Engine(config), created_at=self.now, ready_at=ready_at)
        self._next_rid += 1
        self.replicas.append(r)
        self._by_rid[r.rid] = r

    def live(self) -> list[_Replica]:
        """Replicas not retired: serving or starting."""
        return [r for r in self.replicas if r.retire_at is None]

    def set_replicas(self, n: int) -> None:
        """Scale to `n`: new replicas serve after the start time; the ones let go (latest first) drain."""
        live = self.live()
        for _ in range(n - len(live)):
            self._add(self.config, ready_at=self.now + self.start_seconds)
        for r in sorted(live, key=lambda r: (r.created_at, r.rid), reverse=True)[: max(0, len(live) - n)]:
            r.retire_at = self.now
        self._retire_empty()

    def set_config(self, config: EngineConfig) -> None:
        """A config that is read at model load (the levers): rolled out as new replicas that serve after the start
        time, while the old ones serve until then and drain (the rollout's surge is billed)."""
        if config == self.config:
            return
        self.config = config
        live = self.live()
        for _ in live:
            self._add(config, ready_at=self.now + self.start_seconds)
        for r in live:
            r.retire_at = max(self.now, r.ready_at) + self.start_seconds

    def replica_seconds(self, until: float) -> float:
        """What the replicas cost up to `until`, each from its request until it left."""
        return sum(
            max(0.0, min(until, r.gone_at if r.gone_at is not None else until) - r.created_at) for r in self.replicas
        )

    def ready(self) -> int:
        """Replicas serving now."""
        return sum(r.serving(self.now) for r in self.replicas)

    # Requests.

    def offer(self, requests: Iterable[LlmRequest]) -> None:
        """Requests to play, in arrival order, not before the fleet's clock."""
        self._pending.extend(requests)

    def _route(self, req: LlmRequest) -> None:
        t = req.arrival
        rec = RequestRecord(req)
        self.records.append(rec)
        self._w_arrivals += 1
        self._w_prompt += req.prompt_tokens
        self._w_asked += req.output_tokens
        cands = [r for r in self.replicas if r.serving(t)]
        if not cands:  # nothing serving yet: the one ready first holds it
            starting = [r for r in self.replicas if r.retire_at is None]
            if not starting:
                rec.refused = "no replica"
                self._w_refused += 1
                return
            cands = [min(starting, key=lambda r: r.ready_at)]
        r = min(cands, key=lambda r: (r.load(), r.rid))
        try:
            r.engine.submit(Sequence(rec, req.prompt_tokens, req.output_tokens))
        except Refused as e:
            rec.refused = str(e)
            self._w_refused += 1
            return
        self._kick(r, max(t, r.ready_at))

    def _kick(self, r: _Replica, t: float) -> None:
        if not r.scheduled:
            r.scheduled = True
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, r.rid))

    def _step(self, r: _Replica, t: float) -> None:
        r.scheduled = False
        if r.current is not None:
            for tok in r.engine.complete(r.current):
                rec = tok.sequence.key
                assert isinstance(rec, RequestRecord)
                self._w_output += 1
                if tok.index == 0:
                    rec.first_token_at = t
                    self._w_ttft.append(t - rec.request.arrival)
                if tok.last:
                    rec.finished_at = t
                    tpot = rec.tpot_s
                    if tpot is not None:
                        self._w_tpot.append(tpot)
            r.current = None
        it = r.engine.plan()
        if it is None:
            if r.retire_at is not None and r.retire_at <= t:
                r.gone_at = t
            return
        r.current = it
        self._w_running_area += len(r.engine.running) * it.seconds
        self._kick(r, t + it.seconds)

    def _retire_empty(self) -> None:
        for r in self.replicas:
            if r.gone_at is None and r.retire_at is not None and r.retire_at <= self.now and r.empty():
                r.gone_at = max(r.retire_at, r.created_at)

    def run_until(self, t_end: float) -> None:
        """Play arrivals and iterations up to `t_end`."""
        while True:
            t_arr = self._pending[0].arrival if self._pending else math.inf
            t_it = self._heap[0][0] if self._heap else math.inf
            if min(t_arr, t_it) > t_end:
                break
            if t_arr <= t_it:
                self.now = max(self.now, t_arr)
                self._route(self._pending.popleft())
            else:
                t, _, rid = heapq.heappop(self._heap)
                self.now = max(self.now, t)
                self._step(self._by_rid[rid], t)
        self.now = max(self.now, t_end)
        self._retire_empty()

    # Windows.

    def _reset_window(self) -> None:
        self._w_start = self.now
        self._w_ttft: list[float] = []
        self._w_tpot: list[float] = []
        self._w_arrivals = 0
        self._w_prompt = 0
        self._w_asked = 0
        self._w_output = 0
        self._w_running_area = 0.0
        self._w_refused = 0

    def window(self) -> FleetWindow:
        """What the metrics say of the time since the last call, and start the next window."""
        span = max(self.now - self._w_start, 1e-9)
        serving = [r for r in self.replicas if r.serving(self.now)]
        kv = [r.engine.used_blocks() / r.engine.config.total_blocks for r in serving]
        w = FleetWindow(
            start=self._w_start,
            end=self.now,
            ttft_s=tuple(self._w_ttft),
            tpot_s=tuple(self._w_tpot),
            arrivals=self._w_arrivals,
            prompt_tokens=self._w_prompt,
            output_tokens=self._w_output,
            asked_output_tokens=self._w_asked,
            running_mean=self._w_running_area / span,
            waiting=sum(len(r.engine.waiting) for r in self.replicas if r.gone_at is None),
            kv_use=sum(kv) / len(kv) if kv else 0.0,
            replicas_ready=len(serving),
            refused=self._w_refused,
        )
        self._reset_window()
        return w


def percentile(values: Iterable[float], p: float) -> float | None:
    """The p-th percentile (nearest rank), None of nothing."""
    xs = sorted(values)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


# Traces: (arrival, prompt tokens, output tokens).


@dataclass(frozen=True)
class TokenLengths:
    """Prompt and output lengths: lognormal around a median with a spread (sigma of the log), clipped to
    [1, cap]; chat-like traces (ShareGPT, the MLPerf Llama-2 set) are right-skewed this way."""

    prompt_median: float = 512.0
    prompt_sigma: float = 0.8
    output_median: float = 192.0
    output_sigma: float = 0.7
    prompt_cap: int = 4096
    output_cap: int = 1024

    def draw(self, rng: random.Random, prompt_factor: float = 1.0) -> tuple[int, int]:
        p = rng.lognormvariate(math.log(self.prompt_median * prompt_factor), self.prompt_sigma)
        o = rng.lognormvariate(math.log(self.output_median), self.output_sigma)
        return (max(1, min(self.prompt_cap, round(p))), max(1, min(self.output_cap, round(o))))


def poisson_requests(
    rate: Callable[[float], float],
    duration_s: float,
    lengths: TokenLengths,
    seed: int,
    prompt_factor: Callable[[float], float] = lambda _t: 1.0,
) -> list[LlmRequest]:
    """A non-homogeneous Poisson trace (thinning against the highest rate, sampled per second), lengths drawn
    per request; `prompt_factor(t)` scales the prompt median at t (a long-prompt surge)."""
    rng = random.Random(seed)
    top = max(rate(float(s)) for s in range(int(duration_s) + 1))
    out: list[LlmRequest] = []
    if top <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= duration_s:
            return out
        if rng.random() * top <= rate(t):
            p, o = lengths.draw(rng, prompt_factor(t))
            out.append(LlmRequest(t, p, o))
