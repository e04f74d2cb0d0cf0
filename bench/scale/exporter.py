"""A synthetic Triton metrics exporter: Triton's metric families for every pod of many InferenceServices, one target.

Each pod's counters move at a set rate (requests per second, the mean batch, the mean time per request in the queue
and in each compute step) and its latency summary holds set quantiles: a steady signal, so a tuner within its SLO
has nothing to change and nothing to write. The families and labels are Triton 2.51's (`--metrics-config
summary_latencies=true`) with the `namespace` and `pod` labels Prometheus' pod relabelling adds, so the operator's
default selector (`namespace="{namespace}",model="{model}"`) and its per-pod aggregations (by `instance`) read them
as they read a real fleet. Served as ONE scrape target: Prometheus keeps these labels with `honor_labels: true`.

    python bench/scale/exporter.py --port 9400 --namespace fleet --count 100 --replicas 1
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from devkit.prometheus import GetServer

# Triton's default summary quantiles (`--metrics-config summary_quantiles`), as tailtune.tuner.prom reads them.
QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
# Triton's failure reasons on nv_inference_request_failure (2.51).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass(frozen=True)
class Pod:
    """One Triton pod of one InferenceService, as Prometheus labels it."""

    namespace: str
    model: str
    pod: str

    @property
    def instance(self) -> str:
        return f"{self.pod}:8002"


@dataclass(frozen=True)
class Signal:
    """What every pod serves: its request rate and where a request's time goes (ms, means over requests)."""

    rate_rps: float = 50.0
    mean_batch: float = 4.0
    queue_ms: float = 2.0
    compute_input_ms: float = 0.1
    compute_infer_ms: float = 8.0
    compute_output_ms: float = 0.1
    # Triton's own request path past the queue and the compute steps (the rest of the mean request time).
    rest_ms: float = 0.8
    # The summary's quantiles, as a multiple of the mean request time (a right-skewed latency: P99 = 1.6 x mean).
    quantile_factors: tuple[float, ...] = (0.9, 1.3, 1.4, 1.6, 1.9)

    @property
    def request_ms(self) -> float:
        return self.queue_ms + self.compute_input_ms + self.compute_infer_ms + self.compute_output_ms + self.rest_ms

    def quantile_ms(self, quantile: str) -> float:
        return self.request_ms * self.quantile_factors[QUANTILES.index(quantile)]


def pods_of(namespace: str, names: Sequence[str], replicas: int) -> list[Pod]:
    """The pods of these InferenceServices (`<name>-triton-<k>`), `replicas` each."""
    return [Pod(namespace, name, f"{name}-triton-{k}") for name in names for k in range(replicas)]


def rate_share(pod: Pod) -> float:
    """The pod's share of the set rate, 0.75-1.25: pods differ (a hash of the pod), each is steady."""
    digest = int.from_bytes(hashlib.sha256(pod.pod.encode()).digest()[:4], "big")
    return 0.75 + 0.5 * digest / 2**32


def render(pods: Sequence[Pod], signal: Signal, elapsed_s: float) -> str:
    """Prometheus' text format of every pod's families after `elapsed_s` seconds at the set rates. Pure."""
    families: dict[str, tuple[str, str, list[str]]] = {}

    def add(name: str, kind: str, help_text: str, labels: str, value: float) -> None:
        families.setdefault(name, (kind, help_text, []))[2].append(f"{name}{{{labels}}} {value:.12g}")

    for pod in pods:
        requests = signal.rate_rps * rate_share(pod) * elapsed_s
        base = f'namespace="{pod.namespace}",pod="{pod.pod}",instance="{pod.instance}",model="{pod.model}",version="1"'
        add("nv_inference_request_success", "counter", "Number of successful inference requests", base, requests)
        for reason in FAILURE_REASONS:
            add("nv_inference_request_failure", "counter", "Number of failed inference requests",
                f'{base},reason="{reason}"', 0.0)  # fmt: skip
        add("nv_inference_count", "counter", "Number of inferences performed", base, requests)
        add("nv_inference_exec_count", "counter", "Number of model executions performed", base,
            requests / signal.mean_batch)  # fmt: skip
        for name, ms in (
            ("nv_inference_request_duration_us", signal.request_ms),
            ("nv_inference_queue_duration_us", signal.queue_ms),
            ("nv_inference_compute_input_duration_us", signal.compute_input_ms),
            ("nv_inference_compute_infer_duration_us", signal.compute_infer_ms),
            ("nv_inference_compute_output_duration_us", signal.compute_output_ms),
        ):
            add(name, "counter", "Cumulative duration, microseconds", base, requests * ms * 1000)
        add("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests", base, 0.0)
        summary = "nv_inference_request_summary_us"
        for q in QUANTILES:
            add(summary, "summary", "Summary of request durations, microseconds", f'{base},quantile="{q}"',
                signal.quantile_ms(q) * 1000)  # fmt: skip
        families[summary][2].append(f"{summary}_count{{{base}}} {requests:.12g}")
        families[summary][2].append(f"{summary}_sum{{{base}}} {requests * signal.request_ms * 1000:.12g}")
    lines: list[str] = []
    for name, (kind, help_text, samples) in families.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
    return "\n".join(lines) + "\n"


class Exporter(GetServer):
    """Serves `render` of its pods on `GET /metrics` (127.0.0.1), in a daemon thread; counters start at zero now."""

    def __init__(self, pods: Sequence[Pod], signal: Signal, port: int = 0) -> None:
        self.pods, self.signal = list(pods), signal
        self.started = time.monotonic()
        self.scrapes = 0
        super().__init__("/metrics", self._page, port, name="exporter")

    def _page(self) -> tuple[int, str, bytes]:
        self.scrapes += 1
        page = render(self.pods, self.signal, time.monotonic() - self.started)
        return 200, "text/plain; version=0.0.4", page.encode()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--count", type=int, required=True, help="InferenceServices svc-000 ... svc-<count-1>")
    parser.add_argument("--replicas", type=int, default=1, help="pods per InferenceService")
    parser.add_argument("--rate-rps", type=float, default=Signal.rate_rps, help="requests per second per pod")
    args = parser.parse_args(argv)
    names = [f"svc-{i:03d}" for i in range(args.count)]
    exporter = Exporter(pods_of(args.namespace, names, args.replicas), Signal(rate_rps=args.rate_rps), args.port)
    print(f"serving {args.count * args.replicas} pods on 127.0.0.1:{exporter.port}/metrics", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        exporter.server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
