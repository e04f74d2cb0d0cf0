"""The generative demo's pieces that need no cluster: its plan, the client's windows, the emulated LLM's pod
annotations and warmup count, and the emulated trtllm-build's report as the operator reads it. The run itself is
tests/e2e/test_generative.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from devkit.demo import DemoError
from devkit.llm.build import build
from devkit.llm.demo import GenPlan, client_window
from devkit.llm.load import StreamRecord
from devkit.llm.pod import LlmPodError, llm_from_annotations, warmup_requests
from tailtune.api import InferenceService
from tailtune.operator.engine import parse_build_report

REPO = Path(__file__).resolve().parents[2]


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = dict(
        quick=True, duration=None, low_rps=1.5, high_rps=4.0, low_prompt=256, high_prompt=1024
    )
    return argparse.Namespace(**(base | kw))


def test_the_probe_is_alone_in_the_window_the_operator_reads_after_it() -> None:
    """The window read at the end covers the whole probe and its drain, none of the high phase (caught: a gap
    shorter than the window mixed the step's requests into the figures compared with the probe's)."""
    window, interval = 25.0, 5.0
    p = GenPlan.build(_args(), window, interval)
    assert p.step_at_s < p.high_end_s < p.probe_at_s < p.probe_end_s < p.end_s
    drain = 5.0
    assert p.end_s - window >= p.high_end_s + drain  # the last window starts after the high phase's last token
    assert p.end_s - (p.probe_end_s + drain + 2.0) >= interval  # and a tick reads the whole probe before the end
    assert p.prompt(p.step_at_s - 1).median == 256 and p.prompt(p.step_at_s).median == 1024
    with pytest.raises(DemoError, match="windowSeconds 12 is too short"):
        GenPlan.build(_args(), 12.0, interval)


def test_client_windows_take_the_requests_sent_in_them() -> None:
    recs = [StreamRecord(str(i), 100.0 + i, 10, 3, [100.0 + i + 0.2 + 0.01 * i, 100.3 + i + 0.01 * i, 100.4 + i], True)
            for i in range(10)]  # fmt: skip
    w = client_window(recs, 100.0, 2.0, 5.0, (250.0, 100.0))
    assert w.requests == 3 and w.ttft_p99_ms == pytest.approx(240.0) and w.within


def test_pod_annotations_set_the_emulated_engine_and_name_a_mistake() -> None:
    llm = llm_from_annotations({"emulated-llm.dev.tailtune.io/roofline": "h100",
                                "emulated-llm.dev.tailtune.io/iteration-overhead-ms": "2"})  # fmt: skip
    assert (llm.roofline, llm.iteration_overhead_ms) == ("h100", 2.0)
    # The load-time settings are the operator's (spec.serving.llm, rendered into the pod's config): one place only.
    with pytest.raises(LlmPodError, match=r"spec\.serving\.llm\.enableChunkedContext"):
        llm_from_annotations({"emulated-llm.dev.tailtune.io/enable-chunked-context": "true"})
    with pytest.raises(LlmPodError, match="roofline='a100'"):
        llm_from_annotations({"emulated-llm.dev.tailtune.io/roofline": "a100"})
    with pytest.raises(LlmPodError, match="unknown"):
        llm_from_annotations({"emulated-llm.dev.tailtune.io/tokens": "1"})
    config = 'name: "m"\nmodel_warmup [ { name: "a" batch_size: 1 count: 3 }, { name: "b" batch_size: 2 } ]\n'
    assert warmup_requests(config) == 4 and warmup_requests('name: "m"\n') == 0


def test_the_emulated_build_leaves_tensorrt_llms_tensors_in_a_report_the_operator_reads(tmp_path: Path) -> None:
    report = build(tmp_path, "key", "llm", "NVIDIA-L4")
    assert (tmp_path / "key" / "llm" / "1" / "engine" / "config.json").exists()
    info = parse_build_report(json.dumps(report))
    assert info is not None and info.gpu_product == "NVIDIA-L4"
    assert [t.name for t in info.inputs] == ["input_ids", "request_output_len"]
    assert [t.name for t in info.outputs] == ["output_ids"]


def test_the_example_is_a_valid_generative_service_on_the_runtimes_nodes() -> None:
    doc = yaml.safe_load((REPO / "examples" / "demo-generative.yaml").read_text())
    isvc = InferenceService.model_validate(doc)
    assert isvc.spec.model.kind == "generative" and isvc.spec.slo.ttft and isvc.spec.slo.tpot
    assert isvc.spec.serving.node_selector == {"dev.tailtune.io/local-runtime": "true"}
    assert llm_from_annotations(isvc.spec.serving.pod_annotations).warmup_requests > 0


def test_the_emulated_llm_takes_its_load_time_settings_from_the_operators_config_and_reports_them_back() -> None:
    """At pod start (the ConfigMap) and at a reload (the shim's rewrite of the override) the emulated engine runs the
    settings of the operator's tensorrt_llm config, and its own config carries them where the operator reads them
    back (caught: the pod ran the annotations' settings, so a lever the operator reloaded never reached the engine,
    and the live config could not confirm it)."""
    from devkit.emulation import emulate_any, emulate_load_body
    from devkit.llm.repository import EmulatedLlm, emulate_trtllm, parse_pbtxt, with_trtllm_settings
    from tailtune.api.v1alpha1 import LlmServing
    from tailtune.operator.modelconfig import model_config_json, model_config_pbtxt
    from tailtune.triton.config import config_from_json, config_to_json
    from tailtune.triton.trtllm_config import llm_serving_from_config
    from tailtune.tuner.generative import levers_of

    doc = yaml.safe_load((REPO / "examples" / "demo-generative.yaml").read_text())
    isvc = InferenceService.model_validate(doc)
    wanted = LlmServing(
        batch_scheduler_policy="max_utilization", kv_cache_free_gpu_mem_fraction=0.7,
        enable_chunked_context=True, max_queue_size=12,
    )  # fmt: skip
    pod = llm_from_annotations(isvc.spec.serving.pod_annotations)
    started = with_trtllm_settings(pod, parse_pbtxt(model_config_pbtxt(isvc, isvc.spec.serving.batching, None, wanted)))
    assert (started.roofline, started.warmup_requests) == ("l4", 2)  # the pod's emulation stays
    assert (started.batch_scheduler_policy, started.kv_cache_free_gpu_mem_fraction) == ("max_utilization", 0.7)
    assert (started.enable_chunked_context, started.max_queue_size) == (True, 12)

    override = config_from_json(model_config_json(isvc, isvc.spec.serving.batching, None, wanted))
    params = {**pod.parameters(), "model_kind": "emulated_gpu", "device_lock": "/tmp/lock"}
    emulated = emulate_any(override, params)
    assert emulated == emulate_trtllm(override, params) and emulated.backend == "python"
    assert EmulatedLlm.from_parameters({k: v.string_value for k, v in emulated.parameters.items()}) == started
    live = llm_serving_from_config(json.loads(config_to_json(emulated)))
    assert levers_of(live) == levers_of(wanted)
    body = json.dumps({"parameters": {"config": config_to_json(override)}}).encode()
    sent = json.loads(json.loads(emulate_load_body(body, params))["parameters"]["config"])
    assert sent["backend"] == "python" and sent["parameters"]["enable_chunked_context"]["string_value"] == "true"
