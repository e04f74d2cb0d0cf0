"""Pure tests of the model config rendering: no server needed."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from devkit.triton.onnx_models import build_mlp, mlp_reference
from tailtune.api.v1alpha1 import Batching, QueuePolicy, TensorSpec, Warmup
from tailtune.triton.config import (
    ConfigError,
    InstanceGroup,
    ModelConfigInput,
    batching_from_config,
    build_model_config,
    config_differences,
    config_from_json,
    queue_policy_from_config,
    render_json,
    render_pbtxt,
    validate,
)
from tailtune.triton.metrics import ModelCounters, parse_model_counters, parse_p99_summary_us


def trt_input(**update: Any) -> ModelConfigInput:
    base = ModelConfigInput(
        name="resnet",
        runtime="tensorrt_plan",
        inputs=(TensorSpec(name="images", data_type="TYPE_FP16", dims=[3, 224, 224]),),
        outputs=(TensorSpec(name="logits", data_type="TYPE_FP16", dims=[1000]),),
        batching=Batching(max_batch_size=16, preferred_batch_sizes=[4, 8], max_queue_delay_microseconds=2000),
        engine_max_batch=32,
        instance_groups=(InstanceGroup(kind="KIND_GPU", count=2, gpus=(0,)),),
        queue_policy=QueuePolicy(max_queue_size=64, timeout_microseconds=100_000),
        warmup=Warmup(batch_sizes=[1, 16], count=2, data="random"),
    )
    return base.model_copy(update=update)


def test_tensorrt_plan_renders_exactly() -> None:
    want = text_format.Parse(
        """
        name: "resnet" platform: "tensorrt_plan" max_batch_size: 16
        input { name: "images" data_type: TYPE_FP16 dims: [3, 224, 224] }
        output { name: "logits" data_type: TYPE_FP16 dims: [1000] }
        instance_group { kind: KIND_GPU count: 2 gpus: [0] }
        dynamic_batching {
          preferred_batch_size: [4, 8] max_queue_delay_microseconds: 2000
          default_queue_policy {
            max_queue_size: 64 default_timeout_microseconds: 100000 timeout_action: REJECT
          }
        }
        model_warmup { name: "warmup_batch_1" batch_size: 1 count: 2
          inputs { key: "images" value { data_type: TYPE_FP16 dims: [3, 224, 224] random_data: true } } }
        model_warmup { name: "warmup_batch_16" batch_size: 16 count: 2
          inputs { key: "images" value { data_type: TYPE_FP16 dims: [3, 224, 224] random_data: true } } }
        """,
        model_config_pb2.ModelConfig(),
    )
    assert build_model_config(trt_input()) == want


@pytest.mark.parametrize(
    ("runtime", "platform", "backend"),
    [("tensorrt_plan", "tensorrt_plan", ""), ("onnxruntime", "", "onnxruntime"), ("python", "", "python")],
)
def test_runtime_sets_platform_or_backend(runtime: str, platform: str, backend: str) -> None:
    groups = (InstanceGroup(kind="KIND_GPU", count=1),)
    cfg = build_model_config(trt_input(runtime=runtime, instance_groups=groups))
    assert (cfg.platform, cfg.backend) == (platform, backend)


def test_pbtxt_and_json_round_trip() -> None:
    inp = trt_input(parameters={"a": "1"}, warmup=Warmup(batch_sizes=[2], count=1, data="zero"))
    cfg = build_model_config(inp)
    assert text_format.Parse(render_pbtxt(inp), model_config_pb2.ModelConfig()) == cfg
    doc = render_json(inp)
    assert " " not in doc.replace('"', "")  # compact
    assert config_from_json(doc) == cfg
    assert batching_from_config(json.loads(doc)) == inp.batching
    assert queue_policy_from_config(json.loads(doc)) == inp.queue_policy
    assert cfg.parameters["a"].string_value == "1"
    assert cfg.model_warmup[0].inputs["images"].zero_data


def test_warmup_dims_fill_dynamic_dims() -> None:
    dyn = (TensorSpec(name="tokens", data_type="TYPE_INT64", dims=[-1]),)
    cfg = build_model_config(trt_input(inputs=dyn, warmup_dims={"tokens": (128,)}))
    assert list(cfg.input[0].dims) == [-1]
    assert list(cfg.model_warmup[0].inputs["tokens"].dims) == [128]
    assert build_model_config(trt_input(inputs=dyn, warmup=None)).input[0].dims == [-1]


def _unchecked_batching(max_batch: int, preferred: list[int]) -> Batching:
    # The API model refuses this when built; validate() must still catch it (model_construct skips checks).
    return Batching.model_construct(
        max_batch_size=max_batch, preferred_batch_sizes=preferred, max_queue_delay_microseconds=0
    )


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("empty-name", {"name": " "}, "name"),
    ("no-inputs", {"inputs": ()}, "inputs"),
    (
        "empty-input-name",
        {"inputs": (TensorSpec.model_construct(name="", data_type="TYPE_FP32", dims=[3]),)},
        "inputs[0].name",
    ),
    (
        "dup-output",
        {"outputs": (TensorSpec(name="o", data_type="TYPE_FP32", dims=[1]),) * 2},
        "outputs[1].name",
    ),
    ("zero-dim", {"outputs": (TensorSpec(name="o", data_type="TYPE_FP32", dims=[0]),)}, "outputs[0].dims[0]"),
    ("max-over-engine", {"batching": Batching(max_batch_size=64)}, "batching.max_batch_size"),
    (
        "preferred-over-max",
        {"batching": _unchecked_batching(8, [4, 16])},
        "batching.preferred_batch_sizes[1]",
    ),
    ("warmup-over-max", {"warmup": Warmup(batch_sizes=[1, 32])}, "warmup.batch_sizes[1]"),
    ("warmup-empty", {"warmup": Warmup(batch_sizes=[])}, "warmup.batch_sizes"),
    (
        "dynamic-dims-warmup",
        {"inputs": (TensorSpec(name="t", data_type="TYPE_INT64", dims=[-1]),)},
        "inputs[0].dims",
    ),
    (
        "warmup-dims-wrong-rank",
        {"inputs": (TensorSpec(name="t", data_type="TYPE_INT64", dims=[-1]),), "warmup_dims": {"t": (4, 4)}},
        "warmup_dims['t']",
    ),
    ("warmup-dims-unknown-input", {"warmup_dims": {"nope": (1,)}}, "warmup_dims['nope']"),
    ("trt-without-engine-max", {"engine_max_batch": None}, "engine_max_batch"),
    ("trt-on-cpu", {"instance_groups": (InstanceGroup(kind="KIND_CPU"),)}, "instance_groups[0].kind"),
    (
        "cpu-with-gpus",
        {"runtime": "python", "instance_groups": (InstanceGroup(kind="KIND_CPU", gpus=(0,)),)},
        "instance_groups[0].gpus",
    ),
    ("zero-count", {"instance_groups": (InstanceGroup(count=0),)}, "instance_groups[0].count"),
    ("dup-gpus", {"instance_groups": (InstanceGroup(gpus=(1, 1)),)}, "instance_groups[0].gpus"),
    ("no-groups", {"instance_groups": ()}, "instance_groups"),
]


@pytest.mark.parametrize(("update", "field"), [pytest.param(u, f, id=i) for i, u, f in INVALID])
def test_invalid_inputs_name_the_field(update: dict[str, Any], field: str) -> None:
    inp = trt_input(**update)
    with pytest.raises(ConfigError) as err:
        validate(inp)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    for render in (render_pbtxt, render_json, build_model_config):
        with pytest.raises(ConfigError):
            render(inp)


def test_config_differences_sees_changed_and_missing_fields() -> None:
    want = build_model_config(trt_input())
    live = build_model_config(trt_input())
    live.instance_group[0].name = "resnet_0"  # Triton's own additions are not differences
    live.version_policy.latest.num_versions = 1
    assert config_differences(want, live) == []
    live.dynamic_batching.preferred_batch_size[:] = [4]
    del live.model_warmup[1]
    assert config_differences(want, live) == [
        "dynamic_batching.preferred_batch_size: want [4, 8], live [4]",
        "model_warmup: want 2 entries, live 1",
    ]


def test_mlp_is_deterministic_and_runs_in_onnxruntime() -> None:
    import onnxruntime as ort

    model = build_mlp(8, 16, 4, seed=3)
    assert model == build_mlp(8, 16, 4, seed=3) != build_mlp(8, 16, 4, seed=4)
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    (y,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"INPUT0": x})
    np.testing.assert_allclose(y, mlp_reference(model, x), rtol=1e-5, atol=1e-5)


METRICS = """# HELP nv_inference_count Number of inferences performed
nv_inference_count{model="emu",version="1"} 120
nv_inference_count{model="other",version="1"} 7
nv_inference_exec_count{model="emu",version="1"} 30
nv_inference_request_failure{model="emu",reason="REJECTED",version="1"} 2
nv_inference_request_failure{model="emu",reason="OTHER",version="1"} 1
nv_inference_request_summary_us{model="emu",version="1",quantile="0.5"} 800
nv_inference_request_summary_us{model="emu",version="1",quantile="0.99"} 4100.5
"""


def test_metrics_parsing() -> None:
    c = parse_model_counters(METRICS, "emu")
    assert (c.inference_count, c.exec_count, c.failure) == (120, 30, 3)
    assert (c - ModelCounters(inference_count=20, exec_count=10)).average_batch_size == 5.0
    assert ModelCounters().average_batch_size is None
    assert parse_p99_summary_us(METRICS, "emu") == 4100.5
    assert parse_p99_summary_us(METRICS, "other") is None


def test_model_control_refuses_http_endpoints() -> None:
    from tailtune.triton import control

    with pytest.raises(ValueError, match="gRPC endpoint host:port"):
        control.server_live("http://127.0.0.1:8000")
