"""The tuner's value types: what it observes, the policy it follows, the state it keeps, what it decides.

All pure data (frozen pydantic). `TunerState` round-trips through JSON so the operator can keep it in an
annotation and the tuner survives restarts.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tailtune.api.v1alpha1 import DEFAULT_TARGET_UTILIZATION, Batching, LlmServing, Replicas, Slo, Tuning
from tailtune.tuner.servicetime import BatchSample, Curve, CurvePoint
from tailtune.tuner.shedding import shed_batch_max

# Triton's latency summaries cover a fixed sliding 60 s, whatever the SLO window.
SUMMARY_WINDOW_SECONDS = 60.0


def judged_window_seconds(window_seconds: float) -> float:
    """How far back a window's latency reaches: the SLO window, at least Triton's 60 s summary (the tuner's
    reading, the canary's window and the per-pod reads all judge this span)."""
    return max(window_seconds, SUMMARY_WINDOW_SECONDS)


def max_batch_cap(tuning: Tuning, engine_max_batch: int) -> int:
    """The largest max batch the tuner may set: the spec's bound, at most the engine's profile max (Triton refuses
    a larger one for a TensorRT plan), at least 1."""
    return max(1, min(tuning.max_batch_size.max, engine_max_batch))


# The tail of a window whose demand is read apart (`Observation.tail_demand_rps`): its last third.
TAIL_SHARE = 1 / 3


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Observation(_Frozen):
    """One window of the latency signal, from Prometheus or from the simulator.

    Every measurement is None when it is missing. `span_seconds` is how far back the data reach from
    `window_end` (the SLO window, or Triton's 60 s summary window when that is longer). `window_end` is the newest
    sample as stamped: ahead of the reader's clock when a clock is off, long before it when the data stopped
    (`tuner.judge` says so before the law reads the window).
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
    # Completions plus queue growth over the window's last TAIL_SHARE: a demand well above the window's there says
    # a crowd entered part way through the window (its completions mix the calm before with the crowd after).
    tail_demand_rps: float | None = None
    # The most requests pending on one pod at the window's end (Triton's queue is the pod's: a scale-out drains it
    # only by taking new arrivals away from that pod).
    pending_max: float | None = None
    ready_replicas: int | None = None
    sample_count: int | None = None
    # Triton's per-batch-size statistics over the window (deltas): the live service-time curve.
    batch_stats: tuple[BatchSample, ...] = ()
    # The other targets' percentiles over the same window: (percentile, ms or None when missing).
    other_percentiles: tuple[tuple[float, float | None], ...] = ()

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
    # Device utilisation aimed at when sizing batches and replicas (a replica carries at most this share of its
    # capacity), and 1/it the demand's margin before its variability is measured.
    util_target: float = DEFAULT_TARGET_UTILIZATION  # spec.tuning.targetUtilization
    # The engine build's measured service time (batch -> ms); live statistics refine it.
    build_curve: tuple[CurvePoint, ...] = ()
    # Largest warmup batch the config renders: Triton refuses a max_batch_size below it.
    warmup_max: int = 1
    # Further targets beside (percentile, slo_ms), e.g. P50 <= 8 ms with P99 <= 30 ms: (percentile, ms) pairs.
    # The tuner keeps all of them; the tightest binds.
    other_targets: tuple[tuple[float, float], ...] = ()
    # Scale in only to what the highest demand of this many seconds needs (the HPA's scale-down stabilization);
    # None: only to the demand's upper bound over the lead time a replica given back takes to return
    # (`control.limits`), its rises over the HPA's default 300 s (`scale_in_window_seconds`) as margin.
    scale_in_stabilization_seconds: float | None = None
    # Scale out ahead of demand that repeats (spec.tuning.forecast.enabled; `tailtune.tuner.forecast`).
    forecast: bool = False
    # The margin the demand's own variability calls for, measured this tick (`control.limits.measured_margin`);
    # None: not measured (the fixed margin of the utilisation target).
    measured_margin: float | None = None

    @classmethod
    def from_spec(
        cls,
        slo: Slo,
        tuning: Tuning,
        replicas: Replicas,
        engine_max_batch: int,
        instances: int = 1,
        build_curve: tuple[CurvePoint, ...] = (),
        warmup_max: int = 1,
        shedding: bool = False,
    ) -> Policy:
        """Build the policy from the spec; the engine's max batch caps the tuning range, and with `shedding`
        (spec.serving.shedding) so does `shed_batch_max` on the build's curve (never below the spec's min nor the
        largest warmup batch)."""
        batch_max = max_batch_cap(tuning, engine_max_batch)
        if shedding and build_curve:
            cap = shed_batch_max(
                slo.latency_ms, Curve(build_curve).ms, instances, batch_max, tuning.queue_delay_microseconds.min
            )
            batch_max = max(cap, min(max(tuning.max_batch_size.min, warmup_max, 1), batch_max))
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
            build_curve=build_curve,
            warmup_max=max(1, min(warmup_max, batch_max)),
            other_targets=slo.other_targets(),
            scale_in_stabilization_seconds=replicas.scale_in_stabilization_seconds,
            forecast=tuning.forecast.enabled,
            util_target=tuning.target_utilization,
        )

    @property
    def scale_in_window_seconds(self) -> float:
        """How far back the demand is remembered: the spec's stabilization window, else the HPA's default 300 s."""
        if self.scale_in_stabilization_seconds is not None:
            return self.scale_in_stabilization_seconds
        return 300.0

    @property
    def demand_margin(self) -> float:
        """Capacity a config must have per unit of measured demand: the margin measured this tick where there is
        one, else that of the utilisation target."""
        return self.measured_margin if self.measured_margin is not None else self.fixed_margin

    @property
    def fixed_margin(self) -> float:
        """The margin of the utilisation target (queueing headroom), for a demand whose variability is unknown."""
        return 1.0 / self.util_target

    @property
    def aim_ms(self) -> float:
        """Latency the law aims at: above it a window is bad."""
        return self.headroom * self.slo_ms

    @property
    def comfort_ms(self) -> float:
        """Below this a window is comfortably good (the lower edge of the hysteresis band)."""
        return self.headroom * self.aim_ms


class InForce(_Frozen):
    """The config in force: batching, replicas, when and why it last changed. One annotation holds it.

    The tuner decides from it and returns a new one with each change; the operator renders the ConfigMap
    and scales the Deployment from it (`rolled` says a hot reload failed and the pods were rolled instead).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    batching: Batching
    replicas: int
    changed_at: datetime | None = Field(default=None, alias="changedAt")
    reason: str = ""
    rolled: bool = False
    # A generative service's tensorrt_llm load-time settings in force (None: spec.serving.llm's), why, and when the
    # generative tuner last reloaded them (its reload budget counts these; `tailtune.tuner.generative`).
    llm: LlmServing | None = None
    llm_reason: str = Field(default="", alias="llmReason")
    llm_reloads: tuple[datetime, ...] = Field(default=(), alias="llmReloads")

    def to_annotation(self) -> str:
        """Canonical JSON (camelCase batching, RFC 3339 time); the generative fields only where set."""
        doc = self.model_dump(mode="json", by_alias=True)
        for key in ("llm", "llmReason", "llmReloads"):
            if not doc[key]:
                doc.pop(key)
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_annotation(cls, raw: str) -> InForce:
        """Inverse of `to_annotation`; raises ValueError on a malformed value."""
        try:
            data = json.loads(raw)
            if isinstance(data, dict) and data.get("reason") is None:
                data.pop("reason", None)  # written as null before the config in force had one model
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(str(exc)) from exc


class RejectedConfig(_Frozen):
    """A batching config a canary rejected at a load: the law does not plan it again for a while."""

    batching: Batching
    demand_rps: float | None = None
    at: datetime
    reason: str = ""


class TooFewReplicas(_Frozen):
    """A replica count scaled out of at a demand (it broke the aim, or the observed latency said it would not carry
    the load): the law does not scale in to it (or fewer) again there for a while."""

    replicas: int
    demand_rps: float
    at: datetime


class DemandHistory(_Frozen):
    """The demand per tuning interval, oldest first, for the seasonal forecast (`tailtune.tuner.forecast`): bin i
    covers [start + i x step, start + (i + 1) x step); None where no window was read."""

    start: datetime
    step_seconds: float
    rates: tuple[float | None, ...] = ()


class TunerState(_Frozen):
    """What the tuner remembers between decisions; kept on the InferenceService so it survives restarts.

    The config in force is not here (`InForce`): one fact, one home.
    """

    last_window_end: datetime | None = None
    bad_windows: int = 0
    # End of the last window counted bad: an overlapping one is not counted again.
    last_bad_window_end: datetime | None = None
    good_windows: int = 0
    # Windows in a row within the aim (none bad), counted up to `Policy.good_windows`: that many let the law give
    # back replicas the model does not need at the demand's upper bound, inside the hysteresis band too.
    calm_windows: int = 0
    missing_windows: int = 0
    # Live service-time points from Triton's batch statistics (the build's come with the policy).
    live: tuple[CurvePoint, ...] = ()
    # Observed / predicted latency of the config in force (the model's residual bias), geometric EWMA.
    calibration: float = 1.0
    # (window end, demand req/s) of the recent windows, for the scale-in stabilization window.
    recent_demand: tuple[tuple[datetime, float], ...] = ()
    last_reason_code: str = ""
    # Configs a canary rejected (newest last); `law` skips them near the load they failed at.
    rejected: tuple[RejectedConfig, ...] = ()
    # Replica counts scaled out of (newest last) with the demand then; scale-in stops above them near that demand.
    too_few: tuple[TooFewReplicas, ...] = ()
    # The replica count last seen all ready, and the end of the first window that saw it so after a scale-out (or
    # after a pod came back): a window that starts before then was served in part by fewer pods.
    ready_count: int = 0
    ready_at: datetime | None = None
    # When the last scale-out was decided, and how long its replicas took to be seen all ready (to the end of the
    # first window that saw them so: at most an interval late). None: never measured.
    scaled_out_at: datetime | None = None
    startup_seconds: float | None = None
    # Only with the forecast on (`Policy.forecast`): bounded (`forecast.HISTORY_BINS`).
    demand_history: DemandHistory | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (RFC 3339 times)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TunerState:
        """Inverse of `to_dict`."""
        return cls.model_validate(data)


Action = Literal["hold", "change"]


class Decision(_Frozen):
    """What the law decided: the config to have in force, why, and the state to keep."""

    action: Action
    in_force: InForce
    reason: str
    reason_code: str
    state: TunerState
    # True when the latency signal is missing: the operator says so in a condition.
    signal_missing: bool = False
    # Demand beyond what the bounds allow: SLOMet=False with reason SLOInfeasible.
    infeasible: bool = False
    demand_rps: float | None = None
    capacity_rps: float | None = None
    # The gate or guard of the law that held or limited the plan (`tailtune.tuner.control.gates` and `.guards`
    # name themselves), "" where the plan went through as made.
    bound_by: str = ""

    @property
    def batching(self) -> Batching:
        """The batching to have in force."""
        return self.in_force.batching

    @property
    def replicas(self) -> int:
        """The replicas to have in force."""
        return self.in_force.replicas

    @property
    def changed(self) -> bool:
        """True when the config or replicas must change."""
        return self.action == "change"
