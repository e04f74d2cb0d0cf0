"""Time the built engine at a ladder of batch sizes: the build's half of the service-time curve t(b).

The build Job runs on the serving GPU product, so these figures are the serving device's before the model is
ever served. Timing never fails a build: a size that cannot run ends the ladder with the sizes measured so far.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from tailtune.engine_builder.ladder import ladder as ladder
from tailtune.engine_builder.onnx_model import DYNAMIC, DimRanges

WARMUP_RUNS = 3
TIMED_RUNS = 20
# ms kept in the termination message (4096 bytes in all): a microsecond is below any batching decision.
MS_DECIMALS = 3
MIN_MS = 10**-MS_DECIMALS  # a faster batch is reported at this, never as 0 (a curve's times are > 0)

# (batch, ms): the median execution time of one batch of `batch` requests.
ServiceTime = tuple[tuple[int, float], ...]


def median_ms(run: Callable[[], None], *, warmup: int, runs: int, clock: Callable[[], float]) -> float:
    """Median wall time of `runs` calls of `run` in ms (seconds from `clock`), after `warmup` untimed calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(max(1, runs)):
        start = clock()
        run()
        times.append((clock() - start) * 1000.0)
    return statistics.median(times)


def input_shape(name: str, dims: Sequence[int], batch: int, dim_ranges: DimRanges) -> list[int]:
    """The shape one input is timed at: dim 0 is the batch, other dynamic dims take their opt (else 1). Pure."""
    shape = []
    for axis, size in enumerate(dims):
        if axis == 0:
            shape.append(batch)
        elif size == DYNAMIC or size < 0:
            shape.append(dim_ranges[(name, axis)][1] if (name, axis) in dim_ranges else 1)
        else:
            shape.append(size)
    return shape


def report_points(points: ServiceTime) -> list[dict[str, Any]]:
    """`serviceTime` of the metadata and termination message: `[{"batch": b, "ms": x}]`, ms rounded. Pure."""
    return [{"batch": b, "ms": max(round(ms, MS_DECIMALS), MIN_MS)} for b, ms in points]


def time_ladder(
    sizes: Sequence[int],
    prepare: Callable[[int], Callable[[], None]],
    *,
    warmup: int = WARMUP_RUNS,
    runs: int = TIMED_RUNS,
    clock: Callable[[], float],
    on_error: Callable[[int, Exception], None],
) -> ServiceTime:
    """Time `prepare(b)()` at each size; the first size that raises ends the ladder (reported to `on_error`)."""
    out: list[tuple[int, float]] = []
    for b in sizes:
        try:
            out.append((b, median_ms(prepare(b), warmup=warmup, runs=runs, clock=clock)))
        except Exception as exc:  # runtime errors come from pybind extension classes
            on_error(b, exc)
            break
    return tuple(out)
