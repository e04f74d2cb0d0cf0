"""One schedule for the whole fleet: when each InferenceService's periodic work is next due.

kopf's model is a daemon or a timer per object per handler: at 1,000 objects the operator held ~16,000 tasks and
~60,000 coroutines of them (their waits, stoppers and loggers) and a live body per object (census with
bench/scale/traced_operator.py), and each timer woke on its own. Here one task keeps one heap of due times for every
object and every kind of work (the tuner's tick, the fast path's check, the drift resync, the build and serving
checks, a reconcile asked for by child events) and starts a task only for the work that is due: an object at rest
costs a few small records and no task.

Each (object, kind) has at most one due time and at most one run in flight: the run returns the seconds until its
next run (None: not again until woken), counted from when it ended, so a slow run delays the next, never stacks it.
`wake` makes a kind due now, or right after the run in flight; `forget` (the object deleted, or another shard's)
cancels its runs in flight and drops its due times.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)

Work = Callable[[Hashable, str], Awaitable[float | None]]


class _Slot:
    """One kind of work of one object: when it is next due, and its run in flight."""

    __slots__ = ("again", "task", "when")

    def __init__(self) -> None:
        self.when: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.again = False  # woken while it ran: due again as soon as it ends


class Schedule:
    """Due times of the fleet's work; `run` starts each piece of work when it is due (`work(key, kind)`)."""

    def __init__(self, work: Work, clock: Callable[[], float] = time.time) -> None:
        self._work = work
        self._clock = clock
        self._slots: dict[tuple[Hashable, str], _Slot] = {}
        self._kinds: dict[Hashable, set[str]] = {}
        self._heap: list[tuple[float, int, Hashable, str]] = []
        self._order = itertools.count()
        self._changed = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()

    def at(self, key: Hashable, kind: str, seconds: float) -> None:
        """`kind` of `key` due `seconds` from now (replacing any earlier due time; after the run in flight, if any)."""
        slot = self._slots.get((key, kind))
        if slot is None:
            slot = self._slots[(key, kind)] = _Slot()
            self._kinds.setdefault(key, set()).add(kind)
        when = self._clock() + max(0.0, seconds)
        slot.when = when
        if slot.task is not None:
            return  # the run in flight ends first; it takes this due time up then
        heapq.heappush(self._heap, (when, next(self._order), key, kind))
        if self._heap[0][0] == when:
            self._changed.set()

    def wake(self, key: Hashable, kind: str) -> None:
        """`kind` of `key` due now; when it is running, right after it ends."""
        slot = self._slots.get((key, kind))
        if slot is not None and slot.task is not None:
            slot.again = True
        else:
            self.at(key, kind, 0.0)

    def due(self, key: Hashable, kind: str) -> float | None:
        """When `kind` of `key` is next due (the clock's time), None when not scheduled or running."""
        slot = self._slots.get((key, kind))
        return None if slot is None or slot.task is not None else slot.when

    def running(self, key: Hashable, kind: str) -> bool:
        """Whether a run of `kind` of `key` is in flight."""
        slot = self._slots.get((key, kind))
        return slot is not None and slot.task is not None

    def forget(self, key: Hashable) -> None:
        """Drop everything of `key`: its due times, and its runs in flight (cancelled)."""
        for kind in self._kinds.pop(key, ()):
            slot = self._slots.pop((key, kind), None)
            if slot is not None and slot.task is not None:
                slot.task.cancel()

    def pause(self) -> None:
        """Start nothing until `resume` (runs in flight end on their own); due times are kept."""
        self._resumed.clear()

    def resume(self) -> None:
        """Start the work due again (what fell due meanwhile at once)."""
        self._resumed.set()
        self._changed.set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._kinds

    def __len__(self) -> int:
        return len(self._kinds)

    async def run(self) -> None:
        """Start the work due, then sleep until the next due time or a change of the schedule; forever."""
        while True:
            await self._resumed.wait()
            now = self._clock()
            while self._heap and self._heap[0][0] <= now:
                when, _, key, kind = heapq.heappop(self._heap)
                slot = self._slots.get((key, kind))
                if slot is None or slot.when != when or slot.task is not None:
                    continue  # replaced by another `at`, or forgotten
                slot.when = None
                slot.task = asyncio.create_task(self._run_one(key, kind, slot), name=f"tailtune-{kind}")
            self._changed.clear()
            wait = self._heap[0][0] - now if self._heap else None
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the inner result when a cancel meets a
            # wait that has just ended (cpython gh-86296), and a cancel swallowed here is a schedule that never
            # stops (a unit test hung for its whole 600 s timeout in CI).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._changed.wait()

    async def _run_one(self, key: Hashable, kind: str, slot: _Slot) -> None:
        seconds: float | None = None
        try:
            seconds = await self._work(key, kind)
        except asyncio.CancelledError:
            raise
        except Exception:  # the work's own errors are its to report; one that escapes never ends the schedule
            log.exception("%s of %s failed", kind, key)
        finally:
            slot.task = None
        if self._slots.get((key, kind)) is not slot:
            return  # forgotten while it ran
        # The next run: the earliest of what the run asked, a wake while it ran (now), and an `at` while it ran.
        asked = [] if seconds is None else [seconds]
        if slot.again:
            slot.again = False
            asked.append(0.0)
        if slot.when is not None:
            asked.append(slot.when - self._clock())
            slot.when = None
        if asked:
            self.at(key, kind, min(asked))
