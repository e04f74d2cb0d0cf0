"""A real Prometheus scraping two fake Triton pods (prometheus-client exporters with known values).

The exporters' counters grow at fixed rates from the moment they start, so every rate, ratio and quantile
the reader computes is known in advance. Prometheus comes from the distribution's package
(`apt-get install prometheus`); without it these tests fail rather than silently skip.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from prometheus_client import start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from devkit.ports import free_port
from devkit.procs import Process
from devkit.prometheus import start_prometheus

SCRAPE_SECONDS = 1


@dataclass
class FakeModel:
    """Per-pod Triton metrics of one model: rates in 1/s, times in microseconds."""

    name: str
    success_rps: float = 0.0
    batch: float = 1.0
    queue_us: float = 0.0
    compute_us: tuple[float, float, float] = (0.0, 0.0, 0.0)
    summary_us: dict[str, float] = field(default_factory=dict)
    # (le, share of requests at or below) for a request-duration histogram; empty: none exposed.
    histogram: tuple[tuple[str, float], ...] = ()
    # Requests waiting in the pod's queue (a gauge).
    pending: float = 3.0


class FakeTriton(Collector):
    """Collects Triton-named metrics whose counters grow linearly since `start`."""

    def __init__(self, models: list[FakeModel]) -> None:
        self.models = models
        self.start = time.time()

    def collect(self) -> Iterable[Metric]:
        now = time.time()
        # As if the server had been up for a while: rate() then has no zero to clamp its extrapolation to.
        dt = now - self.start + 1000
        families: dict[str, Metric] = {}

        def add(name: str, kind: str, sample: str, labels: dict[str, str], value: float) -> None:
            family = families.setdefault(name, Metric(name, f"fake {name}", kind))
            # Stamped with the collection time, so a scrape delayed on a busy machine keeps rates exact.
            family.add_sample(sample, labels, value, timestamp=now)

        for m in self.models:
            lab = {"model": m.name, "version": "1"}
            n = m.success_rps * dt
            # Triton's counters carry no _total suffix; untyped keeps the names exact.
            add("nv_inference_request_success", "untyped", "nv_inference_request_success", lab, n)
            add("nv_inference_count", "untyped", "nv_inference_count", lab, n)
            add("nv_inference_exec_count", "untyped", "nv_inference_exec_count", lab, n / m.batch)
            add(
                "nv_inference_queue_duration_us",
                "untyped",
                "nv_inference_queue_duration_us",
                lab,
                n * m.queue_us,
            )
            for part, us in zip(("input", "infer", "output"), m.compute_us, strict=True):
                metric = f"nv_inference_compute_{part}_duration_us"
                add(metric, "untyped", metric, lab, n * us)
            add("nv_inference_pending_request_count", "gauge", "nv_inference_pending_request_count", lab, m.pending)
            for q, us in m.summary_us.items():
                name = "nv_inference_request_summary_us"
                add(name, "summary", name, {**lab, "quantile": q}, us)
            if m.histogram:
                name = "nv_inference_request_duration_us"
                for le, share in m.histogram:
                    add(name, "histogram", f"{name}_bucket", {**lab, "le": le}, n * share)
                add(name, "histogram", f"{name}_count", lab, n)
                add(name, "histogram", f"{name}_sum", lab, n * 10_000)
        return list(families.values())


@dataclass(frozen=True)
class PromEnv:
    url: str
    pods: tuple[FakeTriton, ...]


# Two pods of one InferenceService in namespace "ml". Per pod: 100 req/s, batch 4, queue 2 ms, compute
# 1+5+0.5 ms; P99 12 ms on pod a and 30 ms on pod b; 3 requests pending on pod a, 7 on pod b. "idle" has
# counters but no traffic; "histo" exposes a histogram whose 99th percentile interpolates to 19.8 ms.
POD_MODELS = (
    [
        FakeModel("bert", 100, 4, 2000, (1000, 5000, 500), {"0.5": 5000, "0.99": 12000}),
        FakeModel("idle"),
        FakeModel("histo", 50, 1, 0, (0, 0, 0), {}, (("1000", 0.0), ("10000", 0.5), ("20000", 1.0), ("+Inf", 1.0))),
    ],
    [
        FakeModel("bert", 100, 4, 2000, (1000, 5000, 500), {"0.5": 7000, "0.99": 30000}, pending=7.0),
        FakeModel("idle"),
        FakeModel("histo", 50, 1, 0, (0, 0, 0), {}, (("1000", 0.0), ("10000", 0.5), ("20000", 1.0), ("+Inf", 1.0))),
    ],
)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {log.read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    pytest.fail(f"prometheus not ready: {log.read_text()[-2000:]}")


def static_scrape_config(job: str, targets: Sequence[tuple[str, Mapping[str, str]]]) -> str:
    """A Prometheus config scraping each (host:port, labels) every SCRAPE_SECONDS under one job."""
    static = "".join(
        f"    - targets: ['{address}']\n      labels: {{{', '.join(f'{k}: {v}' for k, v in labels.items())}}}\n"
        for address, labels in targets
    )
    return (
        f"global:\n  scrape_interval: {SCRAPE_SECONDS}s\n  evaluation_interval: {SCRAPE_SECONDS}s\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n{static}"
    )


@contextlib.contextmanager
def running_prometheus(workdir: Path, config: str) -> Iterator[tuple[str, Process]]:
    """The distribution's Prometheus on `config` (devkit's runner: ready when it yields), its URL and process;
    stopped on exit. Fails the test, with the install hint, where there is no `prometheus`."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: apt-get install -y --no-install-recommends prometheus")
    port = free_port()
    proc = start_prometheus(config, workdir, port)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromEnv]:
    tmp = tmp_path_factory.mktemp("prometheus")
    pods, servers, targets = [], [], []
    for pod, models in zip("ab", POD_MODELS, strict=True):
        registry = CollectorRegistry()
        fake = FakeTriton(models)
        registry.register(fake)
        port = free_port()
        server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
        pods.append(fake)
        servers.append(server)
        targets.append((f"127.0.0.1:{port}", {"namespace": "ml", "pod": pod}))
    try:
        with running_prometheus(tmp, static_scrape_config("triton", targets)) as (url, _):
            yield PromEnv(url=url, pods=tuple(pods))
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
