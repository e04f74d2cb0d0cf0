"""What kube.py reads out of the Deployment (the pods themselves: tests/unit/operator/test_pods.py)."""

from __future__ import annotations

from kubernetes import client

from tailtune.operator.kube import _replica_failure
from tailtune.operator.pods import summarise_triton_pods


def _deployment(*conditions: client.V1DeploymentCondition) -> client.V1Deployment:
    spec = client.V1DeploymentSpec(selector=client.V1LabelSelector(), template=client.V1PodTemplateSpec())
    return client.V1Deployment(spec=spec, status=client.V1DeploymentStatus(conditions=list(conditions)))


def test_replica_failure_is_the_deployments_condition_message() -> None:
    message = 'pods "t-1" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1'
    failing = client.V1DeploymentCondition(type="ReplicaFailure", status="True", reason="FailedCreate", message=message)
    progressing = client.V1DeploymentCondition(type="Progressing", status="True", message="ReplicaSet is progressing")
    assert _replica_failure(_deployment(progressing, failing)) == message
    assert _replica_failure(_deployment(progressing)) == ""
    assert _replica_failure(_deployment()) == ""
    cleared = client.V1DeploymentCondition(type="ReplicaFailure", status="False", message=message)
    assert _replica_failure(_deployment(cleared)) == ""


def test_pods_are_read_in_the_api_servers_own_shape() -> None:
    # kube.py hands the pure summary `sanitize_for_serialization` of the client's pods: camelCase JSON.
    crashed = client.V1ContainerStatus(
        name="triton", image="t", image_id="", ready=False, restart_count=3,
        state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason="CrashLoopBackOff")),
        last_state=client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(exit_code=1, message="failed to load 'bert': out of memory")
        ),
    )  # fmt: skip
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="bert-triton-1"),
        status=client.V1PodStatus(phase="Running", container_statuses=[crashed]),
    )
    said = summarise_triton_pods([client.ApiClient().sanitize_for_serialization(pod)])
    assert said.failing == (
        "pod bert-triton-1: container triton exited 1, CrashLoopBackOff, 3 restarts (a failure loop): "
        "failed to load 'bert': out of memory"
    )
    assert said.model_load_failed
