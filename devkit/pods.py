"""Pure pieces of the local runtime: node and lease manifests, pod status, container path mapping.

No I/O, no clock: times come in as arguments, so each piece is tested by equality.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Manifest = dict[str, Any]

RUNTIME_LABEL = "dev.tailtune.io/local-runtime"
HOST_IP = "127.0.0.1"
KUBELET_VERSION = "v1.37.2-tailtune-local"
LEASE_SECONDS = 40


def rfc3339(t: datetime) -> str:
    """Kubernetes `Time`: seconds, UTC."""
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: datetime) -> str:
    """Kubernetes `MicroTime` (leases)."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ----------------------------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeSpec:
    """One node the runtime owns: fake GPUs of one product, labelled as GPU feature discovery would."""

    name: str
    gpu_product: str = "NVIDIA-L4"
    gpus: int = 4
    gpu_memory_mib: int = 23034
    cpu: str = "16"
    memory: str = "64Gi"


def node_labels(spec: NodeSpec) -> dict[str, str]:
    """Labels of a runtime node; `dev.tailtune.io/local-runtime` lets a spec pin pods to these nodes."""
    return {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec.gpu_product,
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/gpu.memory": str(spec.gpu_memory_mib),
        RUNTIME_LABEL: "true",
    }


def node_status(spec: NodeSpec, now: datetime, ready_since: datetime) -> Manifest:
    """The status a kubelet reports: resources, Ready and the pressure conditions, addresses."""
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110", "nvidia.com/gpu": str(spec.gpus)}

    def cond(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(ready_since),
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "local runtime"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "local runtime"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "local runtime"),
            cond("Ready", "True", "KubeletReady", "tailtune local process runtime (emulated GPUs)"),
        ],
        "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": spec.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "tailtune local runtime",
            "containerRuntimeVersion": "tailtune-local://0.1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def build_node(spec: NodeSpec, now: datetime) -> Manifest:
    """The Node as registered (status included, as a kubelet registers). No kwok annotation: kwok ignores it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": node_labels(spec)},
        "spec": {},
        "status": node_status(spec, now, now),
    }


def build_lease(node: str, node_uid: str, now: datetime) -> Manifest:
    """The node's heartbeat Lease in kube-node-lease, owned by the Node."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_time(now)},
    }


# ------------------------------------------------------------------------------------------ pod status

StateName = Literal["waiting", "running", "terminated"]


@dataclass(frozen=True)
class ContainerView:
    """What the runtime knows of one container, for its status."""

    name: str
    image: str
    state: StateName
    reason: str = ""
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    ready: bool = False
    restart_count: int = 0
    last_exit_code: int | None = None
    last_message: str = ""


@dataclass(frozen=True)
class PodView:
    """What the runtime knows of one pod, for its status."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed"]
    ip: str | None
    start_time: datetime
    containers: tuple[ContainerView, ...]
    init_containers: tuple[ContainerView, ...] = ()
    reason: str = ""
    message: str = ""


def _container_status(c: ContainerView) -> Manifest:
    state: Manifest
    if c.state == "running":
        state = {"running": {"startedAt": rfc3339(c.started_at)} if c.started_at else {}}
    elif c.state == "terminated":
        term: Manifest = {"exitCode": c.exit_code if c.exit_code is not None else 0, "reason": c.reason or "Completed"}
        if c.message:
            term["message"] = c.message
        if c.started_at:
            term["startedAt"] = rfc3339(c.started_at)
        if c.finished_at:
            term["finishedAt"] = rfc3339(c.finished_at)
        state = {"terminated": term}
    else:
        waiting: Manifest = {"reason": c.reason or "ContainerCreating"}
        if c.message:
            waiting["message"] = c.message
        state = {"waiting": waiting}
    status: Manifest = {
        "name": c.name,
        "image": c.image,
        "imageID": "",
        "ready": c.ready,
        "started": c.state == "running",
        "restartCount": c.restart_count,
        "state": state,
    }
    if c.last_exit_code is not None:
        last: Manifest = {"exitCode": c.last_exit_code, "reason": "Error"}
        if c.last_message:
            last["message"] = c.last_message
        status["lastState"] = {"terminated": last}
    return status


def _condition(
    type_: str, ok: bool, now: datetime, live: Mapping[str, Mapping[str, Any]], reason: str = ""
) -> Manifest:
    status = "True" if ok else "False"
    before = live.get(type_)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    # A null reason removes a stale one from the live condition (strategic merge patch).
    return {
        "type": type_,
        "status": status,
        "lastTransitionTime": since or rfc3339(now),
        "reason": None if ok or not reason else reason,
    }


def pod_status(view: PodView, now: datetime, live_conditions: Sequence[Mapping[str, Any]] = ()) -> Manifest:
    """The pod's status as a kubelet writes it; conditions keep their transition time while unchanged."""
    live = {str(c.get("type")): c for c in live_conditions}
    initialized = all(c.state == "terminated" and c.exit_code == 0 for c in view.init_containers)
    done = view.phase in ("Succeeded", "Failed")
    ready = not done and bool(view.containers) and all(c.ready for c in view.containers)
    not_ready = "PodCompleted" if done else "ContainersNotReady"
    status: Manifest = {
        "phase": view.phase,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "startTime": rfc3339(view.start_time),
        "conditions": [
            _condition("PodScheduled", True, now, live),
            _condition("PodReadyToStartContainers", view.ip is not None, now, live),
            _condition("Initialized", initialized, now, live, "ContainersNotInitialized"),
            _condition("ContainersReady", ready, now, live, not_ready),
            _condition("Ready", ready, now, live, not_ready),
        ],
        "containerStatuses": [_container_status(c) for c in view.containers],
    }
    if view.init_containers:
        status["initContainerStatuses"] = [_container_status(c) for c in view.init_containers]
    if view.ip:
        status["podIP"] = view.ip
        status["podIPs"] = [{"ip": view.ip}]
    if view.reason:
        status["reason"] = view.reason
    if view.message:
        status["message"] = view.message
    return status


# ------------------------------------------------------------------------------------------ path mapping


@dataclass(frozen=True)
class Mounts:
    """Container paths → host paths, for one container (its volumeMounts resolved to local folders)."""

    paths: Mapping[str, str] = field(default_factory=dict)

    def host_path(self, path: str) -> str | None:
        """The host path of a container path under a mount (the longest mount wins), else None."""
        norm = posixpath.normpath(path) if path.startswith("/") else None
        if norm is None:
            return None
        best = ""
        for mount in self.paths:
            if (norm == mount or norm.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                best = mount
        if not best:
            return None
        rest = norm[len(best) :].lstrip("/")
        host = self.paths[best]
        return posixpath.join(host, rest) if rest else host

    def translate(self, arg: str) -> str:
        """An argument with container paths replaced: `/engines/x`, and `--flag=/engines/x`."""
        flag, sep, value = arg.partition("=")
        if sep and flag.startswith("-"):
            mapped = self.host_path(value)
            return f"{flag}={mapped}" if mapped is not None else arg
        mapped = self.host_path(arg)
        return mapped if mapped is not None else arg


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `--flag=value` or `--flag value` in a command line (the last one wins)."""
    found = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(args):
            found = args[i + 1]
    return found


def without_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """The command line minus every `--flag=value` / `--flag value` of `flags`."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def pre_stop_seconds(pod: Manifest) -> float:
    """The longest `lifecycle.preStop.sleep` of the pod's containers (0 without one): the kubelet runs each
    container's hook before its SIGTERM, and the pod's process here is one."""
    hooks = [(c.get("lifecycle") or {}).get("preStop") or {} for c in pod.get("spec", {}).get("containers", [])]
    return max((float((h.get("sleep") or {}).get("seconds") or 0) for h in hooks), default=0.0)
