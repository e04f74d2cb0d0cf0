"""The Triton Deployment, its model-config ConfigMap and its Service."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tailtune.api import InferenceService
from tailtune.api.keys import (
    CONFIG_HASH_ANNOTATION,
    DESIRED_HASH_ANNOTATION,
    ENGINE_KEY,
    GPU_RESOURCE,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    SCRAPE_ANNOTATION,
    SCRAPE_PATH_ANNOTATION,
    SCRAPE_PORT_ANNOTATION,
)
from tailtune.engine_builder.store import ARTIFACTS, MODEL_VERSION
from tailtune.engine_builder.trtllm import BACKEND as LLM_BACKEND
from tailtune.operator.builders.common import (
    Manifest,
    configmap_name,
    container_security_context,
    deployment_name,
    gpu_tolerations,
    labels,
    metadata,
    node_selector,
    pod_security_context,
    selector,
    service_name,
)

COMPONENT = "triton"
# Where the serving pod mounts its engine's store entry (<store>/<cache key>, by subPath).
ENGINE_MOUNT = "/engines"
# Long enough for engine load + warmup: Triton does not even listen until warmup ends.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 90
# A pod marked for deletion leaves the Service's EndpointSlice at once, but a client (kube-proxy's rules, a gRPC
# resolver, an ingress) stops picking it only once that change reaches it; a request sent meanwhile to a tritonserver
# already shutting down fails. Kubernetes' answer is a preStop sleep before SIGTERM (KEP-3960, the `sleep` action, GA
# in 1.34); 5 s is the low end of the 5-15 s its docs and ingress controllers use for that propagation.
ENDPOINT_PROPAGATION_S = 5
# tritonserver's --exit-timeout-secs default: after SIGTERM it refuses new requests and waits this long for in-flight
# ones (a long generation included) before it unloads; the grace period covers both, so none is cut by SIGKILL.
TRITON_EXIT_TIMEOUT_S = 30


def config_hash(text: str) -> str:
    """Short digest of a model config; a change in the pod template rolls the Deployment."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_model_configmap(isvc: InferenceService, config_pbtxt: str) -> Manifest:
    """ConfigMap with the Triton `config.pbtxt` in force; restarted pods come back with it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(isvc, configmap_name(isvc), COMPONENT),
        "data": {"config.pbtxt": config_pbtxt},
    }


def triton_args(isvc: InferenceService) -> list[str]:
    """tritonserver command line: explicit model control so batching can be reloaded in place."""
    return [
        "tritonserver",
        "--model-repository=/models",
        "--model-control-mode=explicit",
        f"--load-model={isvc.model_name}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-metrics=true",
        "--metrics-config=summary_latencies=true",
    ]


def llm_engine_dir(isvc: InferenceService) -> str:
    """The TensorRT-LLM engine's folder in the serving pod's model repository (the tensorrt_llm config's
    gpt_model_path), linked there from the store entry as the other backends' artifacts are."""
    return f"/models/{isvc.model_name}/{MODEL_VERSION}/{ARTIFACTS[LLM_BACKEND]}"


def _assemble_script(isvc: InferenceService) -> str:
    model = isvc.model_name
    backend = LLM_BACKEND if isvc.spec.model.kind == "generative" else isvc.spec.engine.backend
    artifact = ARTIFACTS[backend]  # a file (model.plan, model.onnx) or trtllm-build's folder (engine)
    # -n for the folder: a rerun of the init container replaces the link instead of linking inside the store.
    link = "ln -sfn" if backend == LLM_BACKEND else "ln -sf"
    return (
        f"set -e; mkdir -p /models/{model}/1; "
        f"cp /config/config.pbtxt /models/{model}/config.pbtxt; "
        f"{link} {ENGINE_MOUNT}/{model}/1/{artifact} /models/{model}/1/{artifact}"
    )


def _probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": HTTP_PORT},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def build_deployment(
    isvc: InferenceService, *, cache_key: str, replicas: int, config_digest: str, desired_hash: str = ""
) -> Manifest:
    """Triton pods on nodes of the requested GPU product, Ready only once the model is warm.

    Pods roll one at a time behind that readiness (maxSurge 1, maxUnavailable 0), not maxUnavailable 1 /
    maxSurge 0: serving capacity never drops below the replicas the tuner sized for the SLO (with one replica
    the other choice is an outage); with no spare GPU the surge pod stays Pending and the old pods keep
    serving the old config: a stalled rollout (Kubernetes marks it ProgressDeadlineExceeded), not a broken SLO.

    `desired_hash` (see `serving_digest`) goes on the Deployment itself, not on its pods: it changes with
    any serving object and must not roll them.
    """
    serving = isvc.spec.serving
    gpus = str(serving.gpu.count)
    resources = serving.resources
    limits = {**resources.limits, GPU_RESOURCE: gpus}
    requests = {**resources.requests, GPU_RESOURCE: gpus}
    pod_labels = labels(isvc, COMPONENT)
    annotations = {
        **serving.pod_annotations,
        SCRAPE_ANNOTATION: "true",
        SCRAPE_PORT_ANNOTATION: str(METRICS_PORT),
        SCRAPE_PATH_ANNOTATION: "/metrics",
        CONFIG_HASH_ANNOTATION: config_digest,
        ENGINE_KEY: cache_key,
    }
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": ENDPOINT_PROPAGATION_S + TRITON_EXIT_TIMEOUT_S,
        "nodeSelector": node_selector(isvc),
        "tolerations": gpu_tolerations(isvc),
        "securityContext": pod_security_context(),
        "initContainers": [
            {
                "name": "model-repository",
                "image": serving.triton_image,
                "command": ["sh", "-c", _assemble_script(isvc)],
                "volumeMounts": [
                    {"name": "models", "mountPath": "/models"},
                    {"name": "config", "mountPath": "/config", "readOnly": True},
                ],
                "securityContext": container_security_context(),
            }
        ],
        "containers": [
            {
                "name": "triton",
                "image": serving.triton_image,
                "args": triton_args(isvc),
                "ports": [
                    {"name": "http", "containerPort": HTTP_PORT},
                    {"name": "grpc", "containerPort": GRPC_PORT},
                    {"name": "metrics", "containerPort": METRICS_PORT},
                ],
                "resources": {"limits": limits, "requests": requests},
                "startupProbe": _probe("/v2/health/live", period=STARTUP_PERIOD_S, failures=STARTUP_FAILURES),
                "readinessProbe": _probe(f"/v2/models/{isvc.model_name}/ready", period=5, failures=3),
                "livenessProbe": _probe("/v2/health/live", period=10, failures=6),
                # Serve on until every client has dropped the endpoint (see ENDPOINT_PROPAGATION_S).
                "lifecycle": {"preStop": {"sleep": {"seconds": ENDPOINT_PROPAGATION_S}}},
                # A failed load or warmup ends tritonserver (--exit-on-error): its last log lines say why.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "volumeMounts": [
                    {"name": "models", "mountPath": "/models"},
                    {"name": "engines", "mountPath": ENGINE_MOUNT, "subPath": cache_key, "readOnly": True},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                ],
                "securityContext": container_security_context(),
            }
        ],
        "volumes": [
            {"name": "models", "emptyDir": {}},
            {"name": "config", "configMap": {"name": configmap_name(isvc)}},
            {
                "name": "engines",
                "persistentVolumeClaim": {"claimName": isvc.spec.engine.store.pvc, "readOnly": True},
            },
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        ],
    }
    if serving.affinity:
        pod_spec["affinity"] = serving.affinity
    meta = metadata(isvc, deployment_name(isvc), COMPONENT)
    if desired_hash:
        meta["annotations"] = {DESIRED_HASH_ANNOTATION: desired_hash}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(isvc, COMPONENT)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod_spec},
        },
    }


def serving_digest(objects: list[Manifest]) -> str:
    """One digest of the serving objects (built without it): an unchanged one on the live Deployment needs no apply."""
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()[:16]


def build_service(isvc: InferenceService) -> Manifest:
    """ClusterIP Service: KServe v2 HTTP and gRPC, and Triton's metrics."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, service_name(isvc), COMPONENT),
        "spec": {
            "selector": selector(isvc, COMPONENT),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }
