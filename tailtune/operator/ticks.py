"""When each tuner ticks, and how the ticks due together read Prometheus: one read for the fleet.

Each InferenceService ticks on its own phase of its interval (`tick_phase`: its uid hashed), so the ticks of many
objects spread over the interval instead of all landing at once, and an object keeps its phase across restarts and
operator replicas. Its daemon runs one tick at a time and schedules the next from when the last one ended
(`seconds_to_next_tick`): a slow or failing Prometheus delays ticks, never stacks them.

A tick due registers its read with the process-wide `FleetReads` and awaits it; GATHER_SECONDS after the first
registration the reads gathered go out, one `tuner.fleet.FleetReader` read per Prometheus (URL and timeout), each in
its own thread, so a slow Prometheus holds up only the ticks that read it.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from tailtune.api import InferenceService
from tailtune.operator.tuning import LatencyRead, failed_read
from tailtune.tuner.fleet import FleetReader
from tailtune.tuner.prom import HttpPromClient, PromClient, ReadSpec, Signal, Target

# How long the first tick due waits for others to read with it: ticks due within a second of each other share one
# read (at 1,000 objects on a 30 s interval, about 33 a read), each delayed by at most this.
GATHER_SECONDS = 1.0
# The least time between two ticks of one object, as a share of its interval: a tick woken off its phase (the
# operator's start, a spec change) is not followed by another one moments later at its phase.
MIN_GAP_SHARE = 0.5


def tick_phase(key: str, interval: float) -> float:
    """The object's phase in its interval, seconds in [0, interval): its key (the uid) hashed, so many objects' phases
    cover the interval evenly and one object's is the same in every process."""
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return digest / 2**64 * interval


def seconds_to_next_tick(now: float, started: float, interval: float, phase: float) -> float:
    """Seconds from `now` (Unix time) to the object's next tick: the first instant on its phase (phase + k·interval)
    that is not before now and at least MIN_GAP_SHARE of an interval after the last tick started (`started`). A tick
    that ran past its next phase point waits for the one after: ticks are delayed, never stacked."""
    earliest = max(now, started + MIN_GAP_SHARE * interval)
    k = math.ceil((earliest - phase) / interval)
    return phase + k * interval - now


@dataclass(frozen=True)
class Source:
    """A Prometheus and the timeout of each of its queries (`spec.metrics`): the reads that share one go together."""

    url: str
    timeout_seconds: float


def read_request(isvc: InferenceService) -> tuple[Source, ReadSpec]:
    """Where and what one InferenceService's tuner reads (further targets and the breakdown included)."""
    spec = isvc.spec
    target = Target(namespace=isvc.metadata.namespace, name=isvc.metadata.name, model=isvc.model_name)
    read = ReadSpec(
        target,
        spec.slo.percentile,
        spec.slo.window_seconds,
        latency_query=spec.metrics.latency_query,
        other_percentiles=tuple(p for p, _ in spec.slo.other_targets()),
        breakdown=True,
    )
    return Source(spec.metrics.prometheus_url, spec.metrics.timeout_seconds), read


def _http_client(source: Source) -> PromClient:
    return HttpPromClient(source.url, source.timeout_seconds)


class FleetReads:
    """The tuner ticks' Prometheus reads, gathered: `read` awaits the read of the batch it joined."""

    def __init__(
        self, gather_seconds: float = GATHER_SECONDS, client: Callable[[Source], PromClient] = _http_client
    ) -> None:
        self._gather = gather_seconds
        self._client = client
        self._pending: dict[Source, list[tuple[ReadSpec, asyncio.Future[LatencyRead]]]] = {}
        self._batch: asyncio.Task[None] | None = None

    async def read(self, source: Source, spec: ReadSpec) -> LatencyRead:
        """This object's read of the window ending when its batch goes out (a failure is a problem, never raised)."""
        future: asyncio.Future[LatencyRead] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(source, []).append((spec, future))
        if self._batch is None:
            self._batch = asyncio.create_task(self._send_after_gather())
        return await future

    async def _send_after_gather(self) -> None:
        await asyncio.sleep(self._gather)
        batch, self._pending, self._batch = self._pending, {}, None
        await asyncio.gather(*(self._send(source, reads) for source, reads in batch.items()))

    async def _send(self, source: Source, reads: list[tuple[ReadSpec, asyncio.Future[LatencyRead]]]) -> None:
        now = datetime.now(UTC)
        specs = [spec for spec, _ in reads]
        try:
            outcomes = await asyncio.to_thread(self._read, source, specs, now)
        except Exception as exc:  # the read itself broke: every tick in it says so
            outcomes = [exc] * len(reads)
        for (_, future), outcome in zip(reads, outcomes, strict=True):
            if not future.done():  # a tick cancelled meanwhile (its object deleted) takes nothing
                read = LatencyRead(outcome, at=now) if isinstance(outcome, Signal) else failed_read(outcome, now)
                future.set_result(read)

    def _read(self, source: Source, specs: Sequence[ReadSpec], now: datetime) -> list[Signal | Exception]:
        return FleetReader(self._client(source)).read(specs, now)
