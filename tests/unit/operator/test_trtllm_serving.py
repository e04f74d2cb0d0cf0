"""A generative model through the operator: the trtllm-build Job, the tensorrt_llm model config rendered with
Triton's protobuf schema, and a spec change of serving.llm reaching the pods as a reload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tailtune.api import InferenceService
from tailtune.api.keys import CONFIG_HASH_ANNOTATION, GPU_RESOURCE
from tailtune.api.v1alpha1 import LlmServing
from tailtune.engine_builder import trtllm
from tailtune.engine_builder.cli import build_report
from tailtune.engine_builder.gpu import GpuInfo
from tailtune.operator.builders.common import Manifest
from tailtune.operator.builders.engine_job import build_engine_job
from tailtune.operator.engine import engine_cache_key
from tailtune.operator.modelconfig import model_config_json, model_config_pbtxt, trtllm_config_input
from tailtune.operator.observed import JobObservation, Observed
from tailtune.operator.reconcile import desired_state
from tailtune.triton.config import ConfigError
from tailtune.triton.trtllm_config import (
    TrtllmConfigInput,
    build_trtllm_config,
    llm_serving_from_config,
    render_trtllm_pbtxt,
)
from tests.unit.operator.test_trtllm_spec import generative

SERVING = {
    "batchSchedulerPolicy": "max_utilization",
    "kvCacheFreeGpuMemFraction": 0.85,
    "enableChunkedContext": True,
    "maxQueueDelayMicroseconds": 100,
    "maxQueueSize": 64,
}
ENGINE = {"maxBatchSize": 64, "maxNumTokens": 4096, "maxInputLen": 2048, "maxSeqLen": 4096, "dtype": "float16"}


def llm(**changes: Any) -> InferenceService:
    isvc = generative().set("spec.engine.llm", dict(ENGINE)).set("spec.serving.llm", dict(SERVING))
    for path, value in changes.items():
        isvc.set(path.replace("__", "."), value)
    return isvc.obj()


def _parse(text: str) -> Any:
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(text, cfg)
    return cfg


def test_the_rendered_config_parses_with_triton_s_schema_and_carries_the_spec() -> None:
    """config.pbtxt parses back into Triton's ModelConfig with every setting of the spec where the tensorrtllm
    backend reads it (caught: a setting rendered under the wrong name or message would be silently ignored)."""
    isvc = llm()
    cfg = _parse(model_config_pbtxt(isvc, isvc.spec.serving.batching, None))
    assert cfg == build_trtllm_config(trtllm_config_input(isvc))
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == ("llm", "tensorrtllm", 64)
    assert cfg.model_transaction_policy.decoupled
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100
    assert cfg.dynamic_batching.default_queue_policy.max_queue_size == 64
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == "/models/llm/1/engine"
    assert params["batch_scheduler_policy"] == "max_utilization"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.85"
    assert params["enable_chunked_context"] == "true"
    [group] = cfg.instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU and group.count == 1
    inputs = {t.name: t for t in cfg.input}
    assert inputs["input_ids"].allow_ragged_batch and inputs["input_ids"].data_type == model_config_pb2.TYPE_INT32
    assert inputs["input_lengths"].HasField("reshape") and not inputs["input_lengths"].optional
    assert inputs["streaming"].optional
    assert {"output_ids", "sequence_length"} <= {t.name for t in cfg.output}


def test_unset_serving_llm_renders_the_backend_s_defaults() -> None:
    isvc = generative().obj()
    cfg = _parse(model_config_pbtxt(isvc, isvc.spec.serving.batching, None))
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert (params["batch_scheduler_policy"], params["kv_cache_free_gpu_mem_fraction"]) == (
        "guaranteed_no_evict",
        "0.9",
    )
    assert params["enable_chunked_context"] == "false"
    assert cfg.max_batch_size == 2048
    assert cfg.dynamic_batching.default_queue_policy.max_queue_size == 0


def test_the_live_config_reads_back_the_settings_in_force() -> None:
    """What a pod reports (`/v2/models/M/config`, JSON) reads back as the LlmServing rendered into it, so a reload
    can be checked against the pod (caught: a lever lost in the round trip would look applied and not be)."""
    isvc = llm()
    live = json.loads(model_config_json(isvc, isvc.spec.serving.batching, None))
    assert llm_serving_from_config(live) == isvc.spec.llm_serving()
    other = LlmServing(enable_chunked_context=False, max_queue_size=8)
    assert llm_serving_from_config(json.loads(model_config_json(isvc, isvc.spec.serving.batching, None, other))) == (
        other
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": " "}, "name"),
        ({"engine_dir": "engines/llm"}, "engine_dir"),
        ({"max_batch_size": 0}, "max_batch_size"),
    ],
)
def test_a_config_the_backend_refuses_names_the_field(changes: dict[str, Any], field: str) -> None:
    base = {"name": "llm", "engine_dir": "/engines/llm/1/engine", "max_batch_size": 8}
    with pytest.raises(ConfigError) as err:
        render_trtllm_pbtxt(TrtllmConfigInput(**{**base, **changes}))
    assert err.value.field == field


def test_the_build_job_of_a_generative_model_runs_trtllm_build_on_one_gpu() -> None:
    isvc = llm(spec__engine__timingCache=False)
    key = engine_cache_key(isvc)
    job = build_engine_job(isvc, key)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert job["metadata"]["name"] == key
    assert container["command"] == [
        "python", "-m", "tailtune.engine_builder", "build-llm",
        "--checkpoint-uri", "pvc://models/llama-3-8b-ckpt",
        "--gpu-product", "NVIDIA-L4",
        "--model-name", "llm",
        "--store", "/engines",
        "--cache-key", key,
        "--max-batch-size", "64",
        "--max-num-tokens", "4096",
        "--max-input-len", "2048",
        "--tensor-parallel", "1",
        "--max-seq-len", "4096",
        "--dtype", "float16",
    ]  # fmt: skip
    assert container["resources"]["limits"] == {GPU_RESOURCE: "1"}
    assert {"name": "model", "mountPath": "/mnt/models/models", "readOnly": True} in container["volumeMounts"]


def test_the_job_s_flags_are_what_the_builder_parses() -> None:
    """The operator's flags parse in the builder into the spec they came from (caught: a flag renamed on one side
    only would fail every generative build with InvalidArguments)."""
    from tailtune.engine_builder.cli import _parser

    isvc = llm()
    args = _parser().parse_args(
        build_engine_job(isvc, "eng-x")["spec"]["template"]["spec"]["containers"][0]["command"][3:]
    )
    request = trtllm.request_from_args(args)
    assert request.spec == trtllm.TrtllmBuildSpec.from_api(isvc.spec.llm_engine())
    assert (request.cache_key, request.checkpoint_uri, request.timing_cache) == ("eng-x", isvc.spec.model.uri, True)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.engine.llm.maxBatchSize", 32),
        ("spec.engine.llm.maxNumTokens", 8192),
        ("spec.engine.llm.maxInputLen", 1024),
        ("spec.engine.llm.maxSeqLen", 8192),
        ("spec.engine.llm.dtype", "bfloat16"),
        ("spec.serving.gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("spec.engine.builderImage", "registry/engine-builder:trtllm-0.17"),
        ("spec.model.revision", "2"),
    ],
)
def test_each_build_input_keys_a_new_engine(path: str, value: object) -> None:
    changed = generative().set("spec.engine.llm", dict(ENGINE)).set(path, value).obj()
    assert engine_cache_key(changed) != engine_cache_key(llm())


def test_serving_settings_key_no_new_engine() -> None:
    """spec.serving.llm is read at model load: changing it reuses the engine (caught: keying it would rebuild an
    LLM engine, minutes on a GPU, for a setting a reload applies)."""
    assert engine_cache_key(llm(spec__serving__llm={"kvCacheFreeGpuMemFraction": 0.5})) == engine_cache_key(llm())


def _succeeded(isvc: InferenceService, tmp_path: Path) -> Observed:
    """The Job's report as the real builder writes it for a TensorRT-LLM build."""
    req = trtllm.LlmBuildRequest(
        checkpoint_uri=isvc.spec.model.uri,
        model_name=isvc.model_name,
        store=tmp_path,
        gpu_product="NVIDIA-L4",
        spec=trtllm.TrtllmBuildSpec.from_api(isvc.spec.llm_engine()),
    )
    machine = trtllm.LlmMachine("0.16.0", "10.7.0", GpuInfo("NVIDIA L4", "8.9"), tmp_path, "test")
    meta = trtllm.build_metadata(
        req, key=engine_cache_key(isvc), machine=machine, model_digest="a" * 64, engine_bytes=16, build_seconds=1
    )
    return Observed(job=JobObservation(succeeded=True, message=build_report(meta, "built")))


def _by_kind(objects: list[Manifest]) -> dict[str, Manifest]:
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize("mode", ["hot", "rolling"])
def test_a_spec_change_of_serving_llm_reloads_the_pods_on_the_same_engine(mode: str, tmp_path: Path) -> None:
    """desired_state: a new spec.serving.llm renders a new config into the ConfigMap and a new config hash into
    the pod template (pods reload one at a time behind readiness: maxSurge 1, maxUnavailable 0), on the same
    engine and Job; the same spec renders the same objects (caught: a lever that never reached the pods, or a
    roll on every reconcile)."""
    before = llm(spec__tuning__mode=mode)
    after = llm(spec__tuning__mode=mode, spec__serving__llm={**SERVING, "kvCacheFreeGpuMemFraction": 0.6})
    one = desired_state(before, _succeeded(before, tmp_path))
    two = desired_state(after, _succeeded(after, tmp_path))
    assert one.serving_problem is None and two.serving_problem is None
    assert one.cache_key == two.cache_key
    a, b = _by_kind(one.objects), _by_kind(two.objects)
    assert "Job" not in a and "Job" not in b  # the Job exists: never re-applied
    assert "kv_cache_free_gpu_mem_fraction" in a["ConfigMap"]["data"]["config.pbtxt"]
    params = _parse(b["ConfigMap"]["data"]["config.pbtxt"]).parameters
    assert params["kv_cache_free_gpu_mem_fraction"].string_value == "0.6"

    def pod_hash(d: Manifest) -> str:
        return str(d["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

    assert pod_hash(a["Deployment"]) != pod_hash(b["Deployment"])
    assert b["Deployment"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert desired_state(before, _succeeded(before, tmp_path)).objects == one.objects
    script = a["Deployment"]["spec"]["template"]["spec"]["initContainers"][0]["command"][2]
    assert "ln -sfn /engines/llm/1/engine /models/llm/1/engine" in script  # where gpt_model_path points


def test_a_build_limit_change_builds_a_new_engine_first(tmp_path: Path) -> None:
    """A new engine.llm limit is a new key: its Job is applied and serving waits for it."""
    isvc = llm(spec__engine__llm={**ENGINE, "maxNumTokens": 8192})
    desired = desired_state(isvc, Observed())
    [job] = desired.objects
    assert job["kind"] == "Job" and job["metadata"]["name"] == engine_cache_key(isvc) != engine_cache_key(llm())
    assert "--max-num-tokens" in job["spec"]["template"]["spec"]["containers"][0]["command"]


def test_the_build_report_fills_status_engine(tmp_path: Path) -> None:
    from tailtune.operator.engine import engine_info

    isvc = llm()
    observed = _succeeded(isvc, tmp_path)
    info = engine_info(isvc, engine_cache_key(isvc), observed.job)
    assert info is not None
    assert (info.location, info.gpu_product, info.engine_bytes) == ("llm/1/engine", "NVIDIA-L4", 16)
    assert info.model_digest == "sha256:" + "a" * 64
    assert json_format.MessageToDict(_parse(model_config_pbtxt(isvc, isvc.spec.serving.batching, info)))["backend"] == (
        "tensorrtllm"
    )
