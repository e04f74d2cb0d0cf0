"""Service-time curves: execution time of one batch on one device, by batch size."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class ServiceCurve(Protocol):
    """Execution time in ms of a batch of `batch` requests."""

    @property
    def name(self) -> str: ...

    def ms(self, batch: int) -> float: ...


@dataclass(frozen=True)
class LinearPower:
    """t(b) = a + c * b**p: a fixed cost per execution plus a (super)linear cost per request."""

    a_ms: float = 2.0
    c_ms: float = 0.4
    p: float = 1.3

    @property
    def name(self) -> str:
        """Short name, e.g. linear-power(2,0.4,1.3)."""
        return f"linear-power({self.a_ms:g},{self.c_ms:g},{self.p:g})"

    def ms(self, batch: int) -> float:
        """Execution time in ms."""
        return float(self.a_ms + self.c_ms * float(batch) ** self.p)


@dataclass(frozen=True)
class TableCurve:
    """Measured points, interpolated (and extrapolated) linearly in log-log space."""

    label: str
    points: tuple[tuple[int, float], ...]

    @property
    def name(self) -> str:
        """The table's label."""
        return self.label

    def ms(self, batch: int) -> float:
        """Execution time in ms."""
        if batch <= self.points[0][0]:
            return self.points[0][1]
        (b0, t0), (b1, t1) = _segment(self.points, batch)
        slope = math.log(t1 / t0) / math.log(b1 / b0)
        return t0 * math.exp(slope * math.log(batch / b0))


@dataclass(frozen=True)
class PiecewiseCurve:
    """A measured curve: linear between points, flat below the first; the last point is the engine's max."""

    points: tuple[tuple[int, float], ...]
    label: str = "curve"

    @property
    def name(self) -> str:
        """The curve's label."""
        return self.label

    @property
    def engine_max(self) -> int:
        """Largest batch the curve (the engine profile) covers."""
        return self.points[-1][0]

    def ms(self, batch: int) -> float:
        """Execution time in ms (linear past the last point along the last segment)."""
        if batch <= self.points[0][0]:
            return self.points[0][1]
        (b0, t0), (b1, t1) = _segment(self.points, batch)
        return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)


def _segment(pts: tuple[tuple[int, float], ...], batch: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """The two measured points around `batch` (the last two past the last point)."""
    k = next((i for i in range(1, len(pts)) if batch <= pts[i][0]), len(pts) - 1)
    return pts[k - 1], pts[k]


def linear_power(a_ms: float = 2.0, c_ms: float = 0.4, p: float = 1.3) -> LinearPower:
    """The curve of the emulated accelerator: t(b) = a + c * b**p (default 2 ms + 0.4 ms * b^1.3)."""
    return LinearPower(a_ms=a_ms, c_ms=c_ms, p=p)


def bert_base_l4() -> TableCurve:
    """Shaped like published BERT-base (seq 128, TensorRT fp16) figures on an L4.

    About 4 ms at batch 1, nearly flat to 8, then growing faster than the batch: the cost per request is
    lowest around 16-20.
    """
    return TableCurve(
        label="bert-base-l4",
        points=((1, 4.0), (2, 4.3), (4, 4.9), (8, 6.3), (16, 11.0), (32, 23.5), (64, 51.0), (128, 110.0)),
    )


CURVES = ("linear-power", "bert-base-l4")


def named_curve(name: str) -> ServiceCurve:
    """A curve by name: one of `CURVES`."""
    if name == "linear-power":
        return linear_power()
    if name == "bert-base-l4":
        return bert_base_l4()
    raise ValueError(f"unknown curve {name!r}; known: {', '.join(CURVES)}")
