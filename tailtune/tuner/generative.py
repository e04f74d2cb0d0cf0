"""The tuner for generative services (spec.model.kind generative): TTFT and TPOT targets on an inflight batcher.

Pure: no I/O, no clock of its own. The operator (or `tailtune simulate --generative`) reads one window of the
engine's metrics into a `GenObservation`, keeps `GenState` between ticks and the levers in force in `GenInForce`,
and calls `decide_generative(state, in_force, obs, policy, now)`; the `GenDecision` says the replicas and levers to
have in force, why (reason code and message), which guard bound it, and the state to keep.

Times (`now`, window ends, `changed_at`) are seconds on one clock of the caller's choosing (epoch seconds in the
operator, trace seconds in the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

SchedulerPolicy = Literal["guaranteed_no_evict", "max_utilization"]

HOLD = "Hold"


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


@dataclass(frozen=True)
class GenPolicy:
    """Targets and bounds, from the spec."""

    ttft_target_ms: float
    tpot_target_ms: float
    ttft_percentile: float = 99.0
    tpot_percentile: float = 99.0
    headroom: float = 0.8
    interval_seconds: float = 30.0
    cooldown_seconds: float = 60.0
    replicas_min: int = 1
    replicas_max: int = 1
    scale_in_stabilization_seconds: float = 300.0


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


def decide_generative(
    state: GenState, in_force: GenInForce, obs: GenObservation, policy: GenPolicy, now: float
) -> GenDecision:
    """Decide the replicas and levers for the next interval (a stub that holds: the law comes next)."""
    return GenDecision(
        replicas=in_force.replicas,
        levers=in_force.levers,
        reason_code=HOLD,
        message="the generative law is not in yet: holding",
        state=replace(state, last_window_end=obs.window_end),
    )
