"""kopf handlers: thin. Each one finds which InferenceService to reconcile and calls `reconcile`."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import kopf

from tailtune.api import GROUP, KIND, PLURAL, VERSION
from tailtune.operator.builders.common import MANAGED_BY, PREFIX
from tailtune.operator.kube import ApiException, Cluster, load_config
from tailtune.operator.reconcile import reconcile

log = logging.getLogger(__name__)

RESYNC_SECONDS = 60.0
CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}


class State:
    """Process-wide state kept in kopf's memo: the API client and one lock per InferenceService."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)


def _state(memo: Any) -> State:
    state: State = memo["tailtune"]
    return state


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """Progress and diff-base in annotations under our prefix, so `status` stays ours alone."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    memo["tailtune"] = State(Cluster(load_config()))


async def run_reconcile(memo: Any, namespace: str, name: str, body: dict[str, Any] | None = None) -> None:
    """Reconcile one InferenceService under its lock, reading it fresh when no body is given."""
    state = _state(memo)
    async with state.locks[(namespace, name)]:
        raw = body if body is not None else await state.cluster.read_isvc(namespace, name)
        if raw is None or raw.get("metadata", {}).get("deletionTimestamp"):
            return
        await reconcile(raw, state.cluster, datetime.now(UTC))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def on_change(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """Any change of the object: reconcile from a fresh read (kopf's body may lag our own status write)."""
    try:
        await run_reconcile(memo, namespace or "default", name)
    except ApiException as exc:
        raise kopf.TemporaryError(f"API server: {exc.status} {exc.reason}", delay=10) from exc


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, sharp=False)
async def resync(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """Drift: kopf reacts to changes, not to state, so reconcile every resource now and then."""
    try:
        await run_reconcile(memo, namespace or "default", name)
    except ApiException as exc:
        log.warning("resync %s/%s: %s %s", namespace, name, exc.status, exc.reason)


@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
async def child_changed(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A child moved (Job finished, pods became ready): reconcile each InferenceService that owns it."""
    namespace = body.metadata.namespace
    owners = [
        ref["name"]
        for ref in body.metadata.get("ownerReferences", [])
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(GROUP + "/")
    ]
    for name in owners:
        try:
            await run_reconcile(memo, namespace or "default", name)
        except ApiException as exc:
            log.warning("reconcile %s/%s after child event: %s %s", namespace, name, exc.status, exc.reason)
