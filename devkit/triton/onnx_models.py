"""Small real ONNX models built in code with `onnx.helper` (nothing is downloaded at run time)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

# Old enough for every onnxruntime we meet, new enough for Gemm/Relu as used here.
OPSET = 17
IR_VERSION = 8


def build_mlp(
    in_dim: int,
    hidden: int,
    out_dim: int,
    seed: int = 0,
    *,
    input_name: str = "INPUT0",
    output_name: str = "OUTPUT0",
) -> bytes:
    """A two-layer MLP `relu(x @ W1 + b1) @ W2 + b2` with a dynamic batch dim, serialized as ONNX.

    Weights come from `seed`, so two calls with the same arguments give the same bytes.
    """
    if min(in_dim, hidden, out_dim) < 1:
        raise ValueError(f"dims must be >= 1, got in_dim={in_dim} hidden={hidden} out_dim={out_dim}")
    rng = np.random.default_rng(seed)
    weights = {
        "W1": (rng.standard_normal((in_dim, hidden)) / np.sqrt(in_dim)).astype(np.float32),
        "B1": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
        "W2": (rng.standard_normal((hidden, out_dim)) / np.sqrt(hidden)).astype(np.float32),
        "B2": (rng.standard_normal(out_dim) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gemm", [input_name, "W1", "B1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("Gemm", ["a", "W2", "B2"], [output_name], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tailtune_mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", in_dim])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", out_dim])],
        initializer=[numpy_helper.from_array(w, name=n) for n, w in weights.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tailtune", ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def mlp_reference(model: bytes, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The MLP's output for `x` computed with numpy from the serialized weights (for tests)."""
    graph = onnx.load_from_string(model).graph
    w = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    h = np.maximum(x @ w["W1"] + w["B1"], 0.0)
    return np.asarray(h @ w["W2"] + w["B2"], dtype=np.float32)
