"""The service-time curve the tuner learns online from (mean batch, execution time) pairs. Pure.

The model is deliberately pessimistic where it has not seen data: below the smallest batch seen it assumes
that batch's time, and past the largest it assumes no further batching gain (time grows in proportion to
the batch). The law can then only move max_batch as far as data vouch for, and learns the rest by going
there when the load asks for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tailtune.tuner.types import CurvePoint

MAX_POINTS = 12
# Two points closer than this share (relative batch size) are one point.
MERGE_SHARE = 0.12
# Weight of a new sample when it merges into a known point.
EWMA_ALPHA = 0.5


def add_point(
    points: Sequence[CurvePoint], batch: float, ms: float, exact: bool = False
) -> tuple[CurvePoint, ...]:
    """Return the points with one more (batch, ms) sample merged in, sorted by batch.

    An exact sample replaces an inexact point nearby; an inexact one never moves an exact point; inexact
    points slower than an exact point at a larger batch are dropped (time grows with the batch).
    """
    if not (batch >= 1.0 and ms > 0.0):
        return tuple(points)
    merged = list(points)
    for i, p in enumerate(merged):
        if abs(p.batch - batch) <= MERGE_SHARE * max(p.batch, batch):
            if exact and not p.exact:
                merged[i] = CurvePoint(batch=batch, ms=ms, exact=True)
            elif exact == p.exact:
                merged[i] = CurvePoint(
                    batch=(1 - EWMA_ALPHA) * p.batch + EWMA_ALPHA * batch,
                    ms=(1 - EWMA_ALPHA) * p.ms + EWMA_ALPHA * ms,
                    exact=exact,
                )
            break
    else:
        merged.append(CurvePoint(batch=batch, ms=ms, exact=exact))
    merged.sort(key=lambda p: p.batch)
    merged = [
        p for p in merged if p.exact or not any(q.exact and q.batch > p.batch and q.ms < p.ms for q in merged)
    ]
    while len(merged) > MAX_POINTS:
        # Fold the closest pair (relative distance) into one point.
        i = min(range(len(merged) - 1), key=lambda k: merged[k + 1].batch / merged[k].batch)
        a, b = merged[i], merged[i + 1]
        merged[i : i + 2] = [
            CurvePoint(batch=(a.batch + b.batch) / 2, ms=(a.ms + b.ms) / 2, exact=a.exact and b.exact)
        ]
    return tuple(merged)


def predict_ms(points: Sequence[CurvePoint], batch: float) -> float | None:
    """Execution time of a batch, pessimistic outside the data; None with no data."""
    if not points:
        return None
    xs = [p.batch for p in points]
    ys: list[float] = []
    for p in points:
        # Execution time never shrinks with the batch: a noisy dip must not invite larger batches.
        ys.append(max(p.ms, ys[-1]) if ys else p.ms)
    if batch <= xs[0]:
        return ys[0]
    if batch >= xs[-1]:
        return ys[-1] * batch / xs[-1]
    for k in range(1, len(xs)):
        if batch <= xs[k]:
            w = (batch - xs[k - 1]) / (xs[k] - xs[k - 1])
            return ys[k - 1] + w * (ys[k] - ys[k - 1])
    return ys[-1]


def predict_trend_ms(points: Sequence[CurvePoint], batch: float) -> float | None:
    """Execution time with the last measured slope carried past the data (the pessimistic model within them).

    Less pessimistic than `predict_ms` where time still grows slower than the batch; a bet on the trend
    that the law takes only under pressure and only a bounded way past what it has run.
    """
    base = predict_ms(points, batch)
    if base is None or len(points) < 2 or batch <= points[-1].batch:
        return base
    xs = [p.batch for p in points]
    ys: list[float] = []
    for p in points:
        ys.append(max(p.ms, ys[-1]) if ys else p.ms)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return min(base, ys[-1] + slope * (batch - xs[-1]))


def largest_exact_batch(points: Sequence[CurvePoint]) -> float:
    """Largest batch with an exact point (0 without one)."""
    return max((p.batch for p in points if p.exact), default=0.0)
