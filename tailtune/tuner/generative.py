"""The tuner for generative services (spec.model.kind generative): TTFT and TPOT targets on an inflight batcher.

Pure: no I/O, no clock of its own. The operator (or `tailtune simulate --generative`) reads one window of the
engine's metrics into a `GenObservation`, keeps `GenState` between ticks and the levers in force in `GenInForce`,
and calls `decide_generative(state, in_force, obs, policy, now)`; the `GenDecision` says the replicas and levers to
have in force, why (reason code and message), which guard bound it, and the state to keep.

Times (`now`, window ends, `changed_at`) are seconds on one clock of the caller's choosing (epoch seconds in the
operator, trace seconds in the simulator).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace

from tailtune.api.v1alpha1 import InferenceServiceSpec, LlmServing
from tailtune.sim.llm import (
    FLOPS_PER_PARAM_PER_TOKEN,
    ROOFLINES,
    TRTLLM_TOKENS_PER_BLOCK,
    EngineConfig,
    SchedulerPolicy,
)


@dataclass(frozen=True)
class GenLevers:
    """The serving levers of one replica (Triton's tensorrt_llm model config; a change is a reload)."""

    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_queue_size: int = 0  # 0: unbounded
    enable_chunked_context: bool = False
    batch_scheduler_policy: SchedulerPolicy = "guaranteed_no_evict"


@dataclass(frozen=True)
class GenObservation:
    """One window of a generative service's metrics (all replicas together), None where missing."""

    window_start: float
    window_end: float
    ttft_ms: float | None = None  # at spec.slo.ttft.percentile, from the TTFT histogram
    tpot_ms: float | None = None  # at spec.slo.tpot.percentile, from the inter-token histogram
    ttft_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    request_rate: float = 0.0  # requests/s that arrived
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    running: float = 0.0  # sequences in flight (decoding or prefilling), all replicas, mean over the window
    waiting: float = 0.0  # sequences queued, all replicas, at the window's end
    kv_use: float = 0.0  # share of the KV-cache blocks in use, mean over replicas
    replicas_ready: int = 0
    requests: int = 0  # requests that finished in the window (samples behind the percentiles)


@dataclass(frozen=True)
class GenInForce:
    """What is in force: replicas and levers, and when they last changed."""

    replicas: int
    levers: GenLevers = GenLevers()
    changed_at: float | None = None  # last change of replicas or levers
    reloads: tuple[float, ...] = ()  # times of lever changes (reloads), newest last

    def after(self, decision: GenDecision, now: float) -> GenInForce:
        """What is in force once `decision` is applied at `now` (a lever change counts as a reload)."""
        if not decision.changed:
            return self
        reloads = self.reloads + ((now,) if decision.levers != self.levers else ())
        return GenInForce(decision.replicas, decision.levers, now, reloads[-RELOADS_PER_HOUR * 2 :])


@dataclass(frozen=True)
class GenState:
    """What the tuner keeps between ticks."""

    bad_windows: int = 0
    good_windows: int = 0
    # (window end, replicas the window's demand needed), for the scale-in stabilization.
    needed: tuple[tuple[float, int], ...] = ()
    # Measured / modelled ratios of TTFT and TPOT at their percentiles (the model's calibration), 1 at the start.
    ttft_scale: float = 1.0
    tpot_scale: float = 1.0
    last_window_end: float | None = None
    # The last window's demand (arrivals, no backlog) and the requests it was read from: the demand a canary judged
    # now was judged at.
    load: Load | None = None
    load_requests: int = 0
    # Lever settings whose canary was rejected, at the demand it was judged at (`remember_rejected`): not proposed
    # again at that demand within REJECTION_MEMORY_SECONDS.
    rejected: tuple[Rejection, ...] = ()
    # The pod start measured: from a scale-out's decision to the first window that saw its replicas ready (None
    # before any: an interval is assumed, `pod_start_seconds`), and the scale-out still waited for (its time).
    start_seconds: float | None = None
    scale_out_at: float | None = None
    # Output tokens per request, from windows without a backlog (`demand`): a window with one under-reads it.
    output_mean: float | None = None
    # The last window's backlog raised the count the law needs (its drain, `drain_of`): the first tokens of the next
    # window carry that queue's wait, which the count was sized for.
    drain_sized: bool = False


@dataclass(frozen=True)
class Rejection:
    """Levers a canary was rejected on, the demand of its window (and the requests it was read from) and when (the
    caller's clock)."""

    levers: GenLevers
    load: Load
    requests: int
    at: float


class GenPolicyError(ValueError):
    """A spec the generative tuner cannot follow; the message names the field and the fix."""


# Roofline figures per GPU product label (GPU feature discovery's nvidia.com/gpu.product), the engine model's prior.
PRODUCT_ROOFLINES = {"NVIDIA-L4": "l4", "NVIDIA-H100-80GB-HBM3": "h100", "NVIDIA-H100-SXM5-80GB": "h100"}


@dataclass(frozen=True)
class GenEngineModel:
    """One replica's engine, as the tuner models it (the prior; measured percentiles calibrate it): a decode step
    of `decode_base_s + decode_s_per_context_token * (sum of the running sequences' contexts)` (memory bound: the
    weights and every context's KV read once), a prefill of `prefill_s_per_token` per prompt token (compute bound),
    and the KV cache and limits trtllm-build and the model config fix."""

    decode_base_s: float
    decode_s_per_context_token: float
    prefill_s_per_token: float
    kv_tokens_at_full_fraction: int  # tokens of KV in all the memory the weights leave (fraction 1)
    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int = TRTLLM_TOKENS_PER_BLOCK

    @classmethod
    def from_engine(cls, cfg: EngineConfig) -> GenEngineModel:
        """The roofline of `cfg` (the same figures the simulator and the emulated engine run)."""
        r = cfg.roofline
        full = cfg.kv_cache_tokens / cfg.kv_cache_free_gpu_mem_fraction if cfg.kv_cache_tokens else None
        return cls(
            decode_base_s=cfg.iteration_overhead_s + r.weights_bytes / r.memory_bandwidth_bytes_per_s,
            decode_s_per_context_token=r.kv_bytes_per_token / r.memory_bandwidth_bytes_per_s,
            prefill_s_per_token=FLOPS_PER_PARAM_PER_TOKEN * r.params / r.fp16_dense_flops_per_s,
            kv_tokens_at_full_fraction=int(full) if full is not None else r.kv_cache_tokens(1.0),
            max_batch_size=cfg.max_batch_size,
            max_num_tokens=cfg.max_num_tokens,
            tokens_per_block=cfg.tokens_per_block,
        )

    @classmethod
    def for_product(cls, product: str, max_batch_size: int, max_num_tokens: int) -> GenEngineModel:
        """The roofline of Llama-3-8B FP16 on the GPU product `product` (spec.serving.gpu.product)."""
        key = PRODUCT_ROOFLINES.get(product)
        if key is None:
            raise GenPolicyError(
                f"spec.serving.gpu.product {product!r}: the generative tuner has a roofline for "
                f"{', '.join(sorted(PRODUCT_ROOFLINES))} only; serve on one of them"
            )
        return cls.from_engine(
            EngineConfig(roofline=ROOFLINES[key], max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)
        )


# Defaults of the bounds the levers move in, from TensorRT-LLM's backend docs (docs/model_config.md): the KV share
# defaults to 0.9 of the free memory; below a half the cache holds fewer sequences than the decode step is worth
# (the step's weight read dominates; design value), above 0.95 the runtime's activations run out of room.
KV_FRACTION_MIN = 0.5
KV_FRACTION_MAX = 0.95
# A reload rolls every pod through the canary (spec.tuning.cooldownSeconds apart at least): at most this many lever
# changes an hour (design value: the reload's surge of replicas is paid each time).
RELOADS_PER_HOUR = 4
RELOAD_BUDGET_SECONDS = 3600.0
# Windows within the comfort line before a scale-in (one window can be a lull; the batching tuner waits 3).
GOOD_WINDOWS_TO_SCALE_IN = 3
# Most of the replicas a scale-in gives back at once (as the batching tuner's guards: a step soon after it meets
# half the capacity, not a fraction of it).
SCALE_IN_MOST_SHARE = 0.5
# The HorizontalPodAutoscaler's default scale-down stabilization window, when the spec sets none.
HPA_SCALE_IN_STABILIZATION_SECONDS = 300.0
# The fewest finished requests in a window for its percentiles to be read (below, a P99 is a maximum of a few).
MIN_REQUESTS = 20
# Two windows' demands are one ("that demand", for a rejected canary's levers) while their request rates, and their
# mean prompt lengths, differ by no more than the noise of the windows' request counts allows: a rate (or a mean
# length, taking the lengths' spread as their mean, an exponential's) from n requests has a relative standard error of
# 1 / sqrt(n) (Poisson), so two windows differ by noise alone up to DEMAND_NOISE_Z x sqrt(a^2 / na + b^2 / nb):
# two-sided 99 %, so the same demand read again is taken for a new one once in a hundred windows.
DEMAND_NOISE_Z = 2.576
# And never less than this share of the larger: a demand a quarter apart or nearer is one for the levers' effect
# (a design value, not measured: the law's slots and waits move little within it).
SAME_DEMAND_SHARE = 0.25
# How long a rejected canary's levers stay out of the law's proposals: the reload budget's hour (a change the budget
# would allow again is worth a new canary once the hour has moved on).
REJECTION_MEMORY_SECONDS = 3600.0


@dataclass(frozen=True)
class GenPolicy:
    """Targets and bounds, from the spec; `engine` is the engine model's prior."""

    ttft_target_ms: float
    tpot_target_ms: float
    engine: GenEngineModel
    ttft_percentile: float = 99.0
    tpot_percentile: float = 99.0
    headroom: float = 0.8
    interval_seconds: float = 30.0
    cooldown_seconds: float = 60.0
    replicas_min: int = 1
    replicas_max: int = 1
    scale_in_stabilization_seconds: float = HPA_SCALE_IN_STABILIZATION_SECONDS
    kv_fraction_min: float = KV_FRACTION_MIN
    kv_fraction_max: float = KV_FRACTION_MAX
    reloads_per_hour: int = RELOADS_PER_HOUR
    min_requests: int = MIN_REQUESTS
    tune_levers: bool = True

    @classmethod
    def from_spec(cls, spec: InferenceServiceSpec, engine: GenEngineModel | None = None) -> GenPolicy:
        """The policy of a generative spec; `engine` defaults to the roofline of spec.serving.gpu.product."""
        ttft, tpot = spec.slo.ttft, spec.slo.tpot
        if ttft is None or tpot is None:
            raise GenPolicyError(
                "spec.slo.ttft and spec.slo.tpot: a generative service needs both, e.g. "
                "ttft: {targetMs: 500, percentile: 99} and tpot: {targetMs: 30, percentile: 99}"
            )
        llm = spec.llm_engine()
        if engine is None:
            engine = GenEngineModel.for_product(spec.serving.gpu.product, llm.max_batch_size, llm.max_num_tokens)
        reps = spec.serving.replicas
        stab = reps.scale_in_stabilization_seconds
        return cls(
            ttft_target_ms=ttft.target_ms,
            tpot_target_ms=tpot.target_ms,
            engine=engine,
            ttft_percentile=ttft.percentile,
            tpot_percentile=tpot.percentile,
            headroom=spec.tuning.headroom,
            interval_seconds=spec.tuning.interval_seconds,
            cooldown_seconds=spec.tuning.cooldown_seconds,
            replicas_min=max(1, reps.min),
            replicas_max=max(1, reps.max),
            scale_in_stabilization_seconds=float(stab) if stab is not None else HPA_SCALE_IN_STABILIZATION_SECONDS,
            tune_levers=spec.tuning.enabled,
        )


def levers_of(s: LlmServing) -> GenLevers:
    """The levers a tensorrt_llm model config's load-time settings set."""
    return GenLevers(
        kv_cache_free_gpu_mem_fraction=s.kv_cache_free_gpu_mem_fraction,
        max_queue_size=s.max_queue_size,
        enable_chunked_context=s.enable_chunked_context,
        batch_scheduler_policy=s.batch_scheduler_policy,
    )


def serving_with(levers: GenLevers, base: LlmServing) -> LlmServing:
    """`base` (the settings in force) with the levers set: what a lever change reloads."""
    return base.model_copy(
        update={
            "kv_cache_free_gpu_mem_fraction": levers.kv_cache_free_gpu_mem_fraction,
            "max_queue_size": levers.max_queue_size,
            "enable_chunked_context": levers.enable_chunked_context,
            "batch_scheduler_policy": levers.batch_scheduler_policy,
        }
    )


@dataclass(frozen=True)
class GenDecision:
    """The replicas and levers to have in force, why, and the state to keep."""

    replicas: int
    levers: GenLevers
    reason_code: str
    message: str
    state: GenState = field(default_factory=GenState)
    bound_by: str = ""
    changed: bool = False

    def describe(self) -> str:
        """One line for `tailtune explain` and logs."""
        bound = f" (bound by {self.bound_by})" if self.bound_by else ""
        return f"{self.reason_code}: {self.message}{bound}"


# Reason codes (the condition's reason and the Event's).
HOLD = "Hold"
NO_SIGNAL = "NoTokenSignal"
SCALED_OUT = "ScaledOut"
SCALED_IN = "ScaledIn"
LEVERS_CHANGED = "LeversChanged"
INFEASIBLE = "TokenSloInfeasible"
COOLDOWN = "Cooldown"


# The model: one replica at a load.


@dataclass(frozen=True)
class Load:
    """The demand the model sizes for: requests/s and the mean prompt and output lengths."""

    rate: float
    prompt_mean: float
    output_mean: float


@dataclass(frozen=True)
class Prediction:
    """What the model expects of one replica: running sequences, the slots the KV cache admits, TTFT and TPOT at
    their percentiles (seconds, uncalibrated: `base` is the TTFT without the wait for a slot)."""

    running: float
    slots: int
    wait_s: float
    base_ttft_s: float
    tpot_s: float

    @property
    def saturated(self) -> bool:
        """The load needs at least every slot: the queue grows without bound."""
        return math.isinf(self.tpot_s) or self.running >= self.slots


def slots(model: GenEngineModel, levers: GenLevers, load: Load) -> int:
    """Sequences the KV cache admits at once: guaranteed_no_evict reserves a whole sequence (prompt and every output
    token), max_utilization what it holds now (the prompt and half the output on average); a sequence's last block
    is half full on average; at most max_batch_size."""
    per_seq = load.prompt_mean + (
        load.output_mean if levers.batch_scheduler_policy == "guaranteed_no_evict" else load.output_mean / 2
    )
    kv = model.kv_tokens_at_full_fraction * levers.kv_cache_free_gpu_mem_fraction
    return max(1, min(model.max_batch_size, math.floor(kv / (per_seq + model.tokens_per_block / 2))))


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `servers` and `offered` load (Erlang C)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho * (1 - b))


def predict(model: GenEngineModel, levers: GenLevers, load: Load, percentile: float) -> Prediction:
    """One replica at `load`: the running sequences N solve Little's law N = rate x output x step(N) with the decode
    step `base + per_token x N x (prompt + output / 2)` (each sequence's mean context), stretched by the share of
    time prefills take (rate x prompt x prefill per token); the wait for one of the slots is an M/M/c wait at the
    percentile (the slots are the servers, a sequence's life the service); the first token comes after the prefill
    and one step."""
    ctx = load.prompt_mean + load.output_mean / 2
    c = slots(model, levers, load)
    prefill_share = load.rate * load.prompt_mean * model.prefill_s_per_token
    inf = math.inf
    if prefill_share >= 1:
        return Prediction(inf, c, inf, inf, inf)
    a = model.decode_base_s / (1 - prefill_share)
    b = model.decode_s_per_context_token * ctx / (1 - prefill_share)
    per_step = load.rate * load.output_mean  # sequences that enter per unit of (step) time per output token
    if per_step * b >= 1:
        return Prediction(inf, c, inf, inf, inf)
    running = per_step * a / (1 - per_step * b)
    step = a + b * running
    base = load.prompt_mean * model.prefill_s_per_token + step
    if running >= c:
        return Prediction(running, c, inf, base, step)
    life = load.output_mean * step
    waits = erlang_c(c, running)
    tail = 1 - percentile / 100
    wait = life / (c - running) * math.log(waits / tail) if waits > tail else 0.0
    return Prediction(running, c, wait, base, step)


def backlog(obs: GenObservation) -> float:
    """Waiting sequences beyond one a replica: at each replica a sequence or so waits for the next iteration's
    admission in steady state (admission happens at iteration boundaries), which is no backlog."""
    return max(0.0, obs.waiting - max(1, obs.replicas_ready))


def load_of(obs: GenObservation, policy: GenPolicy) -> Load | None:
    """The window's demand as it reads: the arrival rate and mean lengths (output tokens that came out per arrival);
    None without traffic. The law sizes on `demand` and `drain_load`."""
    if obs.request_rate <= 0:
        return None
    return Load(
        rate=obs.request_rate,
        prompt_mean=max(1.0, obs.prompt_tokens_per_s / obs.request_rate),
        output_mean=max(1.0, obs.output_tokens_per_s / obs.request_rate),
    )


def demand(obs: GenObservation, policy: GenPolicy, state: GenState) -> Load | None:
    """The arrivals' demand: `load_of` without the backlog, and under a backlog an output length no shorter than the
    windows without one measured (`GenState.output_mean`): the output read is the tokens that came out per arrival,
    and the waiting sequences have arrived without any of theirs coming out yet, so a window that queues
    under-reads the length (and with it the decode time each request asks)."""
    load = load_of(obs, policy)
    if load is None or backlog(obs) <= 0 or state.output_mean is None:
        return load
    return replace(load, output_mean=max(load.output_mean, state.output_mean))


def capacity_rps(model: GenEngineModel, levers: GenLevers, load: Load, tpot_scale: float = 1.0) -> float:
    """Requests/s one replica starts with every KV slot busy at `load`'s lengths: the rate at which `predict`'s
    running sequences reach the slots (Little's law on the calibrated decode step, stretched by the prefills):
    c / (output x step(c) + c x prompt x prefill per token)."""
    c = slots(model, levers, load)
    ctx = load.prompt_mean + load.output_mean / 2
    step = tpot_scale * (model.decode_base_s + model.decode_s_per_context_token * ctx * c)
    return c / (load.output_mean * step + c * load.prompt_mean * model.prefill_s_per_token)


def pod_start_seconds(policy: GenPolicy, state: GenState) -> float:
    """How long a replica asked for takes to serve: the last one measured (`GenState.start_seconds`, to the window
    end that first saw it ready), an interval before any was measured (the earliest window that can see it)."""
    return state.start_seconds if state.start_seconds is not None else policy.interval_seconds


def drain_seconds(policy: GenPolicy, state: GenState) -> float:
    """The bound a backlog drains within once the replicas asked for serve: one pod start (the misses after they are
    ready last no longer than the wait for them did), and never less than the TTFT target (a sequence served within
    it met the target however long the queue was)."""
    return max(pod_start_seconds(policy, state), policy.ttft_target_ms / 1000)


@dataclass(frozen=True)
class Drain:
    """The backlog the law sizes for: the sequences waiting when the replicas asked now serve (those waiting now and
    what the pods ready fall behind the arrivals by during the pod start), and the bound they drain within."""

    queued: float
    start_s: float
    within_s: float


def drain_of(obs: GenObservation, policy: GenPolicy, levers: GenLevers, state: GenState) -> Drain | None:
    """The waiting backlog to drain (None without one). A pod's queue stays on that pod and new replicas serve only
    after the pod start, so until then the pods ready carry the arrivals alone at their capacity (`capacity_rps`,
    calibrated): the backlog grows by the arrivals beyond it over the start."""
    arrivals = demand(obs, policy, state)
    waiting = backlog(obs)
    if arrivals is None or waiting <= 0:
        return None
    start = pod_start_seconds(policy, state)
    carried = max(1, obs.replicas_ready) * capacity_rps(policy.engine, levers, arrivals, state.tpot_scale)
    queued = waiting + max(0.0, arrivals.rate - carried) * start
    return Drain(queued, start, drain_seconds(policy, state))


def drain_load(arrivals: Load, drain: Drain | None) -> Load:
    """The arrivals and the backlog's drain within its bound on top: the load whose aim the count asked holds while
    the queue it finds on the pods in force drains."""
    return arrivals if drain is None else replace(arrivals, rate=arrivals.rate + drain.queued / drain.within_s)


def per_replica(load: Load, replicas: int) -> Load:
    """A replica's share behind the router."""
    return replace(load, rate=load.rate / max(1, replicas))


def predicted_ms(
    policy: GenPolicy, levers: GenLevers, load: Load, replicas: int, state: GenState
) -> tuple[float, float, Prediction]:
    """(TTFT, TPOT) in ms at `replicas`, calibrated by the state's scales, and the model's prediction."""
    p = predict(policy.engine, levers, per_replica(load, replicas), policy.ttft_percentile)
    ttft = p.wait_s + state.ttft_scale * p.base_ttft_s
    return 1000 * ttft, 1000 * state.tpot_scale * p.tpot_s, p


def aims_ms(policy: GenPolicy, load: Load | None, state: GenState) -> tuple[float, float]:
    """The TTFT and TPOT (ms) the law aims at: spec.tuning.headroom of the way from the floor no replica count
    moves (a lone request's calibrated prefill and step for TTFT, the calibrated weight read of a step for TPOT) to
    the target. The headroom is room for what load moves: scaling the hardware's floor by it too would buy replicas
    for latency that replicas do not change (TPOT is mostly that floor: the weight read)."""
    e = policy.engine
    prompt = load.prompt_mean if load is not None else 0.0
    floors = (
        1000 * state.ttft_scale * (prompt * e.prefill_s_per_token + e.decode_base_s),
        1000 * state.tpot_scale * e.decode_base_s,
    )
    targets = (policy.ttft_target_ms, policy.tpot_target_ms)
    a, b = (f + policy.headroom * (t - f) if t > f else t for f, t in zip(floors, targets, strict=True))
    return a, b


def holds_aim(policy: GenPolicy, levers: GenLevers, load: Load, replicas: int, state: GenState) -> bool:
    """Both targets within the aim at `replicas`, by the calibrated model."""
    ttft, tpot, p = predicted_ms(policy, levers, load, replicas, state)
    ttft_aim, tpot_aim = aims_ms(policy, load, state)
    return not p.saturated and ttft <= ttft_aim and tpot <= tpot_aim


def needed_replicas(policy: GenPolicy, levers: GenLevers, load: Load, state: GenState) -> int | None:
    """The fewest replicas within the bounds whose calibrated TTFT and TPOT hold the aim; None where none does."""
    for n in range(policy.replicas_min, policy.replicas_max + 1):
        if holds_aim(policy, levers, load, n, state):
            return n
    return None


# Calibration: measured percentiles against the model at the replicas ready.

# Weight of the newest window in the calibration's moving average (design value: half, so a changed engine is
# followed within a few windows and one noisy window moves it by half its error).
CALIBRATION_WEIGHT = 0.5


def calibrate(state: GenState, obs: GenObservation, policy: GenPolicy, levers: GenLevers) -> GenState:
    """Move the scales toward measured / modelled at the replicas ready: TPOT against the decode step, TTFT's part
    beside the modelled wait against the prefill and a step. Only from windows with enough requests, no backlog
    (a backlog's wait is not the model's steady state), within both targets and a model that is not saturated;
    never below 1 (the roofline is the fastest the hardware allows)."""
    load = load_of(obs, policy)
    if load is None or obs.requests < policy.min_requests or backlog(obs) > 0 or obs.replicas_ready < 1:
        return state
    if (obs.ttft_ms or 0.0) > policy.ttft_target_ms or (obs.tpot_ms or 0.0) > policy.tpot_target_ms:
        # Over a target: a transient (a step, a backlog just drained) the steady-state model does not describe;
        # the measured-over-model guard answers it, the calibration does not learn from it.
        return state
    p = predict(policy.engine, levers, per_replica(load, obs.replicas_ready), policy.ttft_percentile)
    if p.saturated:
        return state
    ttft_scale, tpot_scale = state.ttft_scale, state.tpot_scale
    w = CALIBRATION_WEIGHT
    if obs.tpot_ms is not None and p.tpot_s > 0:
        tpot_scale = max(1.0, (1 - w) * tpot_scale + w * (obs.tpot_ms / 1000) / p.tpot_s)
    if obs.ttft_ms is not None and p.base_ttft_s > 0:
        beside_wait = max(0.0, obs.ttft_ms / 1000 - p.wait_s)
        ttft_scale = max(1.0, (1 - w) * ttft_scale + w * beside_wait / p.base_ttft_s)
    return replace(state, ttft_scale=ttft_scale, tpot_scale=tpot_scale)


# Guards: each pure, named (the name lands in GenDecision.bound_by).


def cooling(in_force: GenInForce, policy: GenPolicy, now: float) -> bool:
    """Within spec.tuning.cooldownSeconds of the last change: its effect is not measured yet."""
    return in_force.changed_at is not None and now - in_force.changed_at < policy.cooldown_seconds


def reloads_left(in_force: GenInForce, policy: GenPolicy, now: float) -> int:
    """Lever changes (reloads) still allowed in the budget's hour."""
    recent = [t for t in in_force.reloads if now - t < RELOAD_BUDGET_SECONDS]
    return max(0, policy.reloads_per_hour - len(recent))


def stabilized_floor(state: GenState, policy: GenPolicy, now: float) -> int:
    """The most replicas any window of the scale-in stabilization needed (the HPA's scale-down stabilization)."""
    recent = [n for t, n in state.needed if now - t <= policy.scale_in_stabilization_seconds]
    return max(recent, default=policy.replicas_min)


def scale_in_target(
    current: int, want: int, state: GenState, obs: GenObservation, policy: GenPolicy, now: float
) -> tuple[int, str]:
    """How far a scale-in may go, and the guard that limited it ("" where none): none under a backlog or
    before GOOD_WINDOWS_TO_SCALE_IN comfortable windows or within the cooldown; no lower than the stabilization's
    highest need; at most SCALE_IN_MOST_SHARE of the replicas at once."""
    if backlog(obs) > 0:
        return current, "no-scale-in-under-backlog"
    if state.good_windows < GOOD_WINDOWS_TO_SCALE_IN:
        return current, "scale-in-confirming"
    floor = stabilized_floor(state, policy, now)
    target, bound = want, ""
    if floor > target:
        target, bound = floor, "scale-in-stabilization"
    half = current - math.floor(current * SCALE_IN_MOST_SHARE)
    if half > target:
        target, bound = half, "scale-in-by-half"
    return min(current, target), bound


def same_demand(a: Load, a_requests: int, b: Load, b_requests: int) -> bool:
    """Whether two windows' demands (each read from that many requests) are one: rates and mean prompt lengths apart
    by no more than their noise (DEMAND_NOISE_Z) or SAME_DEMAND_SHARE, whichever is wider. Pure."""

    def near(x: float, y: float) -> bool:
        noise = DEMAND_NOISE_Z * math.sqrt(x * x / max(1, a_requests) + y * y / max(1, b_requests))
        return abs(x - y) <= max(noise, SAME_DEMAND_SHARE * max(x, y))

    return near(a.rate, b.rate) and near(a.prompt_mean, b.prompt_mean)


def remember_rejected(state: GenState, levers: GenLevers, now: float) -> GenState:
    """`state` with `levers` remembered as rejected by their canary at the last window's demand (`state.load`;
    nothing remembered without one), older rejections past REJECTION_MEMORY_SECONDS dropped. Pure."""
    kept = tuple(r for r in state.rejected if now - r.at < REJECTION_MEMORY_SECONDS and r.levers != levers)
    if state.load is None:
        return replace(state, rejected=kept)
    return replace(state, rejected=(*kept, Rejection(levers, state.load, state.load_requests, now)))


def rejected_at(state: GenState, load: Load | None, requests: int, now: float) -> frozenset[GenLevers]:
    """The levers whose canary was rejected at this demand (read from `requests`) within REJECTION_MEMORY_SECONDS.
    Pure."""
    if load is None:
        return frozenset()
    return frozenset(
        r.levers
        for r in state.rejected
        if now - r.at < REJECTION_MEMORY_SECONDS and same_demand(r.load, r.requests, load, requests)
    )


def lever_change(
    policy: GenPolicy,
    levers: GenLevers,
    load: Load,
    replicas: int,
    state: GenState,
    obs: GenObservation,
    avoid: Collection[GenLevers] = (),
) -> tuple[GenLevers, str] | None:
    """The first of `lever_candidates` not in `avoid` (levers a canary was rejected on at this demand), or None."""
    return next((c for c in lever_candidates(policy, levers, load, replicas, state, obs) if c[0] not in avoid), None)


def lever_candidates(
    policy: GenPolicy, levers: GenLevers, load: Load, replicas: int, state: GenState, obs: GenObservation
) -> Iterator[tuple[GenLevers, str]]:
    """At the replica bound, where replicas alone do not hold the aim: one lever change (one reload) for the target the
    window measured over (TPOT first), and why; none where none helps. TTFT binding: max_utilization (more sequences
    admitted at once) where TPOT keeps its aim there, else chunked prefill (a prompt starts in an iteration's
    leftover token budget), else a larger KV share, else a bounded queue (a request that would wait past the target
    is refused at once rather than delaying those behind it). TPOT binding: back to guaranteed_no_evict, else a
    smaller KV share that caps the running sequences where the step holds the aim. Yielded in that order of
    preference, each one change from `levers`."""
    _, _, p = predicted_ms(policy, levers, load, replicas, state)
    # Which target binds is what the window measured (the model then sizes the lever).
    tpot_binds = obs.tpot_ms is not None and obs.tpot_ms > policy.tpot_target_ms
    ttft_binds = not tpot_binds and obs.ttft_ms is not None and obs.ttft_ms > policy.ttft_target_ms
    one = per_replica(load, replicas)
    if tpot_binds:
        if levers.batch_scheduler_policy == "max_utilization":
            yield replace(levers, batch_scheduler_policy="guaranteed_no_evict"), "TPOT binds: guaranteed_no_evict"
        # The running sequences whose step holds the TPOT aim, and the KV share that admits no more.
        ctx = one.prompt_mean + one.output_mean / 2
        e = policy.engine
        tpot_aim_s = aims_ms(policy, load, state)[1] / 1000
        cap = (tpot_aim_s / state.tpot_scale - e.decode_base_s) / (e.decode_s_per_context_token * ctx)
        per_seq = one.prompt_mean + one.output_mean + e.tokens_per_block / 2
        frac = max(policy.kv_fraction_min, cap * per_seq / e.kv_tokens_at_full_fraction)
        if frac < levers.kv_cache_free_gpu_mem_fraction - 0.01:
            yield (
                replace(levers, kv_cache_free_gpu_mem_fraction=round(frac, 2)),
                f"TPOT binds: KV share {frac:.2f} caps the running sequences near {max(cap, 1):.0f}",
            )
        return
    if not ttft_binds:
        if levers.max_queue_size:
            yield replace(levers, max_queue_size=0), "the targets hold: the queue is unbounded again"
        return
    if levers.batch_scheduler_policy == "guaranteed_no_evict":
        packed = replace(levers, batch_scheduler_policy="max_utilization")
        _, tpot_packed, pp = predicted_ms(policy, packed, load, replicas, state)
        if tpot_packed <= aims_ms(policy, load, state)[1] and pp.slots > p.slots:
            yield packed, "TTFT binds and TPOT has room: max_utilization admits more sequences"
    if not levers.enable_chunked_context:
        yield replace(levers, enable_chunked_context=True), "TTFT binds: chunked prefill"
    if levers.kv_cache_free_gpu_mem_fraction < policy.kv_fraction_max - 0.01:
        yield replace(levers, kv_cache_free_gpu_mem_fraction=policy.kv_fraction_max), "TTFT binds: the most KV"
    if p.saturated and not levers.max_queue_size and not math.isinf(p.tpot_s):
        # The requests a replica's slots start within the TTFT target: a later place in the queue misses it.
        life = one.output_mean * p.tpot_s
        size = max(1, math.floor(p.slots * (policy.ttft_target_ms / 1000) / max(life, 1e-9)))
        yield replace(levers, max_queue_size=size), f"overloaded: a queue of {size} a replica refuses the rest"


def _fmt(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.0f} ms"


def decide_generative(
    state: GenState, in_force: GenInForce, obs: GenObservation, policy: GenPolicy, now: float
) -> GenDecision:
    """Decide the replicas and levers for the next interval.

    Replicas first: the fewest whose calibrated TTFT and TPOT hold the aim (`aims_ms`) at the window's demand, a
    waiting backlog's drain on top (`drain_of`: what waits when the replicas asked now serve, drained within a pod
    start after, at least the TTFT target); out at once (a scale-out is not held by the cooldown: it asks only for
    what the model says the demand and the backlog need beyond what is in force), in only after the guards of
    `scale_in_target` (whose stabilization keeps the arrivals' need, not the drain's). A window over a target
    without a backlog, and after no window whose backlog raised the count, whose demand the model says the
    replicas carry, adds one replica (the model misses a cause; a backlog's TTFT is the drain's to answer). The
    levers move only at the replica bound (`lever_change`), outside the cooldown and within the reload budget."""
    levers = in_force.levers
    cur = in_force.replicas

    def out(replicas: int, new_levers: GenLevers, code: str, msg: str, st: GenState, bound: str = "") -> GenDecision:
        changed = replicas != cur or new_levers != levers
        return GenDecision(replicas, new_levers, code, msg, st, bound, changed)

    if state.last_window_end is not None and obs.window_end <= state.last_window_end:
        return out(cur, levers, HOLD, "no new window since the last decision", state, "stale-window")
    st = replace(calibrate(state, obs, policy, levers), last_window_end=obs.window_end)
    if st.scale_out_at is not None and obs.replicas_ready >= cur:
        # The replicas asked serve: the pod start, to the first window end that saw them.
        st = replace(st, start_seconds=max(0.0, obs.window_end - st.scale_out_at), scale_out_at=None)
    arrivals = load_of(obs, policy)
    if arrivals is not None:
        st = replace(st, load=arrivals, load_requests=obs.requests)
        if backlog(obs) <= 0 and obs.requests >= policy.min_requests:
            w, seen_out = CALIBRATION_WEIGHT, arrivals.output_mean
            st = replace(
                st, output_mean=seen_out if st.output_mean is None else (1 - w) * st.output_mean + w * seen_out
            )
    seen = f"TTFT {_fmt(obs.ttft_ms)} / {policy.ttft_target_ms:.0f}"
    seen += f", TPOT {_fmt(obs.tpot_ms)} / {policy.tpot_target_ms:.0f}"
    enough = obs.requests >= policy.min_requests
    over = enough and (
        (obs.ttft_ms is not None and obs.ttft_ms > policy.ttft_target_ms)
        or (obs.tpot_ms is not None and obs.tpot_ms > policy.tpot_target_ms)
    )
    # Within the aim and no backlog: a window that allows a scale-in (the model then says how far). The aim, not a
    # band below it: TPOT is the decode step's and moves little with the replicas, so a band under the aim on it
    # would keep every replica for good.
    ttft_aim, tpot_aim = aims_ms(policy, arrivals, st)
    comfortable = backlog(obs) == 0 and (
        not enough
        or ((obs.ttft_ms is None or obs.ttft_ms <= ttft_aim) and (obs.tpot_ms is None or obs.tpot_ms <= tpot_aim))
    )
    st = replace(
        st,
        bad_windows=st.bad_windows + 1 if over else 0,
        good_windows=st.good_windows + 1 if comfortable else 0,
    )
    asked = demand(obs, policy, st)
    load = asked
    drain_bound = ""
    alone: int | None = None
    if asked is None:
        need: int | None = policy.replicas_min
        why = f"{seen}: no requests"
    else:
        # While replicas start, the backlog was sized when they were asked (its growth over their start included):
        # size for the arrivals alone then.
        drain = None if obs.replicas_ready < cur else drain_of(obs, policy, levers, st)
        load = drain_load(asked, drain)
        alone = needed_replicas(policy, levers, asked, st)
        need = needed_replicas(policy, levers, load, st) if drain is not None else alone
        if need is None and drain is not None:
            # The backlog's drain asks for more than the bound: the arrivals' count, and one more to drain it.
            need = None if alone is None else min(policy.replicas_max, alone + 1)
        why = f"{seen}: {asked.rate:.2f} req/s of {asked.prompt_mean:.0f}+{asked.output_mean:.0f} tokens"
        if drain is not None and need is not None and (alone is None or need > alone):
            why += (
                f", {drain.queued:.0f} sequences waiting when replicas asked now serve ({drain.start_s:.0f} s "
                f"start) drained within {drain.within_s:.0f} s"
            )
            drain_bound = "backlog-drain"
    # The stabilization keeps the demand's need: the arrivals'. A backlog's drain is sized once, on the window that
    # found it (it holds no replicas for a stabilization window once the queue is gone).
    demand_need = alone if asked is not None else need
    keep = tuple((t, n) for t, n in st.needed if now - t <= policy.scale_in_stabilization_seconds)
    st = replace(st, needed=(*keep, (now, demand_need if demand_need is not None else policy.replicas_max)))
    st = replace(st, drain_sized=bool(drain_bound))
    bound = drain_bound
    want = need if need is not None else policy.replicas_max
    # Over a target with no backlog now nor one the last window sized a drain for (this window's first tokens carry
    # that queue's wait), and the model says the replicas in force carry the demand.
    quiet = backlog(obs) == 0 and not state.drain_sized
    if over and quiet and want <= cur and obs.replicas_ready >= cur and cur < policy.replicas_max:
        want, bound = cur + 1, "measured-over-model"
    want = max(policy.replicas_min, min(policy.replicas_max, want))
    if want > cur:
        code = INFEASIBLE if need is None else SCALED_OUT
        st = replace(st, scale_out_at=now)
        return out(
            want,
            levers,
            code,
            f"{why}: {want} replicas hold the aim" if need else f"{why}: short at the most",
            st,
            bound,
        )
    if want < cur:
        if cooling(in_force, policy, now):
            return out(cur, levers, COOLDOWN, f"{why}: {want} would do; cooling down", st, "cooldown")
        target, limit = scale_in_target(cur, want, st, obs, policy, now)
        if target < cur:
            return out(target, levers, SCALED_IN, f"{why}: {want} replicas hold the aim", st, limit)
        return out(cur, levers, HOLD, f"{why}: {want} would do", st, limit)
    # At the count the model wants: the levers, where replicas alone fall short at the bound.
    if policy.tune_levers and load is not None and over and cur >= policy.replicas_max:
        if cooling(in_force, policy, now):
            return out(cur, levers, COOLDOWN, f"{why}: short at the most replicas; cooling down", st, "cooldown")
        avoid = rejected_at(st, st.load, st.load_requests, now)
        change = lever_change(policy, levers, load, cur, st, obs, avoid)
        if change is None and avoid:
            msg = f"{why}: the lever changes left were rejected by their canary at this demand"
            return out(cur, levers, INFEASIBLE, msg, st, "canary-rejected")
        if change is not None:
            if reloads_left(in_force, policy, now) < 1:
                return out(
                    cur, levers, INFEASIBLE, f"{why}: {change[1]}, but the reload budget is spent", st, "reload-budget"
                )
            return out(cur, change[0], LEVERS_CHANGED, f"{why}: {change[1]}", st, bound)
    if need is None:
        return out(
            cur, levers, INFEASIBLE, f"{why}: short of the aim at the most replicas ({policy.replicas_max})", st, bound
        )
    return out(cur, levers, HOLD, f"{why}: {cur} replicas hold the aim", st, bound)
