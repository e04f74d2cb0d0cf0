"""The fast path: a surge met in seconds, not at the next tuning tick (Knative's panic mode). Pure: no I/O, no clock.

The regular tuner reads a window of Prometheus every `tuning.intervalSeconds`; a surge from near idle piles the
whole of that interval's arrivals on the pods in service, and a pod's queue stays on that pod (new replicas take
none of it). So every CHECK_SECONDS the caller reads each ready pod's Triton counters directly (the pending-request
gauge and the completions counter), and `decide_surge` looks at the last PANIC_WINDOW_SECONDS:

- **reason to panic**: the queue grows and either the fullest pod holds more than it serves within the SLO with
  full batches back to back (its last request waits past the SLO however the batcher does), or the window's demand
  asks for PANIC_THRESHOLD times the replicas in force (Knative's rule); or, queue or not, the window's demand is
  PANIC_THRESHOLD times what the replicas in force carry within the SLO itself by the law's model of the batching
  in force, where it holds the SLO at some load (the pending gauge counts only the requests not yet handed to a
  model instance: with several instances on one device a pod falls behind on the device, its queue at the
  instances, while the gauge stays near zero);
- **the count asked at once**: the most of the replicas that carry the window's demand (the law's margin, the
  batching in force, the law's model of it) and the law's `drain_replicas` for the fullest pod's queue as it will
  be when new pods are ready (its growth times what is left of the measured pod start), never fewer than in force,
  never more than the spec's most;
- **panic lasts** until STABLE_WINDOW_SECONDS pass without a reason to panic; while it lasts the fast path only
  scales out. The law never scales in under it either: each scale-out is recorded as a `TooFewReplicas` of the
  count left (`record_scale_out`), which the law's scale-in already honours at that demand or more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from tailtune.tuner.control.objective import NO_HEADROOM, drain_seconds, drain_within_s
from tailtune.tuner.law import GROWTH_SHARE, MAX_REJECTED, candidate, drain_replicas, safe_capacity
from tailtune.tuner.servicetime import Curve, merged
from tailtune.tuner.types import InForce, Policy, TooFewReplicas, TunerState

# Knative's autoscaler panic window: 6 s, 10 % of its 60 s stable window (config-autoscaler `panic-window-percentage`
# 10.0, `stable-window` 60s).
PANIC_WINDOW_SECONDS = 6.0
# Panic ends after this long without a reason to panic: Knative's stable window (60 s).
STABLE_WINDOW_SECONDS = 60.0
# The panic window's demand asking for this many times the replicas in force is a reason to panic: Knative's
# `panic-threshold-percentage` 200.
PANIC_THRESHOLD = 2.0
# How often the fast path reads the pods: Knative's autoscaler decides every 2 s (its tick interval); three reads
# per panic window.
CHECK_SECONDS = 2.0

SURGE_SCALE_OUT = "SurgeScaleOut"


@dataclass(frozen=True)
class PodReading:
    """One ready pod's Triton counters at one instant (its metrics endpoint, or the simulator's replica)."""

    pod: str
    at: datetime
    pending: float  # nv_inference_pending_request_count
    completed: float  # nv_inference_request_success + nv_inference_request_failure, cumulative


@dataclass(frozen=True)
class SurgeWindow:
    """What the ready pods did over the panic window (between two sets of readings)."""

    start: datetime
    end: datetime
    pods: int
    demand_rps: float  # completions plus the queue's growth, all pods
    growth_rps: float  # the queue's growth, all pods
    completed_rps: float
    pending_total: float
    pending_max: float  # the fullest pod's queue at the window's end
    fullest_growth_rps: float  # that pod's queue growth over the window
    fullest: str

    @property
    def span_s(self) -> float:
        """The window's length, s."""
        return (self.end - self.start).total_seconds()


def read_window(before: Sequence[PodReading], after: Sequence[PodReading]) -> SurgeWindow | None:
    """The window between two reads of the pods; None with no pod in `after` or no time between the reads. A pod
    absent before (just ready) counts from an empty queue and no completions; a counter that went back (the server
    restarted) counts from zero."""
    if not after:
        return None
    then = {r.pod: r for r in before}
    start = min((r.at for r in before), default=min(r.at for r in after))
    end = max(r.at for r in after)
    span = (end - start).total_seconds()
    if span <= 0:
        return None
    completed = growth = 0.0
    fullest, fullest_growth = after[0], -math.inf
    for r in after:
        old = then.get(r.pod)
        done = r.completed - old.completed if old is not None and r.completed >= old.completed else 0.0
        grew = r.pending - (old.pending if old is not None else 0.0)
        completed += done
        growth += grew
        if (r.pending, grew) > (fullest.pending, fullest_growth):
            fullest, fullest_growth = r, grew
    return SurgeWindow(
        start=start,
        end=end,
        pods=len(after),
        demand_rps=max(0.0, (completed + growth) / span),
        growth_rps=growth / span,
        completed_rps=completed / span,
        pending_total=sum(r.pending for r in after),
        pending_max=fullest.pending,
        fullest_growth_rps=fullest_growth / span,
        fullest=fullest.pod,
    )


@dataclass(frozen=True)
class SurgeState:
    """What the fast path remembers between checks (in the operator's memory; lost on a restart, as a 6 s window
    may be)."""

    panic_since: datetime | None = None
    last_reason_at: datetime | None = None  # the last check that had a reason to panic
    growing_since: datetime | None = None  # the check before the queue started growing
    last_check: datetime | None = None
    scaled_out_at: datetime | None = None  # the fast path's last scale-out


@dataclass(frozen=True)
class SurgeDecision:
    """What the fast path decided at one check."""

    panic: bool
    replicas: int  # the replicas to have in force (never fewer than in force)
    scale_out: bool
    reason: str
    state: SurgeState
    demand_rps: float = 0.0
    growing_for_s: float = 0.0  # since the queue started growing (0: it does not grow)


def decide_surge(
    window: SurgeWindow | None,
    surge: SurgeState,
    in_force: InForce,
    tuner: TunerState,
    policy: Policy,
    now: datetime,
) -> SurgeDecision:
    """Panic or not, and the replicas to ask for at once (see the module docstring)."""
    n = in_force.replicas
    if window is None:
        st = replace(surge, last_check=now)
        return SurgeDecision(False, n, False, "no two reads of the ready pods to compare yet", st)
    # The queue grows: by a request or more over the window, faster than the law's backlog share of the completions.
    growing = window.growth_rps * window.span_s >= 1.0 and window.growth_rps > GROWTH_SHARE * window.completed_rps
    # Since when: the check before the first one that saw it grow (said in the Event).
    growing_since = (surge.growing_since or surge.last_check or window.start) if growing else None
    st = replace(surge, last_check=now, growing_since=growing_since)
    growing_for = (now - growing_since).total_seconds() if growing_since is not None else 0.0
    curve = Curve(merged(policy.build_curve, tuner.live))
    if not curve:
        return SurgeDecision(False, n, False, "no service-time curve yet: the tuner's tick decides", st)
    mb, delay = in_force.batching.max_batch_size, in_force.batching.max_queue_delay_microseconds
    per_replica = candidate(curve, mb, delay, policy, tuner.calibration)
    full_rps = safe_capacity(curve, mb, delay)
    # The fullest pod's queue past what it serves within the SLO with full batches back to back: its last request
    # waits past the SLO whatever the batcher does, and a growing queue only waits longer.
    within_slo = full_rps * policy.slo_ms / 1000.0
    queue_past = window.pending_max > within_slo and window.fullest_growth_rps > 0
    # Replicas the window's demand asks for; where a replica of the batching in force carries nothing within the aim,
    # no count of them does: every replica the spec allows is asked (the tick is the one to change the batching).
    carries = per_replica.carries()
    if carries > 0:
        asks = window.demand_rps * policy.demand_margin / carries
    else:
        asks = math.inf if window.demand_rps > 0 else 0.0
    doubled = growing and asks >= PANIC_THRESHOLD * n
    at_slo = candidate(curve, mb, delay, policy.model_copy(update={"headroom": NO_HEADROOM}), tuner.calibration)
    # (A batching that holds the SLO at no load is the tick's to change: more replicas of it hold it no better.)
    past_slo = at_slo.carries() > 0 and window.demand_rps >= PANIC_THRESHOLD * n * at_slo.carries()
    reason_now = (growing and (queue_past or doubled)) or past_slo
    if reason_now:
        st = replace(st, last_reason_at=now, panic_since=surge.panic_since or now)
    elif surge.panic_since is not None and (
        surge.last_reason_at is None or now - surge.last_reason_at >= timedelta(seconds=STABLE_WINDOW_SECONDS)
    ):
        st = replace(st, panic_since=None)
    panic = st.panic_since is not None
    seen = (
        f"{window.pending_max:.0f} requests queued on {window.fullest} (it serves {within_slo:.0f} within the SLO), "
        f"{window.demand_rps:.0f} req/s over the last {window.span_s:.0f} s"
    )
    if not reason_now:
        why = "in panic, no scale-in" if panic else "no surge"
        return SurgeDecision(panic, n, False, f"{seen}: {why}", st, window.demand_rps, growing_for)
    # New pods serve after the measured pod start (an interval before one was measured, as the law assumes); a
    # scale-out already asked for is that much nearer.
    startup_s = tuner.startup_seconds if tuner.startup_seconds is not None else policy.interval_seconds
    if window.pods < n and surge.scaled_out_at is not None:
        startup_s = max(0.0, startup_s - (now - surge.scaled_out_at).total_seconds())
    queued_then = window.pending_max + max(0.0, window.fullest_growth_rps) * startup_s
    for_demand = math.ceil(asks) if math.isfinite(asks) else policy.replicas_max
    for_queue = drain_replicas(full_rps, queued_then, window.demand_rps, policy)
    want = min(policy.replicas_max, max(n, for_demand, for_queue))
    no_replica_carries = "a replica of the batching in force carries none of the demand within the aim"
    cause = (
        "the queue outgrows the SLO"
        if growing and queue_past
        else (f"the demand asks {asks:.1f} replicas" if math.isfinite(asks) else no_replica_carries)
        if growing
        else f"the demand is {window.demand_rps / max(n * at_slo.carries(), 1e-9):.1f}x what {n} replica(s) carry "
        "within the SLO"
    )
    if want <= n:
        limit = " (the most the spec allows)" if n >= policy.replicas_max else ""
        return SurgeDecision(
            True, n, False, f"{seen}: {cause}; {n} replica(s) in force{limit}", st, window.demand_rps, growing_for
        )
    demand_asks = str(for_demand) if math.isfinite(asks) else f"{for_demand}, the most allowed"
    drain = _drain_said(full_rps, queued_then, window, want, policy)
    reason = (
        f"{seen}: {cause}; {n} -> {want} replica(s) at once (the demand asks {demand_asks}; the fullest pod's "
        f"{queued_then:.0f} requests by the time new pods serve {drain}), queue growing for {growing_for:.0f} s"
    )
    return SurgeDecision(True, want, True, reason, replace(st, scaled_out_at=now), window.demand_rps, growing_for)


def _drain_said(full_rps: float, queued: float, window: SurgeWindow, want: int, policy: Policy) -> str:
    """How the fullest pod's queue drains on `want` replicas, said as it is: within the law's drain time
    (`drain_replicas`), or, where no count the spec allows drains it that fast, in how long (its full batches less
    its share of the demand), or never at that demand."""
    planned_s = drain_within_s(policy)
    drain_s = drain_seconds(full_rps, queued, window.demand_rps, want)
    if drain_s <= planned_s:
        return f"drain within {planned_s:.0f} s with {want}"
    if math.isfinite(drain_s):
        return f"drain in about {drain_s:.0f} s with {want}, past the {planned_s:.0f} s planned: the most allowed"
    return f"do not drain at this demand even with {want}, the most allowed"


def record_scale_out(
    tuner: TunerState, in_force: InForce, decision: SurgeDecision, now: datetime
) -> tuple[TunerState, InForce]:
    """The tuner state and config in force after a fast-path scale-out: every count below the one asked is a
    `TooFewReplicas` at the surge's demand (the fullest pod's queue drains in time only with the count asked: the law's
    scale-in stops there while the demand stays near the surge's), the scale-out's time is the one the law measures
    the pod start from, and the config in force changed now."""
    few = TooFewReplicas(replicas=decision.replicas - 1, demand_rps=decision.demand_rps, at=now)
    st = tuner.model_copy(
        update={
            "too_few": (*tuner.too_few, few)[-MAX_REJECTED:],
            "scaled_out_at": now,
            "last_reason_code": SURGE_SCALE_OUT,
        }
    )
    new = in_force.model_copy(update={"replicas": decision.replicas, "changed_at": now, "reason": decision.reason})
    return st, new
