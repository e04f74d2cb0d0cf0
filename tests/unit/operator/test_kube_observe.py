"""What kube.py reads out of pods: the reason a Triton pod is not ready, a build pod's message, scheduling."""

from __future__ import annotations

from kubernetes import client

from tailtune.operator.kube import _not_ready_reason, _replica_failure, _termination_message, _unschedulable


def _pod(statuses: list[client.V1ContainerStatus], conditions: list[client.V1PodCondition]) -> client.V1Pod:
    return client.V1Pod(status=client.V1PodStatus(container_statuses=statuses, conditions=conditions))


def test_warmup_failure_surfaces_with_tritons_last_words() -> None:
    crashed = client.V1ContainerStatus(
        name="triton", image="t", image_id="", ready=False, restart_count=3,
        state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason="CrashLoopBackOff")),
        last_state=client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(
                exit_code=1, message="failed to load 'bert': warmup error: out of memory"
            )
        ),
    )  # fmt: skip
    reason = _not_ready_reason(_pod([crashed], []))
    assert reason == "triton: CrashLoopBackOff failed to load 'bert': warmup error: out of memory"


def test_model_still_warming_reports_the_ready_condition() -> None:
    running = client.V1ContainerStatus(
        name="triton", image="t", image_id="", ready=False, restart_count=0,
        state=client.V1ContainerState(running=client.V1ContainerStateRunning()),
    )  # fmt: skip
    not_ready = client.V1PodCondition(type="Ready", status="False", message="containers with unready status: [triton]")
    assert _not_ready_reason(_pod([running], [not_ready])) == "containers with unready status: [triton]"


def test_build_pod_message_and_unschedulable() -> None:
    done = client.V1ContainerStatus(
        name="builder", image="b", image_id="", ready=False, restart_count=0,
        state=client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(exit_code=11, message="DigestMismatch: got ab, want cd")
        ),
    )  # fmt: skip
    assert _termination_message(_pod([done], [])) == "DigestMismatch: got ab, want cd"
    pending = client.V1PodCondition(
        type="PodScheduled", status="False", reason="Unschedulable", message="0/3 nodes are available"
    )
    assert _unschedulable(_pod([], [pending])) == "0/3 nodes are available"
    assert _unschedulable(_pod([], [])) == ""


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
