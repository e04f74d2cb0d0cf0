"""The emulation rewrite of the operator's model configs (repository at start, hot reloads)."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from devkit.emulation import (
    Curve,
    EmulationError,
    curve_from_annotations,
    emulate,
    emulate_load_body,
    emulate_pbtxt,
    emulation_parameters,
)
from tailtune.api import InferenceService
from tailtune.api.v1alpha1 import Batching
from tailtune.operator.modelconfig import model_config_json, model_config_pbtxt
from tailtune.triton.config import batching_from_config, config_from_json

PARAMS = emulation_parameters(Curve(8, 1.6, 1.3), device_lock="/tmp/pod/lock", site_packages="/venv/site")


def parse(text: str) -> model_config_pb2.ModelConfig:
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(text, cfg)
    return cfg


def test_the_operators_config_becomes_the_emulated_accelerator_keeping_batching_warmup_and_io(
    demo_isvc: InferenceService,
) -> None:
    batching = Batching(max_batch_size=8, preferred_batch_sizes=[4, 8], max_queue_delay_microseconds=500)
    original = parse(model_config_pbtxt(demo_isvc, batching, None))
    assert original.backend == "onnxruntime"

    emulated = parse(emulate_pbtxt(model_config_pbtxt(demo_isvc, batching, None), PARAMS))

    assert emulated.backend == "python" and emulated.platform == ""
    assert [(g.kind, g.count, list(g.gpus)) for g in emulated.instance_group] == [
        (model_config_pb2.ModelInstanceGroup.KIND_CPU, 1, [])
    ]
    assert {k: v.string_value for k, v in emulated.parameters.items()} == PARAMS
    assert emulated.parameters["model_kind"].string_value == "emulated_gpu"
    assert "EMULATED" in emulated.parameters["description"].string_value
    # What the operator decided survives.
    assert emulated.max_batch_size == original.max_batch_size == 8
    assert emulated.dynamic_batching == original.dynamic_batching
    assert list(emulated.model_warmup) == list(original.model_warmup)
    assert list(emulated.input) == list(original.input)
    assert list(emulated.output) == list(original.output)


def test_instances_per_gpu_times_gpus_become_cpu_instances() -> None:
    cfg = parse(
        'name: "m" backend: "onnxruntime" max_batch_size: 4 '
        'input { name: "x" data_type: TYPE_FP32 dims: 4 } output { name: "y" data_type: TYPE_FP32 dims: 4 } '
        "instance_group { kind: KIND_GPU count: 2 gpus: 0 gpus: 1 }"
    )
    out = emulate(cfg, PARAMS)
    assert [(g.kind, g.count) for g in out.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_CPU, 4)]


def test_a_hot_reload_body_is_rewritten_and_keeps_its_batching(demo_isvc: InferenceService) -> None:
    batching = Batching(max_batch_size=16, preferred_batch_sizes=[16], max_queue_delay_microseconds=2000)
    body = json.dumps({"parameters": {"config": model_config_json(demo_isvc, batching, None)}}).encode()

    out = json.loads(emulate_load_body(body, PARAMS))

    config = json.loads(out["parameters"]["config"])
    assert config["backend"] == "python"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["parameters"]["base_ms"] == {"string_value": "8"}
    assert batching_from_config(config) == batching
    assert config_from_json(config).model_warmup  # warmup kept: a reload warms up before it swaps


@pytest.mark.parametrize("body", [b"", b"{}", b'{"parameters": {}}', b'{"parameters": {"config": 3}}'])
def test_a_load_without_a_config_override_passes_unchanged(body: bytes) -> None:
    assert emulate_load_body(body, PARAMS) == body


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"not json", "not JSON"), (b'{"parameters": {"config": "{nope"}}', "does not parse")],
)
def test_bad_load_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(EmulationError, match=message):
        emulate_load_body(body, PARAMS)


def test_output_dims_must_match_input_dims() -> None:
    cfg = parse(
        'name: "m" backend: "onnxruntime" max_batch_size: 4 '
        'input { name: "x" data_type: TYPE_FP32 dims: 16 } output { name: "y" data_type: TYPE_FP32 dims: 4 }'
    )
    with pytest.raises(EmulationError, match="must equal input dims"):
        emulate(cfg, PARAMS)


def test_curve_from_annotations() -> None:
    assert curve_from_annotations({}) == Curve(2.0, 0.4, 1.3)
    prefix = "emulated-gpu.dev.tailtune.io/"
    curve = curve_from_annotations({f"{prefix}base-ms": "8", f"{prefix}per-item-ms": "1.6", "other": "x"})
    assert curve == Curve(8.0, 1.6, 1.3)
    assert curve.ms(1) == pytest.approx(9.6)
    with pytest.raises(EmulationError, match="not a number"):
        curve_from_annotations({f"{prefix}exponent": "fast"})
    with pytest.raises(EmulationError, match=">= 0"):
        curve_from_annotations({f"{prefix}base-ms": "-1"})
