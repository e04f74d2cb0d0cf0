"""What the operator observed about an InferenceService's children: plain data, filled by `kube`."""

from __future__ import annotations

from dataclasses import dataclass

from tailtune.api.v1alpha1 import ServiceTimePoint, TensorSpec


@dataclass(frozen=True)
class JobObservation:
    """The engine-build Job and, when it ended, what its pod said."""

    succeeded: bool = False
    failed: bool = False
    message: str = ""  # the builder's termination message (an error, or its JSON summary on success)
    unschedulable: str = ""  # the scheduler's word when the build pod cannot be placed
    not_created: str = ""  # the Job controller's FailedCreate message while it cannot create the build pod


@dataclass(frozen=True)
class EngineInfo:
    """What a successful build reported (its termination message): the engine's I/O, versions and service time."""

    tensorrt_version: str | None = None
    gpu_product: str | None = None
    location: str | None = None
    model_digest: str | None = None  # sha256:<hex> of the model bytes the build read
    engine_bytes: int | None = None  # the engine file's size (a hot reload holds two copies)
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    service_time: tuple[ServiceTimePoint, ...] = ()  # timed at the batch ladder on the serving GPU product


@dataclass(frozen=True)
class DeploymentObservation:
    """The Triton Deployment and its pods."""

    replicas: int = 0
    ready_replicas: int = 0
    unschedulable: str = ""  # scheduler message of a pod that cannot be placed
    not_ready_reason: str = ""  # e.g. the readiness probe's last failure (warmup not done or failed)
    # The Deployment's ReplicaFailure message: its ReplicaSet cannot create pods (a ResourceQuota, an admission
    # policy, a pod field only the ReplicaSet controller's create meets); "" when it can.
    replica_failure: str = ""
    # Pods that fail (see `pods.summarise_triton_pods`): live ones whose containers exit with an error or cannot
    # start, with Triton's own words and restarts; pods that ended Failed, counted per ReplicaSet.
    failing: str = ""
    failed: str = ""
    model_load_failed: bool = False  # Triton's words say it could not load the model
    ready_pod_ips: tuple[str, ...] = ()  # targets of a hot batching reload (read only when asked for)
    desired_hash: str = ""  # digest of the serving objects last applied (annotation on the Deployment)


@dataclass(frozen=True)
class Observed:
    """Everything reconcile reads before it decides. `None` means the object does not exist."""

    job: JobObservation | None = None
    deployment: DeploymentObservation | None = None


class ChildRejected(Exception):
    """The API server refused a child as invalid (400/422): only a change of the spec can fix it."""

    def __init__(self, kind: str, name: str, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(f"{kind} {name}: {message}")
        self.kind, self.name, self.message, self.fields = kind, name, message, fields
