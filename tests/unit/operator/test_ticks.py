"""Tuner ticks: spread over the interval on a stable phase per object, one in flight per object, and the reads of
the ticks due together gathered into one fleet read per Prometheus."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import uuid
from datetime import datetime
from typing import Any

import pytest

from tailtune.operator import handlers
from tailtune.operator.status import PROMETHEUS_UNAVAILABLE
from tailtune.operator.ticks import (
    MIN_GAP_SHARE,
    FleetReads,
    Source,
    read_request,
    seconds_to_next_tick,
    tick_phase,
)
from tailtune.tuner.prom import PrometheusUnavailable, ReadSpec, Target
from tests.unit.factories import make_isvc
from tests.unit.operator.test_schedule import body, new_state, run_for

SOURCE = Source("http://prom:9090", 3.0)


def test_phases_cover_the_interval_evenly_and_each_object_keeps_its_own() -> None:
    rng = random.Random(41)
    uids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(3000)]
    phases = [tick_phase(uid, 30.0) for uid in uids]
    assert all(0 <= p < 30 for p in phases)
    bins = [0] * 10
    for p in phases:
        bins[int(p / 3)] += 1
    # 300 a bin when even: none beyond a quarter off (binomial spread is ~5 %)
    assert min(bins) > 225 and max(bins) < 375, bins
    # the same in every process and every call (a hash of the uid, not Python's salted hash)
    assert tick_phase(uids[0], 30.0) == tick_phase(uids[0], 30.0)
    assert tick_phase("5f0c6a4e-0000-4000-8000-000000000001", 30.0) == pytest.approx(
        tick_phase("5f0c6a4e-0000-4000-8000-000000000001", 60.0) / 2
    )


def test_the_next_tick_is_on_the_objects_phase() -> None:
    interval, phase = 30.0, 7.0
    base = 1_800_000_000.0 - (1_800_000_000.0 % interval) + phase  # a phase point
    # steady: a tick that started on its phase and took 2 s waits for the next phase point
    assert seconds_to_next_tick(base + 2, base, interval, phase) == pytest.approx(28)
    # a tick woken off its phase (start, spec change) just after a phase point: the next one, 27 s on
    assert seconds_to_next_tick(base + 3, base + 3, interval, phase) == pytest.approx(27)
    # ... just before one: not moments later, the one after (at least half an interval between two ticks)
    assert seconds_to_next_tick(base - 1, base - 1, interval, phase) == pytest.approx(31)


def test_a_tick_that_runs_past_its_next_phase_delays_the_next_never_stacks_it() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        interval = rng.choice((5.0, 30.0, 300.0))
        phase = rng.uniform(0, interval)
        started = rng.uniform(1.7e9, 1.8e9)
        now = started + rng.choice((0.0, rng.uniform(0, interval), rng.uniform(interval, 5 * interval)))
        delay = seconds_to_next_tick(now, started, interval, phase)
        at = now + delay
        assert delay >= 0  # after the tick that ran, never a catch-up burst of missed ones
        assert at - started >= MIN_GAP_SHARE * interval - 1e-6
        assert delay < interval + MIN_GAP_SHARE * interval + 1e-6
        k = (at - phase) / interval
        assert abs(k - round(k)) < 1e-6  # on the phase


class Answers:
    """A client per source: answers every query with no series after `delay` s, or raises; counts the calls."""

    def __init__(self, delay: float = 0.0, error: Exception | None = None, gate: threading.Event | None = None) -> None:
        self.delay, self.error, self.gate = delay, error, gate
        self.calls = 0
        self.clients = 0

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return []


def spec(i: int, **kw: Any) -> ReadSpec:
    return ReadSpec(Target(f"ns{i % 4}", f"svc{i}", f"m{i}"), 99, 60, **kw)


def reads(answers: dict[Source, Answers], gather: float = 0.05) -> FleetReads:
    def client(source: Source) -> Answers:
        answers[source].clients += 1
        return answers[source]

    return FleetReads(gather, client)


def test_ticks_due_together_share_one_read_whatever_their_number() -> None:
    async def run(n: int) -> tuple[int, int]:
        answers = {SOURCE: Answers()}
        fleet = reads(answers)
        got = await asyncio.gather(*(fleet.read(SOURCE, spec(i, breakdown=True)) for i in range(n)))
        assert all(r.signal is not None and r.problem == "" for r in got)
        return answers[SOURCE].clients, answers[SOURCE].calls

    assert asyncio.run(run(3)) == asyncio.run(run(30)) == (1, 16)


def test_a_read_registered_after_its_batch_left_goes_in_the_next() -> None:
    async def run() -> int:
        answers = {SOURCE: Answers()}
        fleet = reads(answers, gather=0.02)
        first = asyncio.ensure_future(fleet.read(SOURCE, spec(1)))
        await asyncio.sleep(0.1)
        second = await fleet.read(SOURCE, spec(2))
        assert (await first).signal is not None and second.signal is not None
        return answers[SOURCE].clients

    assert asyncio.run(run()) == 2


def test_a_slow_prometheus_holds_up_only_the_ticks_that_read_it() -> None:
    slow = Source("http://slow:9090", 3.0)
    gate = threading.Event()

    async def run() -> None:
        answers = {SOURCE: Answers(), slow: Answers(gate=gate)}
        fleet = reads(answers)
        stuck = asyncio.ensure_future(fleet.read(slow, spec(1)))
        fast = await asyncio.wait_for(fleet.read(SOURCE, spec(2)), 5)
        assert fast.signal is not None and not stuck.done()
        gate.set()
        assert (await asyncio.wait_for(stuck, 5)).signal is not None

    asyncio.run(run())


def test_a_failing_prometheus_is_every_ticks_problem_and_a_cancelled_tick_takes_nothing() -> None:
    down = PrometheusUnavailable("http://prom:9090", "refused", "connection refused")

    async def run() -> None:
        answers = {SOURCE: Answers(error=down)}
        fleet = reads(answers)
        gone = asyncio.ensure_future(fleet.read(SOURCE, spec(0)))
        waiting = [asyncio.ensure_future(fleet.read(SOURCE, spec(i))) for i in range(1, 4)]
        await asyncio.sleep(0)
        gone.cancel()  # its object deleted while the batch gathers
        got = await asyncio.gather(*waiting)
        assert answers[SOURCE].calls == 1  # one refused query for the batch
        for r in got:
            assert r.signal is None and r.problem == PROMETHEUS_UNAVAILABLE and "http://prom:9090" in r.message

    asyncio.run(run())


def test_an_objects_read_request_is_its_spec() -> None:
    isvc = (
        make_isvc()
        .set("spec.metrics", {"prometheusUrl": "http://p:9090", "timeoutSeconds": 2})
        .set("spec.slo", {"latencyMs": 50, "percentile": 95, "targets": [{"percentile": 50, "latencyMs": 10}]})
        .obj()
    )
    source, read = read_request(isvc)
    assert source == Source("http://p:9090", 2.0)
    assert read.target == Target(isvc.metadata.namespace, isvc.metadata.name, isvc.model_name)
    assert (read.percentile, read.other_percentiles, read.breakdown) == (95, (50,), True)


def test_the_schedule_ticks_on_its_phase_one_tick_at_a_time_even_when_ticks_run_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interval, uid = 0.3, "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    starts: list[float] = []
    running = 0

    async def slow_tick(state: Any, namespace: str, name: str) -> float:
        nonlocal running
        running += 1
        assert running == 1  # never two ticks of one object at once
        starts.append(time.time())
        # The first tick (the daemon's start, off its phase) is quick; the others run past the next phase point.
        await asyncio.sleep(0.01 if len(starts) == 1 else 0.35)
        running -= 1
        return interval

    monkeypatch.setattr(handlers, "tuner_tick", slow_tick)
    monkeypatch.setenv(handlers.FAST_PATH_ENV, "0")

    async def run() -> None:
        state = new_state()
        state.see(("ml", "svc"), uid, body("svc", uid))
        state.schedule.at(("ml", "svc"), handlers.TICK, 0.0)  # the first tick (the operator's start) off its phase
        await run_for(state.schedule, 1.3)

    asyncio.run(run())
    phase = tick_phase(uid, interval)
    assert len(starts) >= 3
    for before, after in itertools.pairwise(starts):
        assert after - before >= MIN_GAP_SHARE * interval - 0.01
        late = (after - phase) % interval
        assert late < 0.1 or late > interval - 0.005  # on the phase (a timer fires late on a busy machine, never early)
    # A 0.35 s tick on a 0.3 s interval: the next phase point after it (0.6 s on), never one right after another.
    assert all(after - before > interval + 0.1 for before, after in itertools.pairwise(starts[1:]))
