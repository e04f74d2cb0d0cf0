"""A queueing model of one Triton replica's dynamic batcher: predicted tail latency and capacity. Pure.

One replica: Poisson arrivals at rate lambda, a batcher with max batch B and queue delay D, `instances` model
instances that execute on one device one batch at a time, t(b) the measured service-time curve.

- Capacity: B / t(B) requests per second (full batches back to back).
- Mean batch: a free instance takes what has queued (after waiting up to D to fill), so in steady state a
  batch holds what arrived during one execution plus the delay: b = lambda (t(b) + D), capped at B.
- Tail batch: Poisson fluctuation around that mean at the percentile's z.
- Latency at the percentile: the wait for the batch in flight (a busy device with probability u, the
  residual of its execution), the wait for the device behind the other instances' batches, the delay, the
  own execution, and, as the full-batch utilisation rho = lambda/capacity nears 1, a queueing tail that grows
  like rho/(1-rho) (heavy-traffic: the waiting time's tail is exponential).

The model is checked against the discrete-event simulator in tests (`tests/unit/tuner/test_model.py`), and
the tuner corrects its residual bias with the ratio of observed to predicted latency (`calibration`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

ServiceTime = Callable[[float], float]


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one replica at one load."""

    p_ms: float  # latency at the percentile (inf when the load exceeds capacity)
    capacity_rps: float
    mean_batch: float
    util: float  # share of time the device is busy
    stable: bool


def predict(
    t: ServiceTime,
    max_batch: int,
    delay_us: float,
    instances: int,
    rate_rps: float,
    percentile: float = 99.0,
) -> Prediction:
    """Predicted latency and capacity of one replica serving `rate_rps` (Poisson)."""
    big = max(1, max_batch)
    t_full = t(big)
    capacity = 1000.0 * big / t_full
    lam = max(0.0, rate_rps) / 1000.0  # requests per ms
    delay_ms = max(0.0, delay_us) / 1000.0
    if lam <= 0.0:
        return Prediction(t(1.0), capacity, 1.0, 0.0, True)
    rho = rate_rps / capacity
    if rho >= 1.0:
        return Prediction(math.inf, capacity, float(big), 1.0, False)
    b = 1.0
    for _ in range(200):
        nb = max(1.0, lam * (t(b) + delay_ms))
        if abs(nb - b) < 1e-6 or nb > big:
            b = min(nb, float(big))
            break
        b = nb
    q = max(1e-6, 1.0 - percentile / 100.0)
    z = NormalDist().inv_cdf(1.0 - q)
    n = lam * (t(b) + delay_ms)
    # Batch sizes follow b' ~ Poisson(lambda t(b)): an AR(1) around the fixed point whose slope g' = lambda t'(b)
    # amplifies the spread as it nears 1 (the edge of the superlinear collapse).
    slope = min(0.95, lam * (t(b + 0.5) - t(max(1.0, b - 0.5))))
    sd = math.sqrt(max(n, 1e-9) / (1.0 - slope * slope))
    b_hi = min(float(big), max(1.0, b + z * sd))
    t_hi = t(b_hi)
    util = min(1.0, lam * t(b) / b)
    # The batch in flight: found busy with probability util; its residual at the tail.
    in_flight = t_hi * max(0.0, 1.0 - q / util) if util > q else 0.0
    # Batches fill (and a queue forms behind them) with this probability; then an M/D/1-like tail of
    # full batches at utilisation rho.
    p_full = 1.0 - NormalDist().cdf((big - 0.5 - b) / sd)
    queue = p_full * t_full * math.log(max(1.0, rho / q)) / (2.0 * (1.0 - rho))
    # Other instances' batches ahead on the shared device.
    # A queue delay keeps a free instance waiting while another's batch runs: it absorbs that wait.
    contention = (instances - 1) * t_hi * util * max(0.0, 1.0 - delay_ms / t_hi)
    # The delay holds a batch only when the device would otherwise take it at once (idle, or a batch
    # shorter than the delay in flight).
    held = (1.0 - util) * delay_ms + util * max(0.0, delay_ms - t(b))
    p_ms = max(in_flight, queue) + contention + held + t_hi
    return Prediction(p_ms, capacity, b, util, True)


def max_rate(
    t: ServiceTime,
    max_batch: int,
    delay_us: float,
    instances: int,
    aim_ms: float,
    percentile: float = 99.0,
) -> float:
    """Largest rate (req/s) one replica serves with the predicted latency within `aim_ms` (0 if none)."""

    def ok(rate: float) -> bool:
        return predict(t, max_batch, delay_us, instances, rate, percentile).p_ms <= aim_ms

    cap = 1000.0 * max_batch / t(max_batch)
    lo, hi = 0.0, cap
    if not ok(1e-3 * cap):
        return 0.0
    lo = 1e-3 * cap
    for _ in range(40):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4 * cap:
            break
    return lo
