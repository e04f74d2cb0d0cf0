"""EMULATED LLM (not a real GPU, not a real model): a decoupled Python-backend model that serves like an
inflight-batching LLM engine, inside the real tritonserver.

As Triton's vLLM backend does: `execute` only hands each request to the engine and returns; one stepper
thread runs the batch (`devkit.llm.engine`: admission under the KV budget, the scheduler policy, chunked
prefill, the roofline's iteration time, slept for `time_scale` times that) and streams every token through
its request's response sender, the last one flagged final. Inputs as TensorRT-LLM's model takes them:
`input_ids` (INT32, the prompt; only its length matters) and `request_output_len` (INT32 [1]); each response
carries one token in `output_ids`. It exports TTFT, TPOT and inter-token histograms and TensorRT-LLM's
request and KV-cache gauges (`devkit.llm.metrics`).

Parameters (strings): `roofline` (l4 | h100), `time_scale` (wall seconds per emulated second), TensorRT-LLM's
`max_batch_size`, `max_num_tokens`, `batch_scheduler_policy`, `enable_chunked_context`,
`kv_cache_free_gpu_mem_fraction`, `max_queue_size`, and `kv_cache_tokens`, `iteration_overhead_ms`;
`warmup_requests` (default 0): requests of `WARMUP_PROMPT_TOKENS` + `WARMUP_OUTPUT_TOKENS` run through the engine,
on its clock, before `initialize` returns (the model turns READY after them; Triton 2.51 does not send a decoupled
model its `model_warmup`). They are neither sent nor observed in the metrics.

This file runs inside Triton's Python backend stub, not in tailtune: it is excluded from mypy.
"""

import json
import os
import re
import sys
import threading
import time


def _config_parameter(name):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(here, "config.pbtxt")) as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r'key:\s*"' + name + r'"\s*value\s*\{\s*string_value:\s*"([^"]*)"', text)
    return m.group(1) if m else None


# The stub embeds its own Python: numpy comes from the venv's site-packages, the engine from the checkout.
for _name in ("site_packages", "source_root"):
    _path = _config_parameter(_name)
    if _path and _path not in sys.path:
        sys.path.append(_path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from devkit.llm import metrics as names  # noqa: E402
from devkit.llm.engine import ROOFLINES, Engine, EngineConfig, Refused, Sequence, run_to_completion  # noqa: E402

# A warmup request: a short prompt and a few tokens, as TensorRT-LLM's own warmup runs (one context and a decode).
WARMUP_PROMPT_TOKENS = 16
WARMUP_OUTPUT_TOKENS = 4


class _Stream:
    """One request's response sender and its token times (monotonic seconds)."""

    def __init__(self, sender, arrived):
        self.sender = sender
        self.arrived = arrived
        self.first = None
        self.previous = None


class TritonPythonModel:
    """Emulated inflight-batching LLM: execute enqueues, one thread steps the batch and streams tokens."""

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise pb_utils.TritonModelException("emulated_llm streams tokens: set model_transaction_policy.decoupled")
        p = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        roofline = p.get("roofline", "l4")
        if roofline not in ROOFLINES:
            raise pb_utils.TritonModelException(f"parameter roofline {roofline!r}: use one of {', '.join(ROOFLINES)}")
        kv_tokens = p.get("kv_cache_tokens")
        try:
            config = EngineConfig(
                roofline=ROOFLINES[roofline],
                max_batch_size=int(p.get("max_batch_size", "256")),
                max_num_tokens=int(p.get("max_num_tokens", "8192")),
                policy=p.get("batch_scheduler_policy", "guaranteed_no_evict"),
                chunked_prefill=p.get("enable_chunked_context", "false").lower() == "true",
                kv_cache_free_gpu_mem_fraction=float(p.get("kv_cache_free_gpu_mem_fraction", "0.9")),
                kv_cache_tokens=int(kv_tokens) if kv_tokens else None,
                iteration_overhead_s=float(p.get("iteration_overhead_ms", "0")) / 1e3,
                max_queue_size=int(p.get("max_queue_size", "0")),
            )
        except ValueError as e:
            raise pb_utils.TritonModelException(f"emulated_llm: {e}") from e
        self.time_scale = float(p.get("time_scale", "1"))
        warmup = int(p.get("warmup_requests", "0"))
        if warmup > 0:  # on a throwaway engine: the serving one starts empty
            seqs = [Sequence(i, WARMUP_PROMPT_TOKENS, WARMUP_OUTPUT_TOKENS) for i in range(warmup)]
            seconds, _ = run_to_completion(Engine(config), seqs)
            time.sleep(seconds * self.time_scale)
        self.engine = Engine(config)
        self.cv = threading.Condition()
        self.stopping = False
        self._metrics(args["model_name"], args["model_version"])
        self.thread = threading.Thread(target=self._run, name="emulated-llm-stepper", daemon=True)
        self.thread.start()

    def _metrics(self, model, version):
        labels = {"model": model, "version": str(version)}
        buckets = list(names.LATENCY_BUCKETS_MS)
        # A family must outlive its metrics (the stub refuses to set a metric of a collected family): keep them.
        h, c, g = pb_utils.MetricFamily.HISTOGRAM, pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.families = [
            pb_utils.MetricFamily(name=names.TTFT_HISTOGRAM_MS, description="Time to the first response, ms", kind=h),
            pb_utils.MetricFamily(
                name=names.TPOT_HISTOGRAM_MS,
                description="Time per output token after the first, per request, ms",
                kind=h,
            ),
            pb_utils.MetricFamily(name=names.ITL_HISTOGRAM_MS, description="Time between two tokens, ms", kind=h),
            pb_utils.MetricFamily(name=names.OUTPUT_TOKENS_COUNTER, description="Output tokens sent", kind=c),
            pb_utils.MetricFamily(name=names.PROMPT_TOKENS_COUNTER, description="Prompt tokens taken", kind=c),
            pb_utils.MetricFamily(name=names.TRTLLM_REQUEST_GAUGE, description="TRT LLM request metrics", kind=g),
            pb_utils.MetricFamily(
                name=names.TRTLLM_KV_CACHE_GAUGE, description="TRT LLM KV cache block metrics", kind=g
            ),
        ]
        ttft, tpot, itl, tokens, prompts, requests, kv = self.families
        self.ttft = ttft.Metric(labels=labels, buckets=buckets)
        self.tpot = tpot.Metric(labels=labels, buckets=buckets)
        self.itl = itl.Metric(labels=labels, buckets=buckets)
        self.tokens = tokens.Metric(labels=labels)
        self.prompt_tokens = prompts.Metric(labels=labels)
        self.request_gauges = {t: requests.Metric(labels={**labels, "request_type": t}) for t in names.REQUEST_TYPES}
        self.kv_gauges = {t: kv.Metric(labels={**labels, "kv_cache_block_type": t}) for t in names.KV_CACHE_BLOCK_TYPES}

    def execute(self, requests):
        now = time.monotonic()
        for request in requests:
            sender = request.get_response_sender()
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            out_len = pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy()
            seq = Sequence(_Stream(sender, now), prompt_tokens=int(ids.size), output_tokens=int(out_len.reshape(-1)[0]))
            with self.cv:
                try:
                    self.engine.submit(seq)
                except Refused as e:
                    error = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
                    sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                self.prompt_tokens.increment(seq.prompt_tokens)
                self.cv.notify()
        return None

    def _export(self, scheduled=0, context=0):
        s = self.engine.stats()
        values = {"active": s.active, "max": s.max_batch_size, "scheduled": scheduled, "context": context}
        values["waiting"] = s.waiting
        for t, v in values.items():
            self.request_gauges[t].set(v)
        kv = {"max": s.total_blocks, "used": s.used_blocks, "free": s.total_blocks - s.used_blocks}
        kv.update({"tokens_per": s.tokens_per_block, "fraction": s.kv_fraction})
        for t, v in kv.items():
            self.kv_gauges[t].set(v)

    def _run(self):
        try:
            self._step_forever()
        except Exception as e:  # every request still in the engine gets the error, none hangs
            pb_utils.Logger.log_error(f"emulated_llm stepper failed: {e!r}")
            with self.cv:
                self._abort_all(f"emulated_llm failed: {e!r}")

    def _step_forever(self):
        deadline = time.monotonic()
        while True:
            with self.cv:
                if self.stopping:
                    self._abort_all("emulated_llm is unloading")
                    return
                it = self.engine.plan()
                if it is None:
                    self._export()
                    self.cv.wait(0.05)
                    deadline = time.monotonic()
                    continue
                self._export(scheduled=len(it.chunks) + len(it.decoding), context=len(it.chunks))
            # Back to back iterations keep the emulated clock: the next starts where the last one ended.
            deadline = max(deadline, time.monotonic() - 0.002) + it.seconds * self.time_scale
            pause = deadline - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with self.cv:
                tokens = self.engine.complete(it)
            for tok in tokens:
                self._send(tok)

    def _send(self, tok):
        stream = tok.sequence.key
        out = pb_utils.Tensor("output_ids", np.array([tok.index % 32000], dtype=np.int32))
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if tok.last else 0
        now = time.monotonic()
        stream.sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=flags)
        self.tokens.increment(1)
        if stream.first is None:
            stream.first = now
            self.ttft.observe((now - stream.arrived) * 1e3)
        else:
            self.itl.observe((now - stream.previous) * 1e3)
        stream.previous = now
        if tok.last and tok.index > 0:
            self.tpot.observe((now - stream.first) * 1e3 / tok.index)

    def _abort_all(self, why):
        pending = [*self.engine.running, *self.engine.waiting]
        self.engine.running.clear()
        self.engine.waiting.clear()
        for seq in pending:
            error = pb_utils.InferenceResponse(error=pb_utils.TritonError(why))
            seq.key.sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout=10)
