"""The load generator extended to streaming: open-loop Poisson requests to a generative model over KServe v2 gRPC
streams (`tritonclient.grpc` `stream_infer`), measuring per request what a user feels.

Arrivals follow `devkit.load`'s rate schedule whatever the server does; prompt and output lengths come from
seeded distributions. Per request: TTFT, from the send to the first token's arrival; TPOT, (last token - first
token) / (tokens - 1), the mean gap after the first token, as AIPerf and genai-perf define it; and every gap
(inter-token latency). Requests go round robin over a few streams (each has one reader thread).
"""

from __future__ import annotations

import itertools
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from devkit.load import Phase, percentile, rate_at


@dataclass(frozen=True)
class Lengths:
    """Token lengths: log-normal around `median` with log-spread `sigma`, clipped to [low, high]."""

    median: int
    sigma: float = 0.0
    low: int = 1
    high: int = 1_000_000

    def sample(self, rng: random.Random) -> int:
        """One length."""
        value = round(self.median * math.exp(rng.gauss(0.0, self.sigma))) if self.sigma > 0 else self.median
        return max(self.low, min(self.high, value))


@dataclass
class StreamRecord:
    """One streamed request: when it was sent, its lengths, when each token arrived (monotonic s)."""

    key: str
    sent: float
    prompt_tokens: int
    output_tokens: int
    token_times: list[float] = field(default_factory=list)
    done: bool = False
    target: str = ""  # the gRPC address it was sent to (one pod)

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first token, ms."""
        return (self.token_times[0] - self.sent) * 1e3 if self.token_times else None

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first, ms (None with fewer than two tokens)."""
        t = self.token_times
        return (t[-1] - t[0]) * 1e3 / (len(t) - 1) if len(t) > 1 else None

    @property
    def gaps_ms(self) -> list[float]:
        """Every inter-token gap, ms."""
        t = self.token_times
        return [(b - a) * 1e3 for a, b in itertools.pairwise(t)]


@dataclass(frozen=True)
class StreamingStats:
    """The client's percentiles (nearest rank) over the requests that completed."""

    completed: int
    failed: int
    ttft_ms: dict[float, float]
    tpot_ms: dict[float, float]
    itl_ms: dict[float, float]
    output_tokens: int
    duration_s: float

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per second over the run."""
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


def _percentiles(values: list[float], qs: Sequence[float]) -> dict[float, float]:
    out: dict[float, float] = {}
    for q in qs:
        v = percentile(values, q)
        if v is not None:
            out[q] = v
    return out


def summarize(records: Sequence[StreamRecord], qs: Sequence[float] = (50, 90, 99)) -> StreamingStats:
    """Percentiles of TTFT, TPOT and inter-token gaps over the completed requests."""
    ok = [r for r in records if r.done and r.token_times]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    gaps = [g for r in ok for g in r.gaps_ms]
    start = min((r.sent for r in records), default=0.0)
    end = max((r.token_times[-1] for r in ok), default=start)
    return StreamingStats(
        completed=len(ok),
        failed=sum(1 for r in records if not r.done),
        ttft_ms=_percentiles(ttft, qs),
        tpot_ms=_percentiles(tpot, qs),
        itl_ms=_percentiles(gaps, qs),
        output_tokens=sum(len(r.token_times) for r in ok),
        duration_s=end - start,
    )


class StreamingLoad:
    """Open-loop Poisson streaming requests to one generative model; `run()` returns every request's record."""

    def __init__(
        self,
        grpc_url: str | Callable[[], Sequence[str]],
        model: str,
        phases: Sequence[Phase],
        duration_s: float,
        prompt: Lengths | Callable[[float], Lengths],
        output: Lengths,
        *,
        seed: int = 0,
        streams: int = 4,
        drain_timeout_s: float = 60.0,
    ) -> None:
        self.grpc_url = grpc_url
        self.model = model
        self.phases = list(phases)
        self.duration_s = duration_s
        self.prompt = prompt
        self.output = output
        self.rng = random.Random(seed)
        self.streams = streams
        self.drain_timeout_s = drain_timeout_s
        self.records: dict[str, StreamRecord] = {}
        self.errors: list[str] = []
        self._arrivals: queue.Queue[tuple[float, str, Any, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        self._sending = True
        self._closing = False
        self._stop = threading.Event()
        self.wall_offset = time.time() - time.monotonic()  # monotonic + offset = UNIX time
        self.started_at: float | None = None  # monotonic

    def _callback(self, result: Any, error: Any) -> None:
        now = time.monotonic()
        if error is not None:
            # tritonclient does not say which request an error answers: keep it; the request stays open (failed
            # when the drain times out).
            with self._lock:
                if not self._closing:  # stopping the streams cancels them: not the server's error
                    self.errors.append(str(error))
            return
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        with self._lock:
            record = self.records[response.id]
            if result.as_numpy("output_ids") is not None:
                record.token_times.append(now)
            if final:
                record.done = True
                self._check_done()

    def _check_done(self) -> None:
        if not self._sending and all(r.done for r in self.records.values()):
            self._all_done.set()

    def _inputs(self, prompt_tokens: int, output_tokens: int) -> list[grpcclient.InferInput]:
        ids = grpcclient.InferInput("input_ids", [prompt_tokens], "INT32")
        ids.set_data_from_numpy(np.ones(prompt_tokens, dtype=np.int32))
        out = grpcclient.InferInput("request_output_len", [1], "INT32")
        out.set_data_from_numpy(np.array([output_tokens], dtype=np.int32))
        return [ids, out]

    def _targets(self) -> list[str]:
        return [self.grpc_url] if isinstance(self.grpc_url, str) else list(self.grpc_url())

    def _prompt(self, t: float) -> Lengths:
        return self.prompt if isinstance(self.prompt, Lengths) else self.prompt(t)

    def run(self) -> list[StreamRecord]:
        """Send for `duration_s` on the schedule, wait for every stream to finish, return the records.

        With several targets (a callable, asked before each request), requests go round robin over them, each
        target with `streams` streams of its own, opened the first time it is used."""
        clients: dict[str, list[grpcclient.InferenceServerClient]] = {}

        def streams_of(url: str) -> list[grpcclient.InferenceServerClient]:
            if url not in clients:
                opened = []
                for _ in range(self.streams):
                    c = grpcclient.InferenceServerClient(url)
                    c.is_model_ready(self.model)  # connects the channel now, not inside the first request's TTFT
                    c.start_stream(callback=self._callback)
                    opened.append(c)
                clients[url] = opened
            return clients[url]

        for url in self._targets():
            streams_of(url)
        try:
            start = self.started_at = time.monotonic()
            t = 0.0
            n = 0
            while True:
                rate = rate_at(self.phases, t)
                t += self.rng.expovariate(rate) if rate > 0 else 0.1
                if t >= self.duration_s:
                    break
                pause = start + t - time.monotonic()
                if (pause > 0 and self._stop.wait(pause)) or self._stop.is_set():
                    break
                if rate <= 0:
                    continue
                targets = self._targets()
                if not targets:
                    continue
                key = str(n)
                prompt, output = self._prompt(t).sample(self.rng), self.output.sample(self.rng)
                inputs = self._inputs(prompt, output)
                url = targets[n % len(targets)]
                stream = streams_of(url)[(n // len(targets)) % self.streams]
                with self._lock:
                    self.records[key] = StreamRecord(key, time.monotonic(), prompt, output, target=url)
                stream.async_stream_infer(self.model, inputs, request_id=key, enable_empty_final_response=True)
                n += 1
            with self._lock:
                self._sending = False
                self._check_done()
            self._all_done.wait(self.drain_timeout_s)
        finally:
            with self._lock:
                self._closing = True
            for opened in clients.values():
                for c in opened:
                    c.stop_stream(cancel_requests=True)
                    c.close()
        return list(self.records.values())

    def stop(self) -> None:
        """End the sending early (before `duration_s`); `run()` then drains what is in flight and returns."""
        self._stop.set()

    def snapshot(self) -> list[StreamRecord]:
        """The records so far (copies: a running load goes on appending to its own)."""
        with self._lock:
            return [replace(r, token_times=list(r.token_times)) for r in self.records.values()]
