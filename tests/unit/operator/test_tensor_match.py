"""Declared tensors (spec.model.inputs/outputs) against the engine's (the build report): the desired children."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tailtune.operator.observed import JobObservation, Observed
from tailtune.operator.reconcile import Desired, desired_state
from tests.unit.factories import make_isvc

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
