"""The only module that talks to Prometheus: builds the tuner's queries and reads one `Observation`.

Latency, by default from Triton's own metrics:

- a request-duration histogram (`nv_inference_request_duration_us_bucket`) when the server exposes one:
  buckets add up across pods, so `histogram_quantile` over their sum is exact. Triton 2.51's
  `--metrics-config histogram_latencies=true` only adds a first-response histogram for decoupled models,
  so on current Triton this path is for servers or exporters that add one;
- otherwise the summary `nv_inference_request_summary_us{quantile=...}` (`summary_latencies=true`).
  Summary quantiles cannot be averaged across pods, so the conservative aggregate is the max over pods;
  they cover a fixed sliding 60 s, so the observation's span is at least 60 s and the law waits that long
  after a change.

The user's PromQL (`spec.metrics.latencyQuery`, in seconds) replaces both when given. Rate, queue and
compute time per request, mean batch and the pending-queue growth come from Triton's counters.
Missing series give None, never zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from tailtune.tuner.types import SUMMARY_WINDOW_SECONDS, Observation

DEFAULT_SELECTOR = 'namespace="{namespace}",model="{model}"'


class PromClient(Protocol):
    """The part of `prometheus_api_client.PrometheusConnect` the reader uses."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Target:
    """Whose metrics: the InferenceService's namespace and name, and the model name inside Triton."""

    namespace: str
    name: str
    model: str


@dataclass(frozen=True)
class Queries:
    """The PromQL the reader runs; latency in ms, rates in 1/s."""

    latency_ms: str
    span_seconds: float
    request_rate: str
    queue_ms: str
    compute_ms: str
    avg_batch: str
    queue_growth_rps: str
    ready_replicas: str


def fill(template: str, target: Target, window_seconds: float) -> str:
    """Substitute {namespace} {name} {model} {window} and nothing else (PromQL has braces of its own)."""
    values = {
        "namespace": target.namespace,
        "name": target.name,
        "model": target.model,
        "window": f"{round(window_seconds)}s",
    }
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def quantile_label(percentile: float) -> str:
    """Triton's quantile label for a percentile: 99 -> '0.99', 99.9 -> '0.999'."""
    return f"{percentile / 100:g}"


def build_queries(
    target: Target,
    percentile: float,
    window_seconds: float,
    *,
    latency_query: str | None = None,
    histogram: bool = False,
    selector: str = DEFAULT_SELECTOR,
) -> Queries:
    """The queries for one InferenceService."""
    sel = fill(selector, target, window_seconds)
    w = f"{round(window_seconds)}s"

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{{{sel}}}[{w}]))"

    q = percentile / 100
    if latency_query is not None:
        latency = f"({fill(latency_query, target, window_seconds)}) * 1000"
        span = window_seconds
    elif histogram:
        buckets = f"sum by (le) (rate(nv_inference_request_duration_us_bucket{{{sel}}}[{w}]))"
        latency = f"histogram_quantile({q:g}, {buckets}) / 1000"
        span = window_seconds
    else:
        summary = f'nv_inference_request_summary_us{{{sel},quantile="{quantile_label(percentile)}"}}'
        extra = window_seconds - SUMMARY_WINDOW_SECONDS
        # The summary already covers the last 60 s; a longer SLO window adds the max over the rest.
        latency = (
            f"max({summary}) / 1000"
            if extra < 1
            else f"max(max_over_time({summary}[{round(extra)}s])) / 1000"
        )
        span = max(window_seconds, SUMMARY_WINDOW_SECONDS)
    success = rate("nv_inference_request_success")
    compute = " + ".join(
        rate(f"nv_inference_compute_{part}_duration_us") for part in ("input", "infer", "output")
    )
    return Queries(
        latency_ms=latency,
        span_seconds=span,
        request_rate=success,
        queue_ms=f"{rate('nv_inference_queue_duration_us')} / {success} / 1000",
        compute_ms=f"({compute}) / {success} / 1000",
        avg_batch=f"{rate('nv_inference_count')} / {rate('nv_inference_exec_count')}",
        queue_growth_rps=f"sum(deriv(nv_inference_pending_request_count{{{sel}}}[{w}]))",
        ready_replicas=f"count(count by (instance) (nv_inference_request_success{{{sel}}}))",
    )


class PrometheusReader:
    """Reads the window ending at a given time for one InferenceService (the loop's ObservationReader)."""

    def __init__(
        self,
        client: PromClient,
        target: Target,
        percentile: float,
        window_seconds: float,
        *,
        latency_query: str | None = None,
        selector: str = DEFAULT_SELECTOR,
    ) -> None:
        self._client = client
        self._target = target
        self._percentile = percentile
        self._window = window_seconds
        self._latency_query = latency_query
        self._selector = selector

    @classmethod
    def connect(
        cls,
        url: str,
        target: Target,
        percentile: float,
        window_seconds: float,
        *,
        latency_query: str | None = None,
        selector: str = DEFAULT_SELECTOR,
    ) -> PrometheusReader:
        """A reader on a `PrometheusConnect` client for this URL."""
        from prometheus_api_client import PrometheusConnect

        client = PrometheusConnect(url=url, disable_ssl=True)
        return cls(client, target, percentile, window_seconds, latency_query=latency_query, selector=selector)

    def queries(self, at: datetime) -> Queries:
        """The queries for the window ending at `at` (checks whether a latency histogram exists)."""
        histogram = False
        if self._latency_query is None:
            sel = fill(self._selector, self._target, self._window)
            histogram = (
                self._scalar(f"count(nv_inference_request_duration_us_bucket{{{sel}}})", at) or 0
            ) > 0
        return build_queries(
            self._target,
            self._percentile,
            self._window,
            latency_query=self._latency_query,
            histogram=histogram,
            selector=self._selector,
        )

    def read(self, window_end: datetime) -> Observation:
        """One observation; a field is None when its series are missing or not a number."""
        q = self.queries(window_end)
        replicas = self._scalar(q.ready_replicas, window_end)
        requests = self._scalar(q.request_rate, window_end)
        return Observation(
            window_end=window_end,
            span_seconds=q.span_seconds,
            p_latency_ms=self._scalar(q.latency_ms, window_end),
            request_rate=requests,
            queue_ms=self._scalar(q.queue_ms, window_end),
            compute_ms=self._scalar(q.compute_ms, window_end),
            avg_batch=self._scalar(q.avg_batch, window_end),
            queue_growth_rps=self._scalar(q.queue_growth_rps, window_end),
            ready_replicas=round(replicas) if replicas is not None else None,
            sample_count=round(requests * q.span_seconds) if requests is not None else None,
        )

    def _scalar(self, query: str, at: datetime) -> float | None:
        result = self._client.custom_query(query, params={"time": f"{at.timestamp():.3f}"})
        if not result:
            return None
        value = float(result[0]["value"][1])
        return value if math.isfinite(value) else None
