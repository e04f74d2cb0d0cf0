"""Triton pods that fail, on the local cluster with the operator running: ServingReady says Triton's own words.

kwok runs no container, so the failures are written into the pods' status the way a kubelet writes them: a
container in CrashLoopBackOff with its last exit (patched on the status subresource; kwok leaves a Running pod's
status alone), and pods that end Failed without ever being Ready (kwok's `pod-fail` stage, for pods annotated
`kwok.tailtune.io/fail`), which the ReplicaSet keeps replacing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.test_faults import events
from tests.e2e.test_operator import OperatorProcess, engine_store, example, wait_condition

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

LOAD_ERROR = (
    "failed to load 'resnet50' version 1: Invalid argument: model 'resnet50_0_0', tensor 'input': the model "
    "expects 4 dimensions (shape [-1,3,224,224]) but the model configuration specifies 4 dimensions (shape "
    "[-1,3,224,225])"
)
TRITON_TAIL = (
    "I0612 09:41:05.101874 1 model_lifecycle.cc:461] loading: resnet50:1\n"
    f"E0612 09:41:07.412345 1 model_lifecycle.cc:654] {LOAD_ERROR}\n"
    "error: creating server: Internal - failed to load all models\n"
)


def _crash_loop(cluster: Cluster, namespace: str, pod: dict[str, Any], restarts: int) -> None:
    """Write the kubelet's view of a Triton container that exits on a failed load into the pod's status."""
    status = {
        "phase": "Running",
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [triton]"},
            {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
            {"type": "PodScheduled", "status": "True"},
        ],
        "containerStatuses": [{
            "name": "triton", "image": pod["spec"]["containers"][0]["image"], "imageID": "", "ready": False,
            "started": False, "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": TRITON_TAIL,
                                         "startedAt": "2026-06-12T09:41:05Z", "finishedAt": "2026-06-12T09:41:07Z"}},
        }],
    }  # fmt: skip
    cluster.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def test_a_crash_loop_names_tritons_words_within_a_minute_and_warns_once(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    [pod] = [
        p for p in cluster.get("pods", namespace=namespace)["items"]
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "triton"
    ]  # fmt: skip
    start = time.monotonic()
    _crash_loop(cluster, namespace, pod, restarts=3)
    c = wait_condition(cluster, operator, namespace, "resnet50", "Ready", "False", "ModelLoadFailed", 60)
    print(f"Triton's load error in Ready {time.monotonic() - start:.1f} s after the container's exit")
    assert LOAD_ERROR in c["message"] and "3 restarts (a failure loop)" in c["message"], c["message"]
    assert "0/1 Triton pods ready" in c["message"], c["message"]

    # The loop goes on: the count moves in the message (the operator looks again by itself), no second Event.
    _crash_loop(cluster, namespace, pod, restarts=5)

    def five() -> dict[str, Any] | None:
        tis = cluster.get("tis", "resnet50", namespace)
        found = [c for c in tis["status"]["conditions"] if c["type"] == "ServingReady"]
        return found[0] if found and "5 restarts" in found[0]["message"] else None

    cluster.wait_for("the restart count in ServingReady", five, 60)
    seen = [(e["type"], e["reason"]) for e in events(cluster, namespace, "resnet50")]
    assert seen.count(("Warning", "ModelLoadFailed")) == 1, seen


def test_pods_that_keep_ending_failed_are_named_a_loop(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    doc = example()
    doc["spec"]["serving"]["podAnnotations"] = {"kwok.tailtune.io/fail": TRITON_TAIL}
    start = time.monotonic()
    cluster.apply(doc, namespace=namespace)

    def named() -> dict[str, Any] | None:
        tis = cluster.get("tis", "resnet50", namespace)
        found = [c for c in (tis or {}).get("status", {}).get("conditions", []) if c["type"] == "ServingReady"]
        c = found[0] if found else {}
        return c if c.get("reason") == "ModelLoadFailed" and "a failure loop" in c["message"] else None

    try:
        c = cluster.wait_for("ServingReady=False/ModelLoadFailed naming the loop", named, 60)
    except BaseException:
        print("operator log:\n" + operator.log_tail())
        raise
    failed = [p for p in cluster.get("pods", namespace=namespace)["items"] if p["status"].get("phase") == "Failed"]
    print(f"loop named {time.monotonic() - start:.1f} s after the apply, {len(failed)} failed pods by then")
    assert LOAD_ERROR in c["message"] and "failed pods of ReplicaSet resnet50-triton-" in c["message"], c["message"]
    assert "0/1 Triton pods ready" in c["message"], c["message"]

    # The loop spins on (the ReplicaSet's, not ours): counted in decades, so the status is not rewritten for each
    # new pod, and the Warning is told once.
    writes, rv = 0, cluster.get("tis", "resnet50", namespace)["metadata"]["resourceVersion"]
    for _ in range(12):
        time.sleep(0.5)
        now_rv = cluster.get("tis", "resnet50", namespace)["metadata"]["resourceVersion"]
        writes, rv = writes + (now_rv != rv), now_rv
    spun = len([p for p in cluster.get("pods", namespace=namespace)["items"] if p["status"].get("phase") == "Failed"])
    # The count is told exact under ten and in decades past it: the status may move once per told count it
    # passed through (7 -> 128 failed pods: 8, 9, 10+, 100+) and once more for a count the operator had not yet
    # caught up with when `failed` was read; never once per pod.
    told = {n if n < 10 else 10 ** (len(str(n)) - 1) for n in range(len(failed), spun + 1)}
    print(f"{spun - len(failed)} more failed pods in 6 s: {writes} writes of the InferenceService")
    assert writes <= len(told), (writes, len(failed), spun)
    seen = [(e["type"], e["reason"]) for e in events(cluster, namespace, "resnet50")]
    assert seen.count(("Warning", "ModelLoadFailed")) == 1 and ("Normal", "ServingAvailable") not in seen, seen
    cluster.kubectl("delete", "tis", "resnet50", "-n", namespace, "--wait=false")  # stop the ReplicaSet's spin
