"""What the Triton pods say, from their status as the API server serves it, up to ServingReady and its Events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tailtune.operator import status as st
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tailtune.operator.pods import PodsSummary, summarise_triton_pods, termination_message, triton_words, unschedulable
from tailtune.operator.reconcile import reconcile
from tests.unit.factories import make_isvc
from tests.unit.operator.test_reconcile import NOW, RecordingCluster, _with_status

RS = "demo-triton-6b7f9c5d48"
# The tail of Triton's log when the config declares x [17] and the model has [16] (terminationMessagePolicy
# FallbackToLogsOnError: the kubelet keeps the last 2048 bytes).
LOAD_ERROR = (
    "failed to load 'demo' version 1: Invalid argument: model 'demo_0_0', tensor 'x': the model expects 1 "
    "dimensions (shape [-1,16]) but the model configuration specifies 2 dimensions (an initial batch dimension "
    "because max_batch_size > 0 followed by the explicit tensor shape, making complete shape [-1,17])"
)
TRITON_TAIL = f"""\
I0612 09:41:05.101874 1 model_lifecycle.cc:461] loading: demo:1
E0612 09:41:07.412345 1 model_lifecycle.cc:654] {LOAD_ERROR}
I0612 09:41:07.412400 1 model_lifecycle.cc:789] failed to load 'demo'
I0612 09:41:07.412700 1 server.cc:674]
+-------+---------+--------------------------------------------------------------------------+
| Model | Version | Status                                                                   |
+-------+---------+--------------------------------------------------------------------------+
| demo  | 1       | UNAVAILABLE: Invalid argument: model 'demo_0_0', tensor 'x': the model e |
+-------+---------+--------------------------------------------------------------------------+

I0612 09:41:07.450030 1 server.cc:347] Timeout 30: Found 0 live models and 0 in-flight non-inference requests
error: creating server: Internal - failed to load all models
"""
EVICTED = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki."


def pod(name: str, phase: str = "Running", **status: Any) -> dict[str, Any]:
    """A Triton pod of the Deployment's ReplicaSet, as `kubectl get pod -o json` shows it."""
    meta = {
        "name": f"{RS}-{name}",
        "namespace": "default",
        "creationTimestamp": f"2026-06-12T09:{name[-2:]}:00Z",
        "labels": {"app.kubernetes.io/component": "triton", "pod-template-hash": RS.rsplit("-", 1)[1]},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": RS, "uid": "rs-uid", "controller": True}
        ],
    }
    return {"metadata": meta, "status": {"phase": phase, **status}}


def triton(
    state: dict[str, Any], *, last: dict[str, Any] | None = None, restarts: int = 0, ready: bool = False
) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": "triton", "image": "nvcr.io/nvidia/tritonserver:24.08-py3", "imageID": "", "ready": ready,
        "started": "running" in state, "restartCount": restarts, "state": state, "lastState": {},
    }  # fmt: skip
    if last is not None:
        cs["lastState"] = {"terminated": last}
    return cs


def exited(code: int, message: str = "", reason: str = "Error") -> dict[str, Any]:
    out: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": "2026-06-12T09:41:05Z",
                           "finishedAt": "2026-06-12T09:41:07Z"}  # fmt: skip
    if message:
        out["message"] = message
    return out


NOT_READY = [
    {"type": "Initialized", "status": "True"},
    {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
     "message": "containers with unready status: [triton]"},
    {"type": "PodScheduled", "status": "True"},
]  # fmt: skip
READY = [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]
BACKOFF = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s restarting failed container=triton"}}
RUNNING = {"running": {"startedAt": "2026-06-12T09:45:00Z"}}

CRASH_LOOP = pod(
    "aa001", conditions=NOT_READY, containerStatuses=[triton(BACKOFF, last=exited(1, TRITON_TAIL), restarts=5)]
)
# Between two back-offs the container runs again (and is not ready) with the same last exit.
RETRYING = pod(
    "aa002", conditions=NOT_READY, containerStatuses=[triton(RUNNING, last=exited(1, TRITON_TAIL), restarts=1)]
)
JUST_EXITED = pod("aa003", conditions=NOT_READY, containerStatuses=[triton({"terminated": exited(1, TRITON_TAIL)})])
OOM = pod("aa004", conditions=NOT_READY,
          containerStatuses=[triton(BACKOFF, last=exited(137, reason="OOMKilled"), restarts=2)])  # fmt: skip
PULL_FAILS = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "tritonserver:99.99"'}}
NO_IMAGE = pod("aa005", "Pending", conditions=NOT_READY, containerStatuses=[triton(PULL_FAILS)])
INIT_FAILS = pod(
    "aa006", "Pending", conditions=NOT_READY,
    initContainerStatuses=[{
        "name": "model-repository", "ready": False, "restartCount": 4,
        "state": BACKOFF,
        "lastState": {"terminated": exited(1, "cp: can't open '/config/config.pbtxt': No such file or directory")},
    }],
    containerStatuses=[triton({"waiting": {"reason": "PodInitializing"}})],
)  # fmt: skip
WARMING = pod("aa007", conditions=NOT_READY, containerStatuses=[triton(RUNNING)])
SERVING = pod("aa008", conditions=READY, podIP="10.0.0.8", containerStatuses=[triton(RUNNING, ready=True)])
EVICTED_POD = pod("aa009", "Failed", reason="Evicted", message=EVICTED,
                  containerStatuses=[triton({"terminated": exited(137, reason="ContainerStatusUnknown")})])  # fmt: skip


def failed_load(name: str) -> dict[str, Any]:
    """A pod that ended Failed with Triton's exit (the kubelet refusing to restart it, kwok's pod-fail stage)."""
    return pod(name, "Failed", conditions=NOT_READY, containerStatuses=[triton({"terminated": exited(1, TRITON_TAIL)})])


def test_a_crash_loop_names_tritons_line_the_exit_and_the_restarts() -> None:
    said = summarise_triton_pods([CRASH_LOOP])
    assert said.failing == (
        f"pod {RS}-aa001: container triton exited 1 (Error), CrashLoopBackOff, 5 restarts (a failure loop): "
        f"{LOAD_ERROR}"
    )
    assert said.model_load_failed and not said.failed and not said.not_ready


@pytest.mark.parametrize(
    ("pods", "needles"),
    [
        ([RETRYING], ["container triton exited 1 (Error), 1 restart: failed to load 'demo' version 1"]),
        ([JUST_EXITED], ["container triton exited 1 (Error): failed to load 'demo' version 1", "[-1,17]"]),
        ([WARMING, CRASH_LOOP, RETRYING], ["2 pods failing; e.g. pod", "aa001", "5 restarts (a failure loop)"]),
    ],
    ids=["running again after the exit", "the moment it exited", "the pod that failed most tells it"],
)
def test_a_container_that_exits_with_an_error_is_failing_in_every_phase_of_its_loop(
    pods: list[dict[str, Any]], needles: list[str]
) -> None:
    said = summarise_triton_pods(pods)
    assert said.model_load_failed
    assert all(n in said.failing for n in needles), said.failing


@pytest.mark.parametrize(
    ("pods", "failing"),
    [
        ([OOM], f"pod {RS}-aa004: container triton exited 137 (OOMKilled), CrashLoopBackOff, 2 restarts; "
                "no termination message"),
        ([NO_IMAGE], f"pod {RS}-aa005: container triton, ImagePullBackOff: "
                     'Back-off pulling image "tritonserver:99.99"'),
        ([INIT_FAILS], f"pod {RS}-aa006: init container model-repository exited 1 (Error), CrashLoopBackOff, "
                       "4 restarts (a failure loop): cp: can't open '/config/config.pbtxt': No such file or directory"),
    ],
    ids=["out of memory", "image it cannot pull", "init container"],
)  # fmt: skip
def test_failures_that_are_not_the_models_say_what_they_are(pods: list[dict[str, Any]], failing: str) -> None:
    said = summarise_triton_pods(pods)
    assert said.failing == failing
    assert not said.model_load_failed


def test_pods_that_end_failed_are_counted_per_replicaset_and_the_latest_tells_why() -> None:
    said = summarise_triton_pods([failed_load(f"bb0{i:02d}") for i in range(12)] + [WARMING])
    assert said.failed == (
        f"10+ failed pods of ReplicaSet {RS}, a failure loop: the ReplicaSet keeps replacing them; the latest: "
        f"container triton exited 1 (Error): {LOAD_ERROR}"
    )
    # Counted in decades, without a pod name: a ReplicaSet that makes a pod a second does not move the status.
    assert summarise_triton_pods([failed_load(f"bb0{i:02d}") for i in range(13)]).failed == said.failed
    assert summarise_triton_pods([failed_load(f"bb{i:03d}") for i in range(100)]).failed.startswith("100+ failed")
    assert summarise_triton_pods([failed_load(f"bb0{i:02d}") for i in range(3)]).failed.startswith("3 failed pods")
    assert said.model_load_failed and not said.failing


def test_an_evicted_pod_says_the_kubelets_reason() -> None:
    said = summarise_triton_pods([EVICTED_POD])
    assert said.failed == f"pod {RS}-aa009 ended Failed: Evicted: {EVICTED}"
    assert not said.model_load_failed


def test_starting_serving_and_deleted_pods_are_not_failures() -> None:
    deleting = {**CRASH_LOOP, "metadata": {**CRASH_LOOP["metadata"], "deletionTimestamp": "2026-06-12T09:50:00Z"}}
    said = summarise_triton_pods([WARMING, SERVING, deleting])
    assert said == PodsSummary(ready_ips=("10.0.0.8",), not_ready="containers with unready status: [triton]")
    creating = pod("aa010", "Pending", containerStatuses=[triton({"waiting": {"reason": "ContainerCreating"}})])
    assert summarise_triton_pods([creating]).not_ready == "container triton: ContainerCreating"


def test_tritons_words_are_its_own_line() -> None:
    assert triton_words(TRITON_TAIL) == LOAD_ERROR
    # The tail cut before the line that names the model: the model table's row, then the last line.
    table_on = TRITON_TAIL[TRITON_TAIL.index("| Model") :]
    assert triton_words(table_on).startswith("demo  | 1       | UNAVAILABLE: Invalid argument: model 'demo_0_0'")
    assert triton_words("Segmentation fault (core dumped)\n") == "Segmentation fault (core dumped)"
    assert len(triton_words("x" * 5000)) == 600 and triton_words("  \n") == ""


def test_a_build_pods_message_and_a_pod_the_scheduler_cannot_place() -> None:
    done = pod(
        "cc001",
        "Failed",
        containerStatuses=[{"name": "builder", "state": {"terminated": exited(11, "DigestMismatch")}}],
    )
    assert termination_message(done) == "DigestMismatch"
    assert termination_message(CRASH_LOOP) == TRITON_TAIL  # the last state's when the current one has none
    unplaced = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available",
    }
    pending = pod("cc002", "Pending", conditions=[unplaced])
    assert unschedulable(pending) == "0/3 nodes are available" and unschedulable(WARMING) == ""


def observed(pods: list[dict[str, Any]], replicas: int = 1, ready: int = 0) -> Observed:
    said = summarise_triton_pods(pods)
    dep = DeploymentObservation(
        replicas=replicas, ready_replicas=ready, unschedulable=said.unschedulable, not_ready_reason=said.not_ready,
        failing=said.failing, failed=said.failed, model_load_failed=said.model_load_failed,
    )  # fmt: skip
    return Observed(job=JobObservation(succeeded=True), deployment=dep)


@pytest.mark.parametrize(
    ("pods", "replicas", "ready", "status", "reason", "needles"),
    [
        ([CRASH_LOOP], 1, 0, "False", st.MODEL_LOAD_FAILED, ["0/1 Triton pods ready; pod", LOAD_ERROR, "5 restarts"]),
        ([failed_load("bb001"), failed_load("bb002"), WARMING], 1, 0, "False", st.MODEL_LOAD_FAILED,
         ["2 failed pods of ReplicaSet", LOAD_ERROR]),
        ([OOM], 1, 0, "False", st.PODS_FAILING, ["exited 137 (OOMKilled)"]),
        ([EVICTED_POD, WARMING], 1, 0, "False", st.PODS_FAILING, ["Evicted: The node was low on resource: memory"]),
        # A rollout's new pod fails while the old ones serve: serving, and said with a Warning.
        ([SERVING, SERVING, CRASH_LOOP], 2, 2, "True", st.SERVING_DEGRADED, ["2/2 Triton pods ready; pod", LOAD_ERROR]),
        # A pod evicted earlier, its replacement serving: history, not a degraded service.
        ([EVICTED_POD, SERVING], 1, 1, "True", st.SERVING_AVAILABLE, ["1/1 Triton pods ready"]),
        ([EVICTED_POD, SERVING, WARMING], 2, 1, "True", st.SERVING_DEGRADED, ["1/2", "Evicted"]),
        ([WARMING], 1, 0, "False", st.PODS_NOT_READY, ["containers with unready status"]),
    ],
    ids=["crash loop", "failed pods", "out of memory", "evicted", "rollout fails", "evicted earlier",
         "evicted, replacement warming", "warming"],
)  # fmt: skip
def test_serving_ready_names_the_pods_failure(
    pods: list[dict[str, Any]], replicas: int, ready: int, status: str, reason: str, needles: list[str]
) -> None:
    c = st.compute_serving_condition(make_isvc().obj(), observed(pods, replicas, ready), True)
    assert (c.status, c.reason) == (status, reason)
    assert all(n in c.message for n in needles), c.message
    assert "waiting for model load and warmup" not in c.message


def test_a_failure_loop_is_one_warning_event_while_its_count_moves() -> None:
    raw = make_isvc().dict()
    cluster = RecordingCluster(observed([CRASH_LOOP]))
    asyncio.run(reconcile(raw, cluster, NOW))
    status = cluster.statuses[-1]
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", st.MODEL_LOAD_FAILED) and LOAD_ERROR in ready.message
    assert cluster.events.count(("Warning", st.MODEL_LOAD_FAILED)) == 1
    told = list(cluster.events)
    # Two restarts later: the message follows the count; no second Event.
    again = CRASH_LOOP | {"status": {**CRASH_LOOP["status"], "containerStatuses": [
        triton(BACKOFF, last=exited(1, TRITON_TAIL), restarts=7)]}}  # fmt: skip
    cluster.observed = observed([again])
    asyncio.run(reconcile(_with_status(raw, status), cluster, NOW))
    assert "7 restarts" in next(c.message for c in cluster.statuses[-1].conditions if c.type == "ServingReady")
    assert len(cluster.statuses) == 2 and cluster.events == told
