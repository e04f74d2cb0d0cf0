"""The operator's per-object work at rest, offline: where CPU and memory go per object and per tick.

    .venv/bin/python bench/scale/tick_profile.py [--count 300] [--ticks 4] [--profile] [--top 25]

No cluster and no Prometheus: N InferenceServices (bench_scale's, each reconciled once by the real `reconcile` against
an in-memory API server that answers what a served object's children look like: the build Job succeeded, the Triton
Deployment has one ready pod) are ticked by the operator's own `handlers.tuner_tick`, with the fleet read answered by
a fixed steady window (p99 within the SLO, a steady rate: what the synthetic exporter of fleet_tuning.py serves). The
surge fast path's per-check work at rest (its check every CHECK_SECONDS, the pods silent as on kwok) runs as often as
it does in an interval. The API server here is a hand-written stand-in (it keeps bodies, counts requests); everything
the operator runs per object is the real code.

Reported: CPU milliseconds per object per tick (tick, and the fast path's checks of one interval), the Python heap
per object (tracemalloc) after the ticks, and with --profile the functions that take the time (cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import gc
import pstats
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402

from tailtune.api.v1alpha1 import ObjectMeta  # noqa: E402
from tailtune.operator import handlers  # noqa: E402
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed  # noqa: E402
from tailtune.operator.reconcile import reconcile  # noqa: E402
from tailtune.operator.tuning import LatencyRead  # noqa: E402
from tailtune.operator.watched import PodIps, WriteEchoes  # noqa: E402
from tailtune.tuner.prom import Breakdown, ReadSpec, Signal  # noqa: E402
from tailtune.tuner.surge import CHECK_SECONDS  # noqa: E402
from tailtune.tuner.types import Observation  # noqa: E402

INTERVAL_S = 30  # spec.tuning.intervalSeconds' default, as fleet_tuning.py runs it


class Api:
    """A stand-in API server in memory: the bodies, our writes merged into them, and a count of requests."""

    def __init__(self) -> None:
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests = 0
        self.echoes = WriteEchoes()
        self.pod_ips = PodIps()
        self.version = 1

    def _bump(self, meta: ObjectMeta) -> dict[str, Any]:
        body = self.bodies[(meta.namespace, meta.name)]
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.requests += 1
        return body

    async def observe(self, isvc: Any, job_name: str, *, job_report: bool = True, pod_ips: bool = False) -> Observed:
        self.requests += 2
        dep = DeploymentObservation(replicas=1, ready_replicas=1, ready_pod_ips=("10.0.0.1",))
        return Observed(job=JobObservation(succeeded=True), deployment=dep)

    async def apply(self, manifest: Any) -> None:
        self.requests += 1

    async def write_status(self, meta: ObjectMeta, status: Any) -> None:
        self._bump(meta)["status"] = status.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None:
        self.requests += 1

    async def delete_obsolete_jobs(self, isvc: Any, keep: str) -> list[str]:
        self.requests += 1
        return []

    async def ready_pod_ips(self, isvc: Any) -> tuple[str, ...]:
        return ()  # no Triton to read batch statistics from (kwok's pods run none either)

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None:
        self._bump(meta).setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)

    async def patch_latency(self, meta: ObjectMeta, latency: Any, conditions: Any = None) -> None:
        body = self._bump(meta)
        body.setdefault("status", {})["latency"] = latency.model_dump(by_alias=True, mode="json")
        if conditions is not None:
            body["status"]["conditions"] = [c.model_dump(by_alias=True, mode="json", exclude_none=True)
                                            for c in conditions]  # fmt: skip

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests += 1
        return copy.deepcopy(self.bodies.get((namespace, name)))

    def freshest(self, namespace: str, name: str, watched: Any) -> dict[str, Any]:
        return dict(watched)


class SteadyReads:
    """The fleet read, answered: every object's window at a steady rate with its P99 within the SLO."""

    def __init__(self) -> None:
        self.reads = 0

    async def read(self, source: Any, spec: ReadSpec) -> LatencyRead:
        self.reads += 1
        now = datetime.now(UTC)
        obs = Observation(
            window_end=now - timedelta(seconds=5),
            span_seconds=float(spec.window_seconds),
            p_latency_ms=20.0,
            request_rate=100.0,
            queue_ms=2.0,
            compute_ms=8.0,
            avg_batch=4.0,
            sample_count=6000,
            queue_growth_rps=0.0,
            tail_demand_rps=100.0,
            pending_max=1.0,
        )
        breakdown = Breakdown(queue_ms=2.0, input_ms=1.0, infer_ms=6.0, output_ms=1.0, request_ms=10.5)
        return LatencyRead(Signal(observation=obs, source="histogram", breakdown=breakdown), at=now)


async def setup(count: int) -> tuple[handlers.State, Api]:
    api = Api()
    state = handlers.State(cast(Any, api))
    state.reads = cast(Any, SteadyReads())
    now = datetime.now(UTC)
    for i in range(count):
        doc = bench_scale.isvc(i)
        doc["metadata"] |= {"uid": f"uid-{i:05d}", "resourceVersion": "1", "generation": 1}
        doc["spec"]["tuning"] = {"enabled": True, "intervalSeconds": INTERVAL_S}
        key = (doc["metadata"]["namespace"], doc["metadata"]["name"])
        api.bodies[key] = doc
        await reconcile(copy.deepcopy(doc), cast(Any, api), now)
        state.bodies[key] = doc  # the watched body (`State.see`): our writes land in it as the watch would show them
    return state, api


async def tick_all(state: handlers.State, api: Api) -> None:
    for key in list(api.bodies):
        await handlers.tuner_tick(state, *key)


def fast_checks(state: handlers.State, api: Api, checks: int) -> None:
    """The fast path's at-rest check of every object, `checks` times: its parse of kopf's body (pods silent)."""
    for _ in range(checks):
        for body in api.bodies.values():
            state.parsed(body)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--ticks", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="cProfile the ticks and the fast checks")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    tracemalloc.start()
    gc.collect()
    heap0 = tracemalloc.get_traced_memory()[0]
    state, api = await setup(args.count)
    await tick_all(state, api)  # the first tick writes the first status.latency and checkpoint
    gc.collect()
    heap1 = tracemalloc.get_traced_memory()[0]
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    bodies_bytes = sum(len(repr(b)) for b in api.bodies.values())
    requests0 = api.requests
    prof = cProfile.Profile() if args.profile else None
    checks = round(INTERVAL_S / CHECK_SECONDS)
    t0 = time.process_time()
    if prof:
        prof.enable()
    for _ in range(args.ticks):
        await tick_all(state, api)
    t1 = time.process_time()
    fast_checks(state, api, checks * args.ticks)
    t2 = time.process_time()
    if prof:
        prof.disable()
    n = args.count * args.ticks
    print(f"objects {args.count}, ticks each {args.ticks} (interval {INTERVAL_S} s)")
    print(f"tuner tick: {1000 * (t1 - t0) / n:.2f} CPU ms per object per tick")
    print(f"fast path at rest: {1000 * (t2 - t1) / n:.2f} CPU ms per object per interval ({checks} checks)")
    print(f"API requests at rest: {(api.requests - requests0) / n:.2f} per object per tick")
    print(f"Python heap: {(heap1 - heap0) / args.count / 1024:.1f} KiB per object "
          f"(the bodies' repr alone: {bodies_bytes / args.count / 1024:.1f} KiB)")  # fmt: skip
    for stat in snap.statistics("filename")[:8]:
        print(f"  {stat.size / args.count / 1024:7.1f} KiB/object  {stat.traceback}")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
