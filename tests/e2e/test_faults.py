"""Faults on the local cluster with the operator running: each case asserts what the user sees.

What the user sees is a condition (reason and message), one Event per transition, children as the spec says,
and an operator that neither crashes nor loops. Figures (time to a condition, time to repair) are printed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from devkit.cluster import Layout, LocalCluster, command_lines, recorded, start, state_dir, stop
from devkit.procs import Process
from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.tuner.types import InForce
from tests.e2e import test_latency_reasons
from tests.e2e.test_latency_reasons import FAKE_ANSWERS, FAKE_METRIC, FakePrometheus
from tests.e2e.test_operator import (
    BATCH_OF_FOUR,
    SCALE_TO_TWO,
    OperatorProcess,
    condition,
    engine_store,
    example,
    jobs,
    wait_condition,
)

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster, RecoveryTable

pytestmark = pytest.mark.e2e


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """Events on the InferenceService `name`, oldest first."""
    found = cluster.get("events", namespace=namespace)["items"]
    mine = [
        e
        for e in found
        if e["involvedObject"].get("name") == name and e["involvedObject"]["kind"] == "InferenceService"
    ]
    return sorted(mine, key=lambda e: e.get("firstTimestamp") or e["metadata"]["creationTimestamp"])


def assert_quiet(cluster: Cluster, namespace: str, name: str, seconds: float = 4) -> None:
    """No write loop: the object's resourceVersion holds for `seconds`."""
    rv = cluster.get("tis", name, namespace)["metadata"]["resourceVersion"]
    time.sleep(seconds)
    assert cluster.get("tis", name, namespace)["metadata"]["resourceVersion"] == rv, "status rewritten in a loop"


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    node = doc
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


# ------------------------------------------------------------------------- children the API server refuses

AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}  # fmt: skip

# (case, changes, the condition that says so, the spec field its message names)
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("engine pod annotation key", {"spec.engine.podAnnotations": {"bad key!": "x"}},
     "EngineReady", "spec.engine.podAnnotations"),
    ("node selector value", {"spec.serving.nodeSelector": {"disk": "not a label value!"}},
     "EngineReady", "spec.serving.nodeSelector"),
    ("toleration exists with value", {"spec.serving.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
     "EngineReady", "spec.serving.tolerations"),
    ("serving pod annotation key", {"spec.serving.podAnnotations": {"bad key!": "x"}},
     "ServingReady", "spec.serving.podAnnotations"),
    ("unknown resource name", {"spec.serving.resources": {"limits": {"not/a/resource": "1"}}},
     "ServingReady", "spec.serving.resources"),
    ("malformed affinity", {"spec.serving.affinity": AFFINITY}, "ServingReady", "spec.serving.affinity"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "changes", "type_", "field"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_child_becomes_status_and_one_event(
    cluster: Cluster, operator: OperatorProcess, namespace: str, case: str, changes: dict[str, Any], type_: str,
    field: str,
) -> None:  # fmt: skip
    engine_store(cluster, namespace)
    doc = copy.deepcopy(example("refused"))
    for path, value in changes.items():
        _set(doc, path, value)
    start = time.monotonic()
    cluster.apply(doc, namespace=namespace)
    c = wait_condition(cluster, operator, namespace, "refused", type_, "False", "ChildRejected", timeout_s=60)
    print(f"{case}: {type_}=False/ChildRejected {time.monotonic() - start:.1f} s after apply")
    assert field in c["message"] and "refused" in c["message"], c["message"]
    tis = cluster.get("tis", "refused", namespace)
    ready = condition(tis, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "ChildRejected")
    assert not tis["status"].get("endpoints", {}).get("http"), "endpoints name a Service that may not exist"
    assert_quiet(cluster, namespace, "refused")
    rejected = [e for e in events(cluster, namespace, "refused") if e["reason"] == "ChildRejected"]
    assert len(rejected) == 1, [e["message"] for e in rejected]
    assert operator.alive()

    # Fixing the spec retries at once and reaches Ready.
    fixed = copy.deepcopy(example("refused"))
    cluster.kubectl("replace", "-n", namespace, "-f", "-", input=yaml.safe_dump(fixed))
    wait_condition(cluster, operator, namespace, "refused", "Ready", "True", timeout_s=90)


@pytest.mark.parametrize("name", ["r" * 64, "res.net", "9lives"], ids=["64 chars", "dot", "leading digit"])
def test_names_that_cannot_name_children_are_refused_at_admission(
    cluster: Cluster, crd_installed: list[str], name: str
) -> None:
    doc = example(name)
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0, f"{name}: accepted"
    assert "metadata.name must be a DNS-1035 label" in result.stderr, result.stderr


# ------------------------------------------------------------------------------------ scheduling causes


def test_missing_engine_store_is_named_as_the_cause(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    cluster.apply(example(), namespace=namespace)  # no engine_store(): the PVC does not exist
    c = wait_condition(cluster, operator, namespace, "resnet50", "EngineReady", "False", "EngineBuildUnschedulable")
    message = c["message"]
    assert "'tailtune-engines'" in message and "spec.engine.store.pvc" in message, message
    assert "does not exist" in message and message.count("not found") <= 1, message
    assert "can take the build pod" not in message, message  # the GPU is not blamed
    reasons = [e["reason"] for e in events(cluster, namespace, "resnet50")]
    assert reasons.count("EngineBuildUnschedulable") == 1, reasons


# ---------------------------------------------------------------------------------------- Events


def test_one_apply_gives_one_event_per_transition(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    time.sleep(2)
    seen = [(e["reason"], e["message"]) for e in events(cluster, namespace, "resnet50")]
    reasons = [r for r, _ in seen]
    assert len(reasons) == len(set(reasons)), seen
    assert not any("not created yet" in m for _, m in seen), seen
    assert not any(m.startswith("Ready=False") for _, m in seen), seen  # told by EngineReady/ServingReady


def test_build_pod_the_job_cannot_create_is_named(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable
) -> None:
    engine_store(cluster, namespace)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.apply(quota, namespace=namespace)
    cluster.apply(example(), namespace=namespace)
    c = wait_condition(cluster, operator, namespace, "resnet50", "EngineReady", "False", "EngineBuildPodNotCreated", 40)
    assert "cannot create its pod" in c["message"] and "exceeded quota" in c["message"], c["message"]
    ready = condition(cluster.get("tis", "resnet50", namespace), "Ready")
    assert ready is not None and ready["reason"] == "EngineBuildPodNotCreated"
    reasons = [e["reason"] for e in events(cluster, namespace, "resnet50")]
    assert reasons.count("EngineBuildPodNotCreated") == 1, reasons
    start = time.monotonic()
    cluster.kubectl("delete", "resourcequota", "no-pods", "-n", namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True", timeout_s=45)
    recover_s = time.monotonic() - start
    print(f"quota lifted: Ready {recover_s:.1f} s later")
    assert len(jobs(cluster, namespace)) == 1
    recovery_table.record(
        "build Job cannot create its pod (ResourceQuota pods=0)",
        "EngineReady=False/EngineBuildPodNotCreated with the quota's message, one Event; Ready once lifted",
        "nothing; 1 Job",
        recover_s,
    )


def _quota(cluster: Cluster, namespace: str, pods: int) -> None:
    """A ResourceQuota on pods, once the quota controller has counted what runs (admission refuses every pod
    while a quota has no usage yet, which is not the fault under test)."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "pods"},
        "spec": {"hard": {"pods": str(pods)}},
    }
    cluster.apply(quota, namespace=namespace)

    def counted() -> bool:
        q = cluster.get("resourcequota", "pods", namespace)
        return bool(q and q.get("status", {}).get("hard", {}).get("pods") == str(pods) and "used" in q["status"])

    cluster.wait_for("the quota's usage counted", counted, 30)


def test_triton_pods_the_replicaset_cannot_create_are_named(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable
) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    _quota(cluster, namespace, 1)  # the one Triton pod fits; the build pod has finished and counts no more
    start = time.monotonic()
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", SCALE_TO_TWO)
    # One pod serves, the second cannot be created: degraded, with the ReplicaSet controller's words.
    c = wait_condition(cluster, operator, namespace, "resnet50", "ServingReady", "True", "ServingDegraded", 30)
    print(
        f"second Triton pod refused by the quota: ServingReady=True/ServingDegraded {time.monotonic() - start:.1f} s "
        "after the spec change"
    )
    assert "1/2 Triton pods ready" in c["message"] and "exceeded quota" in c["message"], c["message"]
    tis = cluster.get("tis", "resnet50", namespace)
    assert (condition(tis, "Ready") or {}).get("status") == "True"  # one pod still serves
    assert tis["status"]["replicas"] == {"desired": 2, "ready": 1}

    # No pod at all: the only serving pod is gone and cannot come back.
    _quota(cluster, namespace, 0)
    start = time.monotonic()
    cluster.kubectl("delete", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=triton", "--wait=false")
    c = wait_condition(cluster, operator, namespace, "resnet50", "Ready", "False", "PodsNotCreated", 30)
    print(f"serving pod deleted under pods=0: Ready=False/PodsNotCreated {time.monotonic() - start:.1f} s later")
    assert "0/2 Triton pods ready" in c["message"] and "exceeded quota" in c["message"], c["message"]
    assert_quiet(cluster, namespace, "resnet50")
    seen = [(e["type"], e["reason"]) for e in events(cluster, namespace, "resnet50")]
    assert seen.count(("Warning", "ServingDegraded")) == 1, seen
    assert seen.count(("Warning", "PodsNotCreated")) == 1, seen

    start = time.monotonic()
    cluster.kubectl("delete", "resourcequota", "pods", "-n", namespace)

    def serving_both() -> bool:
        tis = cluster.get("tis", "resnet50", namespace)
        serving = condition(tis, "ServingReady") or {}
        return serving.get("reason") == "ServingAvailable" and tis["status"]["replicas"] == {"desired": 2, "ready": 2}

    try:
        cluster.wait_for("both Triton pods ready once the quota is gone", serving_both, 120)
    except BaseException:
        print("operator log:\n" + operator.log_tail(), file=sys.stderr)
        raise
    recover_s = time.monotonic() - start
    print(f"quota lifted: 2/2 Triton pods ready, ServingAvailable {recover_s:.1f} s later")
    assert ("Normal", "ServingAvailable") in [(e["type"], e["reason"]) for e in events(cluster, namespace, "resnet50")]
    assert len(cluster.get("deployments", namespace=namespace)["items"]) == 1
    recovery_table.record(
        "Triton pods the ReplicaSet cannot create (ResourceQuota: pods=1 with 2 replicas, then pods=0)",
        "ServingReady=True/ServingDegraded (1/2 ready) then Ready=False/PodsNotCreated (0/2), each with the "
        "quota's message and one Warning Event; Ready again once the quota is gone (the ReplicaSet controller's "
        "own retry backoff bounds the recovery)",
        "nothing; 1 Deployment",
        recover_s,
    )


# ------------------------------------------------------------------------------------------- drift


def test_scaled_deployment_is_restored_within_seconds(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    start = time.monotonic()
    cluster.kubectl("scale", "deployment/resnet50-triton", "-n", namespace, "--replicas=3")

    def restored() -> bool:
        return bool(cluster.get("deployment", "resnet50-triton", namespace)["spec"]["replicas"] == 1)

    time.sleep(0.5)
    cluster.wait_for("replicas back to 1", restored, 20)
    print(f"kubectl scale repaired in {time.monotonic() - start:.1f} s")
    tis = cluster.get("tis", "resnet50", namespace)
    assert tis["status"]["replicas"]["desired"] == 1


def test_edited_configmap_is_restored_within_seconds(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    name = "resnet50-triton-config"
    original = cluster.get("configmap", name, namespace)["data"]["config.pbtxt"]
    start = time.monotonic()
    patch = json.dumps({"data": {"config.pbtxt": original.replace("max_batch_size: 8", "max_batch_size: 2")}})
    cluster.kubectl("patch", "configmap", name, "-n", namespace, "--type=merge", "-p", patch)

    def restored() -> bool:
        return bool(cluster.get("configmap", name, namespace)["data"]["config.pbtxt"] == original)

    time.sleep(0.5)
    cluster.wait_for("config.pbtxt restored", restored, 20)
    print(f"ConfigMap edit repaired in {time.monotonic() - start:.1f} s")


def test_deleted_service_is_restored(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    cluster.kubectl("delete", "service", "resnet50", "-n", namespace)
    cluster.wait_for("the Service back", lambda: cluster.get("service", "resnet50", namespace), 20)


# ------------------------------------------------------------------------------------ large annotations


def test_large_user_annotation_neither_blocks_updates_nor_deletion(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    doc = example()
    doc["metadata"]["annotations"] = {"example.com/blob": "x" * 150_000}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", SCALE_TO_TWO)
    cluster.wait_for(
        "the spec change applied",
        lambda: cluster.get("deployment", "resnet50-triton", namespace)["spec"]["replicas"] == 2,
        60,
    )
    start = time.monotonic()
    cluster.kubectl("delete", "tis", "resnet50", "-n", namespace, "--wait=false")
    cluster.wait_for(
        "the object gone (finalizer removed)", lambda: cluster.get("tis", "resnet50", namespace) is None, 30
    )
    print(f"deleted in {time.monotonic() - start:.1f} s with a 150 kB annotation")
    assert operator.alive()


# ---------------------------------------------------------------------------- two services, one model


def test_two_services_with_one_model_build_apart_and_outlive_each_other(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example("first"), example("second"), namespace=namespace)
    for name in ("first", "second"):
        wait_condition(cluster, operator, namespace, name, "Ready", "True")
    built = {j["metadata"]["name"]: j["metadata"]["ownerReferences"][0]["name"] for j in jobs(cluster, namespace)}
    assert sorted(built.values()) == ["first", "second"], built
    keys = {n: cluster.get("tis", n, namespace)["status"]["engine"]["cacheKey"] for n in ("first", "second")}
    assert keys["first"] != keys["second"] and set(keys.values()) == set(built)

    cluster.kubectl("delete", "tis", "first", "-n", namespace)
    cluster.wait_for(
        "first's Job collected",
        lambda: keys["first"] not in {j["metadata"]["name"] for j in jobs(cluster, namespace)},
        60,
    )
    assert [j["metadata"]["name"] for j in jobs(cluster, namespace)] == [keys["second"]]
    time.sleep(2)
    second = cluster.get("tis", "second", namespace)
    for type_ in ("EngineReady", "Ready"):
        assert condition(second, type_)["status"] == "True"  # type: ignore[index]
    assert cluster.get("deployment", "second-triton", namespace)["spec"]["replicas"] == 1


# ------------------------------------------------------------------ the model's bytes (issue 40, item 5)


def test_failed_build_is_retried_by_the_command_its_message_names(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """A build that failed on a bad file is never retried on its own (the failed Job is the cache key's); once the
    file is fixed, the command EngineBuildFailed names builds it again."""
    engine_store(cluster, namespace)
    doc = example("corrupt")
    # On kwok the build pod fails with this annotation's words; dropping it is "fixing the file" (no new key).
    doc["spec"]["engine"]["podAnnotations"] = {"kwok.tailtune.io/fail": "CorruptModel: model.onnx: truncated"}
    doc["spec"]["engine"]["backoffLimit"] = 0
    cluster.apply(doc, namespace=namespace)
    c = wait_condition(cluster, operator, namespace, "corrupt", "EngineReady", "False", "EngineBuildFailed")
    command = re.search(r"`(kubectl delete job [^`]+)`", c["message"])
    assert command is not None, c["message"]
    [job] = jobs(cluster, namespace)
    assert shlex.split(command.group(1)) == ["kubectl", "delete", "job", "-n", namespace, job["metadata"]["name"]]

    cluster.kubectl("patch", "tis", "corrupt", "-n", namespace, "--type=merge", "-p",
                    '{"spec": {"engine": {"podAnnotations": null}}}')  # fmt: skip
    time.sleep(3)
    tis = cluster.get("tis", "corrupt", namespace)
    assert condition(tis, "EngineReady")["reason"] == "EngineBuildFailed"  # type: ignore[index]
    start = time.monotonic()
    cluster.kubectl(*shlex.split(command.group(1))[1:])
    wait_condition(cluster, operator, namespace, "corrupt", "Ready", "True", timeout_s=90)
    print(f"failed build retried as told: Ready {time.monotonic() - start:.1f} s after the command")
    assert [j["metadata"]["name"] for j in jobs(cluster, namespace)] == [job["metadata"]["name"]]


def test_model_replaced_at_the_same_uri_is_rebuilt_on_a_new_revision(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    """EngineBuilt says the URI is not read again and how to rebuild; a new spec.model.revision builds a new engine
    (a new cache key: a store entry of the old bytes is no hit) and serves it."""
    engine_store(cluster, namespace)
    doc = example()
    del doc["spec"]["model"]["sha256"]  # unpinned: whatever bytes the URI serves
    cluster.apply(doc, namespace=namespace)
    built = wait_condition(cluster, operator, namespace, "resnet50", "EngineReady", "True")
    assert "spec.model.revision" in built["message"], built["message"]
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    old = cluster.get("tis", "resnet50", namespace)["status"]["engine"]["cacheKey"]
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p",
                    '{"spec": {"model": {"revision": "2026-01-05"}}}')  # fmt: skip

    def rebuilt() -> str | None:
        tis = cluster.get("tis", "resnet50", namespace)
        key: str = tis["status"]["engine"]["cacheKey"]
        ready = condition(tis, "Ready")
        return key if key != old and ready and ready["status"] == "True" else None

    key = cluster.wait_for("Ready on the engine of the new revision", rebuilt, 90)
    dep = cluster.get("deployment", "resnet50-triton", namespace)
    assert dep["spec"]["template"]["metadata"]["annotations"]["tailtune.io/engine-key"] == key

    # Each build is told by its own Events: the engine of the first revision, then the rebuild and its engine.
    def told() -> list[str] | None:
        said = [e["reason"] for e in events(cluster, namespace, "resnet50") if e["reason"].startswith("EngineBuil")]
        return said if said.count("EngineBuilt") == 2 else None

    said = cluster.wait_for("an EngineBuilt Event per build", told, 10)
    assert said.count("EngineBuildRunning") == 2, said


# ---------------------------------------------------------------------------------- operator restarts


def test_operator_killed_with_a_refused_child_tells_it_once(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    doc = example("refused")
    doc["spec"]["serving"]["podAnnotations"] = {"bad key!": "x"}
    cluster.apply(doc, namespace=namespace)
    wait_condition(cluster, operator, namespace, "refused", "ServingReady", "False", "ChildRejected")
    operator.kill()
    operator.start()  # resumes every object: the refusal is met again, and is already in the status
    time.sleep(8)
    assert operator.alive()
    tis = cluster.get("tis", "refused", namespace)
    assert (condition(tis, "Ready") or {}).get("reason") == "ChildRejected"
    rejected = [e for e in events(cluster, namespace, "refused") if e["reason"] == "ChildRejected"]
    assert len(rejected) == 1, [e["message"] for e in rejected]
    assert [d["metadata"]["name"] for d in cluster.get("deployments", namespace=namespace)["items"]] == []
    assert len(jobs(cluster, namespace)) == 1


# ------------------------------------------------------------------------------ control plane restarts

_restarted: list[Process] = []  # components this module restarted: kept referenced, they outlive the session


CONTROLLERS = ("kube-controller-manager", "kube-scheduler", "kwok")


def _restart(name: str, down_s: float = 0, while_down: Callable[[], object] | None = None) -> None:
    """Stops a component of the local cluster by the PID `up` recorded and starts it with the same command line;
    `while_down` is called once it is stopped."""
    if os.environ.get("TAILTUNE_KUBECONFIG"):
        pytest.skip("TAILTUNE_KUBECONFIG: not a cluster this suite started, its processes are not ours")
    layout = Layout(state_dir())
    state = LocalCluster.load(layout.state)
    stop(name, recorded(layout)[name])
    if while_down is not None:
        while_down()
    time.sleep(down_s)
    _restarted.append(start(layout, name, command_lines(layout, Path(state.bin_dir), state.ports)[name]))


def restart_component(cluster: Cluster, name: str, down_s: float) -> float:
    """Restarts `name` after `down_s` down and waits for the API server's /readyz; returns when (monotonic)."""
    _restart(name, down_s)

    def ready() -> bool:
        return cluster.kubectl("get", "--raw", "/readyz", check=False, timeout_s=10).returncode == 0

    cluster.wait_for(f"the API server ready after restarting {name}", ready, 60)
    return time.monotonic()


def restore_controllers(cluster: Cluster) -> None:
    """Restarts Kubernetes' controllers and kwok and waits until a new namespace gets its ServiceAccount and kwok
    holds every kwok node's lease: after an API server restart their watches may take up to a minute to come back
    (client-go backoff), which is not what the next test is about.

    The node leases the stopped kwok held are deleted before the new one starts: kwok plays a node's pods only
    once it holds the node's lease, and the new kwok (a new holder identity) waited out the old one's lease
    (--node-lease-duration-seconds=40): up to 40 s in which the next test's pods were scheduled and stayed
    Pending (CI: the etcd restart case after the kube-apiserver one, the rolling-change case after that)."""
    for name in CONTROLLERS:
        release = (lambda: cluster.kubectl("delete", "leases", "--all", "-n", NODE_LEASES)) if name == "kwok" else None
        _restart(name, while_down=release)
    probe = f"probe-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", probe)
    try:
        cluster.wait_for("the controllers back", lambda: cluster.get("serviceaccount", "default", probe), 60)
    finally:
        cluster.kubectl("delete", "namespace", probe, "--wait=false", check=False)
    cluster.wait_for("kwok holding every kwok node's lease", lambda: kwok_leases_held(cluster), 60)


NODE_LEASES = "kube-node-lease"


def kwok_leases_held(cluster: Cluster) -> bool:
    """Every node kwok manages (annotated kwok.x-k8s.io/node=fake) has a lease with a holder (after the deletion
    above: the new kwok's)."""
    nodes = cluster.get("nodes")["items"]
    fake = {
        n["metadata"]["name"] for n in nodes if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake"
    }
    leases = {
        lease["metadata"]["name"]: lease["spec"] for lease in cluster.get("leases", namespace=NODE_LEASES)["items"]
    }
    return all(leases.get(n, {}).get("holderIdentity") for n in fake)


def scale_to_two_and_wait(cluster: Cluster, namespace: str, acting: OperatorProcess, what: str) -> None:
    """Scales resnet50 to two replicas and waits (45 s at most) for Ready with both; the acting operator's log on
    failure."""
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", SCALE_TO_TWO)
    try:
        cluster.wait_for(what, lambda: ready_with_replicas(cluster, namespace, "resnet50", 2), 45)
    except BaseException:
        print("operator log:\n" + acting.log_tail(), file=sys.stderr)
        raise


def ready_with_replicas(cluster: Cluster, namespace: str, name: str, replicas: int) -> bool:
    tis = cluster.get("tis", name, namespace)
    ready = condition(tis, "Ready")
    return bool(
        ready
        and ready["status"] == "True"
        and tis["status"]["replicas"]["desired"] == replicas
        and tis["status"]["observedGeneration"] == tis["metadata"]["generation"]
    )


@pytest.mark.parametrize(("component", "down_s"), [("kube-apiserver", 5), ("etcd", 5)])
def test_control_plane_restart_is_survived(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable, component: str,
    down_s: float,
) -> None:  # fmt: skip
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    try:
        back = restart_component(cluster, component, down_s)
        assert operator.alive(), "the operator exited while the control plane was down"
        _change_reaches_ready(cluster, operator, namespace, back, component, down_s, recovery_table)
    finally:
        restore_controllers(cluster)


def _change_reaches_ready(
    cluster: Cluster, operator: OperatorProcess, namespace: str, back: float, component: str, down_s: float,
    recovery_table: RecoveryTable,
) -> None:  # fmt: skip
    scale_to_two_and_wait(cluster, namespace, operator, "status to move after the restart")
    recover_s = time.monotonic() - back
    print(f"{component} down {down_s} s: a spec change made then Ready {recover_s:.1f} s after the API server")
    assert operator.alive()
    assert cluster.get("deployment", "resnet50-triton", namespace)["spec"]["replicas"] == 2
    assert len(jobs(cluster, namespace)) == 1
    recovery_table.record(
        f"{component} stopped {down_s:.0f} s and restarted",
        "status frozen while down (reads fail); operator stays up and reconnects; a spec change made after "
        "reaches Ready (time from the API server's /readyz)",
        "nothing; 1 Job, 1 Deployment",
        recover_s,
    )


# ------------------------------------------------------------------------------ operator SIGKILL mid-roll


def test_operator_killed_during_a_rolling_change_converges(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable
) -> None:
    engine_store(cluster, namespace)
    doc = example()
    doc["spec"]["tuning"] = {"mode": "rolling"}
    cluster.apply(doc, namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    before = cluster.get("deployment", "resnet50-triton", namespace)
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", BATCH_OF_FOUR)
    time.sleep(0.05)  # the operator has seen the change, or is about to
    operator.kill()
    operator.start()
    restarted = time.monotonic()

    def rolled() -> bool:
        tis = cluster.get("tis", "resnet50", namespace)
        dep = cluster.get("deployment", "resnet50-triton", namespace)
        ready = condition(tis, "Ready")
        return bool(
            ready
            and ready["status"] == "True"
            and tis["status"]["observedGeneration"] == tis["metadata"]["generation"]
            and tis["status"]["batching"]["maxBatchSize"] == 4
            and dep["metadata"]["generation"] > before["metadata"]["generation"]
            and dep["status"].get("updatedReplicas") == dep["status"].get("readyReplicas") == 1
        )

    cluster.wait_for("the rolling change done after the restart", rolled, 45)
    recover_s = time.monotonic() - restarted
    cm = cluster.get("configmap", "resnet50-triton-config", namespace)
    assert "max_batch_size: 4" in cm["data"]["config.pbtxt"]
    assert [d["metadata"]["name"] for d in cluster.get("deployments", namespace=namespace)["items"]] == [
        "resnet50-triton"
    ]
    assert len(jobs(cluster, namespace)) == 1
    assert operator.alive()
    recovery_table.record(
        "operator SIGKILLed 0.05 s after a rolling change was made",
        "no duplicate or half-applied children; the restarted operator finishes the roll, status shows the new batch",
        "nothing; 1 Job, 1 Deployment",
        recover_s,
    )


# ------------------------------------------------------------------------------------ many objects

SCALE_PRODUCT = "TAILTUNE-SCALE"


def scale_node(name: str, gpus: int) -> dict[str, Any]:
    """A kwok GPU node of its own product, large enough for every build and serving pod of the scale test."""
    capacity = {"cpu": "4000", "memory": "40000Gi", "pods": "1000", "nvidia.com/gpu": str(gpus)}
    labels = {"kubernetes.io/hostname": name, "type": "kwok", "nvidia.com/gpu.product": SCALE_PRODUCT}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "10.255.9.1"}, {"type": "Hostname", "address": name}],
        },
    }


# (way it is invalid, change): each passes admission, and only the operator or a child's refusal can tell.
BROKEN: list[tuple[str, str, dict[str, Any], str]] = [
    ("gpu in resources", "spec.serving.resources", {"limits": {"nvidia.com/gpu": "2"}}, "InvalidSpec"),
    ("engine pod annotation", "spec.engine.podAnnotations", {"bad key!": "x"}, "ChildRejected"),
    ("serving pod annotation", "spec.serving.podAnnotations", {"bad key!": "x"}, "ChildRejected"),
    ("node selector value", "spec.serving.nodeSelector", {"disk": "not a label value!"}, "ChildRejected"),
    ("no such gpu", "spec.serving.gpu.product", "NVIDIA-B200", "EngineBuildUnschedulable"),
]


# The suite's sample: 50 objects, so every way of BROKEN is among the invalid tenth once. What it checks (each
# invalid one at its reason, the valid ones not held up, the operator up) does not depend on the count; the fleet
# size is the benchmark's: TAILTUNE_E2E_SCALE_N=200 (the README's benchmark table; ~4 minutes on two shared cores,
# where the operator's reconciles per child event are the bound).
SCALE_N = int(os.environ.get("TAILTUNE_E2E_SCALE_N", str(10 * len(BROKEN))))


def scale_docs(n: int, *, invalid: bool) -> dict[str, tuple[dict[str, Any], str]]:
    """n InferenceServices on the scale node, by name, with the Ready reason each must reach; with `invalid`,
    every tenth is broken (the ways of BROKEN in turn), else every tenth is left out."""
    docs = {}
    for i in range(n):
        if i % 10 == 0 and not invalid:
            continue
        doc = example(f"m{i:03d}")
        doc["spec"]["serving"]["gpu"]["product"] = SCALE_PRODUCT
        doc["spec"]["serving"]["resources"] = {}
        doc["spec"]["tuning"]["enabled"] = False
        doc["spec"]["metrics"] = {"prometheusUrl": "http://127.0.0.1:1"}
        reason = "AllComponentsReady"
        if i % 10 == 0:
            _, path, value, reason = BROKEN[(i // 10) % len(BROKEN)]
            _set(doc, path, value)
        docs[doc["metadata"]["name"]] = (doc, reason)
    return docs


def apply_and_settle(
    cluster: Cluster, namespace: str, docs: dict[str, tuple[dict[str, Any], str]]
) -> tuple[float, float]:
    """Applies every doc at once; returns the seconds until the valid ones were all Ready and until every one
    had its expected reason."""
    expected = {name: reason for name, (_, reason) in docs.items()}
    valid = {name for name, reason in expected.items() if reason == "AllComponentsReady"}
    start = time.monotonic()
    cluster.apply(*(doc for doc, _ in docs.values()), namespace=namespace)
    seen: dict[str, str] = {}
    valid_s: list[float] = []

    def settled() -> bool:
        items = cluster.get("tis", namespace=namespace)["items"]
        seen.update({t["metadata"]["name"]: (condition(t, "Ready") or {}).get("reason", "") for t in items})
        if not valid_s and all(seen.get(n) == "AllComponentsReady" for n in valid):
            valid_s.append(time.monotonic() - start)
        return seen == expected

    try:
        cluster.wait_for("every object at its expected Ready reason", settled, max(50, len(docs) / 2))
    except BaseException:
        wrong = {n: (seen.get(n), r) for n, r in expected.items() if seen.get(n) != r}
        print(f"{len(wrong)} not there yet (seen, expected): {dict(list(wrong.items())[:10])}", file=sys.stderr)
        raise
    return valid_s[0], time.monotonic() - start


def test_many_objects_10_percent_invalid(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable
) -> None:
    baseline = f"{namespace[:50]}-valid"
    cluster.kubectl("create", "namespace", baseline)
    cluster.wait_for("the baseline's ServiceAccount", lambda: cluster.get("serviceaccount", "default", baseline), 30)
    node = f"scale-{namespace[-6:]}"
    cluster.apply(scale_node(node, 4 * SCALE_N))  # both runs' serving pods and the builds in flight
    try:
        # The valid ones alone first, then the same ones with the invalid tenth among them.
        engine_store(cluster, baseline)
        alone_s, _ = apply_and_settle(cluster, baseline, scale_docs(SCALE_N, invalid=False))
        engine_store(cluster, namespace)
        docs = scale_docs(SCALE_N, invalid=True)
        valid_s, recover_s = apply_and_settle(cluster, namespace, docs)
        n_valid = SCALE_N - SCALE_N // 10
        print(
            f"{SCALE_N} objects ({SCALE_N // 10} invalid): the {n_valid} valid ones Ready in {valid_s:.1f} s "
            f"(alone: {alone_s:.1f} s), every one at its reason in {recover_s:.1f} s"
        )
        assert operator.alive()
        # The invalid ones cost the valid ones little: within half again their time alone (+10 s of noise on
        # two shared cores).
        assert valid_s <= 1.5 * alone_s + 10, (valid_s, alone_s)
        # InvalidSpec creates no Job, and a Job the API server refuses (annotation, node selector) is not there.
        no_job = sum(1 for i in range(0, SCALE_N, 10) if (i // 10) % len(BROKEN) in (0, 1, 3))
        assert len(jobs(cluster, namespace)) == SCALE_N - no_job
        recovery_table.record(
            f"{SCALE_N} InferenceServices applied at once, {SCALE_N // 10} invalid in "
            f"{min(len(BROKEN), SCALE_N // 10)} ways",
            f"each invalid one Ready=False with the reason its way gives (InvalidSpec, ChildRejected, "
            f"EngineBuildUnschedulable); the {n_valid} valid ones Ready in {valid_s:.0f} s ({alone_s:.0f} s without "
            "the invalid ones); operator up",
            "nothing; one Job per valid or unschedulable object",
            recover_s,
        )
    finally:
        drain_namespaces(cluster, (baseline, namespace))
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)


# What an operator watches (InferenceServices, their Jobs and Deployments) and what runs under them.
DRAINED = "inferenceservices,deployments,replicasets,jobs,pods"


def drain_namespaces(cluster: Cluster, names: tuple[str, ...], timeout_s: float = 420) -> None:
    """Deletes the namespaces and waits until they are gone: every InferenceService finalized by this module's
    operator and every child collected. Left in flight, the scale test's 380 objects and their children were
    what the next test's freshly started operators resumed first (CI, stop 24: the HA pair's active operator
    still replaying their Deployments when its own object's 90 s ran out).

    The InferenceServices are deleted first and the namespaces once nothing of DRAINED is left in them: the
    namespace controller deletes pods first and, while any is left, looks again only after half their grace
    period plus a second (16 s), then deletes the rest; a namespace deleted with its 95 objects in it took
    28-32 s to go, most of it that wait. Deleted by their owners' deletion (the garbage collector, kwok), the
    children are gone in a few seconds and the empty namespaces follow."""
    start = time.monotonic()
    for name in names:
        cluster.kubectl("delete", "inferenceservices", "--all", "-n", name, "--wait=false", check=False)

    def empty(namespace: str) -> bool:
        left = cluster.kubectl("get", DRAINED, "-n", namespace, "-o", "name", check=False)
        return left.returncode == 0 and not left.stdout.strip()

    try:
        cluster.wait_for(f"{', '.join(names)} emptied", lambda: all(empty(n) for n in names), timeout_s)
    finally:
        for name in names:
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.wait_for(
        f"namespaces {', '.join(names)} deleted",
        lambda: all(cluster.get("namespace", n) is None for n in names),
        timeout_s,
    )
    print(f"{len(names)} namespaces of the scale test drained in {time.monotonic() - start:.1f} s")


# ------------------------------------------------------------------------------------ a node goes away

NODE_PRODUCT = "TAILTUNE-NODE-LOSS"


@pytest.mark.skipif(
    os.environ.get("TAILTUNE_E2E_SLOW") != "1",
    reason="TAILTUNE_E2E_SLOW=1: recovery waits for the pod garbage collector (40 s quarantine + up to a 20 s period)",
)
def test_serving_node_deleted_pod_moves_to_another(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable
) -> None:
    engine_store(cluster, namespace)
    names = [f"loss-{namespace[-6:]}-{i}" for i in range(2)]
    for name in names:
        node = scale_node(name, 2)
        node["metadata"]["labels"]["nvidia.com/gpu.product"] = NODE_PRODUCT
        cluster.apply(node)
    try:
        doc = example()
        doc["spec"]["serving"]["gpu"]["product"] = NODE_PRODUCT
        cluster.apply(doc, namespace=namespace)
        wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")

        def serving_pods() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = cluster.get("pods", namespace=namespace)["items"]
            return [p for p in items if p["metadata"]["labels"].get("app.kubernetes.io/component") == "triton"]

        [pod] = serving_pods()
        lost = pod["spec"]["nodeName"]
        start = time.monotonic()
        cluster.kubectl("delete", "node", lost)
        time.sleep(3)
        # Nothing reports a pod whose node is gone until it is collected: what the user sees meanwhile.
        stale = condition(cluster.get("tis", "resnet50", namespace), "Ready")
        assert stale is not None and stale["status"] == "True", stale

        def moved() -> bool:
            pods = serving_pods()
            ready = condition(cluster.get("tis", "resnet50", namespace), "Ready")
            return bool(
                [p["spec"].get("nodeName") for p in pods] == [n for n in names if n != lost]
                and ready
                and ready["status"] == "True"
                and all(p["metadata"]["name"] != pod["metadata"]["name"] for p in pods)
            )

        cluster.wait_for("the serving pod on the other node and Ready", moved, 75)
        recover_s = time.monotonic() - start
        print(f"node {lost} deleted: serving back on the other node {recover_s:.1f} s later")
        assert operator.alive()
        assert len(cluster.get("deployments", namespace=namespace)["items"]) == 1
        recovery_table.record(
            "the GPU node under the only serving pod deleted",
            "Ready stays True until the pod garbage collector removes the orphaned pod (40 s quarantine), then "
            "the Deployment's new pod on the other node is Ready",
            "nothing; 1 Deployment, 1 pod",
            recover_s,
        )
    finally:
        for name in names:
            cluster.kubectl("delete", "node", name, "--wait=false", check=False)


# ---------------------------------------------------------------------------------------- HA pair

PEERING_CRD = Path(__file__).resolve().parents[2] / "charts" / "tailtune" / "crds" / "clusterkopfpeerings.kopf.dev.yaml"


@contextlib.contextmanager
def ha_pair(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path, peering: str
) -> Iterator[list[OperatorProcess]]:
    """Two operators peered under `peering` (lifetime 10 s), the higher priority one started first and acting;
    the module's standalone operator is stopped meanwhile (it would act beside the pair) and started after."""
    cluster.kubectl("apply", "--server-side", f"--filename={PEERING_CRD}")
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=60s")
    cluster.apply({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}})
    env = {"TAILTUNE_PEERING_LIFETIME": "10"}
    pair = [
        OperatorProcess(cluster, tmp_path / f"{role}.log", env, (f"--peering={peering}", f"--priority={priority}"))
        for role, priority in (("active", 200), ("standby", 100))
    ]
    active, standby = pair
    operator.stop()
    try:
        active.start()
        cluster.wait_for("the active operator", lambda: "Resuming operations" in active.log_tail(400), 60)
        standby.start()
        cluster.wait_for("the standby", lambda: "Initial authentication has finished" in standby.log_tail(400), 60)
        time.sleep(3)  # its first look at the peering object
        yield pair
    finally:
        for op in pair:
            op.stop()
        operator.start()
        cluster.kubectl("delete", "clusterkopfpeering", peering, "--wait=false", check=False)


def test_active_operator_of_an_ha_pair_killed_the_standby_takes_over(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable, tmp_path: Path
) -> None:
    with ha_pair(cluster, operator, tmp_path, f"ha-{namespace[-6:]}") as (active, standby):
        engine_store(cluster, namespace)
        cluster.apply(example(), namespace=namespace)
        wait_condition(cluster, active, namespace, "resnet50", "Ready", "True")
        active.kill()
        killed = time.monotonic()
        scale_to_two_and_wait(cluster, namespace, standby, "the standby to apply the change")
        recover_s = time.monotonic() - killed
        print(f"active operator killed: the standby applied a change {recover_s:.1f} s later")
        assert standby.alive()
        assert len(jobs(cluster, namespace)) == 1
        assert [d["metadata"]["name"] for d in cluster.get("deployments", namespace=namespace)["items"]] == [
            "resnet50-triton"
        ]
        recovery_table.record(
            "the active operator of an HA pair SIGKILLed, then a spec change",
            "the change waits while the standby still believes the active one alive (peering lifetime 10 s here, "
            "60 s by default), then the standby applies it and status moves",
            "nothing; 1 Job, 1 Deployment",
            recover_s,
        )


# t(b) = 2 ms + 0.4 ms * b^1.3, the emulated accelerator's curve (README), at the build's ladder.
LADDER_MS = {1: 2.4, 2: 3.0, 4: 4.4, 8: 6.9, 16: 12.2, 32: 24.6}

# A fake Prometheus on 127.0.0.1 whose answer a test sets per URL path (FAKE_ANSWERS), shared with the SLOMet tests.
fake_prometheus = test_latency_reasons.fake_prometheus


def in_force(tis: dict[str, Any]) -> InForce | None:
    raw = tis["metadata"].get("annotations", {}).get(APPLIED_ANNOTATION)
    return InForce.from_annotation(raw) if raw else None


def kill_on_first_change(
    cluster: Cluster, namespace: str, op: OperatorProcess, timeout_s: float = 60
) -> InForce | None:
    """Watches resnet50's config-in-force annotation and SIGKILLs `op` on the first event that shows a tuner's
    change; returns that config (None: no change within timeout_s)."""
    path = '{.metadata.annotations.tailtune\\.io/applied}{"\\n"}'
    assert APPLIED_ANNOTATION == "tailtune.io/applied"
    argv = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get", "tis", "resnet50",
            "-n", namespace, "--watch", "-o", f"jsonpath={path}"]  # fmt: skip
    watch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    timer = threading.Timer(timeout_s, watch.kill)
    timer.start()
    try:
        assert watch.stdout is not None
        for line in watch.stdout:
            applied = InForce.from_annotation(line) if line.strip() else None
            if applied is not None and applied.changed_at is not None:
                op.kill()
                return applied
        return None
    finally:
        timer.cancel()
        watch.kill()
        watch.wait()


def serving_state(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """What the user can check of the config: the annotation in force, status, ConfigMap, Deployment, ReplicaSets."""
    tis = cluster.get("tis", "resnet50", namespace)
    dep = cluster.get("deployment", "resnet50-triton", namespace)
    cm = cluster.get("configmap", "resnet50-triton-config", namespace)
    live = [rs for rs in cluster.get("replicasets", namespace=namespace)["items"] if rs["spec"].get("replicas")]
    return {"tis": tis, "in_force": in_force(tis), "dep": dep, "config": cm["data"]["config.pbtxt"], "live_rs": live}


def one_config(state: dict[str, Any]) -> bool:
    """The config in force is the one status reports, the ConfigMap renders and every pod of one ReplicaSet runs."""
    tis, applied, dep = state["tis"], state["in_force"], state["dep"]
    ready = condition(tis, "Ready")
    batching = tis["status"]["batching"]
    return bool(
        applied is not None
        and ready
        and ready["status"] == "True"
        and batching["maxBatchSize"] == applied.batching.max_batch_size
        and batching["maxQueueDelayMicroseconds"] == applied.batching.max_queue_delay_microseconds
        and f"max_batch_size: {applied.batching.max_batch_size}\n" in state["config"]
        and tis["status"]["replicas"] == {"desired": applied.replicas, "ready": applied.replicas}
        and dep["spec"]["replicas"] == applied.replicas
        and dep["status"].get("observedGeneration") == dep["metadata"]["generation"]
        and dep["status"].get("updatedReplicas") == dep["status"].get("readyReplicas") == applied.replicas
        and len(state["live_rs"]) == 1
    )


def test_active_operator_of_an_ha_pair_killed_while_the_tuner_acts(
    cluster: Cluster, operator: OperatorProcess, namespace: str, recovery_table: RecoveryTable, tmp_path: Path,
    fake_prometheus: FakePrometheus,
) -> None:  # fmt: skip
    """The tuner of the active operator changes the config (P99 over the SLO, rolling mode: the change rolls the
    pods); the active one is SIGKILLed the moment the change is recorded, before its roll is done. The standby
    takes over and every view of the config agrees again: annotation, status, ConfigMap, the pods."""
    case = f"ha-tuner-{namespace[-6:]}"
    # P99 80 ms against a 30 ms SLO at 450 req/s: max batch 1 (2.4 ms a request) barely keeps up, so the tuner
    # raises the max batch; one replica at most, so batching is all it can change.
    FAKE_ANSWERS[case] = ([({}, "0.080")], "450")
    host, port = fake_prometheus.server_address[:2]
    doc = example()
    doc["spec"]["serving"] |= {
        "batching": {"maxBatchSize": 1, "maxQueueDelayMicroseconds": 0},
        "replicas": {"min": 1, "max": 1},
    }
    doc["spec"]["warmup"]["batchSizes"] = [1]
    doc["spec"]["tuning"] |= {"mode": "rolling", "intervalSeconds": 5, "cooldownSeconds": 0}
    doc["spec"]["slo"]["windowSeconds"] = 10
    doc["spec"]["metrics"] = {"prometheusUrl": f"http://{host!s}:{port}/{case}", "latencyQuery": FAKE_METRIC}
    try:
        with ha_pair(cluster, operator, tmp_path, f"ha-{namespace[-6:]}") as (active, standby):
            engine_store(cluster, namespace)
            cluster.apply(doc, namespace=namespace)
            wait_condition(cluster, active, namespace, "resnet50", "Ready", "True")
            first = serving_state(cluster, namespace)
            assert first["in_force"] is None or first["in_force"].changed_at is None  # the spec's start config
            # kwok's build pod reports nothing: give status the service-time ladder a real build reports (what the
            # tuner plans batching from), for this engine's cache key.
            key = first["tis"]["status"]["engine"]["cacheKey"]
            points = [{"batch": b, "ms": ms, "samples": 20, "source": "build"} for b, ms in LADDER_MS.items()]
            ladder = {"status": {"serviceTime": {"engineCacheKey": key, "points": points}}}
            # Kept there until the tuner acts: a status write of a reconcile in flight (from what it observed, with
            # no build report) may drop it; a busy operator (after the 200 objects) left the tuner without a curve.
            acting = threading.Event()

            def keep_ladder() -> None:
                while not acting.is_set():
                    tis = cluster.get("tis", "resnet50", namespace) or {}
                    if (tis.get("status", {}).get("serviceTime") or {}).get("engineCacheKey") != key:
                        cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--subresource=status",
                                        "--type=merge", "-p", json.dumps(ladder), check=False)  # fmt: skip
                    acting.wait(1.0)

            keeper = threading.Thread(target=keep_ladder, daemon=True)
            keeper.start()

            # Killed on the watch event of the tuner's record (the config-in-force annotation), so the kill lands
            # while the act is in flight: before or between the ConfigMap and Deployment applies, or in the roll.
            try:
                acted = kill_on_first_change(cluster, namespace, active)
            finally:
                acting.set()
                keeper.join(timeout=10)
            killed = time.monotonic()
            if acted is None:
                print("active log:\n" + active.log_tail(), file=sys.stderr)
                pytest.fail("the active operator's tuner did not change the config within 60 s")
            at_kill = serving_state(cluster, namespace)  # the operator is dead: its part of the act is frozen
            new_config = f"max_batch_size: {acted.batching.max_batch_size}\n" in at_kill["config"]
            new_deployment = at_kill["dep"]["metadata"]["generation"] > first["dep"]["metadata"]["generation"]
            stage = (
                "after its ConfigMap and Deployment applies"
                if new_config and new_deployment
                else "after its ConfigMap apply, before its Deployment's"
                if new_config
                else "before its ConfigMap and Deployment applies"
            )
            print(
                f"tuner acted ({acted.reason!r}): max batch {acted.batching.max_batch_size}, delay "
                f"{acted.batching.max_queue_delay_microseconds} us, {acted.replicas} replica(s); active operator "
                f"killed {stage}; {len(at_kill['live_rs'])} live ReplicaSet(s) at the kill"
            )
            # The P99 stays over the SLO: the standby's tuner would keep acting. From here on it is within the SLO,
            # so what is checked is one config, not a moving target.
            FAKE_ANSWERS[case] = ([({}, "0.010")], "450")

            states: list[dict[str, Any]] = []

            def converged() -> bool:
                states[:] = [serving_state(cluster, namespace)]
                return one_config(states[0]) and "Resuming operations" in standby.log_tail(2000)

            try:
                cluster.wait_for("the standby to hold one config", converged, 60)
            except BaseException:
                state = states[0] if states else {}
                print(f"last state: in force {state.get('in_force')}, status {state.get('tis', {}).get('status')}",
                      file=sys.stderr)  # fmt: skip
                print("standby log:\n" + standby.log_tail(), file=sys.stderr)
                raise
            recover_s = time.monotonic() - killed
            final = states[0]["in_force"]
            print(
                f"standby took over: one config (max batch {final.batching.max_batch_size}, {final.replicas} replicas) "
                f"{recover_s:.1f} s after the kill; peering lifetime 10 s"
            )
            assert standby.alive()
            assert len(jobs(cluster, namespace)) == 1
            assert [d["metadata"]["name"] for d in cluster.get("deployments", namespace=namespace)["items"]] == [
                "resnet50-triton"
            ]
            # The pods rolled to the new config (the Deployment's template carries its digest), and the act the active
            # one began is kept or superseded, never undone to the spec's start config.
            assert states[0]["dep"]["metadata"]["generation"] > first["dep"]["metadata"]["generation"]
            assert final.changed_at is not None and final.changed_at >= acted.changed_at
            recovery_table.record(
                "the active operator of an HA pair SIGKILLed the moment its tuner recorded a rolling change",
                f"killed {stage}; nothing more moves until the standby takes over (peering lifetime 10 s) and "
                "finishes what was left: annotation, status.batching, ConfigMap and the one live ReplicaSet agree, "
                "Ready",
                "nothing; 1 Job, 1 Deployment, 1 live ReplicaSet",
                recover_s,
            )
    finally:
        FAKE_ANSWERS.pop(case, None)
