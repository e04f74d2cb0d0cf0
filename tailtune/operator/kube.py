"""The only module that talks to the Kubernetes API server.

Reads are plain GETs/LISTs; every write of a child is a server-side apply under one field manager, so the
API server, not hand-written equality checks, decides what changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException  # re-exported for the handlers

from tailtune.api import API_VERSION, GROUP, KIND, PLURAL, VERSION, InferenceService, InferenceServiceStatus
from tailtune.api.keys import DESIRED_HASH_ANNOTATION, JOB_NAME_LABEL
from tailtune.api.v1alpha1 import Condition, GenerativeStatus, LatencyStatus, ObjectMeta
from tailtune.operator.builders.common import Manifest, deployment_name, selector
from tailtune.operator.builders.engine_job import ENGINE_BUILD
from tailtune.operator.builders.triton import COMPONENT
from tailtune.operator.observed import ChildRejected, DeploymentObservation, JobObservation, Observed
from tailtune.operator.pods import summarise_triton_pods, termination_message, unschedulable
from tailtune.operator.watched import ChildVersions, PodIps, WriteEchoes

__all__ = ["ApiException", "ChildRejected", "KubeCluster", "load_config"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "tailtune-operator"
_PLURALS = {
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Service"): ("/api/v1", "services"),
}


API_CONCURRENCY = 32  # blocking client calls in flight at once (threads and pooled connections)


def load_config() -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the local kubeconfig."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = API_CONCURRENCY
    return client.ApiClient(configuration)


def _path(manifest: Manifest) -> str:
    base, plural = _PLURALS[(manifest["apiVersion"], manifest["kind"])]
    meta = manifest["metadata"]
    return f"{base}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def _not_found(exc: ApiException) -> bool:
    return getattr(exc, "status", None) == 404


def _rejection(manifest: Manifest, exc: ApiException) -> ChildRejected:
    """The server's own words: its message and the fields its causes name."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = str(body.get("message") or exc.reason or exc.status)
    causes = (body.get("details") or {}).get("causes") or []
    fields = tuple(dict.fromkeys(str(c["field"]) for c in causes if c.get("field")))
    return ChildRejected(manifest["kind"], manifest["metadata"]["name"], message, fields)


class KubeCluster:
    """Typed reads and server-side-apply writes for one InferenceService's world."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # What our last apply of each child left (Deployment: generation; others: resourceVersion), and what the
        # watch last showed: a child event that shows anything else is someone else's edit (drift), repaired at
        # once; a resync re-applies only an owner whose children the watch has not shown as applied (`watched`).
        self.children = ChildVersions()
        # Each InferenceService as our last write left it, until kopf's watch shows that version (`watched`).
        self.echoes = WriteEchoes()
        # The resourceVersion of each Triton Deployment as kopf's watch last showed it, and the ready pods' IPs
        # listed at that version: a tuner tick lists pods only when the Deployment moved.
        self.deployment_versions: dict[tuple[str, str], str] = {}
        self.pod_ips = PodIps()
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    # ---- reads -------------------------------------------------------------------------------------
    async def observe(
        self, isvc: InferenceService, job_name: str, *, job_report: bool = True, pod_ips: bool = False
    ) -> Observed:
        """Read the build Job and the Triton Deployment, and their pods only where needed. Never writes.

        A finished Job's pod is read only when `job_report` (its message is not known yet); the Triton pods only
        when some are not ready (why not) or when `pod_ips` (targets of a hot reload).
        """
        job, dep = await asyncio.gather(
            asyncio.to_thread(self._observe_job, isvc.metadata.namespace, job_name, job_report),
            asyncio.to_thread(self._observe_deployment, isvc, pod_ips),
        )
        return Observed(job=job, deployment=dep)

    def _observe_job(self, ns: str, name: str, job_report: bool) -> JobObservation | None:
        try:
            job = self.batch.read_namespaced_job(name, ns)
        except ApiException as exc:
            if _not_found(exc):
                return None
            raise
        st = job.status
        failed = any(c.type == "Failed" and c.status == "True" for c in st.conditions or [])
        succeeded = bool(st.succeeded) and not failed
        if succeeded and not job_report:
            return JobObservation(succeeded=True)
        pods = self.core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME_LABEL}={name}").items
        message, unplaced = "", ""
        for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)):
            said = self.api.sanitize_for_serialization(pod)
            message = termination_message(said) or message
            unplaced = unschedulable(said) or unplaced
        if failed and not message:
            message = next((c.message or "" for c in st.conditions or [] if c.type == "Failed"), "")
        running = not (succeeded or failed)
        return JobObservation(
            succeeded=succeeded, failed=failed, message=message,
            unschedulable=unplaced if running else "",
            not_created=self._failed_create(ns, name) if running and not pods else "",
        )  # fmt: skip

    def _failed_create(self, ns: str, job_name: str) -> str:
        """The Job controller's latest FailedCreate Event (why the Job has no pod), "" when none or not readable."""
        fields = f"involvedObject.kind=Job,involvedObject.name={job_name},reason=FailedCreate"
        try:
            found = self.core.list_namespaced_event(ns, field_selector=fields).items
        except ApiException as exc:
            if exc.status == 403:  # credentials without events list: the status says the build runs
                return ""
            raise
        latest = max(
            found, key=lambda e: e.last_timestamp or e.event_time or datetime.min.replace(tzinfo=UTC), default=None
        )
        return str(latest.message or "") if latest is not None else ""

    def _observe_deployment(self, isvc: InferenceService, pod_ips: bool) -> DeploymentObservation | None:
        ns = isvc.metadata.namespace
        try:
            dep = self.apps.read_namespaced_deployment(deployment_name(isvc), ns)
        except ApiException as exc:
            if _not_found(exc):
                return None
            raise
        st = dep.status
        ready = st.ready_replicas or 0
        # A rollout's new pod that is not ready counts in status.replicas, not in spec.replicas: look at it too.
        all_ready = ready >= max(dep.spec.replicas or 0, st.replicas or 0)
        sel = ",".join(f"{k}={v}" for k, v in selector(isvc, COMPONENT).items())
        pods = [] if all_ready and not pod_ips else self.core.list_namespaced_pod(ns, label_selector=sel).items
        pods_said = summarise_triton_pods([self.api.sanitize_for_serialization(p) for p in pods])
        return DeploymentObservation(
            replicas=dep.spec.replicas or 0,
            ready_replicas=ready,
            unschedulable=pods_said.unschedulable,
            not_ready_reason=pods_said.not_ready,
            replica_failure=_replica_failure(dep),
            failing=pods_said.failing,
            failed=pods_said.failed,
            model_load_failed=pods_said.model_load_failed,
            ready_pod_ips=pods_said.ready_ips,
            desired_hash=(dep.metadata.annotations or {}).get(DESIRED_HASH_ANNOTATION, ""),
        )

    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]:
        """The IPs of the InferenceService's ready Triton pods: one label-selected LIST when its Deployment moved
        since the last one (or its version is not known from the watch), none at rest."""
        key = (isvc.metadata.namespace, isvc.metadata.name)
        version = self.deployment_versions.get((isvc.metadata.namespace, deployment_name(isvc)), "")
        known = self.pod_ips.get(key, version)
        if known is not None:
            return known
        sel = ",".join(f"{k}={v}" for k, v in selector(isvc, COMPONENT).items())
        found = await asyncio.to_thread(self.core.list_namespaced_pod, isvc.metadata.namespace, label_selector=sel)
        ips = summarise_triton_pods([self.api.sanitize_for_serialization(p) for p in found.items]).ready_ips
        self.pod_ips.put(key, version, ips)
        return ips

    def saw_deployment(self, namespace: str, name: str, version: str | None) -> None:
        """kopf's watch showed the Deployment at `version` (None: deleted)."""
        if version is None:
            self.deployment_versions.pop((namespace, name), None)
        else:
            self.deployment_versions[(namespace, name)] = version

    def freshest(self, namespace: str, name: str, watched: Mapping[str, Any]) -> dict[str, Any]:
        """The InferenceService as kopf's watch shows it (`watched`), or as our own later write left it."""
        return self.echoes.freshest((namespace, name), watched, time.monotonic())

    def _wrote(self, meta: ObjectMeta, answer: Any) -> None:
        if isinstance(answer, dict):
            self.echoes.wrote((meta.namespace, meta.name), answer, time.monotonic())

    def may_watch(self, resource: str, group: str = "", namespaces: Sequence[str] = ()) -> bool:
        """Whether our credentials may list and watch `resource` in each of `namespaces`, or in every namespace
        when none is given (SelfSubjectAccessReviews)."""
        authz = client.AuthorizationV1Api(self.api)
        scopes: Sequence[str | None] = namespaces or [None]
        for namespace in scopes:
            for verb in ("list", "watch"):
                attributes = client.V1ResourceAttributes(group=group, resource=resource, verb=verb, namespace=namespace)
                review = client.V1SelfSubjectAccessReview(
                    spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
                )
                if not authz.create_self_subject_access_review(review).status.allowed:
                    return False
        return True

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The raw InferenceService, or None when it is gone."""
        try:
            obj: dict[str, Any] = await asyncio.to_thread(
                self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as exc:
            if _not_found(exc):
                return None
            raise
        return obj

    async def list_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Events about this InferenceService, oldest first (`tailtune explain`); read only."""
        fields = f"involvedObject.kind={KIND},involvedObject.name={name}"
        found = await asyncio.to_thread(self.core.list_namespaced_event, namespace, field_selector=fields)
        events = [
            {
                "type": e.type or "",
                "reason": e.reason or "",
                "message": e.message or "",
                "count": e.count or 1,
                "lastTimestamp": (
                    e.last_timestamp or e.event_time or e.first_timestamp or e.metadata.creation_timestamp
                ),
            }
            for e in found.items
        ]
        events.sort(key=lambda e: e["lastTimestamp"] or datetime.min.replace(tzinfo=UTC))
        for e in events:
            e["lastTimestamp"] = e["lastTimestamp"].strftime("%Y-%m-%dT%H:%M:%SZ") if e["lastTimestamp"] else None
        return events

    # ---- writes ------------------------------------------------------------------------------------
    async def delete_obsolete_jobs(self, isvc: InferenceService, keep: str) -> list[str]:
        """Deletes the InferenceService's build Jobs other than `keep` (engines its spec no longer asks for),
        with their pods; returns their names. Credentials that may not delete Jobs leave them (logged)."""
        return await asyncio.to_thread(self._delete_obsolete_jobs, isvc, keep)

    def _delete_obsolete_jobs(self, isvc: InferenceService, keep: str) -> list[str]:
        ns = isvc.metadata.namespace
        sel = ",".join(f"{k}={v}" for k, v in selector(isvc, ENGINE_BUILD).items())
        deleted = []
        for job in self.batch.list_namespaced_job(ns, label_selector=sel).items:
            ours = any(o.uid == isvc.metadata.uid for o in job.metadata.owner_references or [])
            if job.metadata.name == keep or not ours:
                continue
            try:
                self.batch.delete_namespaced_job(job.metadata.name, ns, propagation_policy="Background")
            except ApiException as exc:
                if _not_found(exc):
                    continue
                if exc.status == 403:
                    log.warning(
                        "%s/%s: may not delete obsolete build Job %s", ns, isvc.metadata.name, job.metadata.name
                    )
                    break
                raise
            deleted.append(job.metadata.name)
        return deleted

    async def apply(self, manifest: Manifest) -> None:
        """Server-side apply of one child under our field manager; `ChildRejected` when the server refuses it."""
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        try:
            live = await asyncio.to_thread(
                self._call, _path(manifest), "PATCH", json.dumps(manifest), query, "application/apply-patch+yaml"
            )
        except ApiException as exc:
            if exc.status in (400, 422):
                raise _rejection(manifest, exc) from exc
            raise
        meta = (live or {}).get("metadata", {})
        kind, namespace = manifest["kind"], meta.get("namespace", "")
        key = _child_key(kind, namespace, meta.get("name", ""))
        # A Job is applied once, when it does not exist (its template is immutable): not a serving child to resync.
        owners = [] if kind == "Job" else manifest["metadata"].get("ownerReferences") or []
        owner = next(((namespace, str(o["name"])) for o in owners if o.get("kind") == KIND), None)
        self.children.applied_now(owner, key, _version(kind, meta))

    def drifted(self, kind: str, meta: dict[str, Any]) -> bool:
        """Whether a child's event shows a state our last apply did not leave (unknown children: no)."""
        ours = self.children.applied.get(_child_key(kind, meta.get("namespace", ""), meta.get("name", "")))
        return ours is not None and ours != _version(kind, meta)

    def saw_child(self, kind: str, meta: dict[str, Any], deleted: bool) -> None:
        """kopf's watch showed a child (`meta`: its metadata), or its deletion."""
        key = _child_key(kind, meta.get("namespace", ""), meta.get("name", ""))
        self.children.saw(key, None if deleted else _version(kind, meta))

    def children_as_applied(self, namespace: str, name: str) -> bool:
        """Whether the watch shows every serving child of the InferenceService as our last apply left it."""
        return self.children.as_applied((namespace, name))

    async def write_status(self, meta: ObjectMeta, status: InferenceServiceStatus) -> None:
        """Replace status through the status subresource (one write per reconcile)."""
        body = {"status": status.model_dump(by_alias=True, mode="json", exclude_none=True)}
        answer = await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, meta.namespace, PLURAL, meta.name, body,
        )  # fmt: skip
        self._wrote(meta, answer)

    async def patch_annotations(self, meta: ObjectMeta, annotations: dict[str, str]) -> None:
        """Merge-patch annotations of the InferenceService (tuner state and the config in force)."""
        body = {"metadata": {"annotations": annotations}}
        answer = await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object, GROUP, VERSION, meta.namespace, PLURAL, meta.name, body
        )
        self._wrote(meta, answer)

    async def patch_latency(
        self, meta: ObjectMeta, latency: LatencyStatus, conditions: list[Condition] | None = None
    ) -> None:
        """Merge-patch status.latency (the tuner's observation) and, given, the conditions with SLOMet's message
        told from it; reconcile owns the rest of status."""
        status: dict[str, Any] = {"latency": latency.model_dump(by_alias=True, mode="json")}
        if conditions is not None:
            status["conditions"] = [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in conditions]
        body = {"status": status}
        answer = await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, meta.namespace, PLURAL, meta.name, body
        )
        self._wrote(meta, answer)

    async def patch_generative(
        self, meta: ObjectMeta, generative: GenerativeStatus, conditions: list[Condition] | None = None
    ) -> None:
        """Merge-patch status.generative (a generative service's tick) and, given, the conditions (its SLOMet)."""
        status: dict[str, Any] = {"generative": generative.model_dump(by_alias=True, mode="json")}
        if conditions is not None:
            status["conditions"] = [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in conditions]
        answer = await asyncio.to_thread(
            self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, meta.namespace, PLURAL, meta.name,
            {"status": status},
        )  # fmt: skip
        self._wrote(meta, answer)

    async def emit_event(self, meta: ObjectMeta, type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the InferenceService (condition transitions, tuner decisions)."""
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.name}.", namespace=meta.namespace),
            involved_object=client.V1ObjectReference(
                api_version=API_VERSION, kind=KIND, name=meta.name, namespace=meta.namespace, uid=meta.uid,
            ),
            reason=reason, message=message[:1024], type=type_, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component="tailtune-operator"),
        )  # fmt: skip
        try:
            await asyncio.to_thread(self.core.create_namespaced_event, meta.namespace, event)
        except ApiException as exc:  # events are best effort: never fail a reconcile on them
            log.warning("event %s/%s not recorded: %s", meta.name, reason, exc.reason)

    def _call(
        self, path: str, method: str, body: str | None, query: dict[str, str], content_type: str | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, post = self.api.param_serialize(
            method=method, resource_path=path, query_params=list(query.items()), header_params=headers,
            body=body, auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self.api.call_api(method, url, header_params=headers, body=body, post_params=post)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return json.loads(response.data) if response.data else None


def _child_key(kind: str, namespace: str, name: str) -> tuple[str, str, str]:
    return (kind, namespace, name)


def _version(kind: str, meta: dict[str, Any]) -> str:
    # A Deployment's status moves all the time (new resourceVersion); its generation moves only with its spec.
    return str(meta.get("generation", "")) if kind == "Deployment" else str(meta.get("resourceVersion", ""))


def _replica_failure(dep: Any) -> str:
    """The Deployment's ReplicaFailure condition (copied from its ReplicaSets' FailedCreate), "" when none."""
    for c in dep.status.conditions or []:
        if c.type == "ReplicaFailure" and c.status == "True":
            return str(c.message or c.reason or "FailedCreate")
    return ""
