"""The measured service-time curve t(b): execution time of one batch of b requests on one device. Pure.

Two sources, both measured on the serving GPU product:

- the build: the engine-build Job times the engine at a ladder of batch sizes (1, 2, 4, ... the profile's
  max) before it is ever served;
- live: Triton's statistics extension (`ModelStatistics.batch_stats`) gives, per executed batch size, a
  count and the compute nanoseconds; the tuner reads deltas between reads.

Live figures replace the build's where they have enough samples. Between measured sizes the curve is
interpolated linearly; it is never extrapolated past the largest measured size without saying so (the
prediction carries `extrapolated=True`), and then pessimistically: no further batching gain (time grows in
proportion to the batch). Below the smallest measured size it takes that size's time (never faster).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tailtune.engine_builder.ladder import ladder as ladder

Source = Literal["build", "live"]
# Samples a live size needs before it replaces the build's figure (the first call of a size is slow).
MIN_LIVE_SAMPLES = 5
# Live samples a point remembers: older windows fade so a drifting device is followed.
MEMORY_SAMPLES = 400
# Live sizes remembered: the tuner's state lives in an annotation (256 KiB for all of them, ~70 bytes a point),
# and an engine of max batch 4096 executes thousands of sizes.
MAX_LIVE_POINTS = 256


class CurvePoint(BaseModel):
    """One measured size: mean execution time of a batch of `batch` requests, from `samples` executions."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(ge=1)
    ms: float = Field(gt=0)
    samples: int = Field(default=1, ge=0)
    source: Source = "live"


class BatchSample(BaseModel):
    """What one read of Triton's batch statistics says about one size: executions and mean compute ms."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int
    count: int
    ms: float


@dataclass(frozen=True)
class Estimate:
    """t(b) with whether it lies past the largest measured size."""

    ms: float
    extrapolated: bool


def learn(points: Sequence[CurvePoint], samples: Iterable[BatchSample]) -> tuple[CurvePoint, ...]:
    """Merge one read of live batch statistics into the live points (sample-weighted, bounded memory: at most
    `MAX_LIVE_POINTS` sizes, those of this read first, by count, then the best-sampled of the others)."""
    by_size = {p.batch: p for p in points if p.source == "live"}
    seen: dict[int, int] = {}
    for s in samples:
        if s.count <= 0 or not s.ms > 0 or s.batch < 1:
            continue
        seen[s.batch] = seen.get(s.batch, 0) + s.count
        old = by_size.get(s.batch)
        if old is None:
            by_size[s.batch] = CurvePoint(batch=s.batch, ms=s.ms, samples=min(s.count, MEMORY_SAMPLES))
            continue
        kept = min(old.samples, MEMORY_SAMPLES - min(s.count, MEMORY_SAMPLES // 2))
        total = kept + s.count
        ms = (old.ms * kept + s.ms * s.count) / total
        by_size[s.batch] = CurvePoint(batch=s.batch, ms=ms, samples=min(total, MEMORY_SAMPLES))
    if len(by_size) > MAX_LIVE_POINTS:
        ranked = sorted(by_size.values(), key=lambda p: (-seen.get(p.batch, 0), -p.samples, p.batch))
        by_size = {p.batch: p for p in ranked[:MAX_LIVE_POINTS]}
    return tuple(sorted(by_size.values(), key=lambda p: p.batch))


def merged(build: Sequence[CurvePoint], live: Sequence[CurvePoint]) -> tuple[CurvePoint, ...]:
    """The curve to plan with: live points with enough samples replace the build's at their size."""
    out = {p.batch: p.model_copy(update={"source": "build"}) for p in build}
    for p in live:
        if p.samples >= MIN_LIVE_SAMPLES or p.batch not in out:
            out[p.batch] = p.model_copy(update={"source": "live"})
    return tuple(sorted(out.values(), key=lambda p: p.batch))


class Curve:
    """t(b) over measured points: monotone, interpolated, pessimistic and flagged past the data."""

    def __init__(self, points: Sequence[CurvePoint]) -> None:
        pts = sorted(points, key=lambda p: p.batch)
        self.sizes = [p.batch for p in pts]
        times: list[float] = []
        for p in pts:
            # Execution time never shrinks with the batch: a noisy dip must not invite larger batches.
            times.append(max(p.ms, times[-1]) if times else p.ms)
        self.times = times
        # The planner asks t(b) of the same few sizes millions of times a decision: answered once each.
        self._memo: dict[float, Estimate] = {}
        self._ms: dict[float, float] = {}

    def __bool__(self) -> bool:
        return bool(self.sizes)

    @property
    def largest(self) -> int:
        """Largest measured size (0 without data)."""
        return self.sizes[-1] if self.sizes else 0

    def estimate(self, batch: float) -> Estimate:
        """t(batch) in ms; raises ValueError without data."""
        known = self._memo.get(batch)
        if known is None:
            known = self._memo[batch] = self._estimate(batch)
        return known

    def _estimate(self, batch: float) -> Estimate:
        return Estimate(self._interpolate(batch), batch > self.sizes[-1])

    def _interpolate(self, batch: float) -> float:
        """t(batch): the first point below it, linear between points, proportional past the last (the pessimistic
        side: no batching gain assumed beyond the data); raises ValueError without data."""
        xs, ys = self.sizes, self.times
        if not xs:
            raise ValueError("no measured service time")
        if batch <= xs[0]:
            return ys[0]
        if batch > xs[-1]:
            return ys[-1] * batch / xs[-1]
        # The first measured size at or above the batch (live statistics can measure every size up to max batch).
        k = bisect.bisect_left(xs, batch)
        if xs[k] == batch:
            return ys[k]
        w = (batch - xs[k - 1]) / (xs[k] - xs[k - 1])
        return ys[k - 1] + w * (ys[k] - ys[k - 1])

    def ms(self, batch: float) -> float:
        """t(batch) in ms (the model's inner loops ask this at continuous sizes: kept apart from `estimate`'s
        records, a float each, without building a record)."""
        known = self._ms.get(batch)
        if known is None:
            known = self._ms[batch] = self._interpolate(batch)
        return known
