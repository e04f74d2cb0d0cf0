"""The surge fast path in the operator (`tailtune.operator.fastpath`): Triton's metrics page read over HTTP, and a
check that scales out at once with its Event, or writes nothing."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION, TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService, ObjectMeta
from tailtune.operator.fastpath import SILENT_RETRY_SECONDS, SurgeWatch, fast_check, read_pods
from tailtune.operator.inforce import tuner_state_annotation
from tailtune.operator.observed import DeploymentObservation, Observed
from tailtune.tuner.loop import FastPath
from tailtune.tuner.servicetime import CurvePoint
from tailtune.tuner.surge import SURGE_SCALE_OUT, PodReading
from tailtune.tuner.types import InForce, TunerState
from tests.unit.factories import make_isvc

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
# A page as Triton 2.51 exports it (trimmed): two versions of the model, and another model.
PAGE = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="demo",version="1"} 1200
nv_inference_request_success{model="demo",version="2"} 30
nv_inference_request_success{model="other",version="1"} 99999
nv_inference_request_failure{model="demo",reason="REJECTED",version="1"} 4
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="demo",version="1"} 57
nv_inference_pending_request_count{model="other",version="1"} 500
"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def metrics_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_read_pods_reads_the_models_pending_gauge_and_counters_over_http(metrics_port: int) -> None:
    """The model's pending gauge and its successes plus failures, summed over versions, other models left out; a pod
    that does not answer is left out of the check (caught: another model's queue read as this one's)."""
    reads = read_pods(["127.0.0.1", "127.0.0.9"], "demo", NOW, port=metrics_port)
    assert reads == (PodReading(pod="127.0.0.1", at=NOW, pending=57.0, completed=1234.0),)


class FakeCluster:
    """Records the fast check's writes."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.events: list[tuple[str, str, str]] = []

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None:
        self.annotations.update(annotations)

    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def _isvc(enabled: bool = True) -> InferenceService:
    # t(b) = 2 + 0.4 b^1.3 ms measured live: max batch 8 serves ~1000 req/s; the SLO 40 ms holds 40 of them queued.
    live = tuple(CurvePoint(batch=b, ms=2.0 + 0.4 * b**1.3, samples=100) for b in (1, 2, 4, 8, 16))
    state = tuner_state_annotation(TunerState(live=live))[TUNER_STATE_ANNOTATION]
    return (
        make_isvc()
        .set("spec.slo", {"latencyMs": 40})
        .set("spec.serving.replicas", {"min": 1, "max": 6})
        .set("spec.serving.batching", {"maxBatchSize": 8})
        .set("spec.tuning.enabled", enabled)
        .set("status", {"replicas": {"desired": 1, "ready": 1}})
        .annotate(TUNER_STATE_ANNOTATION, state)
        .obj()
    )


def _reads(at: datetime, pending: float, completed: float) -> tuple[PodReading, ...]:
    return (PodReading(pod="10.0.0.5", at=at, pending=pending, completed=completed),)


def test_a_surge_scales_out_at_once_with_one_event() -> None:
    """A queue from 0 to 18,000 in 6 s on the one pod: the config in force goes to more replicas (never past the
    spec's 6), the tuner state records the count as too few, and a Normal SurgeScaleOut names the queue and how long
    it grew; calm reads before it write nothing (caught: a fast check that writes at rest, or waits for the tick)."""
    isvc, cluster, fast = _isvc(), FakeCluster(), FastPath()
    calm = asyncio.run(fast_check(isvc, cluster, fast, _reads(NOW, 2, 100), None, NOW))
    assert calm is not None and not calm.scale_out
    at = NOW + timedelta(seconds=6)
    d = asyncio.run(fast_check(isvc, cluster, fast, _reads(at, 18_000, 6_100), None, at))
    assert d is not None and d.scale_out
    applied = InForce.from_annotation(cluster.annotations[APPLIED_ANNOTATION])
    assert 1 < applied.replicas <= 6 and applied.changed_at == at
    state = TunerState.from_dict(json.loads(cluster.annotations[TUNER_STATE_ANNOTATION]))
    assert state.too_few[-1].replicas == applied.replicas - 1
    [(kind, reason, message)] = cluster.events
    assert (kind, reason) == ("Normal", SURGE_SCALE_OUT)
    assert f"1 -> {applied.replicas} replica(s)" in message and "18000 requests queued on 10.0.0.5" in message
    assert "growing for 6 s" in message


def test_tuning_off_turns_the_fast_path_off() -> None:
    """spec.tuning.enabled false: no check, no write (caught: a fast path scaling a service whose tuner is off)."""
    isvc, cluster, fast = _isvc(enabled=False), FakeCluster(), FastPath()
    assert asyncio.run(fast_check(isvc, cluster, fast, _reads(NOW, 0, 0), None, NOW)) is None
    at = NOW + timedelta(seconds=6)
    assert asyncio.run(fast_check(isvc, cluster, fast, _reads(at, 18_000, 6_100), None, at)) is None
    assert cluster.annotations == {} and cluster.events == []


def test_the_loop_reads_every_check_and_reconciles_after_a_scale_out() -> None:
    """SurgeWatch, checked as the operator's schedule checks it: pods looked up once (the ready count does not
    change), read each check, the surge's check writes and reconciles the fresh object; a pod that did not answer is
    not read again (caught: a loop that looks pods up, or re-reads a dead pod, at every check)."""
    isvc = _isvc()
    raw = isvc.model_dump(mode="json", by_alias=True)
    observed = Observed(
        deployment=DeploymentObservation(replicas=1, ready_replicas=1, ready_pod_ips=("10.0.0.5", "10.0.0.6"))
    )

    class Cluster(FakeCluster):
        observes = 0

        async def observe(self, isvc: InferenceService, job_name: str, **_: object) -> Observed:
            Cluster.observes += 1
            return observed

        async def read_isvc(self, namespace: str, name: str) -> dict[str, object]:
            return raw

    asked: list[tuple[str, ...]] = []
    reconciled: list[object] = []

    def read(ips: object, model: str, at: datetime) -> tuple[PodReading, ...]:
        asked.append(tuple(ips))  # type: ignore[arg-type]
        k = len(asked) - 1
        return _reads(NOW + timedelta(seconds=6 * k), [0, 9_000, 18_000][k], [0, 3_000, 6_000][k])

    async def reconcile(obj: dict[str, object]) -> None:
        reconciled.append(obj)

    async def three_checks(watch: SurgeWatch) -> list[tuple[float, bool]]:
        return [await watch.check() for _ in range(3)]

    cluster = Cluster()
    nexts = asyncio.run(three_checks(SurgeWatch(cluster, asyncio.Lock(), None, lambda: raw, reconcile, read)))
    assert all(not nothing for _, nothing in nexts)  # a pod answers: the next check comes on the check interval
    assert Cluster.observes == 1
    assert asked[0] == ("10.0.0.5", "10.0.0.6") and asked[1:] == [("10.0.0.5",), ("10.0.0.5",)]
    # (The fake object never takes the annotations: each surging check scales out from the one replica again.)
    assert cluster.events and {r for _, r, _ in cluster.events} == {SURGE_SCALE_OUT}
    assert reconciled == [raw] * len(cluster.events)


def test_with_every_pod_silent_the_loop_idles_until_the_retry() -> None:
    """Caught: with no pod answering (kwok's pods run no Triton; a hung Triton) every object's fast path still woke
    every 2 s to find nothing to read: the most of the operator's event-loop work at rest at 200 objects (py-spy)."""
    isvc = _isvc()
    raw = isvc.model_dump(mode="json", by_alias=True)
    observed = Observed(deployment=DeploymentObservation(replicas=1, ready_replicas=1, ready_pod_ips=("10.0.0.5",)))

    class Cluster(FakeCluster):
        async def observe(self, isvc: InferenceService, job_name: str, **_: object) -> Observed:
            return observed

    def silent(ips: object, model: str, at: datetime) -> tuple[PodReading, ...]:
        return ()

    async def reconcile(raw: object) -> None:
        raise AssertionError("nothing to reconcile")

    async def three_checks(watch: SurgeWatch) -> list[tuple[float, bool]]:
        return [await watch.check() for _ in range(3)]

    nexts = asyncio.run(three_checks(SurgeWatch(Cluster(), asyncio.Lock(), None, lambda: raw, reconcile, silent)))
    # The read that found the pod silent is followed by the usual check interval; then nothing is left to read and
    # the schedule may idle until the silent pod's retry, a minute after the first read (less the checks' time).
    assert not nexts[0][1]
    assert [nothing for _, nothing in nexts[1:]] == [True, True]
    assert all(SILENT_RETRY_SECONDS - 5 < seconds <= SILENT_RETRY_SECONDS for seconds, _ in nexts[1:])
