"""A set of replicas behind a load balancer, observed the way Prometheus observes Triton."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import numpy as np

from tailtune.api.v1alpha1 import Batching
from tailtune.sim.arrivals import Times
from tailtune.sim.batcher import Replica
from tailtune.sim.curves import ServiceCurve

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)

Routing = Literal["round_robin", "random"]


@dataclass(frozen=True)
class WindowStats:
    """One window of the simulated replicas, measured the way Prometheus measures Triton.

    The fields of the tuner's `Observation` (`tailtune.offline.simobs` converts), so the tuner runs unchanged
    against the simulator; None where the window holds no request.
    """

    window_end: datetime
    span_seconds: float
    p_latency_ms: float | None = None
    request_rate: float | None = None
    queue_ms: float | None = None
    compute_ms: float | None = None
    avg_batch: float | None = None
    queue_growth_rps: float | None = None  # growth of the pending-request count, req/s
    # Completions plus queue growth over the window's last `tail_s` seconds (None when not asked).
    tail_demand_rps: float | None = None
    pending_max: float | None = None  # the most requests pending on one replica at the window's end
    ready_replicas: int | None = None
    sample_count: int | None = None
    # Per executed batch size: (size, executions, mean device ms), like Triton's batch statistics deltas.
    batch_stats: tuple[tuple[int, int, float], ...] = ()


@dataclass
class _Lease:
    """When one replica was asked for, was ready and was let go (inf while held): what it is paid for."""

    requested: float
    ready: float
    released: float = math.inf


class SimCluster:
    """Replicas (one device each) fed by one arrival trace, reconfigurable while it runs.

    Drive it forward with `advance(t)`, read windows with `observe`, change the config with `apply`.
    Times are seconds from the trace start; `clock(t)` maps them onto datetimes for the tuner.
    """

    def __init__(
        self,
        curve: ServiceCurve,
        arrivals: Times,
        batching: Batching,
        replicas: int = 1,
        *,
        instances: int = 1,
        max_queue_size: int = 0,
        queue_timeout: Callable[[Batching], float] | None = None,
        engine_max_batch: int = 128,
        routing: Routing = "round_robin",
        seed: int = 0,
        noise_sigma: float = 0.0,
        reload_pause_s: float = 0.05,
        startup_s: float = 30.0,
    ) -> None:
        top = max(engine_max_batch, batching.max_batch_size)
        self._exec_ms = [0.0] + [curve.ms(b) for b in range(1, top + 1)]
        self._arrivals = np.asarray(arrivals, dtype=np.float64)
        self._routed = 0
        self._rr = 0
        self._rng = np.random.default_rng(seed)
        self._instances = instances
        self._max_queue = max_queue_size
        # The queue timeout (s) each batching config carries (load shedding); None: no timeout.
        self._queue_timeout = queue_timeout
        self._noise = noise_sigma
        self._reload_pause_s = reload_pause_s
        self._startup_s = startup_s
        self._seed = seed
        self.routing: Routing = routing
        self.batching = batching
        self.now = 0.0
        self._all: list[Replica] = []
        self._leases: list[_Lease] = []  # one per replica of _all, in the same order
        self._active: list[Replica] = []
        for _ in range(replicas):
            self._add_replica(ready_at=0.0)

    def _add_replica(self, ready_at: float) -> None:
        rep = Replica(
            self._exec_ms,
            self.batching,
            instances=self._instances,
            max_queue_size=self._max_queue,
            queue_timeout_s=self._timeout_s(self.batching),
            ready_at=ready_at,
            reload_pause_s=self._reload_pause_s,
            noise_sigma=self._noise,
            rng=np.random.default_rng([self._seed, len(self._all)]),
        )
        self._all.append(rep)
        self._leases.append(_Lease(requested=self.now, ready=ready_at))
        self._active.append(rep)

    def _timeout_s(self, batching: Batching) -> float:
        return self._queue_timeout(batching) if self._queue_timeout is not None else 0.0

    @property
    def replicas(self) -> int:
        """Replicas receiving traffic or starting."""
        return len(self._active)

    def replica_seconds(self, until: float, *, ready_only: bool = False) -> float:
        """Replica-seconds paid over [0, until): each replica from its request (a starting pod holds its device)
        until it is let go; with `ready_only`, from when it was ready (a replica let go while starting adds 0)."""
        total = 0.0
        for lease in self._leases:
            start = lease.ready if ready_only else lease.requested
            total += max(0.0, min(lease.released, until) - start)
        return total

    def ready_replicas(self, t: float | None = None) -> int:
        """Replicas ready at time t (default: now)."""
        at = self.now if t is None else t
        return sum(1 for r in self._active if r.ready_at <= at)

    def pod_counts(self, t: float | None = None) -> tuple[tuple[int, int, int], ...]:
        """(replica index, pending, completed) of each replica ready at time t (default: now), as the fast path reads
        Triton's pending-request gauge and request counters on each ready pod."""
        at = self.now if t is None else t
        active = {id(rep) for rep in self._active}
        return tuple(
            (i, rep.pending(at), rep.completed(at) + rep.shed_between(0.0, at))
            for i, rep in enumerate(self._all)
            if id(rep) in active and rep.ready_at <= at
        )

    def pending_peak(self, replica: int, until: float) -> int:
        """The most requests pending on one replica (by the order they were asked for; 0: the first) before
        `until`."""
        return self._all[replica].pending_peak(until) if replica < len(self._all) else 0

    def clock(self, t: float) -> datetime:
        """The datetime of simulated second t."""
        return EPOCH + timedelta(seconds=t)

    def advance(self, t: float) -> None:
        """Route the arrivals before t and run every replica until t."""
        if t <= self.now:
            return
        cuts = sorted({r.ready_at for r in self._active if self.now < r.ready_at < t} | {t})
        start = self.now
        for cut in cuts:
            end_idx = int(np.searchsorted(self._arrivals, cut, side="left"))
            chunk = self._arrivals[self._routed : end_idx]
            self._routed = end_idx
            ready = [r for r in self._active if r.ready_at <= start] or self._active
            self._route(chunk, ready)
            start = cut
        for rep in self._all:
            rep.run_until(t)
        self.now = t

    def _route(self, chunk: Times, ready: list[Replica]) -> None:
        n = len(ready)
        if len(chunk) == 0:
            return
        if n == 1:
            ready[0].add_arrivals(chunk)
            return
        if self.routing == "random":
            target = self._rng.integers(0, n, len(chunk))
        else:
            target = (np.arange(len(chunk)) + self._rr) % n
            self._rr = (self._rr + len(chunk)) % n
        for i, rep in enumerate(ready):
            rep.add_arrivals(chunk[target == i])

    def apply(self, batching: Batching, replicas: int) -> None:
        """Reload the batching config in every pod and scale to `replicas`, now."""
        if batching != self.batching:
            self.batching = batching
            for rep in self._all:
                rep.set_batching(batching, self.now, self._timeout_s(batching))
        while len(self._active) < replicas:
            self._add_replica(ready_at=self.now + self._startup_s)
        while len(self._active) > max(1, replicas):
            # The newest goes first; it keeps draining what it queued (a graceful stop, counted as paid until now).
            gone = self._active.pop()
            self._leases[next(i for i, r in enumerate(self._all) if r is gone)].released = self.now

    def observe(
        self,
        window_s: float,
        percentile: float,
        span_s: float | None = None,
        stats_since: float | None = None,
        tail_s: float | None = None,
    ) -> WindowStats:
        """The window ending now, as the Prometheus reader reports it.

        Latency is the conservative aggregate (max over pods of each pod's percentile); rate, queue and
        compute times are per request over all pods; the batch is inferences / executions. Batch statistics
        cover [stats_since, now) (the previous read), else the window. The tail demand is completions plus queue
        growth over the last `tail_s` seconds.
        """
        span = max(window_s, span_s or 0.0)
        end = self.now
        since = end - span if stats_since is None else stats_since
        per_size: dict[int, tuple[int, float]] = {}
        for rep in self._all:
            for size, (n, secs) in rep.batch_stats(since, end).items():
                n0, s0 = per_size.get(size, (0, 0.0))
                per_size[size] = (n0 + n, s0 + secs)
        batch_stats = tuple((b, n, 1000.0 * secs / n) for b, (n, secs) in sorted(per_size.items()))
        stats = [r.window(end - span, end) for r in self._all]
        count = sum(len(s.latency_s) for s in stats)
        ready = self.ready_replicas()
        # Each replica's queue at the window's end: its growth (here and over the tail) and the fullest one.
        pending = [r.pending(end) for r in self._all]
        growth = (sum(pending) - sum(r.pending(end - span) for r in self._all)) / span
        pending_max = float(max(pending, default=0))
        tail_demand = None
        if tail_s is not None:
            done = sum(len(r.window(end - tail_s, end).latency_s) for r in self._all)
            tail_demand = (done + sum(pending) - sum(r.pending(end - tail_s) for r in self._all)) / tail_s
        if count == 0:
            return WindowStats(
                window_end=self.clock(end),
                span_seconds=span,
                request_rate=0.0,
                tail_demand_rps=tail_demand,
                pending_max=pending_max,
                ready_replicas=ready,
                sample_count=0,
            )
        p = max(float(np.percentile(s.latency_s, percentile)) for s in stats if len(s.latency_s))
        queue = float(sum(s.queue_s.sum() for s in stats)) / count
        compute = float(sum(s.compute_s.sum() for s in stats)) / count
        executions = float(sum((1.0 / s.batch).sum() for s in stats))
        return WindowStats(
            window_end=self.clock(end),
            span_seconds=span,
            p_latency_ms=p * 1000,
            request_rate=count / span,
            queue_ms=queue * 1000,
            compute_ms=compute * 1000,
            avg_batch=count / executions,
            queue_growth_rps=growth,
            tail_demand_rps=tail_demand,
            pending_max=pending_max,
            ready_replicas=ready,
            sample_count=count,
            batch_stats=batch_stats,
        )

    def outcomes(self) -> tuple[Times, Times]:
        """(arrival, latency in s) of every request of the trace, sorted by arrival; inf = never served."""
        unrouted = self._arrivals[self._routed :]
        parts = [r.outcomes() for r in self._all]
        arr = np.concatenate([p[0] for p in parts] + [unrouted])
        lat = np.concatenate([p[1] for p in parts] + [np.full(len(unrouted), np.inf)])
        del parts  # a long trace holds hundreds of millions of requests: one copy at a time
        order = np.argsort(arr, kind="stable")
        return arr[order], lat[order]

    @property
    def rejected(self) -> int:
        """Requests rejected by full queues."""
        return sum(r.rejected for r in self._all)

    def shed(self) -> Times:
        """Arrival times of the requests the queue timeout rejected (load shedding), sorted."""
        return np.sort(np.concatenate([r.shed() for r in self._all] + [np.empty(0)]))
