"""Names, labels and owner references shared by every child object."""

from __future__ import annotations

from typing import Any

from tailtune.api import API_VERSION, KIND, InferenceService
from tailtune.api.keys import (
    COMPONENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
)

Manifest = dict[str, Any]


def deployment_name(isvc: InferenceService) -> str:
    """Name of the Triton Deployment."""
    return f"{isvc.metadata.name}-triton"


def configmap_name(isvc: InferenceService) -> str:
    """Name of the ConfigMap holding the Triton model config."""
    return f"{isvc.metadata.name}-triton-config"


def service_name(isvc: InferenceService) -> str:
    """Name of the Service in front of the Triton pods."""
    return isvc.metadata.name


def labels(isvc: InferenceService, component: str) -> dict[str, str]:
    """Recommended labels; `instance` + `component` select the pods."""
    return {
        NAME_LABEL: "tailtune",
        INSTANCE_LABEL: isvc.metadata.name,
        COMPONENT_LABEL: component,
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def selector(isvc: InferenceService, component: str) -> dict[str, str]:
    """The immutable subset of labels used as a selector."""
    return {
        INSTANCE_LABEL: isvc.metadata.name,
        COMPONENT_LABEL: component,
    }


def owner_reference(isvc: InferenceService, *, controller: bool = True) -> dict[str, Any]:
    """Owner reference to the InferenceService so children are garbage-collected with it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": isvc.metadata.name,
        "uid": isvc.metadata.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def metadata(isvc: InferenceService, name: str, component: str, *, controller: bool = True) -> dict[str, Any]:
    """Metadata block of a namespaced child."""
    return {
        "name": name,
        "namespace": isvc.metadata.namespace,
        "labels": labels(isvc, component),
        "ownerReferences": [owner_reference(isvc, controller=controller)],
    }


def gpu_tolerations(isvc: InferenceService) -> list[dict[str, Any]]:
    """The user's tolerations plus the usual one for GPU-tainted nodes."""
    tolerations: list[dict[str, Any]] = [
        t.model_dump(by_alias=True, exclude_none=True) for t in isvc.spec.serving.tolerations
    ]
    tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def node_selector(isvc: InferenceService) -> dict[str, str]:
    """Node selection by GPU product, plus the user's own selector."""
    return {**isvc.spec.serving.node_selector, GPU_PRODUCT_LABEL: isvc.spec.serving.gpu.product}


def pod_security_context() -> dict[str, Any]:
    """Restricted pod security: non-root, RuntimeDefault seccomp."""
    return {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    """Restricted container security: no privilege escalation, read-only root, no capabilities."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
