"""Triton's Prometheus counters for one model, read straight from a server's metrics endpoint.

For tests, benchmarks and the local runtime; in a cluster the tuner reads the same series from Prometheus.
"""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_COUNTERS = {
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "exec_count",
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
}


@dataclass(frozen=True)
class ModelCounters:
    """Cumulative counters of one model, summed over versions (and failure reasons)."""

    inference_count: float = 0.0
    exec_count: float = 0.0
    success: float = 0.0
    failure: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0

    def __sub__(self, other: ModelCounters) -> ModelCounters:
        return ModelCounters(
            self.inference_count - other.inference_count,
            self.exec_count - other.exec_count,
            self.success - other.success,
            self.failure - other.failure,
            self.request_duration_us - other.request_duration_us,
            self.queue_duration_us - other.queue_duration_us,
        )

    @property
    def average_batch_size(self) -> float | None:
        """`nv_inference_count / nv_inference_exec_count`; None without executions. Use on a delta."""
        return self.inference_count / self.exec_count if self.exec_count > 0 else None


def parse_model_counters(text: str, model: str) -> ModelCounters:
    """The counters of `model` in a Prometheus text exposition from Triton."""
    sums = dict.fromkeys(_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in _COUNTERS:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if labels.get("model") == model:
            sums[_COUNTERS[m.group(1)]] += float(m.group(3))
    return ModelCounters(**sums)


def parse_pending_requests(text: str, model: str) -> float:
    """`nv_inference_pending_request_count` of `model` (requests queued, not yet executing), summed over versions."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        pending = m is not None and m.group(1) == "nv_inference_pending_request_count"
        if pending and m is not None and dict(_LABEL.findall(m.group(2) or "")).get("model") == model:
            total += float(m.group(3))
    return total


def parse_p99_summary_us(text: str, model: str) -> float | None:
    """Triton's own P99 request latency (`nv_inference_request_summary_us{quantile="0.99"}`), if exported."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) != "nv_inference_request_summary_us":
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        if labels.get("model") == model and labels.get("quantile") == "0.99":
            value = float(m.group(3))
            return None if value != value else value  # NaN: no requests in the summary window
    return None


def scrape(metrics_url: str, timeout: float = 5.0) -> str:
    """The metrics text of one Triton (`http://host:port/metrics`)."""
    with urllib.request.urlopen(metrics_url, timeout=timeout) as r:
        return bytes(r.read()).decode()


def scrape_model_counters(metrics_url: str, model: str, timeout: float = 5.0) -> ModelCounters:
    """`parse_model_counters` on a fresh scrape."""
    return parse_model_counters(scrape(metrics_url, timeout), model)
