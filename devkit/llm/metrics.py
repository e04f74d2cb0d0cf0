"""The series the emulated LLM exports, by name, and the PromQL that reads its percentiles.

- TTFT: `nv_inference_first_response_histogram_ms`, the name and unit Triton gives its own first-response
  histogram from 2.52 on (decoupled models, `--metrics-config histogram_latencies=true`); the bundled 2.51 has
  none, so the model observes it itself (`pb_utils.MetricFamily` HISTOGRAM), from the request's arrival in
  `execute` to its first token's send.
- TPOT: `tailtune_llm_time_per_output_token_ms`, once per request: (last token - first token) / (tokens - 1),
  the figure a streaming client computes per request. Inter-token gaps one by one:
  `tailtune_llm_inter_token_latency_ms`. No Triton backend exports these (tensorrtllm_backend#657).
- Output tokens: the counter `tailtune_llm_output_tokens_total`; prompt tokens taken:
  `tailtune_llm_prompt_tokens_total`.
- TensorRT-LLM's gauges by their real names and labels: `nv_trt_llm_request_metrics{request_type=active|max|
  scheduled|context|waiting}` and `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|
  tokens_per|fraction}`, each with `model` and `version` as the backend sets them.
"""

from __future__ import annotations

TTFT_HISTOGRAM_MS = "nv_inference_first_response_histogram_ms"
TPOT_HISTOGRAM_MS = "tailtune_llm_time_per_output_token_ms"
ITL_HISTOGRAM_MS = "tailtune_llm_inter_token_latency_ms"
OUTPUT_TOKENS_COUNTER = "tailtune_llm_output_tokens_total"
# Prompt tokens of the requests taken (the prefill work offered): the generative tuner sizes prefill by it.
PROMPT_TOKENS_COUNTER = "tailtune_llm_prompt_tokens_total"
TRTLLM_REQUEST_GAUGE = "nv_trt_llm_request_metrics"
TRTLLM_KV_CACHE_GAUGE = "nv_trt_llm_kv_cache_block_metrics"
REQUEST_TYPES = ("active", "max", "scheduled", "context", "waiting")
KV_CACHE_BLOCK_TYPES = ("max", "free", "used", "tokens_per", "fraction")

# Bucket bounds in ms: 24 per doubling (2^(1/24), 2.9 % apart) from 1 ms to 65.5 s, 385 bounds. histogram_quantile
# interpolates linearly inside a bucket, so its error stays within one bucket's 2.9 %, leaving room inside the 5 %
# issue 39 asks of the server's figure against the client's for the client-to-model transit the server does not
# see (2-3 ms on a busy machine). Sixteen per doubling (4.4 %) once read a TPOT median 3.7 % off.
BUCKETS_PER_DOUBLING = 24
DOUBLINGS = 16
LATENCY_BUCKETS_MS: tuple[float, ...] = tuple(
    round(2 ** (i / BUCKETS_PER_DOUBLING), 4) for i in range(BUCKETS_PER_DOUBLING * DOUBLINGS + 1)
)


def quantile_query(histogram: str, model: str, percentile: float, window: str | None = None) -> str:
    """PromQL for a percentile of one model's histogram, summed over pods: over a window with `increase`, as the
    operator reads a tuning window, or over everything since the model loaded without one."""
    selector = f'{histogram}_bucket{{model="{model}"}}'
    buckets = f"increase({selector}[{window}])" if window else selector
    return f"histogram_quantile({percentile / 100:g}, sum by (le) ({buckets}))"
