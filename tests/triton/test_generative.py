"""The EMULATED inflight-batching LLM inside the real tritonserver, driven by the streaming client, its histograms
read through a real Prometheus.

The client's TTFT/TPOT percentiles are the truth; the server's come from the model's own histograms, read with
`histogram_quantile` over the summed buckets as the operator reads a window (here the window is the model's
whole life: it is loaded fresh for the run, so the cumulative buckets are exactly this run's requests).
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from devkit.llm import metrics as names
from devkit.llm.load import Lengths, StreamingLoad, StreamRecord, summarize
from devkit.llm.repository import EmulatedLlm, write_llm_repository
from devkit.load import Phase
from devkit.ports import free_port
from devkit.procs import Process
from devkit.prometheus import scalar, start_prometheus
from devkit.triton.local import LocalTriton
from tests.triton.conftest import Deployer

SCRAPE_SECONDS = 1
# Issue 39's bar: the server's percentiles within 5 % of the client's on the same run.
AGREEMENT = 0.05


@pytest.fixture(scope="module")
def prometheus(triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus scraping the session's tritonserver every second."""
    port = free_port()
    target = f"{triton.host}:{triton.metrics_port}"
    config = (
        f"global: {{scrape_interval: {SCRAPE_SECONDS}s, evaluation_interval: {SCRAPE_SECONDS}s}}\n"
        f"scrape_configs: [{{job_name: triton, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    proc: Process = start_prometheus(config, tmp_path_factory.mktemp("prometheus"), port)
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def _deploy(deployer: Deployer, llm: EmulatedLlm) -> str:
    name = f"llm_{uuid.uuid4().hex[:8]}"  # fresh series: the histograms hold this test's requests only
    write_llm_repository(Path(deployer.repo), name, llm)
    deployer.load(name)
    return name


def _wait_scraped(prom: str, model: str, completed: int, timeout_s: float = 15.0) -> None:
    query = f'sum({names.TTFT_HISTOGRAM_MS}_count{{model="{model}"}})'
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scalar(prom, query) == completed:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never saw {completed} first responses of {model}: {scalar(prom, query)}")


def test_server_ttft_and_tpot_percentiles_agree_with_the_streaming_client(deployer: Deployer, prometheus: str) -> None:
    """Poisson load with log-normal prompt and output lengths on the L4 roofline: the server's TTFT and TPOT
    P50/P90 (histograms through Prometheus) are within 5 % of the client's. It fails when the server measures
    something else than the user feels: a TTFT clock started at admission instead of arrival (queueing left
    out), or a TPOT taken per gap instead of per request."""
    # Real time: the few ms between the client's send and the model's execute (more on a busy machine) stay
    # under 2 % of a TTFT near 170 ms; at half time they reached 3.6 %.
    model = _deploy(deployer, EmulatedLlm(roofline="l4"))
    load = StreamingLoad(
        deployer.server.grpc_url,
        model,
        [Phase(0.0, 8.0)],
        duration_s=7.0,
        prompt=Lengths(median=384, sigma=0.6, low=16, high=2048),
        output=Lengths(median=12, sigma=0.4, low=2, high=48),
        seed=39,
    )
    records = load.run()
    client = summarize(records)
    assert client.failed == 0 and not load.errors, load.errors
    assert client.completed >= 40
    _wait_scraped(prometheus, model, client.completed)
    errors: dict[str, float] = {}
    for label, histogram, truth in (
        ("ttft", names.TTFT_HISTOGRAM_MS, client.ttft_ms),
        ("tpot", names.TPOT_HISTOGRAM_MS, client.tpot_ms),
    ):
        for q in (50.0, 90.0):
            server = scalar(prometheus, names.quantile_query(histogram, model, q))
            assert server is not None, f"no {histogram} in Prometheus"
            errors[f"{label} P{q:g}"] = (server - truth[q]) / truth[q]
    report = dict(errors)
    for label, histogram, truth in (
        ("ttft", names.TTFT_HISTOGRAM_MS, client.ttft_ms),
        ("tpot", names.TPOT_HISTOGRAM_MS, client.tpot_ms),
    ):
        server = scalar(prometheus, names.quantile_query(histogram, model, 99.0))
        report[f"{label} P99 (max of {client.completed}, not held)"] = (server or 0.0) / truth[99.0] - 1
    print(f"client {client}; server/client - 1: " + ", ".join(f"{k} {v:+.1%}" for k, v in report.items()))
    assert all(abs(e) <= AGREEMENT for e in errors.values()), errors


def _gauges(server: LocalTriton, model: str) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith((names.TRTLLM_REQUEST_GAUGE, names.TRTLLM_KV_CACHE_GAUGE)) and f'model="{model}"' in line:
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('_type="', 1)[1].split('"', 1)[0]
            family = "request" if labels.startswith(names.TRTLLM_REQUEST_GAUGE) else "kv"
            out[f"{family}.{kind}"] = float(value)
    return out


def test_the_kv_budget_caps_running_sequences_and_the_gauges_say_so(deployer: Deployer) -> None:
    """A KV cache of 2048 tokens (32 blocks of 64) and requests of 480 + 32 tokens (8 blocks reserved each under
    guaranteed_no_evict): at most 4 run, the rest wait, and TensorRT-LLM's gauges show it by their real names
    (caught: admission that ignored the reservation ran all 8 at once)."""
    model = _deploy(deployer, EmulatedLlm(roofline="l4", time_scale=0.25, kv_cache_tokens=2048))
    load = StreamingLoad(
        deployer.server.grpc_url,
        model,
        [Phase(0.0, 400.0)],
        duration_s=0.03,
        prompt=Lengths(median=480),
        output=Lengths(median=32),
        seed=1,
        streams=2,
    )
    seen: list[dict[str, float]] = []
    done = False

    def watch() -> None:
        while not done:
            seen.append(_gauges(deployer.server, model))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    records: list[StreamRecord] = load.run()
    done = True
    watcher.join()
    assert len(records) >= 6 and all(r.done and len(r.token_times) == 32 for r in records)
    busy = [g for g in seen if g.get("request.active", 0) > 0]
    assert busy, seen
    assert max(g["request.active"] for g in busy) == 4
    assert max(g["request.waiting"] for g in busy) >= 2
    assert {g["kv.max"] for g in busy} == {32} and {g["kv.tokens_per"] for g in busy} == {64}
    assert max(g["kv.used"] for g in busy) <= 32 and max(g["kv.fraction"] for g in busy) > 0.5
    assert seen[-1]["request.max"] == 256


def test_a_request_the_engine_cannot_take_gets_an_error_naming_the_fix(deployer: Deployer) -> None:
    """A prompt longer than max_num_tokens without chunked prefill is answered at once with an error that says
    what to change, and the model keeps serving (caught: a refusal sent as an error response must not take the
    stepper thread or the server down)."""
    model = _deploy(deployer, EmulatedLlm(roofline="h100", max_num_tokens=256))
    client = grpcclient.InferenceServerClient(deployer.server.grpc_url)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for prompt in (512, 64):
            ids = grpcclient.InferInput("input_ids", [prompt], "INT32")
            ids.set_data_from_numpy(np.ones(prompt, dtype=np.int32))
            out = grpcclient.InferInput("request_output_len", [1], "INT32")
            out.set_data_from_numpy(np.array([2], dtype=np.int32))
            client.async_stream_infer(model, [ids, out], request_id=str(prompt), enable_empty_final_response=True)
            result, error = answers.get(timeout=10)
            if prompt == 512:
                assert result is None and "enable chunked prefill" in str(error), (result, error)
            else:
                assert error is None and result.as_numpy("output_ids") is not None
    finally:
        client.stop_stream()
        client.close()
    assert deployer.server.running()


def test_a_tensorrt_llm_reload_moves_the_emulated_engines_settings_and_reads_back(deployer: Deployer) -> None:
    """The operator's lever reload on the emulated engine: a tensorrt_llm config override, rewritten by the pod's
    shim (`devkit.emulation.emulate_any`), loads in the real tritonserver, the live config reads back the settings
    sent (`tailtune.operator.generative.live_llm`, the canary's check), and the model still streams."""
    from devkit.emulation import emulate_any
    from tailtune.api.v1alpha1 import LlmServing
    from tailtune.operator.generative import live_llm
    from tailtune.triton import control
    from tailtune.triton.config import config_to_json
    from tailtune.triton.trtllm_config import TrtllmConfigInput, build_trtllm_config
    from tailtune.tuner.generative import levers_of

    pod = EmulatedLlm(roofline="l4", warmup_requests=1)
    model = _deploy(deployer, pod)
    wanted = LlmServing(
        batch_scheduler_policy="max_utilization", kv_cache_free_gpu_mem_fraction=0.7,
        enable_chunked_context=True, max_queue_size=12,
    )  # fmt: skip
    override = build_trtllm_config(
        TrtllmConfigInput(name=model, engine_dir="/engines/m/1/engine", max_batch_size=64, serving=wanted)
    )
    url = deployer.server.grpc_url
    assert live_llm(url, model) is not None and levers_of(live_llm(url, model) or wanted) != levers_of(wanted)
    deployer.load(model, config_to_json(emulate_any(override, pod.parameters())))
    assert control.is_model_ready(url, model)
    live = live_llm(url, model)
    assert live is not None and levers_of(live) == levers_of(wanted)
    load = StreamingLoad(
        url, model, [Phase(0.0, 4.0)], duration_s=1.5,
        prompt=Lengths(median=64, sigma=0.2, low=8, high=128), output=Lengths(median=4, sigma=0.2, low=2, high=8),
        seed=39,
    )  # fmt: skip
    records = load.run()
    assert summarize(records).completed > 0 and not load.errors, load.errors


def test_an_unloading_model_finishes_the_streams_in_flight(deployer: Deployer) -> None:
    """An unload (a scale-in's SIGTERM unloads too) lets the sequences in flight finish: Triton waits for their final
    responses before the model's `finalize`, which would cut them. What a scale-in does lose (measured on a
    tritonserver sent SIGTERM mid-stream) are requests sent to the pod after its SIGTERM, before the client's target
    list drops it: refused ("has no available versions"), and the client's open stream holds the server past its
    exit timeout."""
    from tailtune.triton import control

    model = _deploy(deployer, EmulatedLlm(roofline="l4"))
    url = deployer.server.grpc_url
    load = StreamingLoad(
        url, model, [Phase(0.0, 6.0)], duration_s=0.6, streams=1,
        prompt=Lengths(median=64, sigma=0.1, low=32, high=96), output=Lengths(median=24, sigma=0.1, low=20, high=28),
        seed=7, drain_timeout_s=20.0,
    )  # fmt: skip
    runner = threading.Thread(target=load.run)
    runner.start()
    time.sleep(0.8)  # the requests are sent and streaming (about 1.3 s each at the L4's step)
    control.unload_model(url, model)
    runner.join(timeout=30)
    records = load.snapshot()
    stats = summarize(records)
    assert records and stats.failed == 0 and not load.errors, (stats, load.errors)
    assert all(len(r.token_times) == r.output_tokens for r in records)
