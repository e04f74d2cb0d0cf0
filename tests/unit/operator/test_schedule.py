"""The operator's one schedule for the fleet's work (`tailtune.operator.schedule`) and the work the handlers put on it:
one run in flight per object and kind, a slow run delays the next and never stacks it, a wake runs it now or right
after the run in flight, forgetting an object leaves its run at once; child events coalesce into one reconcile; the
build and serving checks back off; a deleted object's children are not followed by reads of it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Hashable
from typing import Any, cast

import pytest

from tailtune.operator import handlers
from tailtune.operator.reconcile import Outcome
from tailtune.operator.schedule import Schedule
from tailtune.operator.status import ENGINE_BUILD_RUNNING, ENGINE_READY
from tailtune.operator.watched import ChildVersions, PodIps, WriteEchoes


class FakeCluster:
    """The API client as `handlers.State` uses it, with nothing behind it; counts the reads of an owner."""

    def __init__(self) -> None:
        self.echoes, self.pod_ips, self.children = WriteEchoes(), PodIps(), ChildVersions()
        self.reads = 0

    def freshest(self, namespace: str, name: str, watched: dict[str, Any]) -> dict[str, Any]:
        return dict(watched)

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return None

    def drifted(self, kind: str, meta: dict[str, Any]) -> bool:
        return False

    def children_as_applied(self, namespace: str, name: str) -> bool:
        return True

    def saw_deployment(self, namespace: str, name: str, version: str | None) -> None:
        pass

    def saw_child(self, kind: str, meta: dict[str, Any], deleted: bool) -> None:
        pass


def new_state() -> handlers.State:
    """A State over the fake cluster (made inside the event loop that runs it)."""
    return handlers.State(cast(Any, FakeCluster()))


def body(name: str, uid: str, conditions: list[dict[str, str]] | None = None, **meta: Any) -> dict[str, Any]:
    """An InferenceService's body as the watch delivers it (only what the handlers look at)."""
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "1", **meta},
        "status": {"conditions": conditions or []},
    }


async def run_for(schedule: Schedule, seconds: float) -> None:
    """Run the schedule for `seconds`, then stop it."""
    task = asyncio.create_task(schedule.run())
    try:
        await asyncio.sleep(seconds)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_a_slow_run_delays_the_next_and_never_stacks_it() -> None:
    """Caught by design: a Prometheus read longer than the interval must not start a second tick beside the first."""
    starts: list[float] = []
    running = 0

    async def work(key: Hashable, kind: str) -> float:
        nonlocal running
        running += 1
        assert running == 1
        starts.append(time.monotonic())
        await asyncio.sleep(0.15)  # longer than the 0.05 s it asks between runs
        running -= 1
        return 0.05

    async def go() -> None:
        schedule = Schedule(work)
        schedule.at("a", "tick", 0.0)
        schedule.wake("a", "tick")  # woken before it ran: still one run
        await run_for(schedule, 0.7)

    asyncio.run(go())
    assert 3 <= len(starts) <= 4
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(starts))


def test_a_wake_while_it_runs_runs_it_again_right_after_and_forget_cancels_it() -> None:
    runs: list[str] = []
    cancelled = asyncio.Event

    async def go() -> None:
        gate = asyncio.Event()
        left = cancelled()

        async def work(key: Hashable, kind: str) -> float | None:
            runs.append(str(key))
            if len(runs) == 1:
                await gate.wait()
                return None  # not again unless woken
            if key == "b":
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    left.set()
                    raise
            return None

        schedule = Schedule(work)
        task = asyncio.create_task(schedule.run())
        schedule.at("a", "tick", 0.0)
        await asyncio.sleep(0.05)
        schedule.wake("a", "tick")  # a spec change while the tick runs
        gate.set()
        await asyncio.sleep(0.05)
        assert runs == ["a", "a"]  # right after the run in flight, once
        schedule.at("b", "tick", 0.0)
        await asyncio.sleep(0.05)
        assert schedule.running("b", "tick")
        start = time.monotonic()
        schedule.forget("b")  # deleted while its tick runs: left at once
        await asyncio.wait_for(left.wait(), 1.0)
        assert time.monotonic() - start < 0.5 and "b" not in schedule
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_an_object_at_rest_holds_no_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught: kopf's daemons and timers held ~16 tasks and ~60 coroutines per object at 1,000 objects (census)."""

    async def tick(state: Any, namespace: str, name: str) -> float:
        return 30.0

    monkeypatch.setattr(handlers, "tuner_tick", tick)
    monkeypatch.setenv(handlers.FAST_PATH_ENV, "0")

    async def go() -> int:
        state = new_state()
        for i in range(200):
            state.see(("ml", f"svc-{i}"), f"uid-{i}", body(f"svc-{i}", f"uid-{i}"))
            state.schedule.at(("ml", f"svc-{i}"), handlers.TICK, 0.0)
        before = len(asyncio.all_tasks())
        await run_for(state.schedule, 0.3)
        return len(asyncio.all_tasks()) - before

    assert asyncio.run(go()) <= 0


def test_child_events_coalesce_into_one_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught: each child event (a Job's and a Deployment's status move several times while 1,000 objects come up)
    ran its own reconcile inside kopf's handler, holding its body and context while it waited for the API client."""
    reconciles = 0

    async def counted(raw: dict[str, Any], cluster: object, now: object, *, force: bool = False) -> Outcome:
        nonlocal reconciles
        reconciles += 1
        await asyncio.sleep(0.05)
        return Outcome(None)

    monkeypatch.setattr(handlers, "reconcile", counted)
    monkeypatch.setenv(handlers.FAST_PATH_ENV, "0")

    async def go() -> None:
        state = new_state()
        memo = state.memo
        state.see(("ml", "svc"), "u", body("svc", "u"))
        owner = [{"kind": "InferenceService", "apiVersion": "tailtune.io/v1alpha1", "name": "svc"}]
        logger = cast(Any, type("L", (), {"debug": staticmethod(lambda *a: None)})())
        run = asyncio.create_task(state.schedule.run())
        for i in range(20):
            kind = "Job" if i % 2 else "Deployment"
            child = {"kind": kind, "metadata": {"name": f"c-{kind}", "namespace": "ml", "ownerReferences": owner,
                                                "resourceVersion": str(i)}}  # fmt: skip
            await handlers.child_changed(body=cast(Any, _Body(child)), type="MODIFIED", memo=memo, logger=logger)
        await asyncio.sleep(0.3)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run

    asyncio.run(go())
    assert 1 <= reconciles <= 2  # one for the burst (and at most one for events while it ran)


class _Body(dict[str, Any]):
    """kopf's Body as child_changed reads it: `.metadata` beside the mapping."""

    @property
    def metadata(self) -> Any:
        meta = self["metadata"]
        return type("M", (dict,), {"namespace": meta["namespace"]})(meta)


def test_the_build_check_backs_off_while_it_finds_the_same_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caught: 1,000 objects building at once were each checked every 10 s (a GET of the Job, a LIST of its pods and
    Events): the API server answered 504 and creation stalled."""

    async def same(raw: dict[str, Any], cluster: object, now: object, *, force: bool = False) -> Outcome:
        return Outcome(None)

    monkeypatch.setattr(handlers, "reconcile", same)

    async def go() -> list[float]:
        state = new_state()
        building = [{"type": ENGINE_READY, "status": "False", "reason": ENGINE_BUILD_RUNNING}]
        state.see(("ml", "svc"), "u", body("svc", "u", building))
        tracked = state.tracked[("ml", "svc")]
        return [cast(float, await handlers.check_work(state, ("ml", "svc"), tracked)) for _ in range(5)]

    delays = asyncio.run(go())
    assert delays[0] == handlers.BUILD_CHECK_SECONDS
    assert delays == sorted(delays) and delays[-1] == handlers.CHECK_MAX_SECONDS


def test_a_built_object_is_not_checked() -> None:
    async def go() -> float | None:
        state = new_state()
        state.see(("ml", "svc"), "u", body("svc", "u"))
        assert state.schedule.due(("ml", "svc"), handlers.CHECK) is None
        return await handlers.check_work(state, ("ml", "svc"), state.tracked[("ml", "svc")])

    assert asyncio.run(go()) is None


def test_a_deleted_objects_children_are_not_followed_by_reads_of_it() -> None:
    """Caught: once its tuner had stopped, each event of a child the garbage collector removed read the deleted owner
    (a GET each: 4 children per object)."""

    async def go() -> tuple[int, bool]:
        state = new_state()
        memo = state.memo
        state.see(("ml", "svc"), "u", body("svc", "u"))
        deleting = body("svc", "u", deletionTimestamp="2026-01-01T00:00:00Z")
        await handlers.isvc_seen(
            type="MODIFIED", namespace="ml", name="svc", uid="u", body=cast(Any, deleting), memo=memo
        )
        for _ in range(3):
            await handlers.run_reconcile(memo, "ml", "svc")
        return cast(FakeCluster, state.cluster).reads, ("ml", "svc") in state.schedule

    reads, scheduled = asyncio.run(go())
    assert reads == 0 and not scheduled


def test_an_object_relabelled_out_of_the_shard_is_forgotten() -> None:
    from tailtune.operator.shard import parse_shard_selector

    async def go() -> handlers.State:
        state = new_state()
        memo = {"tailtune": state, "shard": parse_shard_selector("tailtune.io/shard=a")}
        state.memo = memo
        mine = body("svc", "u", labels={"tailtune.io/shard": "a"})
        await handlers.isvc_seen(type=None, namespace="ml", name="svc", uid="u", body=cast(Any, mine), memo=memo)
        assert ("ml", "svc") in state.schedule
        theirs = body("svc", "u", labels={"tailtune.io/shard": "b"})
        await handlers.isvc_seen(
            type="MODIFIED", namespace="ml", name="svc", uid="u", body=cast(Any, theirs), memo=memo
        )
        return state

    state = asyncio.run(go())
    assert ("ml", "svc") not in state.schedule and ("ml", "svc") in state.foreign and not state.bodies


def test_a_pause_by_peering_starts_nothing_until_resumed() -> None:
    """Caught: kopf stops its daemons while a peer of higher priority runs (an HA standby); the schedule went on."""
    runs = 0

    async def work(key: Hashable, kind: str) -> float:
        nonlocal runs
        runs += 1
        return 0.01

    async def go() -> None:
        schedule = Schedule(work)
        peering = logging.getLogger(handlers.KOPF_PEERING_LOGGER)
        pause = handlers.PeeringPause(schedule)
        peering.addFilter(pause)
        level = peering.level
        peering.setLevel(logging.INFO)  # kopf.configure's level for the operator
        try:
            schedule.at("a", "tick", 0.0)
            task = asyncio.create_task(schedule.run())
            await asyncio.sleep(0.05)
            assert runs > 0
            peering.info("Pausing operations in favour of [Peer(...)].")
            await asyncio.sleep(0.02)
            paused_at = runs
            await asyncio.sleep(0.1)
            assert runs == paused_at
            peering.info("Resuming operations after the pause. Conflicting operators with the same priority are gone.")
            await asyncio.sleep(0.05)
            assert runs > paused_at
            task.cancel()
        finally:
            peering.removeFilter(pause)
            peering.setLevel(level)

    asyncio.run(go())
