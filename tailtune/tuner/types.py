"""The tuner's value types: what it observes, the policy it follows, the state it keeps, what it decides.

All pure data (frozen pydantic). `TunerState` round-trips through JSON so the operator can keep it in an
annotation and the tuner survives restarts.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tailtune.api.v1alpha1 import Batching, Replicas, Slo, Tuning

# Triton's latency summaries cover a fixed sliding 60 s, whatever the SLO window.
SUMMARY_WINDOW_SECONDS = 60.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Observation(_Frozen):
    """One window of the latency signal, from Prometheus or from the simulator.

    Every measurement is None when it is missing. `span_seconds` is how far back the data reach from
    `window_end` (the SLO window, or Triton's 60 s summary window when that is longer).
    """

    window_end: datetime
    span_seconds: float
    p_latency_ms: float | None = None
    request_rate: float | None = None
    queue_ms: float | None = None
    compute_ms: float | None = None
    avg_batch: float | None = None
    # Growth of the pending-request count (req/s): completions understate demand by this much.
    queue_growth_rps: float | None = None
    ready_replicas: int | None = None
    sample_count: int | None = None

    @property
    def window_start(self) -> datetime:
        """Oldest instant the window's data can reflect."""
        return self.window_end - timedelta(seconds=self.span_seconds)


class Policy(_Frozen):
    """What the law aims at and the bounds it keeps, flattened from the InferenceService spec."""

    slo_ms: float
    percentile: float = 99.0
    window_seconds: float = 60.0
    interval_seconds: float = 30.0
    cooldown_seconds: float = 60.0
    batch_min: int = 1
    batch_max: int = 32
    delay_min_us: int = 0
    delay_max_us: int = 10_000
    preferred_candidates: tuple[int, ...] = ()
    max_batch_step: int = 8
    max_delay_step_us: int = 2000
    headroom: float = 0.8
    replicas_min: int = 1
    replicas_max: int = 1
    # Model instances per GPU: with more than one, a queue delay lets batches fill before one grabs them.
    instances: int = 1
    # Consecutive fresh windows needed before acting (noise) or relaxing (hysteresis).
    bad_windows: int = 2
    good_windows: int = 3
    min_samples: int = 20
    # Device utilisation aimed at when sizing batches and replicas, and the one that allows scaling in.
    util_target: float = 0.85
    util_high: float = 0.93
    util_scale_in: float = 0.6

    @classmethod
    def from_spec(
        cls, slo: Slo, tuning: Tuning, replicas: Replicas, engine_max_batch: int, instances: int = 1
    ) -> Policy:
        """Build the policy from the spec; the engine's max batch caps the tuning range."""
        batch_max = max(1, min(tuning.max_batch_size.max, engine_max_batch))
        return cls(
            slo_ms=slo.latency_ms,
            percentile=slo.percentile,
            window_seconds=slo.window_seconds,
            interval_seconds=tuning.interval_seconds,
            cooldown_seconds=tuning.cooldown_seconds,
            batch_min=max(1, min(tuning.max_batch_size.min, batch_max)),
            batch_max=batch_max,
            delay_min_us=tuning.queue_delay_microseconds.min,
            delay_max_us=tuning.queue_delay_microseconds.max,
            preferred_candidates=tuple(sorted(set(tuning.preferred_batch_sizes))),
            max_batch_step=tuning.max_batch_step,
            max_delay_step_us=tuning.max_delay_step_microseconds,
            headroom=tuning.headroom,
            replicas_min=max(1, replicas.min),
            replicas_max=max(1, replicas.max),
            instances=instances,
        )

    @property
    def aim_ms(self) -> float:
        """Latency the law aims at: above it a window is bad."""
        return self.headroom * self.slo_ms

    @property
    def comfort_ms(self) -> float:
        """Below this a window is comfortably good (the lower edge of the hysteresis band)."""
        return self.headroom * self.aim_ms


class CurvePoint(_Frozen):
    """One learned point of the service-time curve: execution time of a batch of this (mean) size.

    `exact` when the window's batches were nearly all of one size (all full, or nearly all single), so
    the per-request compute time is the batch's; otherwise it reads high (large batches weigh more).
    """

    batch: float
    ms: float
    exact: bool = False


class TunerState(_Frozen):
    """What the tuner remembers between decisions; kept on the InferenceService so it survives restarts."""

    batching: Batching
    replicas: int
    last_change: datetime | None = None
    last_window_end: datetime | None = None
    last_rate: float | None = None
    bad_windows: int = 0
    good_windows: int = 0
    missing_windows: int = 0
    curve: tuple[CurvePoint, ...] = ()
    # Most requests/s one replica served in a window within the aim (evidence for scaling in).
    served_per_replica: float = 0.0
    last_reason_code: str = ""

    @classmethod
    def initial(cls, batching: Batching, replicas: int) -> TunerState:
        """The state before the first decision: the spec's batching and replicas."""
        return cls(batching=batching, replicas=replicas)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (camelCase batching, RFC 3339 times)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TunerState:
        """Inverse of `to_dict`."""
        return cls.model_validate(data)


Action = Literal["hold", "change"]


class Decision(_Frozen):
    """What the law decided: the config to have in force, why, and the state to keep."""

    action: Action
    batching: Batching
    replicas: int
    reason: str
    reason_code: str
    state: TunerState
    # True when the latency signal is missing: the operator says so in a condition.
    signal_missing: bool = False
    # Whether this window met the SLO (None without a usable window).
    slo_met: bool | None = None

    @property
    def changed(self) -> bool:
        """True when the config or replicas must change."""
        return self.action == "change"
