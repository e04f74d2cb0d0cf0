"""spec.engine.llm and spec.serving.llm: defaults, rules, and the CRD's CEL rules that mirror them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tailtune.api import v1alpha1 as api
from tailtune.api.crdgen import build_crd
from tests.unit.factories import IsvcBuilder, make_isvc

TTFT = {"targetMs": 500, "percentile": 99}
TPOT = {"targetMs": 30, "percentile": 99}


def generative(name: str = "llm") -> IsvcBuilder:
    """A generative spec with both token targets."""
    return (
        make_isvc(name)
        .set("spec.model.kind", "generative")
        .set("spec.model.uri", "pvc://models/llama-3-8b-ckpt")
        .set("spec.slo.ttft", TTFT)
        .set("spec.slo.tpot", TPOT)
    )


def test_a_generative_spec_without_llm_fields_gets_the_documented_defaults() -> None:
    """Unset, the engine gets trtllm-build's defaults and serving the tensorrt_llm backend's (caught: a default
    that drifted from its documented source would build or load a different engine than the user reads)."""
    spec = generative().obj().spec
    assert spec.engine.llm is None and spec.serving.llm is None
    eng, srv = spec.llm_engine(), spec.llm_serving()
    assert (eng.max_batch_size, eng.max_num_tokens, eng.max_input_len, eng.max_seq_len) == (2048, 8192, 1024, None)
    assert (eng.dtype, eng.tensor_parallel) == (None, 1)
    assert srv.batch_scheduler_policy == "guaranteed_no_evict"
    assert srv.kv_cache_free_gpu_mem_fraction == 0.9
    assert (srv.enable_chunked_context, srv.max_queue_delay_microseconds, srv.max_queue_size) == (False, 0, 0)


def test_wire_names_are_camel_case() -> None:
    isvc = (
        generative()
        .set("spec.engine.llm", {"maxBatchSize": 64, "maxNumTokens": 4096, "maxInputLen": 2048, "maxSeqLen": 4096})
        .set("spec.serving.llm", {"batchSchedulerPolicy": "max_utilization", "kvCacheFreeGpuMemFraction": 0.8})
        .obj()
    )
    dumped = isvc.spec.model_dump(by_alias=True)
    assert dumped["engine"]["llm"]["maxNumTokens"] == 4096
    assert dumped["serving"]["llm"]["kvCacheFreeGpuMemFraction"] == 0.8
    assert dumped["serving"]["llm"]["batchSchedulerPolicy"] == "max_utilization"


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"spec.engine.llm": {"maxInputLen": 2048, "maxSeqLen": 2048}}, "engine.llm.maxSeqLen must be > "),
        ({"spec.engine.llm": {"maxNumTokens": 512, "maxInputLen": 1024}}, "maxNumTokens must be >= "),
        ({"spec.engine.llm": {"tensorParallel": 2}}, "Input should be 1"),
        ({"spec.serving.llm": {"kvCacheFreeGpuMemFraction": 1.0}}, "less than 1"),
        ({"spec.serving.llm": {"kvCacheFreeGpuMemFraction": 0}}, "greater than 0"),
        ({"spec.serving.llm": {"batchSchedulerPolicy": "static_batch"}}, "'max_utilization' or 'guaranteed_no_evict'"),
        ({"spec.serving.llm": {"maxQueueDelayMicroseconds": 2_000_000}}, "less than or equal to 1000000"),
        ({"spec.engine.backend": "onnxruntime", "spec.engine.precision": "fp32"}, "leave spec.engine.backend at"),
        ({"spec.engine.llm": {"dtype": "int8"}}, "'float16', 'bfloat16' or 'float32'"),
    ],
)
def test_bad_llm_fields_name_the_field_and_the_fix(changes: dict[str, Any], needle: str) -> None:
    isvc = generative()
    for path, value in changes.items():
        isvc.set(path, value)
    with pytest.raises(ValidationError) as err:
        isvc.obj()
    assert needle in str(err.value)


def test_chunked_context_lets_a_prompt_exceed_the_token_budget() -> None:
    """maxNumTokens < maxInputLen is refused without chunked context and taken with it (caught: a rule that
    refused both would forbid the documented way to serve long prompts on a small token budget)."""
    isvc = generative().set("spec.engine.llm", {"maxNumTokens": 512, "maxInputLen": 4096})
    with pytest.raises(ValidationError, match="or enable chunked context"):
        isvc.obj()
    spec = isvc.set("spec.serving.llm", {"enableChunkedContext": True}).obj().spec
    assert spec.llm_engine().needs_chunked_context


@pytest.mark.parametrize("path", ["spec.engine.llm", "spec.serving.llm"])
def test_a_request_model_must_not_set_llm_fields(path: str) -> None:
    with pytest.raises(ValidationError, match="apply to generative services only: remove them"):
        make_isvc().set(path, {}).obj()


def _rules(schema: dict[str, Any]) -> list[str]:
    return [v["rule"] for v in schema.get("x-kubernetes-validations", [])]


def test_the_crd_carries_the_llm_fields_defaults_and_rules() -> None:
    """The CRD (what admission enforces) has the same defaults and rules as the models (caught: a rule only in
    pydantic would let the API server admit what the operator then refuses)."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    engine_llm = schema["properties"]["engine"]["properties"]["llm"]
    serving_llm = schema["properties"]["serving"]["properties"]["llm"]
    assert engine_llm["properties"]["maxNumTokens"]["default"] == 8192
    assert engine_llm["properties"]["tensorParallel"]["enum"] == [1]
    assert "default" not in engine_llm and "default" not in serving_llm  # unset stays unset for the request check
    assert serving_llm["properties"]["kvCacheFreeGpuMemFraction"]["default"] == 0.9
    assert serving_llm["properties"]["batchSchedulerPolicy"]["default"] == "guaranteed_no_evict"
    assert any("self.maxSeqLen > self.maxInputLen" in r for r in _rules(engine_llm))
    spec_rules = _rules(schema)
    assert any("!has(self.engine.llm) && !has(self.serving.llm)" in r for r in spec_rules)
    assert any("self.serving.llm.enableChunkedContext" in r for r in spec_rules)
    assert any("self.engine.backend == 'tensorrt'" in r for r in spec_rules)
    messages = [v["message"] for v in schema["x-kubernetes-validations"]]
    assert api.PROMPT_ABOVE_TOKEN_BUDGET in messages and api.LLM_FIELDS_WITHOUT_GENERATIVE in messages
