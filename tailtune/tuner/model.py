"""A queueing model of one Triton replica's dynamic batcher: predicted tail latency and capacity. Pure.

One replica: Poisson arrivals at rate lambda, a batcher with max batch B and queue delay D, `instances` model
instances that execute on one device one batch at a time, t(b) the measured service-time curve.

- Capacity: B / t(B) requests per second (full batches back to back).
- Mean batch: a free instance takes what has queued (after waiting up to D to fill), so in steady state a
  batch holds what arrived during one execution plus the delay: b = lambda (t(b) + D), capped at B. Where a
  steep stretch of the curve (a TensorRT profile edge) lets fluctuations carry the batches past the next
  crossing within the hour (the batch-size Markov chain's expected hitting time), they settle at the fixed
  point above it instead (`settle`).
- Tail batch: Poisson fluctuation around that mean at the percentile's z, its spread from the curve's slope
  over the excursion itself (the secant), not only at the mean.
- Latency at the percentile: the wait for the batch in flight (a busy device with probability u, the
  residual of its execution), the wait for the device behind the other instances' batches, the delay, the
  own execution, and, where batches fill at least as often as the percentile's tail, the queue of full batches
  ahead: B requests leave per t(B) while Poisson(lambda t(B)) arrive, a random walk whose length at the tail
  Kingman's exponential bound gives (the walk's Cramer root), B requests per t(B) of wait.
- Overflow: where a batch is full, the requests past B (a geometric count by the same root, the last to arrive
  during the batch in flight) wait for a full batch besides their own (`_overflow`). Without it the tail batch,
  capped at B, held the predicted P99 at 2 t(B) over a tenth of the load, until a whole queue of full batches
  formed, while the simulator's P99 kept rising.
- A queue delay (derived from how Triton's batcher closes a batch and checked against the simulator and a real
  tritonserver for 1-4 instances: `bench/tuner/instances.py`): where the delay, not the device, closes the batches,
  a batch holds the first request after a dispatch and what arrives within the delay, b = 1 + min(B - 1,
  Poisson(lambda D)), and reaches the device a window and an exponential gap after the last; the device wait is
  that Lindley walk's tail (`_delay_window`). The latency is the smaller of that and the greedy fixed point's
  above, each an over-estimate in the other's regime (the fixed point alone counts the delay into every cycle and
  over-predicted P99 with a delay 1.3-8x at 1-4 instances).
- Share within an SLO (`share_within`, what the tuner ranks configs by where none holds the SLO): for one
  instance without a queue delay, from the chain of queue lengths at the moments the device frees (batches past
  a plateau's edge feed on themselves: a big batch runs long, so the next is big too); otherwise the highest
  percentile the latency above keeps within the SLO.

The model is checked against the discrete-event simulator in tests (`tests/unit/tuner/test_model.py`), and
the tuner corrects its residual bias with the ratio of observed to predicted latency (`calibration`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

ServiceTime = Callable[[float], float]
# The spread's slope is the curve's secant over this many standard deviations above the fixed point.
SPREAD_SECANT_SD = 2.0
# Queue-length tails decaying faster than exp(-THETA_MAX n) are taken as no queue.
THETA_MAX = 50.0
# How often batches fill comes from the batch-size chain up to this max batch (a solve of its size).
FULL_CHAIN_MAX = 128
# The queue-length chain of `_chain_share` stops at this many queued (the rest is folded into the last state).
CHAIN_STATES_MAX = 1024
# Bisection for a tail's decay rate stops within this share of it: the device wait it gives (log(1/q) / theta) is
# then off by a millionth, far below the model's own error against the simulator (percents); 60 halvings were ~3x
# the cost of the planner's predictions for digits nothing reads.
ROOT_TOLERANCE = 1e-6
# `max_rate` bisects a replica's largest rate to within this share of its capacity: the model's own error against
# the simulator is percents and the demand margin planned over it is tens of percents, so a thousandth decides
# nothing a ten-thousandth would (and takes three bisection steps fewer, of the planner's dearest call).
RATE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one replica at one load."""

    p_ms: float  # latency at the percentile (inf when the load exceeds capacity)
    capacity_rps: float
    mean_batch: float
    util: float  # share of time the device is busy
    stable: bool


def _fixed_point(t: ServiceTime, big: int, lam: float, delay_ms: float) -> float | None:
    """The batch a greedy batcher settles at (b = lambda (t(b) + D)), or None when batches run away past B. A
    batch that fills before the delay is over leaves at once: past B the batches settle at B if full ones keep
    up (lambda t(B) < B), whatever the delay."""
    b = 1.0
    for _ in range(200):
        nb = max(1.0, lam * (t(b) + delay_ms))
        if nb > big:
            return float(big) if _full_keeps_up(t, big, lam) else None
        if abs(nb - b) < 1e-6:
            return nb
        b = nb
    return b


def _full_keeps_up(t: ServiceTime, big: int, lam: float) -> bool:
    """Whether full batches of `big`, leaving as soon as they fill, keep up with `lam` requests per ms."""
    return lam * t(float(big)) < big


def _spread(t: ServiceTime, b: float, lam: float, delay_ms: float, big: float = math.inf) -> float:
    """Standard deviation of the batch size around the fixed point: an AR(1) whose slope lambda t'(b) is taken
    as the secant over the excursion itself (a fluctuation that reaches a steep stretch of the curve, e.g. a
    TensorRT profile edge just above a plateau, is amplified there even where the curve is flat at b)."""
    n = lam * (t(b) + delay_ms)
    slope = min(0.95, lam * (t(b + 0.5) - t(max(1.0, b - 0.5))))
    sd = math.sqrt(max(n, 1e-9) / (1.0 - slope * slope))
    for _ in range(8):
        reach = min(SPREAD_SECANT_SD * sd, big - b)  # batches never exceed max batch
        if reach < 0.5:
            break
        secant = min(0.95, lam * (t(b + reach) - t(b)) / reach)
        if secant <= slope + 1e-6:
            break
        slope = secant
        sd = math.sqrt(max(n, 1e-9) / (1.0 - slope * slope))
    return sd


def _crossing(t: ServiceTime, big: int, lam: float, delay_ms: float, b1: float) -> float | None:
    """The first batch size above the fixed point `b1` from which batches grow (lambda (t(b) + D) >= b), if any
    up to `big`."""
    steps = 64
    for k in range(1, steps + 1):
        b = b1 + (big - b1) * k / steps
        if b > b1 + 0.5 and lam * (t(b) + delay_ms) >= b:
            return b
    return None


def _hitting_batches(t: ServiceTime, lam: float, delay_ms: float, b1: float, b2: float) -> float:
    """Expected number of batches before a greedy batcher at `b1` first forms a batch of `b2` or more.

    The batch sizes are a Markov chain: the next batch holds what arrived during this one's execution (and the
    delay), b' ~ Poisson(lambda (t(b) + D)), at least 1. The expected number of batches before the chain first
    reaches `b2` solves (I - Q) h = 1 over the sizes below it: NaN where the solve fails or comes out negative
    (a nearly singular system: the hitting time is astronomically long, or the chain runs away)."""
    n = max(1, math.ceil(b2) - 1)
    sizes = np.arange(1, n + 1)
    means = lam * (np.array([t(float(b)) for b in sizes]) + delay_ms)
    # q[i, j]: from a batch of i+1 to one of j+1 (the chain's steps among the sizes below b2).
    pmf = _poisson_pmf(means, n)
    q = pmf[:, 1:]
    q[:, 0] += pmf[:, 0]  # an empty queue: the next batch is the next arrival alone
    try:
        h = np.linalg.solve(np.eye(n) - q, np.ones(n))
    except np.linalg.LinAlgError:
        return math.nan
    if np.any(h < 0):
        return math.nan
    start = min(n, max(1, round(b1))) - 1
    return float(h[start])


def _escapes(t: ServiceTime, lam: float, delay_ms: float, b1: float, b2: float) -> bool:
    """Whether a greedy batcher at its fixed point `b1` forms a batch of `b2` or more within an hour. A steep
    stretch of the curve between the two (lambda t'(b) > 1: a TensorRT profile edge) amplifies every
    fluctuation, which a spread taken at `b1` misses."""
    batches_per_hour = 3_600_000.0 * lam / max(b1, 1.0)
    h = _hitting_batches(t, lam, delay_ms, b1, b2)
    return not (math.isfinite(h) and h >= batches_per_hour)


def _poisson_pmf(means: npt.NDArray[np.float64], top: int) -> npt.NDArray[np.float64]:
    """P(k arrivals) for k = 0..top at each of `means` (one row each)."""
    k = np.arange(top + 1)[None, :]
    m = means[:, None]
    pmf: npt.NDArray[np.float64] = np.exp(k * np.log(np.maximum(m, 1e-300)) - m - _log_factorial(top)[None, :])
    return pmf


@functools.lru_cache(maxsize=8)
def _log_factorial(n: int) -> npt.NDArray[np.float64]:
    """log(k!) for k = 0..n."""
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))


def settle(t: ServiceTime, max_batch: int, delay_us: float, rate_rps: float) -> float | None:
    """The mean batch a greedy batcher settles at under `rate_rps`: its lowest fixed point b = lambda (t(b) + D),
    unless fluctuations carry it past the next crossing within an hour (`_escapes`); then the next fixed point
    above (a curve that flattens again, e.g. the next TensorRT profile range), or None: batches run away to max
    batch and the queue grows."""
    big = max(1, max_batch)
    lam = max(0.0, rate_rps) / 1000.0
    delay_ms = max(0.0, delay_us) / 1000.0
    b = _fixed_point(t, big, lam, delay_ms)
    while b is not None:
        b2 = _crossing(t, big, lam, delay_ms, b)
        if b2 is None or not _escapes(t, lam, delay_ms, b, b2):
            return b
        # Past the crossing batches grow until the curve lets them keep up again.
        b = next(
            (
                float(x)
                for x in range(min(big, math.floor(b2) + 1), big + 1)
                if lam * (t(float(x)) + delay_ms) <= x or (x == big and _full_keeps_up(t, big, lam))
            ),
            None,
        )
    return None


def stable(t: ServiceTime, max_batch: int, delay_us: float, rate_rps: float) -> bool:
    """Whether the batcher keeps up with `rate_rps` (`settle` finds where its batches settle)."""
    return settle(t, max_batch, delay_us, rate_rps) is not None


def capacity(t: ServiceTime, max_batch: int, delay_us: float = 0.0) -> float:
    """Most req/s one replica keeps up with at this max batch (see `stable`)."""
    big = max(1, max_batch)
    top = max(1000.0 * b / t(b) for b in range(1, big + 1))
    full = 1000.0 * big / t(big)
    if stable(t, big, delay_us, top * 0.999):
        return top * 0.999
    lo, hi = min(full, top) * 0.5, top
    if not stable(t, big, delay_us, lo):
        lo = 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if stable(t, big, delay_us, mid):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-3 * top:
            break
    return lo


def predict(
    t: ServiceTime,
    max_batch: int,
    delay_us: float,
    instances: int,
    rate_rps: float,
    percentile: float = 99.0,
    capacity_rps: float | None = None,
) -> Prediction:
    """Predicted latency and capacity of one replica serving `rate_rps` (Poisson)."""
    cap = capacity(t, max(1, max_batch), delay_us) if capacity_rps is None else capacity_rps
    at, mean_batch, util, steady = _at_load(t, max_batch, delay_us, instances, rate_rps, cap)
    return Prediction(at(percentile), cap, mean_batch, util, steady)


def _at_load(
    t: ServiceTime,
    max_batch: int,
    delay_us: float,
    instances: int,
    rate_rps: float,
    cap: float,
    windows: bool = True,
) -> tuple[Callable[[float], float], float, float, bool]:
    """One replica at one load: (latency in ms at a percentile, mean batch, device utilisation, stable). Where
    the batches settle does not depend on the percentile: it is found once for every percentile asked. With
    `windows` off, the greedy fixed point alone (the regime the delay's windows are weighed against)."""
    big = max(1, max_batch)
    t_full = t(big)
    lam = max(0.0, rate_rps) / 1000.0  # requests per ms
    delay_ms = max(0.0, delay_us) / 1000.0
    if lam <= 0.0:
        return (lambda _pct: t(1.0)), 1.0, 0.0, True
    rho = rate_rps / cap if cap > 0 else math.inf
    if rho >= 1.0:
        return (lambda _pct: math.inf), float(big), 1.0, False
    window = _delay_window(t, big, lam, delay_ms, instances) if windows else None
    if window is not None:
        # Each regime's latency bounds the other's from above: the windows ignore that batches grow once the
        # device falls behind them (past that they track the device), the greedy fixed point counts the delay into
        # every cycle. The batcher is in the one that answers sooner.
        greedy = _at_load(t, max_batch, delay_us, instances, rate_rps, cap, windows=False)[0]
        closes = min(float(big), 1.0 + lam * delay_ms)
        return (lambda pct: min(window(pct), greedy(pct))), closes, min(1.0, rho), True
    b = settle(t, big, delay_us, rate_rps) or float(big)
    # Batch sizes follow b' ~ Poisson(lambda t(b)): an AR(1) around the fixed point whose slope g' = lambda t'(b)
    # amplifies the spread as it nears 1 (the edge of the superlinear collapse).
    sd = _spread(t, b, lam, delay_ms, big)
    util = min(1.0, lam * t(b) / b)
    # The delay holds a batch only when the device would otherwise take it at once (idle, or a batch
    # shorter than the delay in flight).
    # (No longer than the batch takes to fill: one that fills first leaves at once.)
    fill_ms = min(delay_ms, max(0.0, b / lam - t(b)))
    held = (1.0 - util) * fill_ms + util * max(0.0, fill_ms - t(b))
    # Batches fill (and a queue forms behind them) with this probability.
    p_full = 1.0 - NormalDist().cdf((big - 0.5 - b) / sd)
    if big > 1 and big <= FULL_CHAIN_MAX:
        # The chain's excursions on a superlinear stretch reach B more often than a normal spread says: one
        # full batch per expected hitting time from where the batches settle, at least.
        h = _hitting_batches(t, lam, delay_ms, b, big)
        if math.isfinite(h):
            p_full = max(p_full, 1.0 / max(h, 1.0))

    # The walk of full batches (B leave per t(B) while Poisson(lambda t(B)) arrive): its Cramer root sets both
    # the queue ahead and the requests a full batch leaves over, which wait for a full batch besides their own.
    theta = _cramer_root(lam * t_full, big)
    overflow = _overflow(t, t_full, b, big, lam, p_full, theta)

    def at(percentile: float) -> float:
        q = max(1e-6, 1.0 - percentile / 100.0)
        z = NormalDist().inv_cdf(1.0 - q)
        b_hi = min(float(big), max(1.0, b + z * sd))
        t_hi = t(b_hi)
        # The batch in flight: found busy with probability util; its residual at the tail. A request left over
        # from a full batch waits for that full batch too.
        in_flight = _wait_tail(q, util, t_hi, overflow)
        # A queue of full batches: B requests leave per t(B) while Poisson(lambda t(B)) arrive (a random walk);
        # its length at the tail, by Kingman's bound, where full batches are at least as common as the tail.
        reach = min(1.0, p_full / q)
        ahead = _queue_tail(theta, q / reach) * t_full / big if reach > q else 0.0
        # Other instances' batches ahead on the shared device (a queue delay does not reliably absorb this
        # wait: the waiting instance still takes what has queued once the delay is over, often before the
        # device frees). Those batches are typical ones, formed apart from this request's own: their size is
        # the mean, not the tail.
        contention = (instances - 1) * t(b) * util
        return max(in_flight, ahead) + contention + held + t_hi

    return at, b, util, True


def _delay_window(
    t: ServiceTime, big: int, lam: float, delay_ms: float, instances: int
) -> Callable[[float], float] | None:
    """Latency at a percentile where the queue delay, not the device, closes the batches (None where it does not).

    Triton's batcher forms one batch at a time and sends it when its oldest request has waited the delay or it is
    full, to an idle instance. The first request after a dispatch opens the next batch, which closes D later or at
    its B-th request, whichever comes first: it holds b = 1 + N requests, N = min(B - 1, Poisson(lambda D)).
    Batches reach the device G = X + min(D, Gamma(B - 1)) apart (X ~ Exp(lambda), the wait for the next first
    request), whatever the instance count, and each takes t(b) there, one at a time: the wait W for the device
    follows Lindley's recursion W' = max(0, W + t(b) - G), a random walk whose tail P(W > w) <= exp(-theta w)
    (Kingman's bound; theta its Cramer root, `_lindley_root`). This holds while the device keeps up with the
    windows (E[t(b)] < E[G]); past that the batches track the device (the greedy regime of `_at_load`). With
    several instances another one takes a window's batch at once and it waits on the device (with no delay and
    several instances every arrival that finds one idle leaves alone: b = 1, the device an M/D/1 queue); with one,
    it waits in the queue for the instance and takes in what arrives meanwhile.

    A request's latency: its wait within the window (the first waits all of it: P(wait > w) = (1 + lambda
    (window - w)) / b), the device wait, and its batch's execution at the tail batch (1 + Poisson(lambda window)).
    The tails are added (a bound: the first of a window meets the device wait as often as any other)."""
    if (delay_ms <= 0.0 and instances == 1) or lam <= 0.0 or big <= 1:
        return None
    window_ms = min(delay_ms, (big - 1) / lam)
    # P(b = 1 + k), k = 0 .. B - 1: Poisson(lambda D) arrivals within the window, the last size taking the rest.
    sizes = _poisson_pmf(np.array([lam * delay_ms]), big - 1)[0]
    sizes[-1] = max(0.0, 1.0 - float(sizes[:-1].sum()))
    times = np.array([t(float(k)) for k in range(1, big + 1)])
    b = float(np.dot(sizes, np.arange(1, big + 1)))
    # E[G] = 1 / lambda + E[min(D, Gamma(B - 1))], and E[min(D, Gamma(B - 1))] = E[N] / lambda (the integral over
    # [0, D] of P(fewer than B - 1 arrivals by s)) = (b - 1) / lambda.
    if float(np.dot(sizes, times)) >= b / lam:
        return None
    theta = _lindley_root(sizes, times, lam, delay_ms)
    spread = math.sqrt(lam * window_ms)

    def at(percentile: float) -> float:
        q = max(1e-6, 1.0 - percentile / 100.0)
        z = NormalDist().inv_cdf(1.0 - q)
        own = max(0.0, window_ms - max(0.0, q * b - 1.0) / lam)
        device = math.log(1.0 / q) / theta
        # With one instance the batch waits in the queue for it and takes in what arrives meanwhile (with several,
        # the window's batch waits on the device, already formed, while another instance is free).
        grown = lam * device if instances == 1 else 0.0
        return own + device + t(min(float(big), max(1.0, b + grown + z * spread)))

    return at


def _lindley_root(sizes: npt.NDArray[np.float64], times: npt.NDArray[np.float64], lam: float, delay_ms: float) -> float:
    """The positive root theta of E[exp(theta S)] E[exp(-theta G)] = 1, S the execution time of a window's batch
    (`times` at the size probabilities `sizes`, sizes 1 .. B) and G = X + min(D, Gamma(B - 1)) the gap between
    batches (`_delay_window`; X ~ Exp(lambda), Gamma(B - 1) the time to B - 1 more arrivals):
    E[exp(-theta G)] = lambda / (lambda + theta) (e^(-theta D) P(Poisson(lambda D) <= B - 2)
    + (lambda / (lambda + theta))^(B - 1) P(Poisson((lambda + theta) D) >= B - 1)). The log of the left side is
    convex in theta, 0 at 0 with slope E[S] - E[G] < 0: bisect between 0 and a point where it is positive."""
    big = len(times)
    slow = float(sizes[:-1].sum())  # P(Poisson(lambda D) <= B - 2): the window closes on the delay
    log_sizes = np.log(np.maximum(sizes, 1e-300))

    def f(theta: float) -> float:
        r = lam / (lam + theta)
        fast = 1.0 - float(_poisson_pmf(np.array([(lam + theta) * delay_ms]), big - 2)[0].sum())
        laplace = r * (math.exp(-theta * delay_ms) * slow + r ** (big - 1) * max(0.0, fast))
        exponents = theta * times + log_sizes
        top = float(exponents.max())
        return top + math.log(float(np.exp(exponents - top).sum())) + math.log(max(laplace, 1e-300))

    lo, hi = 0.0, 1.0 / max(float(times[0]), 1e-9)
    while f(hi) <= 0.0 and hi < 1e9:
        hi *= 2.0
    while hi - lo > ROOT_TOLERANCE * hi:
        mid = (lo + hi) / 2
        if f(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def _overflow(
    t: ServiceTime, t_full: float, b: float, big: int, lam: float, p_full: float, theta: float | None
) -> tuple[float, float, float]:
    """(Share of requests that find B queued ahead of them when the device frees, the execution time of the
    batch they go in, how long before the device frees they arrived.) A batch is full with probability `p_full`;
    the queue past B then decays as the walk of full batches does (`theta`, its `_cramer_root`): a geometric count,
    P(N - B >= k | full) = e^(-theta k), so E[N - B | full] = 1 / (e^theta - 1), and the share of requests left
    over is p_full times that over the mean batch. They are the last to arrive, within the last
    E[N - B | full] / lambda ms of the batch in flight. Their own batch holds that excess and what arrives during
    the full batch ahead of it."""
    # One at a time, the queue ahead (`_queue_tail`) is the whole wait; without a root, no queue past B.
    if p_full <= 0.0 or big <= 1 or theta is None:
        return 0.0, 0.0, 0.0
    excess = 1.0 / math.expm1(theta)
    share = min(1.0, p_full * excess / max(b, 1.0))
    size = min(float(big), max(1.0, excess + lam * t_full))
    return share, t(size), excess / lam


def _wait_tail(q: float, util: float, t_hi: float, overflow: tuple[float, float, float]) -> float:
    """The wait before a request's own batch at the 1-q tail. The device is busy with probability `util`, the
    residual of the batch in flight uniform over `t_hi`. A share o of requests (`_overflow`: share, the full
    batch's time t_B they wait for besides, the span s of their residual) wait t_B plus a residual uniform over s:
    P(wait > w) = util ((1 - o) P(R > w) + o P(R_s > w - t_B)), solved for w."""
    if util <= q:
        return 0.0
    share, t_full, span = overflow
    if share <= 0.0:
        return t_hi * max(0.0, 1.0 - q / util)
    span = max(1e-9, min(span, t_hi))

    def over(w: float) -> float:
        below = min(1.0, max(0.0, 1.0 - w / t_hi))
        above = min(1.0, max(0.0, 1.0 - (w - t_full) / span))
        return util * ((1.0 - share) * below + share * above)

    # `over` is piecewise linear and falls from util at 0 to 0 past the last breakpoint: find the piece where it
    # crosses q and interpolate (exact).
    points = sorted({0.0, t_hi, t_full, t_full + span})
    for lo, hi in itertools.pairwise(points):
        p_lo, p_hi = over(lo), over(hi)
        if p_hi <= q < p_lo:
            return lo + (hi - lo) * (p_lo - q) / (p_lo - p_hi)
    return 0.0


def _queue_tail(theta: float | None, q: float) -> float:
    """Requests queued at the 1-q tail when full batches of B leave while Poisson(a) arrive: P(queue > n) <=
    exp(-theta n), theta the positive root of a (e^theta - 1) = B theta (`_cramer_root`: Kingman's exponential
    bound for the walk's Cramer root). Full batches that do not keep up (a superlinear curve whose
    batches settle well below B) make no such queue: were they reached, batches would run away, and `settle`
    found that out of reach within the hour."""
    if theta is None or q >= 1.0:
        return 0.0  # a root past THETA_MAX: under a request's worth queued at any tail asked
    return math.log(1.0 / q) / theta


def _cramer_root(a: float, big: int) -> float | None:
    """The positive root theta of a (e^theta - 1) = B theta (None where full batches do not keep up, a >= B, or
    the root lies past THETA_MAX)."""
    if a >= big or a * math.expm1(THETA_MAX) <= big * THETA_MAX:
        return None
    # Newton from the heavy-traffic root 2 (B - a) / a, which lies above the true one (the function is convex).
    theta = min(THETA_MAX, 2.0 * (big - a) / a)
    for _ in range(60):
        step = (a * math.expm1(theta) - big * theta) / (a * math.exp(theta) - big)
        theta -= step
        if abs(step) <= 1e-9 * theta:
            break
    return theta


def max_rate(
    t: ServiceTime,
    max_batch: int,
    delay_us: float,
    instances: int,
    aim_ms: float,
    percentile: float = 99.0,
    capacity_rps: float | None = None,
    known: dict[float, float] | None = None,
) -> float:
    """Largest rate (req/s) one replica serves with the predicted latency within `aim_ms` (0 if none).

    `known` (rate -> predicted percentile in ms) keeps the predictions of earlier calls for the same config and
    curve at another aim: the bisection's midpoints depend on the capacity alone, so two aims share the first
    steps of their search and the answer is the same as without it."""
    cap = capacity(t, max_batch, delay_us) if capacity_rps is None else capacity_rps
    memo: dict[float, float] = {} if known is None else known

    def ok(rate: float) -> bool:
        p_ms = memo.get(rate)
        if p_ms is None:
            p_ms = memo[rate] = predict(t, max_batch, delay_us, instances, rate, percentile, cap).p_ms
        return p_ms <= aim_ms

    if cap <= 0 or not ok(1e-3 * cap):
        return 0.0
    return _largest(ok, 1e-3 * cap, cap, RATE_TOLERANCE * cap)


def _largest(ok: Callable[[float], bool], lo: float, hi: float, tolerance: float) -> float:
    """The largest x in [lo, hi] with ok(x), for ok true at lo and monotone (bisection to `tolerance`)."""
    for _ in range(60):
        if hi - lo < tolerance:
            break
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def chained(max_batch: int, delay_us: float, instances: int) -> bool:
    """Whether `share_within` takes this config's share from the queue-length chain (below its capacity): the
    model whose error stays within a tenth of the demand (the normal spread's runs to a half)."""
    return instances == 1 and delay_us <= 0 and max(1, max_batch) <= FULL_CHAIN_MAX


def share_within(
    t: ServiceTime,
    max_batch: int,
    delay_us: float,
    instances: int,
    rate_rps: float,
    slo_ms: float,
    capacity_rps: float | None = None,
) -> float:
    """Predicted share of requests answered within `slo_ms` at `rate_rps`. One instance without a queue delay:
    from the batcher's queue-length chain (`_chain_share`). Otherwise, or where full batches do not keep up
    (batches that settle below them only for a while): the highest percentile the model keeps within it (0 when
    the load exceeds capacity or not even the median fits)."""
    cap = capacity(t, max_batch, delay_us) if capacity_rps is None else capacity_rps
    if chained(max_batch, delay_us, instances) and 0 < rate_rps < cap:
        from_chain = _chain_share(t, max(1, max_batch), rate_rps / 1000.0, slo_ms)
        if from_chain is not None:
            return min(0.9999, from_chain)
    at = _at_load(t, max_batch, delay_us, instances, rate_rps, cap)[0]

    def ok(pct: float) -> bool:
        return at(pct) <= slo_ms

    if not ok(50.0):
        return 0.0
    if ok(99.99):
        return 0.9999
    return _largest(ok, 50.0, 99.99, 0.01) / 100.0


def _chain_share(t: ServiceTime, big: int, lam: float, slo_ms: float) -> float | None:
    """Share of requests answered within `slo_ms` by one instance with no queue delay, from the chain of queue
    lengths at the moments the device frees (None where full batches do not keep up: the chain has no steady
    state). The normal spread of `_at_load` misses how batches past the plateau's edge feed on themselves (a
    big batch takes long, so the next one is big too); the chain carries that.

    From n queued, the device takes b = min(n, B) (an idle device takes the next arrival alone, at once), and
    Poisson(lambda t(b)) arrive while it runs. An arrival waits the uniform residual of the batch in flight, the
    full batches ahead of it (t(B) each), and its own batch: what has queued by then, up to B."""
    sizes = np.arange(1, big + 1, dtype=np.float64)
    times = np.array([t(float(b)) for b in sizes])
    t_full = float(times[-1])
    if lam * t_full >= big:
        return None
    states = min(CHAIN_STATES_MAX, 2 * big + math.ceil(_queue_tail(_cramer_root(lam * t_full, big), 1e-7)) + 20)
    n = np.arange(states + 1)
    batch = np.where(n == 0, 1, np.minimum(n, big))
    t_batch = times[batch - 1]
    left = np.where(n == 0, 0, n - batch)  # queued behind the batch taken
    mean = lam * t_batch
    top = int(mean.max() + 8.0 * math.sqrt(mean.max()) + 10)
    a = np.arange(top + 1)
    pmf = _poisson_pmf(mean, top)
    pmf[:, -1] += np.maximum(0.0, 1.0 - pmf.sum(axis=1))
    queued = left[:, None] + a[None, :]
    step = np.zeros((states + 1, states + 1))
    np.add.at(step, (np.repeat(n, top + 1), np.minimum(queued, states).ravel()), pmf.ravel())
    # The steady state: pi (P - I) = 0, sum pi = 1.
    system = step.T - np.eye(states + 1)
    system[-1, :] = 1.0
    rhs = np.zeros(states + 1)
    rhs[-1] = 1.0
    try:
        pi = np.linalg.solve(system, rhs)
    except np.linalg.LinAlgError:
        return None
    pi = np.maximum(pi, 0.0)
    if not np.isfinite(pi).all() or pi.sum() <= 0:
        return None
    pi /= pi.sum()
    # The arrivals during a batch take the places left .. left + A - 1 in the queue; a place in [m B, (m+1) B)
    # waits m full batches, then its own.
    within = np.zeros_like(pmf)
    for m in range(int(queued.max()) // big + 1):
        places = np.maximum(0, np.minimum(queued, (m + 1) * big) - np.maximum(left[:, None], m * big))
        if not places.any():
            continue
        own = np.clip(queued - m * big + lam * m * t_full, 1.0, float(big))
        spare = slo_ms - m * t_full - np.interp(own, sizes, times)
        within += places * np.clip(spare / t_batch[:, None], 0.0, 1.0)
    served = float(pi @ (pmf @ a)) + float(pi[0])
    good = float(pi @ (within * pmf).sum(axis=1)) + float(pi[0]) * float(times[0] <= slo_ms)
    return good / served if served > 0 else None
