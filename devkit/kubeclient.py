"""The harness's only Kubernetes API client: the process runtime's and the demo's calls, on raw JSON.

Everything in devkit that talks to the API server goes through `KubeClient` (import-linter checks it), so the
kubernetes package's types stop here: callers see dicts and `ApiError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config

Manifest = dict[str, Any]
# The client's error for a non-2xx answer; `.status` is the HTTP status.
ApiError = client.ApiException


class KubeClient:
    """API calls on raw JSON (dicts), with the kubernetes client's transport."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)

    @classmethod
    def from_kubeconfig(cls, path: str | Path) -> KubeClient:
        """A client with the credentials of the kubeconfig at `path`."""
        return cls(config.new_client_from_config(config_file=str(path)))

    @staticmethod
    def _json(response: Any) -> Manifest:
        data: Manifest = json.loads(response.data)
        return data

    def _get(self, read: Callable[..., Any], *args: str) -> Manifest | None:
        """A read, or None on 404."""
        try:
            return self._json(read(*args, _preload_content=False))
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # ---- reads -------------------------------------------------------------------------------------
    def raw(self, path: str) -> Manifest | None:
        """GET an API path as JSON; None on 404; ApiError on any other non-2xx answer."""
        method, url, headers, _, _ = self.api.param_serialize(
            method="GET", resource_path=path, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, header_params=headers, _request_timeout=10)
        response.read()
        if response.status == 404:
            return None
        if not 200 <= response.status < 300:
            raise ApiError(status=response.status, reason=f"GET {path}")
        return self._json(response)

    def list_namespaced_pods(self, namespace: str, timeout_s: float = 5) -> list[Manifest]:
        """The pods of `namespace`."""
        response = self.core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=timeout_s)
        items: list[Manifest] = self._json(response)["items"]
        return items

    def list_pods(self, node: str) -> Manifest:
        """PodList of the pods bound to `node`."""
        sel = f"spec.nodeName={node}"
        return self._json(self.core.list_pod_for_all_namespaces(field_selector=sel, _preload_content=False))

    def watch_pods(self, node: str, resource_version: str, timeout_s: int) -> Iterator[Manifest]:
        """Watch events of the pods bound to `node` from `resource_version`, for at most `timeout_s`."""
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}",
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=timeout_s + 10,
        )
        try:
            for line in response:
                if line.strip():
                    event: Manifest = json.loads(line)
                    yield event
        finally:
            response.release_conn()

    def read_pvc(self, namespace: str, name: str) -> Manifest | None:
        return self._get(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    def read_pv(self, name: str) -> Manifest | None:
        return self._get(self.core.read_persistent_volume, name)

    def read_config_map(self, namespace: str, name: str) -> Manifest | None:
        return self._get(self.core.read_namespaced_config_map, name, namespace)

    # ---- writes (the runtime's kubelet duties) -------------------------------------------------------
    def patch_pod_status(self, namespace: str, name: str, status: Manifest) -> None:
        self.core.patch_namespaced_pod_status(
            name,
            namespace,
            {"status": status},
            _content_type="application/strategic-merge-patch+json",
            _preload_content=False,
        )

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's final delete: grace 0, only this incarnation of the pod."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body, grace_period_seconds=0, _preload_content=False)
        except client.ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def register_node(self, node: Manifest) -> str:
        """Create the node, or refresh labels and status of an existing one; return its uid."""
        name = node["metadata"]["name"]
        try:
            created = self._json(self.core.create_node(node, _preload_content=False))
            return str(created["metadata"]["uid"])
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        self.core.patch_node(name, {"metadata": {"labels": node["metadata"]["labels"]}}, _preload_content=False)
        self.patch_node_status(name, node["status"])
        live = self._get(self.core.read_node, name)
        return str(live["metadata"]["uid"]) if live else ""

    def patch_node_status(self, name: str, status: Manifest) -> None:
        self.core.patch_node_status(
            name, {"status": status}, _content_type="application/strategic-merge-patch+json", _preload_content=False
        )

    def renew_lease(self, lease: Manifest) -> None:
        meta = lease["metadata"]
        try:
            self.coordination.patch_namespaced_lease(
                meta["name"],
                meta["namespace"],
                {"spec": lease["spec"]},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            self.coordination.create_namespaced_lease(meta["namespace"], lease, _preload_content=False)
