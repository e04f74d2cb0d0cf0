"""The engine-build Job: runs `tailtune.engine_builder` on one GPU of the serving product."""

from __future__ import annotations

from typing import Any

from tailtune.api import InferenceService
from tailtune.api.keys import ENGINE_KEY, GPU_RESOURCE
from tailtune.engine_builder import trtllm
from tailtune.operator.builders.common import (
    Manifest,
    container_security_context,
    gpu_tolerations,
    metadata,
    node_selector,
    pod_security_context,
)

ENGINE_MOUNT = "/engines"
ENGINE_BUILD = "engine-build"  # the Job's app.kubernetes.io/component
# A finished build Job goes after a day (the engine store is the cache, and status.engine records the build's
# report, so an engine built before needs no Job); a failed build is then tried again.
FINISHED_JOB_TTL_S = 86400
MODELS_MOUNT = "/mnt/models"


def pvc_claim(uri: str) -> str | None:
    """The claim of a `pvc://claim/path` URI, else None."""
    if not uri.startswith("pvc://"):
        return None
    return uri.removeprefix("pvc://").split("/", 1)[0]


def builder_args(isvc: InferenceService, cache_key: str) -> list[str]:
    """Command line of the builder for this InferenceService: `build-llm` (trtllm-build) for a generative model."""
    spec = isvc.spec
    if spec.model.kind == "generative":
        return llm_builder_args(isvc, cache_key)
    engine = spec.engine
    args = [
        "python", "-m", "tailtune.engine_builder", "build",
        "--model-uri", spec.model.uri,
        "--backend", engine.backend,
        "--precision", engine.precision,
        "--max-batch", str(engine.optimization_profile.max),
        "--opt-batch", str(engine.optimization_profile.opt),
        "--workspace-mib", str(engine.workspace_mi_b),
        "--opt-level", str(engine.builder_optimization_level),
        "--gpu-product", spec.serving.gpu.product,
        "--model-name", isvc.model_name,
        "--store", ENGINE_MOUNT,
        "--cache-key", cache_key,
    ]  # fmt: skip
    if spec.model.sha256:
        args += ["--sha256", spec.model.sha256]
    if engine.timing_cache:
        args.append("--timing-cache")
    if engine.calibration_cache_uri:
        args += ["--calibration-cache", engine.calibration_cache_uri]
    return args


def llm_builder_args(isvc: InferenceService, cache_key: str) -> list[str]:
    """`build-llm`: trtllm-build on the TensorRT-LLM checkpoint at spec.model.uri, with spec.engine.llm's limits."""
    spec = isvc.spec
    args = [
        "python", "-m", "tailtune.engine_builder", "build-llm",
        "--checkpoint-uri", spec.model.uri,
        "--gpu-product", spec.serving.gpu.product,
        "--model-name", isvc.model_name,
        "--store", ENGINE_MOUNT,
        "--cache-key", cache_key,
        *trtllm.builder_flags(trtllm.TrtllmBuildSpec.from_api(spec.llm_engine())),
    ]  # fmt: skip
    if spec.model.sha256:
        args += ["--sha256", spec.model.sha256]
    if spec.engine.timing_cache:
        args.append("--timing-cache")
    return args


def build_engine_job(isvc: InferenceService, cache_key: str) -> Manifest:
    """The build Job. Its name is the engine cache key, so a finished Job is a cache hit."""
    engine = isvc.spec.engine
    volumes: list[dict[str, Any]] = [
        {"name": "engines", "persistentVolumeClaim": {"claimName": engine.store.pvc}},
        {"name": "scratch", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "engines", "mountPath": ENGINE_MOUNT},
        {"name": "scratch", "mountPath": "/tmp"},
    ]
    claim = pvc_claim(isvc.spec.model.uri)
    if claim:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": f"{MODELS_MOUNT}/{claim}", "readOnly": True})
    # A TensorRT or TensorRT-LLM build runs on one GPU of the serving product (generative implies tensorrt).
    gpu_limits = {GPU_RESOURCE: "1"} if engine.backend == "tensorrt" else {}
    meta = metadata(isvc, cache_key, ENGINE_BUILD, controller=False)
    meta["labels"][ENGINE_KEY] = cache_key
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": engine.backoff_limit,
            "activeDeadlineSeconds": engine.deadline_seconds,
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_S,
            "template": {
                "metadata": {
                    "labels": {**meta["labels"]},
                    "annotations": dict(engine.pod_annotations),
                },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": node_selector(isvc),
                    "tolerations": gpu_tolerations(isvc),
                    "securityContext": pod_security_context(),
                    "containers": [
                        {
                            "name": "builder",
                            "image": engine.builder_image,
                            "command": builder_args(isvc, cache_key),
                            "env": [{"name": "TAILTUNE_PVC_ROOT", "value": MODELS_MOUNT}],
                            "resources": {"limits": gpu_limits, "requests": {"cpu": "1", "memory": "4Gi"}},
                            "volumeMounts": mounts,
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "securityContext": container_security_context(),
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }
