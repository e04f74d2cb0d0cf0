"""Triton model configuration, rendered with Triton's own protobuf schema (no string templates).

Pure: no I/O, no clock. `validate` judges a `ModelConfigInput` against the invariants Triton and the engine
impose, with errors that name the field and the fix; `build_model_config` returns the `ModelConfig` message;
`render_pbtxt` writes it for a ConfigMap, `render_json` for the repository API's load-with-config-override.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from google.protobuf import json_format, text_format
from pydantic import BaseModel, ConfigDict, Field
from tritonclient.grpc import model_config_pb2

from tailtune.api.v1alpha1 import Batching, QueuePolicy, TensorSpec, Warmup

Runtime = Literal["tensorrt_plan", "onnxruntime", "python"]
InstanceKind = Literal["KIND_GPU", "KIND_CPU"]
# Triton's message type; tritonclient ships no type stubs for it.
ModelConfig = Any

_PLATFORMS: dict[Runtime, tuple[str, str]] = {  # runtime -> (platform, backend)
    "tensorrt_plan": ("tensorrt_plan", ""),
    "onnxruntime": ("", "onnxruntime"),
    "python": ("", "python"),
}


class ConfigError(ValueError):
    """A model config input Triton or the engine would refuse; `field` is the dotted path to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstanceGroup(_Input):
    """Model instances: `count` per listed GPU (all GPUs when `gpus` is empty) or `count` on the CPU."""

    kind: Annotated[InstanceKind, Field(description="KIND_GPU in production, KIND_CPU locally.")] = "KIND_GPU"
    count: Annotated[int, Field(description="Instances (per GPU for KIND_GPU).")] = 1
    gpus: Annotated[tuple[int, ...], Field(description="GPU indices; empty means every visible GPU.")] = ()


class ModelConfigInput(_Input):
    """Everything the Triton model config is made of, typed; `max_batch_size` is `batching.max_batch_size`."""

    name: Annotated[str, Field(description="Model name inside Triton.")]
    runtime: Annotated[Runtime, Field(description="tensorrt_plan platform, onnxruntime or python backend.")]
    inputs: Annotated[tuple[TensorSpec, ...], Field(description="Input tensors, dims without the batch dim.")]
    outputs: Annotated[tuple[TensorSpec, ...], Field(description="Output tensors.")]
    batching: Annotated[Batching, Field(description="max_batch_size and dynamic batching.")] = Batching()
    engine_max_batch: Annotated[
        int | None,
        Field(description="Largest batch the engine accepts (TensorRT profile max); None: no limit."),
    ] = None
    instance_groups: Annotated[tuple[InstanceGroup, ...], Field(description="Instance groups.")] = (InstanceGroup(),)
    queue_policy: Annotated[QueuePolicy | None, Field(description="Default queue policy; None: Triton's.")] = None
    warmup: Annotated[Warmup | None, Field(description="Warmup before the model turns ready.")] = None
    warmup_dims: Annotated[
        Mapping[str, tuple[int, ...]],
        Field(description="Concrete dims for warmup samples of inputs whose dims contain -1."),
    ] = Field(default_factory=dict)
    parameters: Annotated[Mapping[str, str], Field(description="Model parameters (python backend).")] = Field(
        default_factory=dict
    )


def _check_tensors(kind: str, tensors: tuple[TensorSpec, ...]) -> None:
    if not tensors:
        raise ConfigError(kind, f"at least one {kind[:-1]} tensor is needed; list the engine's {kind}")
    seen: set[str] = set()
    for i, t in enumerate(tensors):
        if not t.name.strip():
            raise ConfigError(f"{kind}[{i}].name", "must not be empty; use the tensor name of the ONNX graph")
        if t.name in seen:
            raise ConfigError(f"{kind}[{i}].name", f"{t.name!r} is listed twice; tensor names must be unique")
        seen.add(t.name)
        if not t.dims:
            raise ConfigError(f"{kind}[{i}].dims", "must list at least one dim (without the batch dim)")
        for j, d in enumerate(t.dims):
            if d == 0 or d < -1:
                raise ConfigError(f"{kind}[{i}].dims[{j}]", f"{d} is not a dim; use a size >= 1 or -1 (dynamic)")


def _warmup_dims(inp: ModelConfigInput, index: int, spec: TensorSpec) -> tuple[int, ...]:
    given = inp.warmup_dims.get(spec.name)
    if given is None:
        if -1 in spec.dims:
            raise ConfigError(
                f"inputs[{index}].dims",
                f"{spec.name!r} has dynamic dims {spec.dims}; give concrete dims in warmup_dims",
            )
        return tuple(spec.dims)
    if len(given) != len(spec.dims) or any(
        g < 1 or (d != -1 and g != d) for g, d in zip(given, spec.dims, strict=True)
    ):
        raise ConfigError(
            f"warmup_dims[{spec.name!r}]",
            f"{list(given)} does not fit dims {spec.dims}; give one size >= 1 per dim, equal where fixed",
        )
    return given


def validate(inp: ModelConfigInput) -> None:
    """Raise `ConfigError` for the first invariant `inp` breaks; return None when Triton can load it.

    Checks: non-empty, unique names; preferred sizes <= max batch <= engine max batch; warmup batch <=
    max batch; warmup inputs with known dims; instance groups that fit the runtime.
    """
    if not inp.name.strip():
        raise ConfigError("name", "must not be empty; use the model name clients call")
    _check_tensors("inputs", inp.inputs)
    _check_tensors("outputs", inp.outputs)
    b = inp.batching
    if b.max_batch_size < 1:
        raise ConfigError("batching.max_batch_size", f"{b.max_batch_size} must be >= 1")
    if inp.engine_max_batch is not None and b.max_batch_size > inp.engine_max_batch:
        raise ConfigError(
            "batching.max_batch_size",
            f"{b.max_batch_size} exceeds the engine's max batch {inp.engine_max_batch}; lower it to <= "
            f"{inp.engine_max_batch} or rebuild the engine with a larger optimization profile max",
        )
    for i, s in enumerate(b.preferred_batch_sizes):
        if not 1 <= s <= b.max_batch_size:
            raise ConfigError(
                f"batching.preferred_batch_sizes[{i}]",
                f"{s} must be within 1..max_batch_size {b.max_batch_size}; drop it or raise max_batch_size",
            )
    if b.max_queue_delay_microseconds < 0:
        raise ConfigError("batching.max_queue_delay_microseconds", "must be >= 0")
    if inp.runtime == "tensorrt_plan" and inp.engine_max_batch is None:
        raise ConfigError("engine_max_batch", "a tensorrt_plan needs its engine's max batch (profile max)")
    for i, g in enumerate(inp.instance_groups):
        if g.count < 1:
            raise ConfigError(f"instance_groups[{i}].count", f"{g.count} must be >= 1")
        if g.kind == "KIND_CPU" and g.gpus:
            raise ConfigError(f"instance_groups[{i}].gpus", "KIND_CPU takes no gpus; remove them or use KIND_GPU")
        if g.kind == "KIND_CPU" and inp.runtime == "tensorrt_plan":
            raise ConfigError(f"instance_groups[{i}].kind", "a tensorrt_plan runs on GPUs only; use KIND_GPU")
        if any(x < 0 for x in g.gpus) or len(set(g.gpus)) != len(g.gpus):
            raise ConfigError(f"instance_groups[{i}].gpus", f"{list(g.gpus)} must be distinct indices >= 0")
    if not inp.instance_groups:
        raise ConfigError("instance_groups", "at least one instance group is needed")
    unknown = set(inp.warmup_dims) - {t.name for t in inp.inputs}
    if unknown:
        raise ConfigError(f"warmup_dims[{sorted(unknown)[0]!r}]", "names no input; use an input tensor name")
    if inp.warmup is not None:
        if not inp.warmup.batch_sizes:
            raise ConfigError("warmup.batch_sizes", "list at least one batch size, or leave warmup out")
        for i, s in enumerate(inp.warmup.batch_sizes):
            if not 1 <= s <= b.max_batch_size:
                raise ConfigError(
                    f"warmup.batch_sizes[{i}]",
                    f"{s} must be within 1..max_batch_size {b.max_batch_size}; Triton refuses larger warmups",
                )
        if inp.warmup.count < 1:
            raise ConfigError("warmup.count", f"{inp.warmup.count} must be >= 1")
        for i, t in enumerate(inp.inputs):
            _warmup_dims(inp, i, t)
    for k in inp.parameters:
        if not k.strip():
            raise ConfigError("parameters", "parameter names must not be empty")


def _tensor(msg: Any, spec: TensorSpec) -> None:
    msg.name = spec.name
    msg.data_type = model_config_pb2.DataType.Value(spec.data_type)
    msg.dims.extend(spec.dims)


def build_model_config(inp: ModelConfigInput) -> ModelConfig:
    """The `model_config_pb2.ModelConfig` for `inp`, after `validate`."""
    validate(inp)
    cfg = model_config_pb2.ModelConfig()
    cfg.name = inp.name
    platform, backend = _PLATFORMS[inp.runtime]
    if platform:
        cfg.platform = platform
    if backend:
        cfg.backend = backend
    cfg.max_batch_size = inp.batching.max_batch_size
    for spec in inp.inputs:
        _tensor(cfg.input.add(), spec)
    for spec in inp.outputs:
        _tensor(cfg.output.add(), spec)
    for g in inp.instance_groups:
        group = cfg.instance_group.add()
        group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value(g.kind)
        group.count = g.count
        group.gpus.extend(g.gpus)
    db = cfg.dynamic_batching
    db.preferred_batch_size.extend(inp.batching.preferred_batch_sizes)
    db.max_queue_delay_microseconds = inp.batching.max_queue_delay_microseconds
    if inp.queue_policy is not None:
        qp = db.default_queue_policy
        qp.max_queue_size = inp.queue_policy.max_queue_size
        qp.default_timeout_microseconds = inp.queue_policy.timeout_microseconds
        qp.timeout_action = model_config_pb2.ModelQueuePolicy.TimeoutAction.Value("REJECT")
        # Off: a request's own timeout never replaces the config's (Triton would let it shorten it).
        qp.allow_timeout_override = False
    if inp.warmup is not None:
        for b in inp.warmup.batch_sizes:
            sample = cfg.model_warmup.add()
            sample.name = f"warmup_batch_{b}"
            sample.batch_size = b
            sample.count = inp.warmup.count
            for i, spec in enumerate(inp.inputs):
                w = sample.inputs[spec.name]
                w.data_type = model_config_pb2.DataType.Value(spec.data_type)
                w.dims.extend(_warmup_dims(inp, i, spec))
                if inp.warmup.data == "zero":
                    w.zero_data = True
                else:
                    w.random_data = True
    for k, v in sorted(inp.parameters.items()):
        cfg.parameters[k].string_value = v
    return cfg


def config_to_json(cfg: ModelConfig) -> str:
    """Compact JSON of a `ModelConfig`, as the load-with-config-override API takes it."""
    doc = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def config_from_json(doc: Mapping[str, Any] | str) -> ModelConfig:
    """Parse a config as Triton returns it (`/v2/models/M/config`) into a `ModelConfig`."""
    cfg = model_config_pb2.ModelConfig()
    json_format.ParseDict(json.loads(doc) if isinstance(doc, str) else dict(doc), cfg, ignore_unknown_fields=True)
    return cfg


def render_pbtxt(inp: ModelConfigInput) -> str:
    """`config.pbtxt` text for `inp` (protobuf text format)."""
    return str(text_format.MessageToString(build_model_config(inp)))


def render_json(inp: ModelConfigInput) -> str:
    """Compact JSON config for `inp`, the `config` parameter of `POST /v2/repository/models/M/load`."""
    return config_to_json(build_model_config(inp))


def batching_from_config(cfg_json: Mapping[str, Any]) -> Batching:
    """The `Batching` a config (e.g. Triton's live `/v2/models/M/config`) carries."""
    cfg = config_from_json(cfg_json)
    return Batching(
        max_batch_size=cfg.max_batch_size,
        preferred_batch_sizes=list(cfg.dynamic_batching.preferred_batch_size),
        max_queue_delay_microseconds=cfg.dynamic_batching.max_queue_delay_microseconds,
    )


def batching_equivalent(a: Batching, b: Batching) -> bool:
    """Whether Triton's dynamic batcher treats `a` and `b` alike.

    Triton fills an empty preferred list with `[max_batch_size]` and reports it so; order does not matter.
    """

    def key(x: Batching) -> tuple[int, list[int], int]:
        preferred = sorted(set(x.preferred_batch_sizes or [x.max_batch_size]))
        return x.max_batch_size, preferred, x.max_queue_delay_microseconds

    return key(a) == key(b)


def queue_policy_from_config(cfg_json: Mapping[str, Any]) -> QueuePolicy:
    """The default `QueuePolicy` a config carries."""
    qp = config_from_json(cfg_json).dynamic_batching.default_queue_policy
    return QueuePolicy(max_queue_size=qp.max_queue_size, timeout_microseconds=qp.default_timeout_microseconds)


def config_differences(expected: ModelConfig, live: ModelConfig, path: str = "") -> list[str]:
    """Every field set in `expected` whose value `live` does not show, as `path: want ..., live ...` lines.

    Fields `expected` leaves unset are not judged: Triton fills in defaults and names of its own.
    """
    diffs: list[str] = []
    for field, value in expected.ListFields():
        name = f"{path}{field.name}"
        other = getattr(live, field.name)
        is_message = field.message_type is not None
        if is_message and field.message_type.GetOptions().map_entry:
            nested = field.message_type.fields_by_name["value"].message_type is not None
            for key in value:
                if key not in other:
                    diffs.append(f"{name}[{key!r}]: missing live")
                elif nested:
                    diffs += config_differences(value[key], other[key], f"{name}[{key!r}].")
                elif value[key] != other[key]:
                    diffs.append(f"{name}[{key!r}]: want {value[key]!r}, live {other[key]!r}")
        elif is_message and field.is_repeated:
            if len(value) != len(other):
                diffs.append(f"{name}: want {len(value)} entries, live {len(other)}")
            else:
                for i, (a, b) in enumerate(zip(value, other, strict=True)):
                    diffs += config_differences(a, b, f"{name}[{i}].")
        elif is_message:
            diffs += config_differences(value, other, f"{name}.")
        elif field.is_repeated and list(value) != list(other):
            diffs.append(f"{name}: want {list(value)}, live {list(other)}")
        elif not field.is_repeated and value != other:
            diffs.append(f"{name}: want {value!r}, live {other!r}")
    return diffs
