"""Lay out Triton model repositories for the two CPU Python-backend models shipped in `models/`.

- `onnx_mlp`: a real ONNX MLP (`onnx_models.build_mlp`) on onnxruntime, for the whole path's correctness.
- `emulated_gpu`: an EMULATED accelerator: service time t(b) = a + c * b^p, CPU idle while it "computes",
  all instances serialized on one shared device. It stands in for a GPU in tests and the local runtime.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

from devkit.triton.local import venv_site_packages
from devkit.triton.onnx_models import build_mlp
from tailtune.api.v1alpha1 import Batching, QueuePolicy, TensorSpec, Warmup
from tailtune.triton.config import InstanceGroup, ModelConfigInput, render_pbtxt

ModelKind = Literal["onnx_mlp", "emulated_gpu"]
MODEL_KINDS: tuple[ModelKind, ...] = get_args(ModelKind)

DESCRIPTIONS: dict[ModelKind, str] = {
    "onnx_mlp": "real ONNX MLP on onnxruntime (CPU)",
    "emulated_gpu": "EMULATED accelerator: t(b) = base_ms + per_item_ms * b^exponent on one shared device",
}


def local_model_input(
    kind: ModelKind,
    name: str,
    *,
    dim: int = 16,
    out_dim: int | None = None,
    batching: Batching | None = None,
    queue_policy: QueuePolicy | None = None,
    warmup: Warmup | None = None,
    instances: int = 1,
    parameters: dict[str, str] | None = None,
) -> ModelConfigInput:
    """A `ModelConfigInput` for a local model: FP32 INPUT0[dim] -> OUTPUT0[out_dim], KIND_CPU instances.

    The emulated accelerator returns INPUT0 * 2, so its output has `dim` elements whatever `out_dim` says.
    """
    out = dim if kind == "emulated_gpu" or out_dim is None else out_dim
    return ModelConfigInput(
        name=name,
        runtime="python",
        inputs=(TensorSpec(name="INPUT0", data_type="TYPE_FP32", dims=[dim]),),
        outputs=(TensorSpec(name="OUTPUT0", data_type="TYPE_FP32", dims=[out]),),
        batching=batching or Batching(),
        queue_policy=queue_policy,
        warmup=warmup,
        instance_groups=(InstanceGroup(kind="KIND_CPU", count=instances),),
        parameters=dict(parameters or {}),
    )


def write_model_repository(
    dest: str | os.PathLike[str],
    kind: ModelKind,
    name: str,
    config_input: ModelConfigInput,
    **params: str | int | float,
) -> ModelConfigInput:
    """Write `<dest>/<name>/config.pbtxt` and `<dest>/<name>/1/model.py` (+ `model.onnx` for onnx_mlp).

    `params` join the config's `parameters` (as strings), with `site_packages` set to this venv's so the
    backend stub can import numpy. For onnx_mlp, `hidden` (default 64) and `seed` (default 0) also shape the
    ONNX model. Returns the config input actually written: a hot reload must send it whole (Triton's
    config override replaces the config, parameters included).
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; use one of {', '.join(MODEL_KINDS)}")
    merged = {"site_packages": venv_site_packages(), "model_kind": kind, "description": DESCRIPTIONS[kind]}
    merged.update(config_input.parameters)
    merged.update({k: str(v) for k, v in params.items()})
    inp = config_input.model_copy(update={"name": name, "runtime": "python", "parameters": merged})
    pbtxt = render_pbtxt(inp)  # validates before anything is written
    model_dir = Path(dest) / name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    source = resources.files("devkit.triton").joinpath("models", kind, "model.py")
    (version / "model.py").write_text(source.read_text())
    if kind == "onnx_mlp":
        if (
            len(inp.inputs[0].dims) != 1
            or len(inp.outputs[0].dims) != 1
            or -1 in (inp.inputs[0].dims + inp.outputs[0].dims)
        ):
            raise ValueError("onnx_mlp needs one fixed dim per tensor: INPUT0[in_dim] -> OUTPUT0[out_dim]")
        onnx_bytes = build_mlp(
            inp.inputs[0].dims[0],
            int(merged.get("hidden", "64")),
            inp.outputs[0].dims[0],
            int(merged.get("seed", "0")),
            input_name=inp.inputs[0].name,
            output_name=inp.outputs[0].name,
        )
        (version / "model.onnx").write_bytes(onnx_bytes)
    (model_dir / "config.pbtxt").write_text(pbtxt)
    return inp
