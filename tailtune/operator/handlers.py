"""kopf handlers: thin. Each one finds which InferenceService to reconcile and calls `reconcile`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import kopf

from tailtune.api import GROUP, KIND, PLURAL, VERSION, InferenceService
from tailtune.api.keys import LAST_HANDLED_KEY, MANAGED_BY, MANAGED_BY_LABEL, PREFIX
from tailtune.api.v1alpha1 import Tuning
from tailtune.operator import metrics
from tailtune.operator.allocator import trim_forever
from tailtune.operator.atrest import TunerMemory
from tailtune.operator.fastpath import watch_surges
from tailtune.operator.generative import forget as forget_generative
from tailtune.operator.generative import generative_tick, is_generative
from tailtune.operator.kube import API_CONCURRENCY, ApiException, KubeCluster, load_config
from tailtune.operator.reconcile import Outcome, reconcile, rollout_status
from tailtune.operator.shard import ShardSelector
from tailtune.operator.status import (
    ENGINE_BUILD_FAILED,
    ENGINE_BUILD_POD_NOT_CREATED,
    ENGINE_BUILD_RUNNING,
    ENGINE_BUILT,
    ENGINE_READY,
    SERVING_READY,
    SERVING_WATCHED,
)
from tailtune.operator.ticks import FleetReads, read_request, seconds_to_next_tick, tick_phase
from tailtune.operator.tuning import parse_isvc, slo_condition_moved, tune_step
from tailtune.operator.watched import ParsedBodies
from tailtune.triton.stats import BatchStatsReader
from tailtune.tuner.prom import HttpPromClient, PodWindow, Target, read_pod_windows

log = logging.getLogger(__name__)

# Drift repair (forced re-apply of every child); child events and the tuner cover the quick paths.
RESYNC_SECONDS = 300.0
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
RETRY_MAX_SECONDS = 300.0
# While a build runs, its Job may fail to create its pod (quota, admission) without a change of the Job to
# react to: look this often, so the status says so within seconds instead of at the resync.
BUILD_CHECK_SECONDS = 10.0
# While the Triton pods do not all serve, a container that exits or a pod evicted moves nothing we watch (the
# Deployment's status stays the same): look this often, so ServingReady names Triton's words within a minute.
SERVING_CHECK_SECONDS = 10.0
SERVING_CHILD_RESOURCES = ("configmaps", "services")  # watched for drift when the credentials allow it
SERVING_CHILD_KINDS = {"configmaps": "ConfigMap", "services": "Service"}
# Reconciles of kopf's events and timers in flight at once: as many as the API client has threads and connections
# (API_CONCURRENCY); more would only wait for one of them with their manifests and answers held. A tuner tick's or the
# fast path's reconcile (under the object's lock, after a decision) does not wait for this.
RECONCILES_AT_ONCE = API_CONCURRENCY
# How long kopf waits for a daemon or timer told to stop (the object deleted) to end on its own before it cancels it
# or polls it again: the upper end of what kopf's docs advise (0.001-0.1 s). Ours end within it: the tuner leaves its
# tick at once, a timer's reconcile of a deleted object returns before any API call.
INSTANT_EXIT_SECONDS = 0.1
# How often kopf looks again at a timer still running when its object is deleted (kopf's default is 60 s, which held
# deletions that long): a reconcile in flight is a few API round trips, seconds at most on a loaded API server.
EXIT_POLL_SECONDS = 2.0


class State:
    """Process-wide state kept in kopf's memo: the API client and one lock per InferenceService."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        # Triton's batch statistics are counters: each object keeps its previous read to take deltas.
        self.batch_stats: dict[tuple[str, str], BatchStatsReader] = {}
        # Objects whose tuner tick is running: never two at once for one object.
        self.ticking: set[tuple[str, str]] = set()
        # Set by a change of the spec: the object's tuner ticks at once (new bounds may forbid what the pods run).
        self.wake: defaultdict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        # The tuner state between ticks; the object's annotation is its checkpoint (tailtune.operator.atrest).
        self.memory = TunerMemory()
        # The ticks' Prometheus reads: those due together go out as one read for the fleet (tailtune.operator.ticks).
        self.reads = FleetReads()
        # Each InferenceService as kopf's watch shows it: the tuner daemon's `body`, a live view kopf updates with
        # every event of the object, registered while the daemon runs. Read instead of a GET (`current`).
        self.bodies: dict[tuple[str, str], Mapping[str, Any]] = {}
        # Objects another shard serves (`operator --shard`), as a read of one found: their children's events are not
        # followed by a read of the owner each time. An object relabelled into this shard leaves it (`on_change`).
        self.foreign: set[tuple[str, str]] = set()
        # Each object's body parsed once per version (the tick and the fast path read it again and again at rest).
        self.parsed: ParsedBodies[InferenceService | None] = ParsedBodies(parse_isvc)
        # Set by an event of the object's Deployment (a pod ready or gone) or a spec change: the fast path, idle while
        # it has no pod to read, looks again (`fastpath.watch_surges`).
        self.pods_moved: defaultdict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        # Reconciles in flight at once (`run_reconcile`): a fleet created at once otherwise holds every object's
        # manifests and answers in memory while each waits for one of the API client's threads.
        self.reconciling = asyncio.Semaphore(RECONCILES_AT_ONCE)

    async def current(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as the watch shows it, or as our own later write left it (`watched.WriteEchoes`); a GET only
        when the watch's body is not known here (no daemon running for it yet)."""
        watched = self.bodies.get((namespace, name))
        if watched is None:
            return await self.cluster.read_isvc(namespace, name)
        return self.cluster.freshest(namespace, name, watched)


def in_shard(labels: Mapping[str, str] | None, memo: Any, **_: Any) -> bool:
    """Whether the object is this process's to serve: every object, or those its shard selects (`operator --shard`)."""
    shard: ShardSelector | None = memo.get("shard")
    return shard is None or shard.matches(labels)


def _state(memo: Any) -> State:
    state: State = memo["tailtune"]
    return state


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """Progress and diff-base in annotations under our prefix, so `status` stays ours alone.

    The diff base holds the spec only: kopf's default copies the user's annotations too, and a large one
    (150 kB) doubled past the API server's 256 kB limit leaves the object unpatchable and undeletable.
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key=LAST_HANDLED_KEY, ignored_fields=["metadata"]
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    # How long a silent peer is believed alive: a standby takes over at most this long after the active one died.
    settings.peering.lifetime = int(os.environ.get("TAILTUNE_PEERING_LIFETIME", "60"))
    settings.background.instant_exit_timeout = INSTANT_EXIT_SECONDS
    settings.background.cancellation_polling = EXIT_POLL_SECONDS
    # The Kubernetes client blocks: give its calls (run in threads) as many workers as pooled connections.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=API_CONCURRENCY))
    cluster = KubeCluster(load_config())
    memo["tailtune"] = State(cluster)
    # What the busiest moments (a fleet created or re-listed at once) freed goes back to the OS (`allocator`).
    memo["allocator"] = asyncio.create_task(trim_forever(), name="tailtune-allocator-trim")
    # Hand edits of the ConfigMap and the Service are seen only with list/watch on them; kopf starts its
    # watchers after this handler, so watching is registered here, where the credentials can be asked.
    # Restricted to namespaces (`tailtune operator --namespace`, the chart's watchNamespaces), kopf watches each
    # of them: the credentials are asked there (a Role per namespace grants nothing cluster-wide).
    namespaces = tuple(memo.get("watch_namespaces", ()))
    for resource in SERVING_CHILD_RESOURCES:
        if await asyncio.to_thread(cluster.may_watch, resource, "", namespaces):
            kopf.on.event("", "v1", resource, labels=CHILD_LABELS)(child_changed)
            cluster.children.watched_kinds.add(SERVING_CHILD_KINDS[resource])
        else:
            log.warning("no list/watch on %s: their hand edits are repaired by the resync only", resource)


async def run_reconcile(
    memo: Any,
    namespace: str,
    name: str,
    *,
    body: dict[str, Any] | None = None,
    force: bool = False,
    force_if: Callable[[], bool] | None = None,
    force_why: str = "a child was changed by someone else",
) -> None:
    """Reconcile one InferenceService under its lock (from `body`, else the watch's newest, else a read) and record
    metrics.

    `force_if` is asked under the lock, after any reconcile in flight has recorded what it applied. An object being
    deleted is not reconciled, and not waited for: its children go with it.
    """
    state = _state(memo)
    if _deleting(body if body is not None else state.bodies.get((namespace, name))):
        return
    if body is None and (namespace, name) in state.foreign:
        return
    async with state.locks[(namespace, name)]:
        raw = body if body is not None else await state.current(namespace, name)
        if raw is not None and not in_shard((raw.get("metadata") or {}).get("labels"), memo):
            state.foreign.add((namespace, name))  # a child event of an object another shard serves
            return
        if raw is None or _deleting(raw):
            return
        if force_if is not None and force_if():
            if force_why:  # "": the caller's routine (the resync), not worth a line per object
                log.info("%s/%s: %s: re-applying", namespace, name, force_why)
            force = True
        async with state.reconciling:
            with metrics.RECONCILE_DURATION.time():
                try:
                    outcome = await reconcile(raw, state.cluster, datetime.now(UTC), force=force)
                except Exception:
                    metrics.RECONCILES.labels("error").inc()
                    raise
    record_outcome(namespace, name, outcome)


def _deleting(body: Mapping[str, Any] | None) -> bool:
    return body is not None and bool((body.get("metadata") or {}).get("deletionTimestamp"))


def record_outcome(namespace: str, name: str, outcome: Outcome) -> None:
    """Metrics of one reconcile: result, engine builds that ended, SLO and replicas per InferenceService."""
    metrics.RECONCILES.labels("ok" if outcome.isvc else "invalid_spec").inc()
    for c in outcome.transitions:
        if c.type == ENGINE_READY and c.reason in (ENGINE_BUILT, ENGINE_BUILD_FAILED):
            metrics.ENGINE_BUILDS.labels("succeeded" if c.reason == ENGINE_BUILT else "failed").inc()
    if outcome.isvc is not None and outcome.status is not None:
        metrics.SLO_MS.labels(namespace, name).set(outcome.isvc.spec.slo.latency_ms)
        metrics.REPLICAS.labels(namespace, name, "desired").set(outcome.status.replicas.desired)
        metrics.REPLICAS.labels(namespace, name, "ready").set(outcome.status.replicas.ready)
        if outcome.status.latency.observed_ms is not None:
            metrics.P99_OBSERVED_MS.labels(namespace, name).set(outcome.status.latency.observed_ms)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True, when=in_shard)
async def on_delete(namespace: str | None, name: str, **_: Any) -> None:
    """Children go with the owner (garbage collection); only the per-service metrics are ours to drop."""
    metrics.forget_inference_service(namespace or "default", name)


@kopf.on.resume(GROUP, VERSION, PLURAL, when=in_shard)
@kopf.on.create(GROUP, VERSION, PLURAL, when=in_shard)
@kopf.on.update(GROUP, VERSION, PLURAL, when=in_shard)
async def on_change(namespace: str | None, name: str, body: kopf.Body, memo: Any, retry: int, **_: Any) -> None:
    """Any change of the object: reconcile from the body the watch just delivered.

    A child the API server refuses is status, not an error (reconcile reports it); other API errors are
    retried with a doubling delay (10 s, 20 s ... 5 min), not every 10 s forever.
    """
    _state(memo).foreign.discard((namespace or "default", name))  # this shard's (again)
    try:
        await run_reconcile(memo, namespace or "default", name, body=dict(body))
        _state(memo).wake[(namespace or "default", name)].set()
        _state(memo).pods_moved[(namespace or "default", name)].set()
    except ApiException as exc:
        delay = min(RETRY_MAX_SECONDS, 10.0 * 2**retry)
        raise kopf.TemporaryError(f"{namespace}/{name}: API server: {exc.status} {exc.reason}", delay=delay) from exc


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, sharp=False, when=in_shard)
async def resync(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """Drift: kopf reacts to changes, not to state, so reconcile every resource now and then, and re-apply the serving
    children unless the watch shows each of them as our last apply left it (`watched.ChildVersions`: a child of a
    kind not watched, or not applied by this process yet, is re-applied). At rest it writes nothing."""
    ns = namespace or "default"
    cluster = _state(memo).cluster
    try:
        await run_reconcile(
            memo, ns, name, force_if=lambda: not cluster.children_as_applied(ns, name),
            force_why="",
        )  # fmt: skip
    except ApiException as exc:
        log.warning("resync %s/%s: %s %s", namespace, name, exc.status, exc.reason)


def _building(status: kopf.Status, labels: kopf.Labels, memo: Any, **_: Any) -> bool:
    building = (ENGINE_BUILD_RUNNING, ENGINE_BUILD_POD_NOT_CREATED)
    return in_shard(labels, memo) and any(
        c.get("type") == ENGINE_READY and c.get("reason") in building for c in status.get("conditions", [])
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=BUILD_CHECK_SECONDS, initial_delay=BUILD_CHECK_SECONDS, when=_building)
async def build_check(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """While the engine builds: whether the Job could create its pod (a FailedCreate moves nothing we watch)."""
    try:
        await run_reconcile(memo, namespace or "default", name)
    except ApiException as exc:
        log.warning("build check %s/%s: %s %s", namespace, name, exc.status, exc.reason)


def _serving_watched(status: kopf.Status, labels: kopf.Labels, memo: Any, **_: Any) -> bool:
    return in_shard(labels, memo) and any(
        c.get("type") == SERVING_READY and c.get("reason") in SERVING_WATCHED for c in status.get("conditions", [])
    )


@kopf.timer(
    GROUP, VERSION, PLURAL, interval=SERVING_CHECK_SECONDS, initial_delay=SERVING_CHECK_SECONDS, when=_serving_watched
)
async def serving_check(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """While the Triton pods do not all serve: what their containers and pods say now (exits, evictions)."""
    try:
        await run_reconcile(memo, namespace or "default", name)
    except ApiException as exc:
        log.warning("serving check %s/%s: %s %s", namespace, name, exc.status, exc.reason)


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
async def child_changed(body: kopf.Body, type: str | None, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    """A child moved (Job finished, pods became ready, a hand edit): reconcile each InferenceService owning it.

    A child that someone else changed or deleted (`kubectl scale`, an edited ConfigMap) is re-applied at
    once, not at the next resync.
    """
    namespace = body.metadata.namespace or "default"
    kind, meta = str(body.get("kind", "")), dict(body.metadata)
    cluster = _state(memo).cluster
    if kind == "Deployment":  # the tuner lists a Deployment's pods again only when it moved (`watched.PodIps`)
        cluster.saw_deployment(
            namespace, str(meta.get("name", "")), None if type == "DELETED" else meta.get("resourceVersion")
        )
    cluster.saw_child(kind, {**meta, "namespace": namespace}, deleted=type == "DELETED")
    owners = [
        ref["name"]
        for ref in body.metadata.get("ownerReferences", [])
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(GROUP + "/")
    ]
    for name in owners:
        logger.debug("%s %s/%s changed (%s): reconcile %s/%s", kind, namespace, meta.get("name"), type, namespace, name)

        def drifted() -> bool:
            return kind != "Job" and (type == "DELETED" or cluster.drifted(kind, meta))

        try:
            await run_reconcile(memo, namespace, name, force_if=drifted)
        except ApiException as exc:
            log.warning("reconcile %s/%s after child event: %s %s", namespace, name, exc.status, exc.reason)
        if kind == "Deployment":  # after the reconcile: the ready count it wrote is what the fast path reads
            _state(memo).pods_moved[(namespace, name)].set()


class PodWindows:
    """Each Triton pod's own latency window from Prometheus, for judging a canary (`rollout.PodReader`)."""

    def __init__(self, isvc: InferenceService) -> None:
        spec = isvc.spec
        self._client = HttpPromClient(spec.metrics.prometheus_url, spec.metrics.timeout_seconds)
        self._target = Target(namespace=isvc.metadata.namespace, name=isvc.metadata.name, model=isvc.model_name)
        self._percentile = spec.slo.percentile
        self._window = float(spec.slo.window_seconds)

    def read(self, at: datetime) -> Mapping[str, PodWindow]:
        """The windows ending at `at`, keyed by pod IP."""
        return read_pod_windows(self._client.query, self._target, self._percentile, self._window, at)


async def tuner_tick(state: State, namespace: str, name: str) -> float:
    """One tuner tick; returns the seconds until the next one (the spec's interval).

    Prometheus is read before the per-object lock is taken, in the read of the ticks due with this one
    (`ticks.FleetReads`): a slow or hanging Prometheus delays this tuner by at most its timeouts and never holds up a
    reconcile. At most one tick per object is in flight.
    """
    key = (namespace, name)
    raw = await state.current(namespace, name)
    isvc = state.parsed(raw) if raw else None
    if isvc is not None and is_generative(isvc):  # TTFT/TPOT: status and its own tuner (tailtune.operator.generative)

        async def reconciled(fresh: dict[str, Any]) -> None:
            record_outcome(namespace, name, await reconcile(fresh, state.cluster, datetime.now(UTC)))

        return await generative_tick(state, namespace, name, parse_isvc, reconciled) or RESYNC_SECONDS
    if isvc is None or not isvc.spec.tuning.enabled:
        return RESYNC_SECONDS
    interval = float(isvc.spec.tuning.interval_seconds)
    if isvc.status.replicas.ready < 1 or key in state.ticking:
        return interval
    state.ticking.add(key)
    try:
        read = await state.reads.read(*read_request(isvc))
        async with state.locks[key]:
            now = datetime.now(UTC)
            # Again under the lock: a reconcile may have moved the object while Prometheus answered.
            raw = await state.current(namespace, name)
            isvc = state.parsed(raw) if raw else None
            if isvc is None or not isvc.spec.tuning.enabled:
                return RESYNC_SECONDS
            interval = float(isvc.spec.tuning.interval_seconds)
            stats = state.batch_stats.setdefault(key, BatchStatsReader(isvc.model_name))
            pods = PodWindows(isvc) if isvc.spec.tuning.mode == "hot" else None
            decision = await tune_step(isvc, state.cluster, read, now, stats, pods, state.memory)
            changed = decision is not None and decision.changed
            if decision is not None and changed:
                log.info("%s/%s tuner: %s", namespace, name, decision.reason)
            # Reconcile now when the tuner changed the config (ConfigMap, replicas: kopf does not react to our
            # own annotations), when the new latency moves SLOMet, or a rollout moves status.rollout (status,
            # which reconcile writes).
            fresh = await state.current(namespace, name)  # with what this tick wrote
            fresh_isvc = state.parsed(fresh) if fresh else None
            status_moves = fresh_isvc is not None and (
                slo_condition_moved(fresh_isvc, fresh_isvc.status.latency)
                or rollout_status(fresh_isvc) != fresh_isvc.status.rollout
            )
            if fresh and fresh_isvc and (changed or status_moves):
                record_outcome(namespace, name, await reconcile(fresh, state.cluster, now))
    finally:
        state.ticking.discard(key)
    return interval


# After a failed tick the tuner retries after 5, 10, 20 ... s, never later than its interval (not the resync).
RETRY_SECONDS = 5.0


def retry_delay(failures: int, interval: float) -> float:
    """Seconds before the next try after `failures` failed ticks in a row: doubling, bounded by the interval."""
    return min(interval, RETRY_SECONDS * 2.0 ** max(0, failures - 1))


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0, initial_delay=5.0, when=in_shard)
async def tuner(
    namespace: str | None,
    name: str,
    uid: str | None,
    body: kopf.Body,
    memo: Any,
    stopped: kopf.DaemonStopped,
    **_: Any,
) -> None:
    """The SLO tuner of one InferenceService: every `tuning.intervalSeconds`, on its own phase of the interval
    (`ticks.tick_phase`), read Prometheus, decide, apply.

    Its `body` (kopf's live view of the watched object) is what every handler of this process reads the object from
    while it runs. Told to stop (the object deleted, the operator exiting), it leaves a tick in flight at once and
    ends without being cancelled: kopf then removes its finalizer without polling it again.
    """
    state, key = _state(memo), (namespace or "default", name)
    state.bodies[key] = body
    state.foreign.discard(key)  # kopf runs it only for this shard's objects: one relabelled into it is ours now
    ticking = asyncio.ensure_future(_tune_until_stopped(memo, namespace, name, uid, stopped))
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait((ticking, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        ticking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticking
        state.bodies.pop(key, None)
        state.cluster.echoes.forget(key)
        state.cluster.pod_ips.forget(key)
        state.cluster.children.forget(key)
        state.memory.forget(uid)  # deleted, or no longer this process's to tune: its annotation is the truth
        state.parsed.forget(uid)
        forget_generative(uid)


async def _tune_until_stopped(
    memo: Any, namespace: str | None, name: str, uid: str | None, stopped: kopf.DaemonStopped
) -> None:
    interval, failures = float(Tuning().interval_seconds), 0
    wake = _state(memo).wake[(namespace or "default", name)]
    key = uid or f"{namespace}/{name}"
    due = time.time()
    while not stopped:
        started = time.time()
        try:
            interval = await tuner_tick(_state(memo), namespace or "default", name)
            # From when it was due (or woken early by a spec change) to decided: a busy loop shows here.
            metrics.TICK_LAG.observe(time.time() - min(due, started))
            failures = 0
            delay = seconds_to_next_tick(time.time(), started, interval, tick_phase(key, interval))
        except ApiException as exc:
            metrics.ERRORS.labels("api").inc()
            log.warning("tuner %s/%s: API server %s %s", namespace, name, exc.status, exc.reason)
            failures += 1
            delay = retry_delay(failures, min(interval, RESYNC_SECONDS))
        except Exception:  # never let one bad tick kill the daemon: the next tick decides again
            metrics.ERRORS.labels("tuner").inc()
            log.exception("tuner %s/%s: tick failed", namespace, name)
            failures += 1
            delay = retry_delay(failures, min(interval, RESYNC_SECONDS))
        due = time.time() + delay
        await next_tick(stopped, wake, delay)


async def next_tick(stopped: kopf.DaemonStopped, wake: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less when the daemon stops (`stopped`, kopf's flag) or the spec changed (`wake`): a spec
    change that forbids what the pods run is acted on at once, not an interval later."""
    woken, stop = asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait(seconds))
    try:
        await asyncio.wait((woken, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
        stop.cancel()
    wake.clear()


# The surge fast path (tailtune.operator.fastpath) runs unless the operator is started with TAILTUNE_FAST_PATH=0.
FAST_PATH_ENV = "TAILTUNE_FAST_PATH"


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0, initial_delay=5.0, when=in_shard)
async def surge_watch(
    namespace: str | None, name: str, body: kopf.Body, memo: Any, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """The surge fast path of one InferenceService: every few seconds, beside the tuner, scale out at once when the
    ready pods' queues outgrow the SLO."""
    if os.environ.get(FAST_PATH_ENV, "1") == "0" or body.get("spec", {}).get("model", {}).get("kind") == "generative":
        return  # a generative service's replicas are its own tuner's (tailtune.operator.generative)
    state, ns = _state(memo), namespace or "default"

    async def reconciled(raw: dict[str, Any]) -> None:
        record_outcome(ns, name, await reconcile(raw, state.cluster, datetime.now(UTC)))

    key = (ns, name)
    try:
        await watch_surges(
            state.cluster, state.locks[key], state.memory, lambda: state.cluster.freshest(ns, name, body),
            lambda: bool(stopped), stopped.wait, reconciled, parse=state.parsed,
            idle=lambda seconds: next_tick(stopped, state.pods_moved[key], seconds),
        )  # fmt: skip
    finally:
        state.pods_moved.pop(key, None)
