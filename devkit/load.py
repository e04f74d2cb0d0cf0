"""An open-loop Poisson load generator for KServe v2 HTTP, with a rate schedule, measuring client latency.

Open loop: arrivals follow the schedule whatever the server does (a slow server builds a queue, as real
users would), each request on its own keep-alive connection from a per-target pool, targets taken round
robin from a list the caller refreshes (the ready pods). Every request is recorded: send time, latency,
success. A request still unanswered after `timeout_s` counts as failed, and so does one refused because
`max_in_flight` requests are already out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Phase:
    """From `start_s` (seconds after the load starts) on, send `rate` requests per second."""

    start_s: float
    rate: float


def rate_at(phases: Sequence[Phase], t: float) -> float:
    """The scheduled rate at `t` (0 before the first phase)."""
    current = 0.0
    for p in sorted(phases, key=lambda p: p.start_s):
        if t >= p.start_s:
            current = p.rate
    return current


def infer_body(input_name: str, dims: Sequence[int]) -> bytes:
    """A KServe v2 JSON request of one sample (batch 1) of ones."""
    shape = [1, *dims]
    count = math.prod(dims)
    doc = {"inputs": [{"name": input_name, "shape": shape, "datatype": "FP32", "data": [1.0] * count}]}
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass
class Samples:
    """Per-request records, appended by the load thread, read by others (append-only lists)."""

    sent: list[float] = field(default_factory=list)  # seconds since the load started
    latency_ms: list[float] = field(default_factory=list)  # NaN when failed
    ok: list[bool] = field(default_factory=list)
    target: list[str] = field(default_factory=list)  # where it went ("" when it was not sent)

    def add(self, sent: float, latency_ms: float, ok: bool, target: str = "") -> None:
        # Appends under the GIL, the target first; readers take the shortest length.
        self.target.append(target)
        self.sent.append(sent)
        self.latency_ms.append(latency_ms)
        self.ok.append(ok)

    def snapshot(self) -> tuple[list[float], list[float], list[bool]]:
        n = min(len(self.sent), len(self.latency_ms), len(self.ok))
        return self.sent[:n], self.latency_ms[:n], self.ok[:n]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of `values`, None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class WindowStats:
    """Client-side view of the requests sent in one window."""

    start_s: float
    end_s: float
    sent: int
    succeeded: int
    failed: int
    p99_ms: float | None
    p50_ms: float | None

    @property
    def throughput_rps(self) -> float:
        """Successful requests per second of the window."""
        return self.succeeded / max(1e-9, self.end_s - self.start_s)


def window_stats(
    sent: Sequence[float], latency_ms: Sequence[float], ok: Sequence[bool], start_s: float, end_s: float
) -> WindowStats:
    """Stats of the requests sent in [start_s, end_s); a failed request counts as infinitely slow."""
    lat: list[float] = []
    failed = 0
    n = 0
    for s, latency, good in zip(sent, latency_ms, ok, strict=False):
        if start_s <= s < end_s:
            n += 1
            if good:
                lat.append(latency)
            else:
                failed += 1
    p99_rank = percentile([*lat, *([math.inf] * failed)], 99) if n else None
    return WindowStats(start_s, end_s, n, len(lat), failed, p99_rank, percentile(lat, 50))


class _Pool:
    """Idle keep-alive connections per target."""

    def __init__(self) -> None:
        self.idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def get(self, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        conns = self.idle.setdefault(target, [])
        while conns:
            reader, writer = conns.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
        host, port = target.rsplit(":", 1)
        return await asyncio.open_connection(host, int(port))

    def put(self, target: str, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.setdefault(target, []).append(conn)

    def close(self) -> None:
        for conns in self.idle.values():
            for _, writer in conns:
                writer.close()
        self.idle.clear()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bool]:
    """Send one request and read its response; returns (status, keep-alive)."""
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    length, keep = 0, True
    for line in lines[1:]:
        name, _, value = line.partition(":")
        lname = name.strip().lower()
        if lname == "content-length":
            length = int(value.strip())
        elif lname == "connection" and "close" in value.lower():
            keep = False
    if length:
        await reader.readexactly(length)
    return status, keep


class LoadGenerator:
    """Runs the schedule in its own thread and event loop; `targets()` gives the current `host:port` list."""

    def __init__(
        self,
        phases: Sequence[Phase],
        duration_s: float,
        targets: Callable[[], Sequence[str]],
        model: str,
        body: bytes,
        *,
        timeout_s: float = 10.0,
        max_in_flight: int = 1000,
        seed: int = 0,
    ) -> None:
        self.phases = list(phases)
        self.duration_s = duration_s
        self.targets = targets
        self.path = f"/v2/models/{model}/infer"
        self.body = body
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.random = random.Random(seed)
        self.samples = Samples()
        self.started_at: float | None = None  # time.monotonic() of the first arrival
        self.in_flight = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sending, from now."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sending and wait for the thread (in-flight requests are abandoned)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def elapsed(self) -> float:
        """Seconds since the load started (0 before)."""
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _request(self, target: str) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {target}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self.body)}\r\n\r\n"
        )
        return head.encode() + self.body

    async def _one(self, pool: _Pool, target: str, sent: float) -> None:
        t0 = time.monotonic()
        ok = False
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                conn = await pool.get(target)
                status, keep = await _exchange(*conn, self._request(target))
                ok = status == 200
                if keep:
                    pool.put(target, conn)
                    conn = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError, IndexError):
            ok = False
        finally:
            self.in_flight -= 1
            if conn is not None:
                conn[1].close()  # timed out or broken: the server must not keep a request for nobody
        latency = (time.monotonic() - t0) * 1000
        self.samples.add(sent, latency if ok else math.nan, ok, target)

    async def _run(self) -> None:
        pool = _Pool()
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        self.started_at = start
        next_t = 0.0
        turn = 0
        try:
            while not self._stop.is_set():
                rate = rate_at(self.phases, next_t)
                if next_t >= self.duration_s:
                    break
                if rate <= 0:
                    next_t += 0.1
                    continue
                next_t += self.random.expovariate(rate)
                delay = start + next_t - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                targets = self.targets()
                if not targets or self.in_flight >= self.max_in_flight:
                    self.samples.add(next_t, math.nan, False)  # nowhere to send, or too much outstanding
                    continue
                target = targets[turn % len(targets)]
                turn += 1
                self.in_flight += 1
                task = asyncio.create_task(self._one(pool, target, next_t))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait(tasks, timeout=self.timeout_s)
        finally:
            for task in tasks:
                task.cancel()
            pool.close()


class Buckets:
    """Per-second buckets of the samples (by send time), filled incrementally: cheap live windows."""

    def __init__(self) -> None:
        self.seen = 0
        self.latencies: dict[int, list[float]] = {}
        self.failures: dict[int, int] = {}
        self.completions: dict[int, int] = {}  # successes by the second they completed

    def update(self, samples: Samples) -> None:
        """Take the samples recorded since the last update."""
        sent, latency_ms, ok = samples.snapshot()
        for s, lat, good in zip(sent[self.seen :], latency_ms[self.seen :], ok[self.seen :], strict=True):
            second = int(s)
            if good:
                self.latencies.setdefault(second, []).append(lat)
                done = int(s + lat / 1000)
                self.completions[done] = self.completions.get(done, 0) + 1
            else:
                self.failures[second] = self.failures.get(second, 0) + 1
        self.seen = len(sent)

    def completed(self, start_s: int, end_s: int) -> int:
        """Successful requests that completed in the whole seconds [start_s, end_s)."""
        return sum(self.completions.get(sec, 0) for sec in range(start_s, end_s))

    def stats(self, start_s: int, end_s: int) -> WindowStats:
        """Stats of the requests sent in the whole seconds [start_s, end_s)."""
        lat = [x for sec in range(start_s, end_s) for x in self.latencies.get(sec, [])]
        failed = sum(self.failures.get(sec, 0) for sec in range(start_s, end_s))
        n = len(lat) + failed
        p99 = percentile([*lat, *([math.inf] * failed)], 99) if n else None
        return WindowStats(float(start_s), float(end_s), n, len(lat), failed, p99, percentile(lat, 50))
