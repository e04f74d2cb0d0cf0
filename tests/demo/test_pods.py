"""Pure pieces of the runtime: node and lease manifests, pod status, container path mapping."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from devkit.pods import (
    RUNTIME_LABEL,
    ContainerView,
    Mounts,
    NodeSpec,
    PodView,
    build_lease,
    build_node,
    flag_value,
    pod_status,
    pre_stop_seconds,
    without_flags,
)
from devkit.runtime import IpPool, is_engine_build, is_triton

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)


def test_a_runtime_node_is_an_l4_node_kwok_leaves_alone() -> None:
    node = build_node(NodeSpec("demo-l4-0"), T0)
    assert "annotations" not in node["metadata"]  # no kwok.x-k8s.io/node: kwok manages annotated nodes only
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert labels[RUNTIME_LABEL] == "true"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "tailtune local process runtime (emulated GPUs)",
            "lastHeartbeatTime": "2026-01-01T12:00:00Z",
            "lastTransitionTime": "2026-01-01T12:00:00Z",
        }
    ]


def test_the_lease_is_the_nodes_heartbeat() -> None:
    assert build_lease("demo-l4-0", "uid-1", T0) == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "demo-l4-0",
            "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "demo-l4-0", "uid": "uid-1"}],
        },
        "spec": {"holderIdentity": "demo-l4-0", "leaseDurationSeconds": 40, "renewTime": "2026-01-01T12:00:00.000000Z"},
    }


def running(ready: bool) -> PodView:
    triton = ContainerView("triton", "img", "running", started_at=T0, ready=ready)
    init = ContainerView("model-repository", "img", "terminated", "Completed", "", T0, T0, 0)
    return PodView("Running", "127.0.1.2", T0, (triton,), (init,))


def test_status_of_a_warming_triton_pod() -> None:
    status = pod_status(running(ready=False), T1)
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.1.2" and status["podIPs"] == [{"ip": "127.0.1.2"}]
    assert status["hostIP"] == "127.0.0.1"
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "PodScheduled": ("True", None),
        "PodReadyToStartContainers": ("True", None),
        "Initialized": ("True", None),
        "ContainersReady": ("False", "ContainersNotReady"),
        "Ready": ("False", "ContainersNotReady"),
    }
    assert status["containerStatuses"] == [
        {
            "name": "triton",
            "image": "img",
            "imageID": "",
            "ready": False,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": "2026-01-01T12:00:00Z"}},
        }
    ]
    assert status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


def test_ready_follows_the_probe_and_transition_times_move_only_on_change() -> None:
    warming = pod_status(running(ready=False), T0)
    later = datetime(2026, 1, 1, 12, 0, 9, tzinfo=UTC)
    ready = pod_status(running(ready=True), later, warming["conditions"])
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times["Ready"] == "2026-01-01T12:00:09Z"  # changed
    assert times["PodScheduled"] == "2026-01-01T12:00:00Z"  # kept
    assert {c["type"]: c["status"] for c in ready["conditions"]}["Ready"] == "True"


def test_a_finished_build_pod_carries_its_termination_message() -> None:
    term = ContainerView("builder", "img", "terminated", "Error", "FetchFailed: no such file", T0, T1, 4)
    status = pod_status(PodView("Failed", "127.0.1.3", T0, (term,)), T1)
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"] == {
        "terminated": {
            "exitCode": 4,
            "reason": "Error",
            "message": "FetchFailed: no such file",
            "startedAt": "2026-01-01T12:00:00Z",
            "finishedAt": "2026-01-01T12:00:05Z",
        }
    }
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Ready"] == "PodCompleted"


def test_mounts_map_container_paths_longest_first() -> None:
    mounts = Mounts({"/engines": "/data/store/KEY", "/engines/cache": "/data/cache", "/tmp": "/pod/tmp"})
    assert mounts.host_path("/engines/mlp/1/model.onnx") == "/data/store/KEY/mlp/1/model.onnx"
    assert mounts.host_path("/engines/cache/x") == "/data/cache/x"
    assert mounts.host_path("/engines") == "/data/store/KEY"
    assert mounts.host_path("/enginesX") is None
    assert mounts.host_path("relative/path") is None
    assert mounts.translate("--store=/engines") == "--store=/data/store/KEY"
    assert mounts.translate("/tmp/x") == "/pod/tmp/x"
    assert mounts.translate("--model-uri=https://x/y") == "--model-uri=https://x/y"
    assert mounts.translate("build") == "build"


def test_flags() -> None:
    args = ["tritonserver", "--load-model=a", "--http-port", "8000", "--strict-readiness=true", "--load-model=b"]
    assert flag_value(args, "--load-model") == "b"
    assert flag_value(args, "--http-port") == "8000"
    assert flag_value(args, "--grpc-port") is None
    assert without_flags(args, ["--load-model", "--http-port"]) == ["tritonserver", "--strict-readiness=true"]


def pod(command: list[str], args: list[str] | None = None) -> dict[str, object]:
    return {"spec": {"containers": [{"name": "c", "command": command, "args": args or []}]}}


def test_pod_kinds() -> None:
    assert is_triton(pod([], ["tritonserver", "--model-repository=/models"]))
    assert is_triton(pod(["/opt/tritonserver/bin/tritonserver"]))
    assert is_engine_build(pod(["python", "-m", "tailtune.engine_builder", "build"]))
    assert not is_triton(pod(["sleep", "1"])) and not is_engine_build(pod(["sleep", "1"]))


def test_ip_pool_hands_out_loopback_addresses_once() -> None:
    pool = IpPool((8000,))
    a = pool.allocate("uid-a")
    b = pool.allocate("uid-b")
    assert a.startswith("127.0.1.") and b.startswith("127.0.1.") and a != b
    assert pool.allocate("uid-a") == a
    assert not pool.release(a, "uid-b")  # not b's to free
    assert pool.release(a, "uid-a")
    assert pool.allocate("uid-c") == a
    assert not pool.release(a, "uid-a")  # a finished pod's old address, now c's


@pytest.mark.parametrize("ip", ["127.0.1.0", "127.0.1.1", "127.0.1.255"])
def test_ip_pool_skips_network_and_first_and_broadcast(ip: str) -> None:
    pool = IpPool((8000,))
    assert ip not in {pool.allocate(f"uid-{i}") for i in range(3)}


def test_the_runtime_sleeps_the_triton_pods_pre_stop_hook_before_its_sigterm() -> None:
    """Caught: a runtime that sent SIGTERM at once lost the requests a client sent before it dropped the endpoint
    (2 of 355 streams in the generative e2e on a scale-in)."""
    from tailtune.operator.builders.triton import ENDPOINT_PROPAGATION_S, build_deployment
    from tests.unit.factories import make_isvc

    deployment = build_deployment(make_isvc().obj(), cache_key="eng-0", replicas=1, config_digest="d")
    assert pre_stop_seconds(deployment["spec"]["template"]) == ENDPOINT_PROPAGATION_S > 0
    assert pre_stop_seconds({"spec": {"containers": [{"name": "a"}, {"name": "b", "lifecycle": {}}]}}) == 0.0
