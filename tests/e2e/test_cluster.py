"""The local cluster itself behaves like the GPU cluster the operator is written for."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.e2e

L4, H100 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"
EXPECTED_NODES = {"gpu-l4-0": (L4, "4"), "gpu-l4-1": (L4, "4"), "gpu-h100-0": (H100, "8")}


def container(name: str = "main", gpus: int = 0) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"name": name, "image": "registry.invalid/tailtune/test:0", "resources": {"limits": limits}}


def pod(name: str, product: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"nvidia.com/gpu.product": product}, "containers": [container(gpus=gpus)]},
    }


def job(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": L4},
                    "containers": [container(gpus=1)],
                },
            },
        },
    }


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in (obj or {}).get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            return dict(cond)
    return None


def is_true(obj: dict[str, Any] | None, kind: str) -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond["status"] == "True"


def test_gpu_nodes_are_ready_with_products_and_allocatable_gpus(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.get("nodes")["items"]}

    found = {
        name: (
            n["metadata"]["labels"]["nvidia.com/gpu.product"],
            n["status"]["allocatable"]["nvidia.com/gpu"],
        )
        for name, n in nodes.items()
        if name in EXPECTED_NODES
    }
    assert found == EXPECTED_NODES
    for name in EXPECTED_NODES:
        labels = nodes[name]["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == name
        assert labels["nvidia.com/gpu.count"] == EXPECTED_NODES[name][1]
        assert is_true(nodes[name], "Ready"), nodes[name]["status"]
        assert not nodes[name]["spec"].get("taints"), nodes[name]["spec"]
        # kwok renews a Lease per node like a kubelet; without it the node-lifecycle controller flaps the nodes.
        assert cluster.get("lease", name, "kube-node-lease") is not None


def test_gpu_pod_is_scheduled_on_an_l4_node_becomes_ready_and_can_be_deleted(cluster: Cluster, namespace: str) -> None:
    cluster.apply(pod("l4", L4), namespace=namespace)

    def ready_pod() -> dict[str, Any] | None:
        found = cluster.get("pod", "l4", namespace)
        return found if is_true(found, "Ready") else None

    ready = cluster.wait_for("pod l4 Ready", ready_pod)
    assert ready["spec"]["nodeName"] in {"gpu-l4-0", "gpu-l4-1"}
    assert ready["status"]["phase"] == "Running"
    assert ready["status"]["podIP"].startswith("10.244.")

    cluster.kubectl("delete", "pod", "l4", f"--namespace={namespace}", "--timeout=30s")
    assert cluster.get("pod", "l4", namespace) is None


def test_deployment_becomes_available(cluster: Cluster, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "triton"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "triton"}},
            "template": {
                "metadata": {"labels": {"app": "triton"}},
                "spec": {"nodeSelector": {"nvidia.com/gpu.product": H100}, "containers": [container(gpus=4)]},
            },
        },
    }
    cluster.apply(deployment, namespace=namespace)

    cluster.kubectl(
        "wait", "--for=condition=Available", "deployment/triton", f"--namespace={namespace}", "--timeout=60s"
    )
    status = cluster.get("deployment", "triton", namespace)["status"]
    assert status["readyReplicas"] == 2


def test_job_completes(cluster: Cluster, namespace: str) -> None:
    cluster.apply(job("build"), namespace=namespace)

    cluster.kubectl("wait", "--for=condition=Complete", "job/build", f"--namespace={namespace}", "--timeout=60s")
    assert cluster.get("job", "build", namespace)["status"]["succeeded"] == 1


def test_job_annotated_to_fail_fails_with_the_annotation_as_termination_message(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(job("build", annotations={"kwok.tailtune.io/fail": "boom"}), namespace=namespace)

    cluster.kubectl("wait", "--for=condition=Failed", "job/build", f"--namespace={namespace}", "--timeout=60s")
    pods = cluster.get("pods", namespace=namespace)["items"]
    assert [p["status"]["phase"] for p in pods] == ["Failed"]
    terminated = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"]) == (1, "boom")
    assert cluster.get("job", "build", namespace)["status"].get("succeeded", 0) == 0


def test_pod_selecting_a_product_no_node_has_stays_pending_unschedulable(cluster: Cluster, namespace: str) -> None:
    cluster.apply(pod("b200", "NVIDIA-B200"), namespace=namespace)

    scheduled = cluster.wait_for(
        "PodScheduled=False", lambda: condition(cluster.get("pod", "b200", namespace), "PodScheduled")
    )
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert cluster.get("pod", "b200", namespace)["status"]["phase"] == "Pending"
    cluster.wait_for(
        "a FailedScheduling event",
        lambda: [
            e
            for e in cluster.get("events", namespace=namespace)["items"]
            if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "b200"
        ],
    )


def test_garbage_collector_deletes_a_child_after_its_owner(cluster: Cluster, namespace: str) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace=namespace)
    owner = cluster.get("configmap", "owner", namespace)
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "child", "ownerReferences": [reference]},
    }
    cluster.apply(child, namespace=namespace)

    cluster.kubectl("delete", "configmap", "owner", f"--namespace={namespace}")
    cluster.wait_for("the child to be collected", lambda: cluster.get("configmap", "child", namespace) is None)


def test_a_port_taken_between_the_pick_and_the_bind_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Free ports are picked seconds before the components bind them; another process (a second cluster, a
    tritonserver beside the suite) may bind one meanwhile. The start is tried again on fresh ports, not failed
    (CI: the controller-manager's port taken by the other side's cluster failed every e2e test of the run)."""
    from devkit import cluster as local

    monkeypatch.setenv("TAILTUNE_CLUSTER_DIR", str(tmp_path / "cluster"))
    for field in dataclasses.fields(local.Ports):
        monkeypatch.delenv(f"TAILTUNE_CLUSTER_{field.name.upper()}_PORT", raising=False)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real, picks = local.pick_ports, []

        def pick() -> local.Ports:
            ports = real()
            # The first pick: the controller-manager's port is one another process holds.
            ports = dataclasses.replace(ports, controller_manager=port) if not picks else ports
            picks.append(ports)
            return ports

        monkeypatch.setattr(local, "pick_ports", pick)
        try:
            state = local.up()
        finally:
            local.down()
    assert len(picks) == 2, picks
    assert state.ports == picks[1] and state.ports.controller_manager != port
    assert "picking again" in capfd.readouterr().err
