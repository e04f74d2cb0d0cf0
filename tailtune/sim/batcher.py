"""One Triton server (one pod, one device) with its dynamic batcher, simulated batch by batch.

Semantics, as in Triton's dynamic batch scheduler:

- when an instance is free, the batcher looks at the queue: with max_batch requests queued, a batch of
  max_batch goes at once; with a preferred size formable (largest preferred <= queued), that size goes at
  once; otherwise the batch waits until the oldest request has waited max_queue_delay (then everything
  queued, up to max_batch, goes) or until the queue reaches the next preferred size or max_batch;
- with delay 0 the oldest has always waited long enough: a free instance takes what is queued;
- with max_queue_size > 0, a request arriving to a full queue is rejected;
- with a queue timeout (Triton's `default_queue_policy`, timeout_action REJECT), the batcher, whenever it looks at
  the queue, rejects the requests that have waited longer than the timeout (queue time only: a dispatched request
  runs to its end); they are counted apart (`shed`);
- N instances pull batches independently but execute on one device, one batch at a time, in order
  (as on the emulated accelerator); Triton's compute time then includes the wait for the device;
- a config change (hot reload) applies to batches formed after it and pauses new batches briefly.

The loop steps from batch to batch (not request to request) over typed arrays (`array.array`), and hands
the readers numpy arrays (views of those, within one read).
"""

from __future__ import annotations

import array
import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tailtune.api.v1alpha1 import Batching

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class WindowStats:
    """Requests of one replica that completed within a window."""

    latency_s: Floats
    queue_s: Floats
    compute_s: Floats
    batch: Floats


def _view(items: array.array[float] | array.array[int], dtype: type[np.float64] | type[np.int64]) -> npt.NDArray[Any]:
    """A numpy view of a typed array, no copy. Hold it only within one read: the array cannot grow while a view
    of it lives (Python raises BufferError rather than move the memory under it)."""
    return np.frombuffer(items, dtype=dtype) if len(items) else np.empty(0, dtype=dtype)


class Replica:
    """One pod: a dynamic batcher, `instances` model instances and one device."""

    def __init__(
        self,
        exec_ms: Sequence[float],
        batching: Batching,
        *,
        instances: int = 1,
        max_queue_size: int = 0,
        queue_timeout_s: float = 0.0,
        ready_at: float = 0.0,
        reload_pause_s: float = 0.0,
        noise_sigma: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        self._exec_s = [m / 1000.0 for m in exec_ms]  # index = batch size; [0] unused
        self.batching = batching
        self.ready_at = ready_at
        self._max_queue = max_queue_size
        self._timeout_s = queue_timeout_s  # 0: none, as Triton's default_timeout_microseconds
        self._reload_pause_s = reload_pause_s
        self._noise_sigma = noise_sigma
        self._rng = rng or np.random.default_rng(0)
        self._noise: list[float] = []
        # Per-request and per-batch records are typed arrays (8 bytes an item, not a boxed Python number: a
        # recorded day of traffic is hundreds of millions of requests).
        self._arr = array.array("d")  # arrivals routed here, sorted
        self._scan = 0  # arrivals before this were admitted or rejected
        self._queue = array.array("q")  # admitted arrival indices, in order; [head:] still queued
        self._head = 0
        self._rejected: list[float] = []
        # Requests the queue timeout rejected: their arrivals, and when the batcher rejected them (both sorted).
        self._shed_arr = array.array("d")
        self._shed_at = array.array("d")
        # Per batch, in dispatch order (so completion times are sorted): size, dispatch, completion.
        self._b_size = array.array("q")
        self._b_start = array.array("d")
        self._b_fin = array.array("d")
        self._b_exec = array.array("d")  # device time of each batch (what Triton's batch statistics time)
        self._b_first = array.array("q", [0])  # requests dispatched before each batch (and after the last)
        self._instances = [ready_at] * instances
        self._device_free = ready_at
        self._cursor = ready_at
        self._paused_until = ready_at

    @property
    def executions(self) -> int:
        """Batches executed (or in flight) so far."""
        return len(self._b_size)

    def add_arrivals(self, times: Floats) -> None:
        """Route more arrivals here; all later than those already routed."""
        self._arr.frombytes(np.ascontiguousarray(times, dtype=np.float64).tobytes())

    def set_batching(self, batching: Batching, at: float, queue_timeout_s: float = 0.0) -> None:
        """Hot reload at time `at` (the replica must have run until `at`), with the queue timeout of the new config."""
        self.batching = batching
        self._timeout_s = queue_timeout_s
        self._paused_until = max(self._paused_until, at + self._reload_pause_s)

    def run_until(self, t_end: float) -> None:
        """Form and execute every batch that the batcher starts before t_end."""
        arr = self._arr
        n_arr = len(arr)
        queue = self._queue
        b = self.batching
        max_batch = b.max_batch_size
        preferred = sorted(b.preferred_batch_sizes)
        delay_s = b.max_queue_delay_microseconds / 1e6
        instances = self._instances
        while True:
            now = max(instances[0], self._cursor, self._paused_until)
            if now >= t_end:
                return
            self._admit(now)
            if self._timeout_s > 0:
                self._expire(now)
            queued = len(queue) - self._head
            if queued == 0:
                if self._scan >= n_arr or arr[self._scan] >= t_end:
                    self._cursor = now
                    return
                self._cursor = arr[self._scan]
                continue
            oldest = arr[queue[self._head]]
            if queued >= max_batch:
                size = max_batch
            elif now - oldest >= delay_s - 1e-12:
                size = queued
            else:
                formable = [p for p in preferred if p <= queued]
                if formable:
                    size = formable[-1]
                else:
                    goal = next((p for p in preferred if p > queued), max_batch)
                    idx = self._scan + goal - queued - 1
                    full_possible = self._max_queue == 0 or goal <= self._max_queue
                    reach = arr[idx] if idx < n_arr and full_possible else math.inf
                    wake = min(oldest + delay_s, reach)
                    if wake >= t_end:
                        self._cursor = now
                        return
                    self._cursor = wake
                    continue
            self._dispatch(now, size)

    def _admit(self, now: float) -> None:
        j = bisect.bisect_right(self._arr, now, self._scan)
        new = j - self._scan
        if new <= 0:
            return
        take = new
        if self._max_queue > 0:
            take = max(0, min(new, self._max_queue - (len(self._queue) - self._head)))
        self._queue.extend(range(self._scan, self._scan + take))
        if take < new:
            self._rejected.extend(self._arr[self._scan + take : j])
        self._scan = j

    def _expire(self, now: float) -> None:
        """Reject the queued requests that have waited past the queue timeout by `now` (the oldest first: a prefix
        of the queue). Only the queued tail of the array moves."""
        queue, head = self._queue, self._head
        late = bisect.bisect_left(queue, now - self._timeout_s, head, key=self._arr.__getitem__) - head
        if late <= 0:
            return
        self._shed_arr.extend(self._arr[i] for i in queue[head : head + late])
        self._shed_at.extend([now] * late)
        del queue[head : head + late]

    def _dispatch(self, now: float, size: int) -> None:
        self._head += size
        heapq.heappop(self._instances)
        start = max(now, self._device_free)
        exec_s = self._exec_s[size]
        if self._noise_sigma > 0:
            if not self._noise:
                self._noise = self._rng.lognormal(0.0, self._noise_sigma, 4096).tolist()
            exec_s *= self._noise.pop()
        fin = start + exec_s
        self._device_free = fin
        heapq.heappush(self._instances, fin)
        self._b_size.append(size)
        self._b_start.append(now)
        self._b_fin.append(fin)
        self._b_exec.append(exec_s)
        self._b_first.append(self._head)
        self._cursor = now

    def _requests(self, lo: int, hi: int) -> tuple[Floats, Floats, Floats, Floats]:
        """(arrival, dispatch, completion, batch size) of the requests in batches lo..hi-1."""
        arr = _view(self._arr, np.float64)
        queue = _view(self._queue, np.int64)
        sizes = _view(self._b_size, np.int64)[lo:hi]
        first = self._b_first[lo]
        n = self._b_first[hi] - first
        return (
            arr[queue[first : first + n]],
            np.repeat(_view(self._b_start, np.float64)[lo:hi], sizes),
            np.repeat(_view(self._b_fin, np.float64)[lo:hi], sizes),
            np.repeat(sizes, sizes).astype(np.float64),
        )

    def window(self, start: float, end: float) -> WindowStats:
        """Requests that completed in [start, end)."""
        fin = _view(self._b_fin, np.float64)
        lo = int(np.searchsorted(fin, start, side="left"))
        hi = int(np.searchsorted(fin, end, side="left"))
        arr, st, done, size = self._requests(lo, hi)
        return WindowStats(latency_s=done - arr, queue_s=st - arr, compute_s=done - st, batch=size)

    def batch_stats(self, start: float, end: float) -> dict[int, tuple[int, float]]:
        """Per batch size: executions that completed in [start, end) and their summed device seconds."""
        fin = _view(self._b_fin, np.float64)
        lo = int(np.searchsorted(fin, start, side="left"))
        hi = int(np.searchsorted(fin, end, side="left"))
        out: dict[int, tuple[int, float]] = {}
        for size, secs in zip(self._b_size[lo:hi], self._b_exec[lo:hi], strict=True):
            n, total = out.get(size, (0, 0.0))
            out[size] = (n + 1, total + secs)
        return out

    def outcomes(self) -> tuple[Floats, Floats]:
        """(arrival, latency) of every request routed here; inf when rejected or not finished."""
        everything = _view(self._arr, np.float64)
        queue = _view(self._queue, np.int64)
        served = everything[queue[: self._head]]
        latency = np.repeat(_view(self._b_fin, np.float64), _view(self._b_size, np.int64))
        latency -= served
        lost = np.concatenate(
            [
                everything[queue[self._head :]],
                everything[self._scan :],
                np.asarray(self._rejected),
                _view(self._shed_arr, np.float64),
            ]
        )
        return np.concatenate([served, lost]), np.concatenate([latency, np.full(len(lost), np.inf)])

    def pending(self, t: float) -> int:
        """Requests routed here by time t and not yet dispatched or rejected by then (t in the past)."""
        arrived = bisect.bisect_right(self._arr, t)
        batches = bisect.bisect_right(self._b_start, t)
        dispatched = self._b_first[batches]
        return arrived - dispatched - bisect.bisect_right(self._rejected, t) - bisect.bisect_right(self._shed_at, t)

    def pending_peak(self, until: float) -> int:
        """The most requests pending here at any instant before `until` (a queue peaks at an arrival)."""
        arr = _view(self._arr, np.float64)
        arr = arr[: int(np.searchsorted(arr, until, side="left"))]
        if len(arr) == 0:
            return 0
        dispatched = _view(self._b_first, np.int64)[np.searchsorted(_view(self._b_start, np.float64), arr, "right")]
        gone = np.searchsorted(np.asarray(self._rejected, dtype=np.float64), arr, "right") + np.searchsorted(
            _view(self._shed_at, np.float64), arr, "right"
        )
        return int(np.max(np.arange(1, len(arr) + 1) - dispatched - gone))

    def completed(self, t: float) -> int:
        """Requests whose batch finished by time t (t in the past), as Triton's success counter counts them."""
        return self._b_first[bisect.bisect_right(self._b_fin, t)]

    @property
    def rejected(self) -> int:
        """Requests rejected by a full queue so far."""
        return len(self._rejected)

    def shed(self) -> Floats:
        """Arrival times of the requests the queue timeout rejected so far, in order (a copy)."""
        return np.array(self._shed_arr, dtype=np.float64)

    def shed_between(self, start: float, end: float) -> int:
        """Requests the queue timeout rejected in [start, end) (as Triton's failure counter counts them)."""
        return bisect.bisect_left(self._shed_at, end) - bisect.bisect_left(self._shed_at, start)
