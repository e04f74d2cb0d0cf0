"""kopf handlers: thin. Each one finds which InferenceService to reconcile and calls `reconcile`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from tailtune.api import GROUP, KIND, PLURAL, VERSION, InferenceService
from tailtune.api.keys import LAST_HANDLED_KEY, MANAGED_BY, MANAGED_BY_LABEL, PREFIX
from tailtune.api.v1alpha1 import Tuning
from tailtune.operator import metrics
from tailtune.operator.allocator import trim_forever
from tailtune.operator.atrest import TunerMemory
from tailtune.operator.fastpath import SurgeWatch
from tailtune.operator.generative import forget as forget_generative
from tailtune.operator.generative import generative_tick, is_generative
from tailtune.operator.kube import API_CONCURRENCY, ApiException, KubeCluster, load_config
from tailtune.operator.reconcile import Outcome, reconcile, rollout_status
from tailtune.operator.schedule import Schedule
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
from tailtune.operator.tuning import forget_stats_unavailable, parse_isvc, slo_condition_moved, tune_step
from tailtune.operator.watched import ParsedBodies
from tailtune.triton.stats import BatchStatsReader
from tailtune.tuner.prom import HttpPromClient, PodWindow, Target, read_pod_windows

log = logging.getLogger(__name__)

# Drift repair (forced re-apply of every child); child events and the tuner cover the quick paths.
RESYNC_SECONDS = 300.0
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY}
RETRY_MAX_SECONDS = 300.0
# While a build runs, its Job may fail to create its pod (quota, admission) without a change of the Job to
# react to: look this long after it started, so the status says so within seconds instead of at the resync.
BUILD_CHECK_SECONDS = 10.0
# While the Triton pods do not all serve, a container that exits or a pod evicted moves nothing we watch (the
# Deployment's status stays the same): look this long after, so ServingReady names Triton's words within a minute.
SERVING_CHECK_SECONDS = 10.0
# Each look that finds the same reason waits twice as long as the last, up to this: what a check finds is named within
# a minute (the serving check's promise), and 1,000 objects building at once ask the API server for ~17 checks a
# second instead of 100 (every 10 s, a GET of the Job, a LIST of its pods and of its Events: at 1,000 objects the API
# server answered those reads 504 and creation stalled with 390 Ready after 619 s).
CHECK_MAX_SECONDS = 60.0
# An object newly seen ticks and checks for surges this long after (kopf's daemons' initial delay before): the
# reconcile of its creation or of the operator's start goes first.
FIRST_TICK_SECONDS = 5.0
# A deleted object's children keep sending events while the garbage collector removes them (seconds, or minutes on a
# loaded API server): for this long they are not followed by a read of their owner (`State.gone`).
GONE_SECONDS = RESYNC_SECONDS
# The kinds of each object's work on the operator's schedule (`tailtune.operator.schedule`).
TICK, FAST, RESYNC, CHECK, RECONCILE = "tick", "fast", "resync", "check", "reconcile"
SERVING_CHILD_RESOURCES = ("configmaps", "services")  # watched for drift when the credentials allow it
SERVING_CHILD_KINDS = {"configmaps": "ConfigMap", "services": "Service"}
# Reconciles of kopf's events and of the schedule's work in flight at once: as many as the API client has threads and
# connections (API_CONCURRENCY); more would only wait for one of them with their manifests and answers held. A tuner
# tick's or the fast path's reconcile (under the object's lock, after a decision) does not wait for this.
RECONCILES_AT_ONCE = API_CONCURRENCY


class Tracked:
    """What the operator keeps of one InferenceService of its shard between the runs of its work (small: 1,000 of
    them are at rest together)."""

    __slots__ = ("check_reason", "check_seconds", "children", "failures", "interval", "surge", "tick_due", "uid")

    def __init__(self, uid: str) -> None:
        self.uid = uid
        # The tuner: when its tick was due (the lag is from there), its interval, failed ticks in a row.
        self.tick_due = time.time() + FIRST_TICK_SECONDS
        self.interval = float(Tuning().interval_seconds)
        self.failures = 0
        self.surge: SurgeWatch | None = None  # made at its first check
        # Child events since the last reconcile they asked for: (kind, name) -> (kind, metadata, event type).
        self.children: dict[tuple[str, str], tuple[str, dict[str, Any], str | None]] = {}
        # The build or serving check: the reason it last found, and how long it waits before the next look.
        self.check_reason = ""
        self.check_seconds = 0.0


class State:
    """Process-wide state kept in kopf's memo: the API client, one lock per InferenceService, and the schedule of
    every object's periodic work (`tailtune.operator.schedule`), in place of kopf's daemons and timers per object."""

    def __init__(self, cluster: KubeCluster, memo: Any = None) -> None:
        self.cluster = cluster
        self.memo = memo if memo is not None else {"tailtune": self}
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        # Triton's batch statistics are counters: each object keeps its previous read to take deltas.
        self.batch_stats: dict[tuple[str, str], BatchStatsReader] = {}
        # Objects whose tuner tick is running: never two at once for one object.
        self.ticking: set[tuple[str, str]] = set()
        # The tuner state between ticks; the object's annotation is its checkpoint (tailtune.operator.atrest).
        self.memory = TunerMemory()
        # The ticks' Prometheus reads: those due together go out as one read for the fleet (tailtune.operator.ticks).
        self.reads = FleetReads()
        # Each InferenceService of this shard as kopf's watch last showed it (`isvc_seen`; its managedFields left
        # out): what every handler of this process reads the object from, instead of a GET (`current`).
        self.bodies: dict[tuple[str, str], Mapping[str, Any]] = {}
        # Objects another shard serves (`operator --shard`), as a read of one found: their children's events are not
        # followed by a read of the owner each time. An object relabelled into this shard leaves it (`isvc_seen`).
        self.foreign: set[tuple[str, str]] = set()
        # Objects deleted within GONE_SECONDS (monotonic time of the deletion, oldest first): their children's events
        # as the garbage collector removes them are not followed by a read of the owner.
        self.gone: dict[tuple[str, str], float] = {}
        # Each object's body parsed once per version (the tick and the fast path read it again and again at rest).
        self.parsed: ParsedBodies[InferenceService | None] = ParsedBodies(parse_isvc)
        # Reconciles in flight at once (`run_reconcile`): a fleet created at once otherwise holds every object's
        # manifests and answers in memory while each waits for one of the API client's threads.
        self.reconciling = asyncio.Semaphore(RECONCILES_AT_ONCE)
        # This shard's objects and their work: the tuner's tick, the fast path, the resync, the build and serving
        # checks, and the reconcile their children's events ask for.
        self.tracked: dict[tuple[str, str], Tracked] = {}
        self.schedule = Schedule(lambda key, kind: run_work(self, cast(tuple[str, str], key), kind))

    async def current(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as the watch shows it, or as our own later write left it (`watched.WriteEchoes`); a GET only
        when the watch's body is not known here (not seen yet, or not this shard's)."""
        watched = self.bodies.get((namespace, name))
        if watched is None:
            return await self.cluster.read_isvc(namespace, name)
        return self.cluster.freshest(namespace, name, watched)

    def see(self, key: tuple[str, str], uid: str, body: Mapping[str, Any]) -> None:
        """The watch showed this shard's object `key` at `body`: keep it, and schedule its work when it is new."""
        meta = body.get("metadata") or {}
        self.bodies[key] = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        self.foreign.discard(key)
        self.gone.pop(key, None)
        tracked = self.tracked.get(key)
        if tracked is None or tracked.uid != uid:
            if tracked is not None:  # deleted and created again under the name while the watch was away
                self.forget(key, tracked.uid)
            self.tracked[key] = tracked = Tracked(uid)
            self.schedule.at(key, TICK, FIRST_TICK_SECONDS)
            self.schedule.at(key, FAST, FIRST_TICK_SECONDS)
            # The resync on the object's own phase of its period (its uid hashed): a fleet created at once does not
            # resync at once.
            now = time.time()
            self.schedule.at(
                key, RESYNC, seconds_to_next_tick(now, now, RESYNC_SECONDS, tick_phase(uid, RESYNC_SECONDS))
            )
        idle = self.schedule.due(key, CHECK) is None and not self.schedule.running(key, CHECK)
        if idle and checked_reason(self.bodies[key]):
            self.schedule.at(key, CHECK, tracked.check_seconds or BUILD_CHECK_SECONDS)

    def forget(self, key: tuple[str, str], uid: str | None, deleted: bool = False) -> None:
        """The object is deleted, or no longer this shard's: its work ends (a run in flight is left at once) and what
        this process kept of it goes; a deleted one's children's events are ignored for GONE_SECONDS."""
        self.schedule.forget(key)
        tracked = self.tracked.pop(key, None)
        uid = uid or (tracked.uid if tracked is not None else None)
        self.bodies.pop(key, None)
        self.locks.pop(key, None)
        self.batch_stats.pop(key, None)
        forget_stats_unavailable(key)
        self.cluster.echoes.forget(key)
        self.cluster.pod_ips.forget(key)
        self.cluster.children.forget(key)
        self.memory.forget(uid)  # deleted, or no longer this process's to tune: its annotation is the truth
        self.parsed.forget(uid)
        forget_generative(uid)
        if deleted:
            now = time.monotonic()
            self.gone.pop(key, None)
            self.gone[key] = now
            while self.gone and next(iter(self.gone.values())) < now - GONE_SECONDS:
                del self.gone[next(iter(self.gone))]


class PeeringPause(logging.Filter):
    """Pauses the schedule while kopf's peering pauses this operator in favour of another (an HA standby; kopf stopped
    its daemons then): kopf gives no public signal of its pause, its peering logs the two transitions, and this reads
    them. Every record passes."""

    def __init__(self, schedule: Schedule) -> None:
        super().__init__()
        self._schedule = schedule

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Pausing "):
            log.info("paused by peering: no tick, check or resync until resumed")
            self._schedule.pause()
        elif message.startswith("Resuming operations"):
            self._schedule.resume()
        return True


# kopf's peering logs its pauses and resumes here (`PeeringPause`).
KOPF_PEERING_LOGGER = "kopf._core.engines.peering"


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
    # The Kubernetes client blocks: give its calls (run in threads) as many workers as pooled connections.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=API_CONCURRENCY))
    cluster = KubeCluster(load_config())
    memo["tailtune"] = state = State(cluster, memo)
    # Every object's periodic work, from one task (`tailtune.operator.schedule`).
    memo["schedule"] = asyncio.create_task(state.schedule.run(), name="tailtune-schedule")
    logging.getLogger(KOPF_PEERING_LOGGER).addFilter(PeeringPause(state.schedule))
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
    if body is None and ((namespace, name) in state.foreign or (namespace, name) in state.gone):
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
async def on_change(
    namespace: str | None, name: str, body: kopf.Body, memo: Any, retry: int, reason: str | None = None, **_: Any
) -> None:
    """Any change of the object: reconcile from the body the watch just delivered; a change of the spec wakes its
    tuner and fast path (new bounds may forbid what the pods run).

    A child the API server refuses is status, not an error (reconcile reports it); other API errors are
    retried with a doubling delay (10 s, 20 s ... 5 min), not every 10 s forever.
    """
    state, key = _state(memo), (namespace or "default", name)
    state.foreign.discard(key)  # this shard's (again)
    try:
        await run_reconcile(memo, namespace or "default", name, body=dict(body))
        if reason == kopf.Reason.UPDATE and key in state.schedule:
            state.schedule.wake(key, TICK)
            state.schedule.wake(key, FAST)
    except ApiException as exc:
        delay = min(RETRY_MAX_SECONDS, 10.0 * 2**retry)
        raise kopf.TemporaryError(f"{namespace}/{name}: API server: {exc.status} {exc.reason}", delay=delay) from exc


@kopf.on.event(GROUP, VERSION, PLURAL)
async def isvc_seen(
    type: str | None, namespace: str | None, name: str, uid: str | None, body: kopf.Body, memo: Any, **_: Any
) -> None:
    """Every event of an InferenceService: keep its body and its work on the schedule while it is this shard's and
    not being deleted; else forget it (its tick in flight is left at once). Never blocks: kopf's next event of the
    object waits for it."""
    state, key = _state(memo), (namespace or "default", name)
    meta = body.get("metadata") or {}
    deleted = type == "DELETED" or bool(meta.get("deletionTimestamp"))
    if deleted or not in_shard(meta.get("labels"), memo):
        if key in state.tracked or deleted:
            state.forget(key, uid, deleted=deleted)
        if not deleted:
            state.foreign.add(key)
        if type == "DELETED":
            metrics.forget_inference_service(key[0], name)
        return
    state.see(key, uid or "", body)


def checked_reason(body: Mapping[str, Any] | None) -> str:
    """The reason of EngineReady while the engine builds, or of ServingReady while the Triton pods do not all serve:
    what the build or serving check looks at; "" when there is nothing to check."""
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == ENGINE_READY and c.get("reason") in (ENGINE_BUILD_RUNNING, ENGINE_BUILD_POD_NOT_CREATED):
            return str(c["reason"])
    for c in conditions:
        if c.get("type") == SERVING_READY and c.get("reason") in SERVING_WATCHED:
            return str(c["reason"])
    return ""


async def run_work(state: State, key: tuple[str, str], kind: str) -> float | None:
    """One run of an object's work on the schedule; the seconds until its next run (None: when woken)."""
    tracked = state.tracked.get(key)
    if tracked is None:
        return None
    if kind == TICK:
        return await tick_work(state, key, tracked)
    if kind == FAST:
        return await fast_work(state, key, tracked)
    if kind == RESYNC:
        return await resync_work(state, key)
    if kind == CHECK:
        return await check_work(state, key, tracked)
    return await reconcile_work(state, key, tracked)


async def resync_work(state: State, key: tuple[str, str]) -> float:
    """Drift: kopf reacts to changes, not to state, so reconcile every resource now and then, and re-apply the serving
    children unless the watch shows each of them as our last apply left it (`watched.ChildVersions`: a child of a
    kind not watched, or not applied by this process yet, is re-applied). At rest it writes nothing."""
    ns, name = key
    cluster = state.cluster
    try:
        await run_reconcile(
            state.memo, ns, name, force_if=lambda: not cluster.children_as_applied(ns, name), force_why="",
        )  # fmt: skip
    except ApiException as exc:
        log.warning("resync %s/%s: %s %s", ns, name, exc.status, exc.reason)
    return RESYNC_SECONDS


async def check_work(state: State, key: tuple[str, str], tracked: Tracked) -> float | None:
    """While the engine builds: whether the Job could create its pod (a FailedCreate moves nothing we watch); while
    the Triton pods do not all serve: what their containers and pods say now (exits, evictions). The next look waits
    twice as long while it finds the same reason (up to CHECK_MAX_SECONDS); none once there is nothing to check."""
    ns, name = key
    if not checked_reason(state.bodies.get(key)):
        tracked.check_reason, tracked.check_seconds = "", 0.0
        return None
    try:
        await run_reconcile(state.memo, ns, name)
    except ApiException as exc:
        log.warning("check %s/%s: %s %s", ns, name, exc.status, exc.reason)
    watched = state.bodies.get(key)
    found = checked_reason(state.cluster.freshest(ns, name, watched) if watched is not None else None)
    if not found:
        tracked.check_reason, tracked.check_seconds = "", 0.0
        return None
    same = found == tracked.check_reason
    first = (
        BUILD_CHECK_SECONDS if found in (ENGINE_BUILD_RUNNING, ENGINE_BUILD_POD_NOT_CREATED) else SERVING_CHECK_SECONDS
    )
    tracked.check_seconds = min(CHECK_MAX_SECONDS, 2 * tracked.check_seconds) if same else first
    tracked.check_reason = found
    return tracked.check_seconds


async def reconcile_work(state: State, key: tuple[str, str], tracked: Tracked) -> float | None:
    """The reconcile the object's children's events asked for since the last one: one for all of them. A child someone
    else changed or deleted (`kubectl scale`, an edited ConfigMap) is re-applied."""
    ns, name = key
    events, tracked.children = tracked.children, {}
    cluster = state.cluster

    def drifted() -> bool:
        return any(k != "Job" and (t == "DELETED" or cluster.drifted(k, m)) for k, m, t in events.values())

    try:
        await run_reconcile(state.memo, ns, name, force_if=drifted)
    except ApiException as exc:
        log.warning("reconcile %s/%s after child events: %s %s", ns, name, exc.status, exc.reason)
    if any(kind == "Deployment" for kind, _, _ in events.values()):
        state.schedule.wake(key, FAST)  # after the reconcile: the ready count it wrote is what the fast path reads
    if state.schedule.due(key, CHECK) is not None:  # it just looked: the check waits its whole delay from here
        state.schedule.at(key, CHECK, tracked.check_seconds or BUILD_CHECK_SECONDS)
    return None


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
    state = _state(memo)
    for name in owners:
        logger.debug("%s %s/%s changed (%s): reconcile %s/%s", kind, namespace, meta.get("name"), type, namespace, name)
        key = (namespace, name)
        tracked = state.tracked.get(key)
        if tracked is not None:  # one reconcile for the events that come while one runs or waits (`reconcile_work`)
            tracked.children[(kind, str(meta.get("name", "")))] = (kind, meta, type)
            state.schedule.wake(key, RECONCILE)
            continue

        def drifted() -> bool:
            return kind != "Job" and (type == "DELETED" or cluster.drifted(kind, meta))

        try:  # an owner not seen yet (the operator starting), another shard's, or deleted: read as it comes
            await run_reconcile(memo, namespace, name, force_if=drifted)
        except ApiException as exc:
            log.warning("reconcile %s/%s after child event: %s %s", namespace, name, exc.status, exc.reason)


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


async def tick_work(state: State, key: tuple[str, str], tracked: Tracked) -> float:
    """The SLO tuner of one InferenceService: one tick (`tuner_tick`), and the seconds until the next, on the object's
    own phase of its interval (`ticks.tick_phase`), at least half an interval after this one started; after a failed
    tick, sooner (`retry_delay`)."""
    ns, name = key
    started = time.time()
    try:
        tracked.interval = await tuner_tick(state, ns, name)
        # From when it was due (or woken early by a spec change) to decided: a busy loop shows here.
        metrics.TICK_LAG.observe(time.time() - min(tracked.tick_due, started))
        tracked.failures = 0
        phase = tick_phase(tracked.uid or f"{ns}/{name}", tracked.interval)
        delay = seconds_to_next_tick(time.time(), started, tracked.interval, phase)
    except ApiException as exc:
        metrics.ERRORS.labels("api").inc()
        log.warning("tuner %s/%s: API server %s %s", ns, name, exc.status, exc.reason)
        tracked.failures += 1
        delay = retry_delay(tracked.failures, min(tracked.interval, RESYNC_SECONDS))
    except Exception:  # never let one bad tick end the tuner: the next tick decides again
        metrics.ERRORS.labels("tuner").inc()
        log.exception("tuner %s/%s: tick failed", ns, name)
        tracked.failures += 1
        delay = retry_delay(tracked.failures, min(tracked.interval, RESYNC_SECONDS))
    tracked.tick_due = time.time() + delay
    return delay


# The surge fast path (tailtune.operator.fastpath) runs unless the operator is started with TAILTUNE_FAST_PATH=0.
FAST_PATH_ENV = "TAILTUNE_FAST_PATH"


async def fast_work(state: State, key: tuple[str, str], tracked: Tracked) -> float | None:
    """One check of the surge fast path of one InferenceService (`fastpath.SurgeWatch`): beside the tuner, scale out
    at once when the ready pods' queues outgrow the SLO. The seconds until the next: CHECK_SECONDS while pods are read,
    until the silent pods' retry with nothing to read (woken by an event of its Deployment or a spec change). None
    for a generative service (its replicas are its own tuner's) or with the fast path off."""
    body = state.bodies.get(key) or {}
    if (
        os.environ.get(FAST_PATH_ENV, "1") == "0"
        or (body.get("spec") or {}).get("model", {}).get("kind") == "generative"
    ):
        return None
    ns, name = key
    if tracked.surge is None:

        async def reconciled(raw: dict[str, Any]) -> None:
            record_outcome(ns, name, await reconcile(raw, state.cluster, datetime.now(UTC)))

        tracked.surge = SurgeWatch(
            state.cluster, state.locks[key], state.memory,
            lambda: state.cluster.freshest(ns, name, state.bodies.get(key) or {}), reconciled, parse=state.parsed,
        )  # fmt: skip
    seconds, _ = await tracked.surge.check()
    return seconds
