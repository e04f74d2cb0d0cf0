"""Generated families of service-time curves, policies and windows for the tuner's invariant tests."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

from tailtune.api.v1alpha1 import Batching
from tailtune.sim.batcher import Replica
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner import law
from tailtune.tuner.model import capacity as model_capacity
from tailtune.tuner.model import predict, share_within
from tailtune.tuner.servicetime import Curve, CurvePoint, ladder
from tailtune.tuner.types import InForce, Observation, Policy, TunerState

Fn = Callable[[float], float]
KINDS = ("linear", "power", "step", "saturating")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
SPAN = 60.0


def make_curve(rng: np.random.Generator, kind: str) -> Fn:
    """One curve of a family: t(b) in ms, increasing in b."""
    a, c = float(rng.uniform(1, 8)), float(rng.uniform(0.1, 1.5))
    if kind == "linear":
        return lambda b: a + c * b
    if kind == "power":
        p = float(rng.uniform(0.8, 1.6))
        return lambda b: a + c * b**p
    if kind == "step":
        k = int(rng.choice([4, 8]))  # padded to a multiple of k (tensor-core tiles)
        return lambda b: a + c * k * math.ceil(b / k)
    # Flat while the device has idle lanes, then linear.
    return lambda b: max(a, c * b) + 0.05 * a


def stepwise_edge(rng: np.random.Generator) -> PiecewiseCurve:
    """A plateau up to batch 4, a steep profile edge to 8 and 12, then a gentle slope to 64."""
    a = float(rng.uniform(5.0, 9.0))
    edge = a * float(rng.uniform(1.2, 1.5))
    pts = [(1, a), (2, a), (4, a), (8, a + edge), (12, a + 2.7 * edge), (16, a + 2.9 * edge)]
    pts += [(b, a + 2.9 * edge + 0.25 * a * (b - 16) / 16) for b in (32, 48, 64)]
    return PiecewiseCurve(tuple((b, round(ms, 3)) for b, ms in pts), f"stepwise(a={a:.1f})")


def superlinear(rng: np.random.Generator) -> Fn:
    """t(b) = a + c b^p with p in 1.2..1.6: the cost per request is lowest well below a large engine max."""
    a, c, p = float(rng.uniform(1, 6)), float(rng.uniform(0.1, 0.8)), float(rng.uniform(1.2, 1.6))
    return lambda b: a + c * b**p


@dataclass(frozen=True)
class Simulated:
    """What one simulated replica answered: sorted latencies (ms) and the requests offered."""

    latency_ms: npt.NDArray[np.float64]
    offered: int

    def share(self, slo_ms: float) -> float:
        """Share of the offered requests answered within `slo_ms`."""
        return float(np.searchsorted(self.latency_ms, slo_ms)) / self.offered

    @property
    def p99_ms(self) -> float:
        """P99 in ms; infinite when a tenth of the requests never completed (the queue grew)."""
        lat = self.latency_ms
        return float(lat[int(0.99 * len(lat))]) if len(lat) >= 0.9 * self.offered else math.inf


def simulate(t: Fn, max_batch: int, instances: int, rate: float, n: int, seed: int, drain_s: float = 60.0) -> Simulated:
    """One replica with delay 0 fed with n Poisson arrivals at `rate` req/s, the first 10 % left out; requests
    still queued `drain_s` after the last arrival count as unanswered."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    replica = Replica(
        [0.0] + [t(b) for b in range(1, max_batch + 1)], Batching(max_batch_size=max_batch), instances=instances
    )
    replica.add_arrivals(arrivals)
    end = float(arrivals[-1])
    replica.run_until(end + drain_s)
    latency = np.sort(replica.window(0.1 * end, end + drain_s).latency_s * 1000)
    return Simulated(latency, int(np.sum(arrivals >= 0.1 * end)))


RANKED_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def ranking_ratios(seed: int, cases: int) -> list[tuple[int, float]]:
    """Per generated case and instance count (1, 2): the share of requests answered within a tight SLO (0.95-1.3x
    the best simulated P99) by the max batch the model ranks first (the lowest predicted P99 among those predicted
    within the SLO, else the largest predicted share within it), over the simulator's best max batch."""
    rng = np.random.default_rng(seed)
    out = []
    for case in range(cases):
        t = make_curve(rng, KINDS[case % len(KINDS)])
        top = int(rng.choice([8, 16, 64]))
        batches = [b for b in RANKED_SIZES if b <= top]
        rate = float(rng.uniform(0.2, 0.95)) * max(model_capacity(t, b) for b in batches)
        for instances in (1, 2):
            sims = {b: simulate(t, b, instances, rate, 10_000, case) for b in batches}
            slo = float(rng.uniform(0.95, 1.3)) * min(s.p99_ms for s in sims.values())
            predicted = {b: predict(t, b, 0, instances, rate).p_ms for b in batches}
            within = [b for b in batches if predicted[b] <= slo]
            first = (
                min(within, key=lambda b: predicted[b])
                if within
                else max(batches, key=lambda b: share_within(t, b, 0, instances, rate, slo))
            )
            out.append((instances, sims[first].share(slo) / max(s.share(slo) for s in sims.values())))
    return out


def build_points(t: Fn, top: int) -> tuple[CurvePoint, ...]:
    """The engine build's ladder of t."""
    return tuple(CurvePoint(batch=b, ms=t(b), samples=1, source="build") for b in ladder(top))


def capacity(t: Fn, max_batch: int) -> float:
    """Full batches back to back, req/s."""
    return 1000.0 * max_batch / t(max_batch)


@dataclass(frozen=True)
class Case:
    """Inputs of one decision, with the true curve behind them."""

    t: Fn
    policy: Policy
    state: TunerState
    in_force: InForce
    obs: Observation
    demand: float  # offered req/s
    overloaded: bool


def make_policy(rng: np.random.Generator, t: Fn, top: int, **kw: object) -> Policy:
    """A policy over the build's ladder of t up to `top`; `kw` overrides the drawn fields."""
    replicas_max = int(kw.get("replicas_max", rng.integers(1, 9)))  # type: ignore[call-overload]
    fields: dict[str, object] = {
        "slo_ms": float(t(1) * rng.uniform(3, 25)),
        "batch_max": top,
        "replicas_min": int(rng.integers(1, replicas_max + 1)) if rng.uniform() < 0.3 else 1,
        "replicas_max": replicas_max,
        "warmup_max": int(min(top, rng.choice([1, 1, 2, 4, 8]))),
        "instances": int(rng.choice([1, 1, 1, 2])),
        "delay_max_us": 20_000,
        "build_curve": build_points(t, top),
    }
    return Policy(**(fields | kw))


def window(
    t: Fn,
    policy: Policy,
    in_force: InForce,
    demand: float,
    rng: np.random.Generator,
    end: datetime = NOW,
) -> tuple[Observation, bool]:
    """What Prometheus would report of `in_force` serving `demand` req/s (Poisson) on the true curve t."""
    mb = in_force.batching.max_batch_size
    delay_us = in_force.batching.max_queue_delay_microseconds
    total = in_force.replicas * capacity(t, mb)
    per = demand / in_force.replicas
    pred = predict(t, mb, delay_us, policy.instances, per, policy.percentile)
    if demand < 0.97 * total and math.isfinite(pred.p_ms):
        served = demand
        growth = float(rng.normal(0.0, 0.005 * demand))
        p = pred.p_ms * float(rng.lognormal(0.0, 0.25))
        batch = pred.mean_batch
        queue_ms = max(0.0, p - t(batch)) * 0.3 + delay_us / 1000
        overloaded = False
    else:
        served = total * float(rng.uniform(0.9, 1.0))
        growth = demand - served
        batch = float(mb)
        queue_ms = float(policy.slo_ms * rng.uniform(1, 10))
        p = queue_ms * 1.5 + t(mb)
        overloaded = True
    obs = Observation(
        window_end=end,
        span_seconds=SPAN,
        p_latency_ms=p,
        request_rate=served,
        queue_ms=queue_ms,
        compute_ms=t(batch),
        avg_batch=batch,
        queue_growth_rps=growth,
        ready_replicas=in_force.replicas,
        sample_count=max(policy.min_samples, int(served * SPAN)),
    )
    return obs, overloaded


def make_case(rng: np.random.Generator, kind: str | None = None) -> Case:
    """A random curve, policy, config in force, load and memory."""
    t = make_curve(rng, kind or KINDS[int(rng.integers(0, len(KINDS)))])
    top = int(rng.choice([8, 16, 32, 64, 128]))
    policy = make_policy(rng, t, top)
    mb = int(rng.integers(1, top + 1)) if rng.uniform() < 0.7 else int(rng.choice([1, top]))
    replicas = int(rng.integers(policy.replicas_min, policy.replicas_max + 1))
    in_force = InForce(
        batching=Batching(max_batch_size=mb, max_queue_delay_microseconds=int(rng.choice([0, 0, 0, 1000]))),
        replicas=replicas,
        changed_at=None if rng.uniform() < 0.3 else NOW - timedelta(seconds=float(rng.uniform(SPAN + 1, 3600))),
    )
    demand = replicas * capacity(t, mb) * float(rng.uniform(0.05, 2.0))
    obs, overloaded = window(t, policy, in_force, demand, rng)
    past = [(NOW - timedelta(seconds=30 * k), demand * float(rng.uniform(0.3, 1.5))) for k in range(1, 8)]
    state = TunerState(
        last_window_end=NOW - timedelta(seconds=30),
        bad_windows=int(rng.integers(0, 3)),
        good_windows=int(rng.integers(0, 4)),
        calibration=float(np.clip(rng.lognormal(0.0, 0.4), 0.5, 4.0)),
        recent_demand=tuple(sorted(past)),
    )
    return Case(t, policy, state, in_force, obs, demand, overloaded)


def steady_window(p99: float, rate: float, replicas: int, queue_ms: float, compute_ms: float) -> Observation:
    """A window with no queue growth, plenty of samples and every replica ready."""
    return Observation(
        window_end=NOW,
        span_seconds=SPAN,
        p_latency_ms=p99,
        request_rate=rate,
        queue_ms=queue_ms,
        compute_ms=compute_ms,
        queue_growth_rps=0.0,
        ready_replicas=replicas,
        sample_count=9000,
    )


def in_force_share(
    curve: Curve, batching: Batching, policy: Policy, calibration: float, demand_rps: float, replicas: int
) -> float:
    """The share of the demand the model answers within the SLO with the config in force on `replicas`, judged
    against the SLO (no headroom) as a share plan's candidates are."""
    at_slo = policy.model_copy(update={"headroom": 1.0})
    current = law.candidate(curve, batching.max_batch_size, batching.max_queue_delay_microseconds, at_slo, calibration)
    return law.share(curve, current, demand_rps, policy, calibration, replicas)
