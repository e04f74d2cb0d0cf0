"""The operator's own Prometheus metrics, served on their own port (the chart scrapes `metrics`, 9090).

Names are the contract with the chart's Grafana dashboard (charts/tailtune/dashboards/tailtune.json): rename
one and the dashboard's panel goes blank, so tests/chart checks that every `tailtune_*` name it queries is here.
"""

from __future__ import annotations

from contextlib import suppress

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = [
    "CONFIG_RELOADS",
    "ENGINE_BUILDS",
    "ERRORS",
    "P99_OBSERVED_MS",
    "RECONCILES",
    "RECONCILE_DURATION",
    "REPLICAS",
    "SLO_MS",
    "TUNER_DECISIONS",
    "forget_inference_service",
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

_PER_SERVICE_GAUGES = (P99_OBSERVED_MS, SLO_MS)


def forget_inference_service(namespace: str, name: str) -> None:
    """Drop the gauges of a deleted InferenceService, so dashboards do not show its last value forever."""
    for gauge in _PER_SERVICE_GAUGES:
        with suppress(KeyError):  # never set
            gauge.remove(namespace, name)
    for state in ("desired", "ready"):
        with suppress(KeyError):
            REPLICAS.remove(namespace, name, state)


def start_metrics_server(port: int) -> None:
    """Serve the default registry (ours plus process and Python collectors) on 0.0.0.0:port in a thread."""
    start_http_server(port)
