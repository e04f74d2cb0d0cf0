"""Rewrite a GPU model config for the EMULATED accelerator. Pure: no I/O, no clock.

A Triton pod's config names a GPU backend (`tensorrt_plan`, `onnxruntime`) on `KIND_GPU` instances; the
local `tritonserver` has only the Python backend and no GPU. The rewrite keeps what the operator decided
(max batch, dynamic batching, queue policy, warmup, inputs, outputs, instance count) and swaps the engine for
the `emulated_gpu` Python-backend model: service time t(b) = base_ms + per_item_ms * b^exponent on one
emulated device per pod. The same rewrite applies to the repository at pod start and to every
load-with-config-override the tuner sends, so a hot reload changes batching, never the emulation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from devkit.faults import ReloadFault
from devkit.llm.repository import emulate_trtllm, is_trtllm_config
from devkit.triton.repository import DESCRIPTIONS, ModelKind
from tailtune.triton.config import ModelConfig, config_from_json, config_to_json

MODEL_KIND: ModelKind = "emulated_gpu"
# Pod annotations that set the emulated device's service-time curve (serving.podAnnotations in the spec).
ANNOTATION_PREFIX = "emulated-gpu.dev.tailtune.io/"
DEFAULT_CURVE = {"base_ms": 2.0, "per_item_ms": 0.4, "exponent": 1.3}


class EmulationError(ValueError):
    """A config or annotation the emulated accelerator cannot take."""


@dataclass(frozen=True)
class Curve:
    """The emulated device's service time, t(b) = base_ms + per_item_ms * b**exponent milliseconds."""

    base_ms: float = DEFAULT_CURVE["base_ms"]
    per_item_ms: float = DEFAULT_CURVE["per_item_ms"]
    exponent: float = DEFAULT_CURVE["exponent"]

    def ms(self, batch: float) -> float:
        """Execution time of one batch."""
        return self.base_ms + self.per_item_ms * float(batch**self.exponent)


def curve_from_annotations(annotations: Mapping[str, str]) -> Curve:
    """The curve from `emulated-gpu.dev.tailtune.io/{base-ms,per-item-ms,exponent}`; defaults elsewhere."""
    values = dict(DEFAULT_CURVE)
    for key in DEFAULT_CURVE:
        raw = annotations.get(ANNOTATION_PREFIX + key.replace("_", "-"))
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise EmulationError(
                f"annotation {ANNOTATION_PREFIX}{key.replace('_', '-')}={raw!r}: not a number"
            ) from None
        if value < 0 or value != value:
            raise EmulationError(f"annotation {ANNOTATION_PREFIX}{key.replace('_', '-')}={raw!r}: must be >= 0")
        values[key] = value
    return Curve(**values)


def emulation_parameters(curve: Curve, *, device_lock: str, site_packages: str) -> dict[str, str]:
    """The `parameters` the emulated_gpu model reads (all strings, as Triton passes them)."""
    return {
        "model_kind": MODEL_KIND,
        "description": DESCRIPTIONS[MODEL_KIND],
        "base_ms": f"{curve.base_ms:g}",
        "per_item_ms": f"{curve.per_item_ms:g}",
        "exponent": f"{curve.exponent:g}",
        "device_lock": device_lock,
        "site_packages": site_packages,
    }


def emulate(cfg: ModelConfig, parameters: Mapping[str, str]) -> ModelConfig:
    """A copy of `cfg` on the emulated accelerator: python backend, CPU instances, emulation parameters.

    Every instance group becomes KIND_CPU with its count times its GPUs (count is per GPU on KIND_GPU), so
    the instance count the operator chose survives. The emulated model returns INPUT * 2, so it needs as
    many output elements as input elements.
    """
    out = model_config_pb2.ModelConfig()
    out.CopyFrom(cfg)
    if not out.input or not out.output:
        raise EmulationError("the model config lists no input or no output")
    if list(out.input[0].dims) != list(out.output[0].dims):
        raise EmulationError(
            f"the emulated accelerator returns {out.input[0].name} * 2: output dims {list(out.output[0].dims)} "
            f"must equal input dims {list(out.input[0].dims)}"
        )
    out.ClearField("platform")
    out.backend = "python"
    out.ClearField("default_model_filename")
    for group in out.instance_group:
        gpus = max(1, len(group.gpus))
        group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")
        group.count = max(1, group.count) * gpus
        group.ClearField("gpus")
    if not out.instance_group:
        group = out.instance_group.add()
        group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")
        group.count = 1
    out.ClearField("optimization")  # GPU execution accelerators mean nothing to the Python backend
    for key, value in sorted(parameters.items()):
        out.parameters[key].string_value = value
    return out


def emulate_any(cfg: ModelConfig, parameters: Mapping[str, str]) -> ModelConfig:
    """A reload's config on this pod's emulation: a tensorrt_llm config becomes the EMULATED LLM with its load-time
    settings (`devkit.llm.repository.emulate_trtllm`), any other the emulated accelerator (`emulate`)."""
    if is_trtllm_config(cfg):
        return emulate_trtllm(cfg, parameters)
    return emulate(cfg, parameters)


def emulate_pbtxt(text: str, parameters: Mapping[str, str]) -> str:
    """`emulate` on a `config.pbtxt` (the operator's ConfigMap), returning `config.pbtxt` text."""
    cfg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise EmulationError(f"config.pbtxt does not parse: {exc}") from None
    return str(text_format.MessageToString(emulate(cfg, parameters)))


def emulate_load_body(body: bytes, parameters: Mapping[str, str], fault: ReloadFault | None = None) -> bytes:
    """The body of `POST /v2/repository/models/M/load` with its config override emulated (and `fault`, the
    harness's injected reload fault, applied to it).

    A body without a `config` parameter (a plain reload from the repository) comes back unchanged.
    """
    if not body.strip():
        return body
    try:
        doc: Any = json.loads(body)
    except ValueError:
        raise EmulationError("the load request body is not JSON") from None
    params = doc.get("parameters") if isinstance(doc, dict) else None
    if not isinstance(params, dict) or not isinstance(params.get("config"), str):
        return body
    config: str = params["config"]
    try:
        cfg = config_from_json(config)
    except (ValueError, json_format.ParseError) as exc:
        raise EmulationError(f"the config override does not parse: {exc}") from None
    emulated = emulate_any(cfg, parameters)
    params["config"] = config_to_json(fault.apply(emulated) if fault is not None else emulated)
    return json.dumps(doc, separators=(",", ":")).encode()


def emulate_grpc_load(request: bytes, parameters: Mapping[str, str], fault: ReloadFault | None = None) -> bytes:
    """A serialized gRPC `RepositoryModelLoadRequest` with its `config` override emulated, `fault` applied
    (else unchanged)."""
    try:
        req = service_pb2.RepositoryModelLoadRequest.FromString(request)
    except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
        raise EmulationError(f"not a RepositoryModelLoadRequest: {exc}") from None
    if "config" not in req.parameters or req.parameters["config"].WhichOneof("parameter_choice") != "string_param":
        return request
    try:
        cfg = config_from_json(req.parameters["config"].string_param)
    except (ValueError, json_format.ParseError) as exc:
        raise EmulationError(f"the config override does not parse: {exc}") from None
    emulated = emulate_any(cfg, parameters)
    req.parameters["config"].string_param = config_to_json(fault.apply(emulated) if fault is not None else emulated)
    return bytes(req.SerializeToString())
