"""Small ONNX models built in code with onnx.helper (shared with tests/gpu)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8  # what onnxruntime and TensorRT 10 both read


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="tailtune-tests")


def relu_model(batch: int | str) -> onnx.ModelProto:
    """x[batch, 4] -> Relu -> y; `batch` a number (static) or a name (dynamic)."""
    return _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
    )


def multi_input_model() -> onnx.ModelProto:
    """Three inputs of three dtypes, one with a second dynamic dim."""
    return _model(
        [
            helper.make_node("Relu", ["a"], ["ra"]),
            helper.make_node("Identity", ["b"], ["ib"]),
            helper.make_node("Not", ["mask"], ["nm"]),
        ],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("b", TensorProto.INT64, ["n", 2]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", "seq"]),
        ],
        [
            helper.make_tensor_value_info("ra", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("ib", TensorProto.INT64, ["n", 2]),
            helper.make_tensor_value_info("nm", TensorProto.BOOL, ["n", "seq"]),
        ],
    )


def identity_model(dtype: int, name: str = "v") -> onnx.ModelProto:
    """One input of `dtype` passed through: for dtypes some backend cannot serve."""
    return _model(
        [helper.make_node("Identity", [name], [f"{name}_out"])],
        [helper.make_tensor_value_info(name, dtype, ["n", 2])],
        [helper.make_tensor_value_info(f"{name}_out", dtype, ["n", 2])],
    )


def custom_op_model() -> onnx.ModelProto:
    """A valid graph whose op is in a domain no runtime implements."""
    return _model(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        extra_opsets={"com.example": 1},
    )


def unknown_op_model() -> onnx.ModelProto:
    """An op the default ONNX domain does not have."""
    return _model(
        [helper.make_node("NotAnOp", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )


def dangling_input_model() -> onnx.ModelProto:
    """A node reading a tensor nothing produces: a broken graph that still decodes."""
    return _model(
        [helper.make_node("Add", ["x", "nowhere"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
