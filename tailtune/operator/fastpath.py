"""The surge fast path in the operator (`tailtune.tuner.surge`): a scale-out asked within seconds of a surge.

Every CHECK_SECONDS, beside the tuner's ticks, the fast check reads each ready Triton pod's own metrics endpoint
(`:8002/metrics`: the pending-request gauge and the request counters of the model; a scrape interval is too slow
for it) and hands the reads to `tuner.loop.FastPath`. When it asks for more replicas, the config in force and the
tuner state are written as the tuner writes a scale-out (the annotations; reconcile scales the Deployment), with a
Normal Event `SurgeScaleOut` naming the queue, the replicas and how long the queue has been growing. It never
scales in and never touches the batching. Off with the tuner (`spec.tuning.enabled: false`), or for the whole
operator with `TAILTUNE_FAST_PATH=0` (to compare).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

from tailtune.api.keys import METRICS_PORT
from tailtune.api.v1alpha1 import InferenceService, ObjectMeta
from tailtune.operator import metrics
from tailtune.operator.atrest import TunerMemory
from tailtune.operator.engine import build_curve, engine_cache_key
from tailtune.operator.inforce import in_force as config_in_force
from tailtune.operator.inforce import in_force_annotation, policy_for, tuner_state, tuner_state_annotation
from tailtune.operator.observed import Observed
from tailtune.operator.tuning import parse_isvc
from tailtune.triton.metrics import parse_model_counters, parse_pending_requests, scrape
from tailtune.tuner.loop import FastPath
from tailtune.tuner.surge import CHECK_SECONDS, SURGE_SCALE_OUT, PodReading, SurgeDecision

log = logging.getLogger(__name__)

# A pod's metrics read must come back well within a check (CHECK_SECONDS): a pod that does not is left out of it.
READ_TIMEOUT_SECONDS = CHECK_SECONDS / 2


PodsReader = Callable[[Iterable[str], str, datetime], tuple[PodReading, ...]]


class FastCluster(Protocol):
    """What the fast check writes through (`tailtune.operator.kube.KubeCluster`)."""

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None: ...
    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None: ...


def read_pod(
    ip: str, model: str, at: datetime, port: int = METRICS_PORT, timeout: float = READ_TIMEOUT_SECONDS
) -> PodReading | None:
    """One pod's reading from Triton's metrics endpoint; None when it does not answer in time (it is left out of
    the check: the tuner's tick and ServingReady say what is wrong with a pod). Blocking."""
    try:
        text = scrape(f"http://{ip}:{port}/metrics", timeout)
    except (OSError, ValueError) as exc:
        log.info("fast path: %s metrics unreadable: %s", ip, exc)
        return None
    counters = parse_model_counters(text, model)
    return PodReading(
        pod=ip, at=at, pending=parse_pending_requests(text, model), completed=counters.success + counters.failure
    )


def read_pods(ips: Iterable[str], model: str, at: datetime, port: int = METRICS_PORT) -> tuple[PodReading, ...]:
    """Every ready pod's reading, read side by side (a slow pod delays the check by at most the read timeout)."""
    ips = tuple(ips)
    if not ips:
        return ()
    with ThreadPoolExecutor(max_workers=min(16, len(ips))) as pool:
        reads = list(pool.map(lambda ip: read_pod(ip, model, at, port), ips))
    return tuple(r for r in reads if r is not None)


def surge_event_message(decision: SurgeDecision, before: int) -> str:
    """The Event's words: the queue, the replicas, how long the queue has been growing (in `decision.reason`)."""
    return f"surge: {before} -> {decision.replicas} replica(s) at once; {decision.reason}"


async def fast_check(
    isvc: InferenceService,
    cluster: FastCluster,
    fast: FastPath,
    readings: tuple[PodReading, ...],
    memory: TunerMemory | None,
    now: datetime,
) -> SurgeDecision | None:
    """One fast check of one InferenceService on the pods' reads; writes only on a scale-out (the caller then
    reconciles, which scales the Deployment). None when the tuner is off or nothing serves yet."""
    if not isvc.spec.tuning.enabled or isvc.status.replicas.ready < 1:
        return None
    applied = config_in_force(isvc)
    checkpoint = tuner_state(isvc)
    state = memory.recall(isvc, checkpoint) if memory is not None else checkpoint
    policy = policy_for(isvc, build_curve(isvc))
    decision, new_state, new_in_force = fast.check(readings, applied, state, policy, now)
    if not decision.scale_out:
        return decision
    annotations = in_force_annotation(new_in_force) | tuner_state_annotation(new_state)
    await cluster.patch_annotations(isvc.metadata, annotations)
    if memory is not None:
        memory.keep(isvc, annotations, new_state)
    await cluster.emit_event(isvc.metadata, "Normal", SURGE_SCALE_OUT, surge_event_message(decision, applied.replicas))
    return decision


class WatchCluster(FastCluster, Protocol):
    """The API calls the fast path's loop makes (`tailtune.operator.kube.KubeCluster`)."""

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed: ...


# A pod that did not answer is read again after this long (a pod that never runs, as on kwok's fake nodes, costs one
# read timeout a minute on the fast path's own threads, and no API request).
SILENT_RETRY_SECONDS = 60.0
# The pods are read on threads of their own, never the API client's (a pod that hangs holds one for the read timeout).
_READS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fastpath")


class SurgeWatch:
    """The fast path of one InferenceService, one check at a time (`check`): the operator's schedule runs it
    (`handlers`, `schedule`).

    Each check reads the ready pods and, under the object's lock (never beside a tuner tick or a reconcile), checks
    the object as last seen (`current`, the watch's body, parsed by `parse`: once per version in the operator);
    reconciles after a scale-out. The pods' addresses are looked up (an API read) only when the ready count in status
    moves: at rest the fast path sends the API server nothing."""

    def __init__(
        self,
        cluster: WatchCluster,
        lock: asyncio.Lock,
        memory: TunerMemory | None,
        current: Callable[[], Mapping[str, Any]],
        reconcile: Callable[[dict[str, Any]], Awaitable[None]],
        read: PodsReader = read_pods,
        parse: Callable[[Mapping[str, Any]], InferenceService | None] = lambda body: parse_isvc(dict(body)),
    ) -> None:
        self._cluster, self._lock, self._memory = cluster, lock, memory
        self._current, self._reconcile, self._read, self._parse = current, reconcile, read, parse
        self._fast = FastPath()
        self._ips: tuple[str, ...] = ()
        self._silent: set[str] = set()
        self._ready_seen, self._retried = -1, -math.inf

    async def check(self) -> tuple[float, bool]:
        """One check; (seconds until the next, whether it found nothing to read: then the next may wait until a pod
        moves, for at most those seconds: until the silent pods' retry)."""
        started = time.monotonic()
        live: tuple[str, ...] = ()
        try:
            live = await self._check(started)
        except Exception:  # never let one failed check end the loop: the next check reads again
            metrics.ERRORS.labels("fastpath").inc()  # what an alert on tailtune_errors sees
            log.exception("fast path: check failed")
        took = time.monotonic() - started
        if live:
            return max(0.0, CHECK_SECONDS - took), False
        return max(CHECK_SECONDS - took, self._retried + SILENT_RETRY_SECONDS - started), True

    async def _check(self, started: float) -> tuple[str, ...]:
        isvc = self._parse(self._current())
        serving = isvc is not None and isvc.spec.tuning.enabled and isvc.status.replicas.ready >= 1
        if isvc is not None and serving and isvc.status.replicas.ready != self._ready_seen:
            observed = await self._cluster.observe(isvc, engine_cache_key(isvc), job_report=False, pod_ips=True)
            self._ips = observed.deployment.ready_pod_ips if observed.deployment else ()
            self._ready_seen, self._silent = isvc.status.replicas.ready, set()
        if started - self._retried >= SILENT_RETRY_SECONDS:
            self._retried, self._silent = started, set()
        if not serving or isvc is None:
            return ()
        live = tuple(ip for ip in self._ips if ip not in self._silent)
        if not live:
            return ()
        loop = asyncio.get_running_loop()
        readings = await loop.run_in_executor(_READS, self._read, live, isvc.model_name, datetime.now(UTC))
        self._silent |= set(live) - {r.pod for r in readings}
        async with self._lock:
            latest = self._parse(self._current()) or isvc
            at = max((r.at for r in readings), default=datetime.now(UTC))  # the check is as of its reads
            decision = await fast_check(latest, self._cluster, self._fast, readings, self._memory, at)
            if decision is not None and decision.scale_out:
                meta = latest.metadata
                log.info("%s/%s fast path: %s", meta.namespace, meta.name, decision.reason)
                fresh = await self._cluster.read_isvc(meta.namespace, meta.name)
                if fresh is not None:
                    await self._reconcile(fresh)
        return live
