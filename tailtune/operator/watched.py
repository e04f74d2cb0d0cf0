"""What the operator knows of its objects without asking the API server: kopf's watch, and its own writes.

A tuner tick reads its InferenceService from the body kopf's watch keeps up to date (the daemon's `body`, a live
view), not with a GET. The watch shows our own writes a moment after they are made: until it does, the object the
write returned is the newer one. `WriteEchoes` keeps each object's last write until the watch shows that version or a
later one, the way kopf waits for the version it patched (`settings.persistence.consistency_timeout`), and never
longer than ECHO_TIMEOUT_SECONDS. "Later" is told by the resourceVersion: the API server's is etcd's revision, a
number that only grows; where it is not a number only the same version counts, and the timeout ends the wait (kopf
batches one object's events, so the watch may skip our version and show a later one).

The Triton pods a tick reads batch statistics from are listed once per version of their Deployment (`PodIps`): the
Deployment's status moves whenever a pod starts, becomes ready, stops being ready or goes, and kopf already watches
the Deployments, so at rest a tick lists no pods.

An object's body is parsed (validated into the API's frozen model) once per version (`ParsedBodies`): the tuner's tick
and the fast path's check every CHECK_SECONDS read the same version of a body again and again at rest.

The drift resync re-applies an object's serving children only when the watch has not shown each of them as our last
apply left it (`ChildVersions`): a child of a kind this process watches, whose last event carries the version our
apply answered, has not been changed since, or its event would say so (a re-list after a broken watch delivers every
object again). At rest the resync then writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Parsed = TypeVar("Parsed")

# How long our own write is believed newer than what the watch shows: kopf's default consistency timeout (5 s,
# `settings.persistence.consistency_timeout`), the time it gives the watch to show a version it patched.
ECHO_TIMEOUT_SECONDS = 5.0

Key = tuple[str, str]  # (namespace, name)
ChildKey = tuple[str, str, str]  # (kind, namespace, name)


def resource_version(body: Mapping[str, Any]) -> str:
    """The object's metadata.resourceVersion, "" when it has none."""
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def _not_before(seen: str, written: str) -> bool:
    """Whether the version `seen` is `written` or later."""
    if seen == written:
        return True
    if seen.isdigit() and written.isdigit():
        return int(seen) > int(written)
    return False


@dataclass
class WriteEchoes:
    """Each object's last write by this process, kept until the watch shows it (or ECHO_TIMEOUT_SECONDS pass)."""

    timeout: float = ECHO_TIMEOUT_SECONDS
    written: dict[Key, tuple[str, dict[str, Any], float]] = field(default_factory=dict)  # key -> (version, body, at)

    def wrote(self, key: Key, body: Mapping[str, Any], now: float) -> None:
        """The API server answered our write of `key` with `body` at `now` (monotonic seconds)."""
        self.written[key] = (resource_version(body), dict(body), now)

    def freshest(self, key: Key, watched: Mapping[str, Any], now: float) -> dict[str, Any]:
        """The newest we know of the object: our last write while the watch has not shown it yet, else what the
        watch shows."""
        entry = self.written.get(key)
        if entry is None:
            return dict(watched)
        version, body, at = entry
        if _not_before(resource_version(watched), version) or now - at > self.timeout:
            del self.written[key]
            return dict(watched)
        return body

    def forget(self, key: Key) -> None:
        """The object is gone, or no longer this process's."""
        self.written.pop(key, None)


@dataclass
class PodIps:
    """The ready Triton pods' IPs of each object, as listed at one version of its Deployment."""

    listed: dict[Key, tuple[str, tuple[str, ...]]] = field(default_factory=dict)  # key -> (Deployment version, IPs)

    def get(self, key: Key, deployment_version: str) -> tuple[str, ...] | None:
        """The IPs listed at this version of the Deployment; None when they must be listed (another version, never
        listed, or the Deployment's version unknown)."""
        entry = self.listed.get(key)
        if not deployment_version or entry is None or entry[0] != deployment_version:
            return None
        return entry[1]

    def put(self, key: Key, deployment_version: str, ips: tuple[str, ...]) -> None:
        """The IPs listed while the Deployment was at `deployment_version` ("" when unknown: never reused)."""
        if deployment_version:
            self.listed[key] = (deployment_version, ips)
        else:
            self.listed.pop(key, None)

    def forget(self, key: Key) -> None:
        """Listed anew next time (a pod did not answer, or the object is gone)."""
        self.listed.pop(key, None)


@dataclass
class ChildVersions:
    """Each serving child's version (a Deployment's generation, another kind's resourceVersion) as our last apply left
    it and as the watch last showed it, grouped by the InferenceService that owns them."""

    # Kinds whose events this process receives: a Deployment always (kopf watches it); a ConfigMap or a Service
    # where the credentials allow list/watch on them (`handlers.configure`).
    watched_kinds: set[str] = field(default_factory=lambda: {"Deployment"})
    applied: dict[ChildKey, str] = field(default_factory=dict)
    seen: dict[ChildKey, str] = field(default_factory=dict)
    owned: dict[Key, set[ChildKey]] = field(default_factory=dict)

    def applied_now(self, owner: Key | None, child: ChildKey, version: str) -> None:
        """Our apply of `child` (owned by `owner`, None when it has no InferenceService owner) answered `version`."""
        self.applied[child] = version
        if owner is not None:
            self.owned.setdefault(owner, set()).add(child)

    def saw(self, child: ChildKey, version: str | None) -> None:
        """The watch showed `child` at `version` (None: deleted)."""
        if version is None:
            self.seen.pop(child, None)
        else:
            self.seen[child] = version

    def as_applied(self, owner: Key) -> bool:
        """Whether every child of `owner` applied by this process is of a watched kind and was last shown by the watch
        at the version our apply left (False when none is known: after a restart the first resync applies)."""
        children = self.owned.get(owner, set())
        return bool(children) and all(
            c[0] in self.watched_kinds and c in self.seen and self.seen[c] == self.applied.get(c) for c in children
        )

    def forget(self, owner: Key) -> None:
        """The owner is gone, or no longer this process's: its children's records go with it."""
        for child in self.owned.pop(owner, None) or ():
            self.applied.pop(child, None)
            self.seen.pop(child, None)


@dataclass
class ParsedBodies(Generic[Parsed]):
    """Each object's body parsed once per resourceVersion: the newest parse per uid, reused while the body shows the
    same version (the API server's version names one content; the models are frozen). A body without a uid or a
    version is parsed every time."""

    parse: Callable[[dict[str, Any]], Parsed]
    kept: dict[str, tuple[str, Parsed]] = field(default_factory=dict)  # uid -> (resourceVersion, parsed)

    def __call__(self, body: Mapping[str, Any]) -> Parsed:
        meta = body.get("metadata") or {}
        uid, version = str(meta.get("uid") or ""), resource_version(body)
        if not uid or not version:
            return self.parse(dict(body))
        entry = self.kept.get(uid)
        if entry is not None and entry[0] == version:
            return entry[1]
        parsed = self.parse(dict(body))
        self.kept[uid] = (version, parsed)
        return parsed

    def forget(self, uid: str | None) -> None:
        """The object is gone, or no longer this process's."""
        self.kept.pop(uid or "", None)
