"""The operator's own Prometheus metrics, served on their own port (the chart scrapes `metrics`, 9090).

Names are the contract with the chart's Grafana dashboard (charts/tailtune/dashboards/tailtune.json): rename
one and the dashboard's panel goes blank, so tests/chart checks that every `tailtune_*` name it queries is here.
"""

from __future__ import annotations

from contextlib import suppress

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from tailtune.api.v1alpha1 import LatencyStatus

__all__ = [
    "BATCH_SIZE_MEAN",
    "CONFIG_RELOADS",
    "ENGINE_BUILDS",
    "ERRORS",
    "LATENCY_BREAKDOWN_MS",
    "LATENCY_OBSERVED_MS",
    "LATENCY_TARGET_MS",
    "P99_OBSERVED_MS",
    "RECONCILES",
    "RECONCILE_DURATION",
    "REPLICAS",
    "SLO_MS",
    "TICK_LAG",
    "TUNER_DECISIONS",
    "forget_inference_service",
    "record_latency",
    "start_metrics_server",
]

RECONCILES = Counter("tailtune_reconciles", "Reconciles of an InferenceService, by outcome.", ["result"])
# Reconciles are a few API round trips: buckets from 10 ms to a minute (a slow API server, a big list).
RECONCILE_DURATION = Histogram(
    "tailtune_reconcile_duration_seconds",
    "Wall time of one reconcile.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
ERRORS = Counter("tailtune_errors", "Errors in handlers, by kind (api, prometheus, triton, spec, ...).", ["kind"])
TUNER_DECISIONS = Counter(
    "tailtune_tuner_decisions", "Decisions of the tuner, by reason.", ["namespace", "name", "reason"]
)
# A tick is due on its phase of the interval (`ticks.tick_phase`) and waits GATHER_SECONDS (1 s) for the reads due with
# it, then Prometheus' answer and the decision: buckets from 0.1 s to two minutes (a 30 s interval overrun four times).
TICK_LAG = Histogram(
    "tailtune_tick_lag_seconds",
    "Seconds from when a tuner tick was due to when it had decided (and applied), per completed tick.",
    buckets=(0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0),
)
P99_OBSERVED_MS = Gauge(
    "tailtune_p99_observed_ms", "Latency at the SLO percentile the tuner last observed, ms.", ["namespace", "name"]
)
SLO_MS = Gauge("tailtune_slo_ms", "Latency objective (spec.slo.latencyMs), ms.", ["namespace", "name"])
REPLICAS = Gauge(
    "tailtune_replicas",
    "Triton replicas of an InferenceService; state is desired or ready.",
    ["namespace", "name", "state"],
)
CONFIG_RELOADS = Counter(
    "tailtune_config_reloads",
    "Triton model-config changes applied, by mode (reload in place, rollout) and result.",
    ["namespace", "name", "mode", "result"],
)
ENGINE_BUILDS = Counter("tailtune_engine_builds", "Engine build Jobs that finished, by result.", ["result"])
LATENCY_OBSERVED_MS = Gauge(
    "tailtune_latency_observed_ms",
    "Latency at each spec.slo target's percentile over the tuner's last window, ms.",
    ["namespace", "name", "percentile"],
)
LATENCY_TARGET_MS = Gauge(
    "tailtune_latency_target_ms", "Each spec.slo target, ms.", ["namespace", "name", "percentile"]
)
LATENCY_BREAKDOWN_MS = Gauge(
    "tailtune_latency_breakdown_ms",
    "Where a request's time goes over the tuner's last window, mean ms per request; part is queue, "
    "compute_input, compute_infer, compute_output, rest (inside Triton) or outside (metrics.latencyQuery's "
    "figure minus Triton's at the SLO percentile).",
    ["namespace", "name", "part"],
)
BATCH_SIZE_MEAN = Gauge(
    "tailtune_batch_size_mean", "Mean batch size Triton executed over the tuner's last window.", ["namespace", "name"]
)
_PARTS = ("queue", "compute_input", "compute_infer", "compute_output", "rest", "outside")

_PER_SERVICE_GAUGES = (P99_OBSERVED_MS, SLO_MS, BATCH_SIZE_MEAN)
_LABELLED: dict[tuple[str, str], set[tuple[Gauge, str]]] = {}


def _set(gauge: Gauge, namespace: str, name: str, label: str, value: float | None) -> None:
    """Set one labelled gauge, or drop it when the value is gone (a blank beats a stale figure)."""
    if value is None:
        with suppress(KeyError):
            gauge.remove(namespace, name, label)
        return
    gauge.labels(namespace, name, label).set(value)
    _LABELLED.setdefault((namespace, name), set()).add((gauge, label))


def record_latency(namespace: str, name: str, latency: LatencyStatus) -> None:
    """Export one tuner window: each target and its figure, where the time goes, the mean batch."""
    for t in latency.targets:
        _set(LATENCY_TARGET_MS, namespace, name, f"{t.percentile:g}", t.target_ms)
        _set(LATENCY_OBSERVED_MS, namespace, name, f"{t.percentile:g}", t.observed_ms)
    b = latency.breakdown
    values = (
        (b.queue_ms, b.compute_input_ms, b.compute_infer_ms, b.compute_output_ms, b.rest_ms, b.outside_ms)
        if b is not None
        else (None,) * len(_PARTS)
    )
    for part, value in zip(_PARTS, values, strict=True):
        _set(LATENCY_BREAKDOWN_MS, namespace, name, part, value)
    if b is not None and b.mean_batch is not None:
        BATCH_SIZE_MEAN.labels(namespace, name).set(b.mean_batch)


def forget_inference_service(namespace: str, name: str) -> None:
    """Drop the gauges of a deleted InferenceService, so dashboards do not show its last value forever."""
    for gauge in _PER_SERVICE_GAUGES:
        with suppress(KeyError):  # never set
            gauge.remove(namespace, name)
    for state in ("desired", "ready"):
        with suppress(KeyError):
            REPLICAS.remove(namespace, name, state)
    for gauge, label in _LABELLED.pop((namespace, name), set()):
        with suppress(KeyError):
            gauge.remove(namespace, name, label)


def start_metrics_server(port: int) -> None:
    """Serve the default registry (ours plus process and Python collectors) on 0.0.0.0:port in a thread."""
    start_http_server(port)
