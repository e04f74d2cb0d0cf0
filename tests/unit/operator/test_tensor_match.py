"""Declared tensors (spec.model.inputs/outputs) against the engine's (the build report): the desired children."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tailtune.operator.reconcile import Desired, desired_state, reconcile
from tests.unit.factories import make_isvc
from tests.unit.operator.test_reconcile import NOW, RecordingCluster

X16 = {"name": "x", "dataType": "TYPE_FP32", "dims": [16]}
Y4 = {"name": "y", "dataType": "TYPE_FP32", "dims": [4]}


def _desired(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], engine_in: list[dict[str, Any]]) -> Desired:
    """desired_state once a build reported `engine_in` and y [4], for a spec that declares `inputs`/`outputs`."""
    report = json.dumps({"inputs": engine_in, "outputs": [Y4]})
    isvc = make_isvc().set("spec.model.inputs", inputs).set("spec.model.outputs", outputs).obj()
    return desired_state(isvc, Observed(job=JobObservation(succeeded=True, message=report)))


@pytest.mark.parametrize(
    ("declared", "engine"),
    [
        ([16], [16]),
        ([-1], [16]),  # dynamic in the spec
        ([16], [-1]),  # dynamic in the engine
        ([3, -1, 224], [3, 224, -1]),
    ],
)
def test_matching_or_dynamic_dims_give_the_deployment(declared: list[int], engine: list[int]) -> None:
    desired = _desired([{**X16, "dims": declared}], [Y4], [{**X16, "dims": engine}])
    assert desired.serving_problem is None
    assert [o["kind"] for o in desired.objects] == ["ConfigMap", "Service", "Deployment"]


@pytest.mark.parametrize(
    ("inputs", "outputs", "engine_in", "named"),
    [
        ([{**X16, "dims": [17]}], [Y4], [X16], ["spec.model.inputs[0].dims", "[17]", "declare [16]"]),
        ([{**X16, "dims": [-1, 16]}], [Y4], [X16], ["spec.model.inputs[0].dims", "leave out the batch dim"]),
        ([{**X16, "dataType": "TYPE_FP16"}], [Y4], [X16], ["spec.model.inputs[0].dataType", "declare TYPE_FP32"]),
        ([X16], [{**Y4, "dims": [5]}], [X16], ["spec.model.outputs[0].dims", "[5]", "declare [4]"]),
        ([X16], [Y4], [X16, {**X16, "name": "mask"}], ["spec.model.inputs:", "'mask'", "add it"]),
    ],
)
def test_a_declared_tensor_the_engine_disagrees_with_gives_no_serving_objects(
    inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], engine_in: list[dict[str, Any]], named: list[str]
) -> None:
    desired = _desired(inputs, outputs, engine_in)
    assert desired.objects == []  # no ConfigMap, Service or Deployment: no pod failure loop
    assert desired.serving_problem is not None
    reason, message = desired.serving_problem
    assert reason == "TensorMismatch"
    assert all(n in message for n in named), message
    assert "or omit spec.model." in message


def test_a_declared_tensor_the_report_leaves_out_is_not_judged() -> None:
    # The report leaves out tensors of unknown rank: declaring them is what spec.model.inputs is for.
    desired = _desired([X16, {**X16, "name": "len", "dims": [1]}], [Y4], [X16])
    assert desired.serving_problem is None and desired.objects


def test_without_a_report_the_declared_tensors_are_used() -> None:
    isvc = make_isvc().set("spec.model.inputs", [{**X16, "dims": [17]}]).obj()
    desired = desired_state(isvc, Observed(job=JobObservation(succeeded=True)))
    assert desired.serving_problem is None
    assert [o["kind"] for o in desired.objects] == ["ConfigMap", "Service", "Deployment"]


def test_a_mismatch_patched_into_a_serving_spec_rolls_nothing_out_and_says_the_old_pods_keep_serving() -> None:
    # spec.model.inputs patched to x [17] while a Deployment serves the engine's x [16]: applying the new config
    # would make every pod that restarts (or rolls) fail to load the model. Nothing is applied, so the running pods
    # keep the last config applied (ConfigMap and pod template untouched) and the status says so.
    report = json.dumps({"inputs": [X16], "outputs": [Y4]})
    serving = DeploymentObservation(replicas=2, ready_replicas=2, ready_pod_ips=("10.0.0.5", "10.0.0.6"))
    cluster = RecordingCluster(Observed(job=JobObservation(succeeded=True, message=report), deployment=serving))
    raw = make_isvc().set("spec.model.inputs", [{**X16, "dims": [17]}]).dict()
    asyncio.run(reconcile(raw, cluster, NOW))
    assert cluster.applied == []
    status = cluster.statuses[-1]
    serving_ready = next(c for c in status.conditions if c.type == "ServingReady")
    assert (serving_ready.status, serving_ready.reason) == ("False", "TensorMismatch")
    assert "spec.model.inputs[0].dims" in serving_ready.message
    assert "not rolled out: the Triton Deployment keeps its pods on the last config applied (2/2 ready)" in (
        serving_ready.message
    )
    assert status.replicas.ready == 2 and status.endpoints.http == "http://demo.default.svc:8000"  # still served there
    assert cluster.events.count(("Warning", "TensorMismatch")) == 1
    told = list(cluster.events)
    asyncio.run(reconcile(raw | {"status": status.model_dump(by_alias=True, mode="json", exclude_none=True)},
                          cluster, NOW, force=True))  # fmt: skip
    assert cluster.applied == [] and cluster.events == told  # the resync re-applies nothing either
