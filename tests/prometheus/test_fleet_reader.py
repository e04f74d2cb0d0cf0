"""The fleet reader against the per-object reader on a real Prometheus holding generated series.

Each case is a fleet of InferenceServices in namespaces of its own (percentiles, windows, further targets, the
breakdown, a user's query; Triton's summary or a histogram, one to three pods joining or leaving, idle pods,
counters at random rates, queues that grow and drain, data that stopped or runs ahead of the read, models of the same
namespaces outside the fleet). All the cases' series are written as OpenMetrics, turned into TSDB blocks by
`promtool tsdb create-blocks-from openmetrics` and served by one Prometheus, so every read is of fixed data. For every
object of a case, one `FleetReader` read of the case's fleet gives exactly the `Signal` its own `PrometheusReader`
gives. The suite draws a sample of the family (`tests/sampling.py`); bench/tuner/properties.py runs all of it.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from devkit.ports import free_port
from tailtune.tuner.fleet import FleetReader
from tailtune.tuner.prom import MAX_GET_QUERY_CHARS, HttpPromClient, PrometheusReader, ReadSpec, Signal, Target
from tests.prometheus.conftest import _wait_ready
from tests.sampling import cases

pytestmark = pytest.mark.prometheus

FULL = 60
SEED = 41
STEP = 5  # seconds between samples, as a scrape interval
# The data span [at - BEFORE, at + AFTER]: the longest window (90 s) plus its tail and Prometheus' lookback to spare.
BEFORE, AFTER = 240, 60
USER_QUERIES = (
    'max(nv_inference_request_summary_us{{namespace="{namespace}",model="{model}",quantile="{quantile}"}}) / 1e6',
    # one series per pod: ambiguous where more than one pod serves
    'nv_inference_request_summary_us{{namespace="{namespace}",model="{model}",quantile="0.99"}} / 1e6',
    # every namespace's pods of the model
    "histogram_quantile(0.99, sum by (le) "
    '(rate(nv_inference_request_duration_us_bucket{{model="{model}"}}[{window}])))',
)
MODEL_NAMES = ("bert", "resnet-50.v2", "gpt_2", "t5", "clip.vit-b")
BUCKETS = ("1000", "5000", "20000", "100000", "+Inf")


@dataclass(frozen=True)
class Case:
    number: int
    specs: tuple[ReadSpec, ...]
    at: datetime


def _series(name: str, labels: dict[str, str], points: list[tuple[int, float]]) -> list[str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{text}}} {v:.9g} {t}" for t, v in points]


def _pod_lines(rng: random.Random, ns: str, model: str, pod: str, at: int, histogram: bool) -> dict[str, list[str]]:
    """One Triton pod's series of one model, by metric name."""
    start = rng.choice((at - BEFORE, at - BEFORE, at - 40))  # some pods joined part way through
    end = rng.choice((at + AFTER, at, at - 1, at - 150))  # runs ahead of the read, stops at it, or stopped long ago
    times = list(range(start - start % STEP, end + 1, STEP))
    rps = rng.choice((0.0, rng.uniform(1, 300), rng.uniform(1, 300)))
    rps2 = rps * rng.choice((1.0, 0.3, 2.5))  # demand changing part way
    batch = rng.uniform(1, 8)
    labels = {"namespace": ns, "model": model, "version": "1", "pod": pod, "instance": f"{pod}:8002"}
    done, n = [], 0.0
    for t in times:
        n += (rps if t < at - 30 else rps2) * STEP
        done.append((t, n))
    out: dict[str, list[str]] = {
        "nv_inference_request_success": _series("nv_inference_request_success", labels, done),
        "nv_inference_count": _series("nv_inference_count", labels, done),
        "nv_inference_exec_count": _series("nv_inference_exec_count", labels, [(t, v / batch) for t, v in done]),
    }
    for metric, us in (
        ("nv_inference_queue_duration_us", rng.uniform(0, 50_000)),
        ("nv_inference_compute_input_duration_us", rng.uniform(0, 500)),
        ("nv_inference_compute_infer_duration_us", rng.uniform(100, 20_000)),
        ("nv_inference_compute_output_duration_us", rng.uniform(0, 500)),
        ("nv_inference_request_duration_us", rng.uniform(20_000, 80_000)),
    ):
        out[metric] = _series(metric, labels, [(t, v * us) for t, v in done])
    pending, queue = 0.0, []
    for t in times:
        pending = max(0.0, pending + rng.choice((-3, 0, 1, 2, 5)))
        queue.append((t, pending))
    out["nv_inference_pending_request_count"] = _series("nv_inference_pending_request_count", labels, queue)
    summary = []
    for q in rng.sample(("0.5", "0.9", "0.99", "0.999"), rng.randint(2, 4)):
        us = {"0.5": 5_000, "0.9": 12_000, "0.99": 30_000, "0.999": 60_000}[q] * rng.uniform(0.5, 2)
        summary += _series("nv_inference_request_summary_us", labels | {"quantile": q}, [(t, us) for t in times])
    out["nv_inference_request_summary_us"] = summary
    if histogram:
        shares = [*sorted(rng.uniform(0, 1) for _ in BUCKETS[:-2]), rng.choice((1.0, 0.97)), 1.0]
        buckets = []
        for le, share in zip(BUCKETS, shares, strict=True):
            buckets += _series(
                "nv_inference_request_duration_us_bucket", labels | {"le": le}, [(t, v * share) for t, v in done]
            )
        out["nv_inference_request_duration_us_bucket"] = buckets
    return out


def _spec(rng: random.Random, ns: str, model: str) -> ReadSpec:
    return ReadSpec(
        Target(ns, f"svc-{model}", model),
        rng.choice((99, 99, 50, 95, 99.9, 97)),
        rng.choice((20, 60, 90)),
        latency_query=rng.choice(USER_QUERIES) if rng.random() < 0.25 else None,
        other_percentiles=tuple(p for p in (50, 90, 99.9) if rng.random() < 0.3),
        breakdown=rng.random() < 0.5,
    )


def generate(number: int, at: int, lines: dict[str, list[str]]) -> Case:
    """Case `number` of the family: its objects' read specs, and its series added to `lines` (by metric name)."""
    rng = random.Random(SEED * 100_003 + number)
    namespaces = (f"c{number}-a", f"c{number}-b")
    objects = [(rng.choice(namespaces), rng.choice(MODEL_NAMES)) for _ in range(rng.randint(1, 7))]
    # Served: the fleet's own models, mostly, and models of its namespaces it does not tune.
    served = {o for o in objects if rng.random() < 0.85} | {
        (ns, m) for ns in namespaces for m in MODEL_NAMES if rng.random() < 0.2
    }
    for ns, model in sorted(served):
        histogram = rng.random() < 0.35
        for k in range(rng.randint(1, 3)):
            pod = f"10.{number % 250}.{MODEL_NAMES.index(model)}.{k}{namespaces.index(ns)}"
            for metric, text in _pod_lines(rng, ns, model, pod, at, histogram).items():
                lines.setdefault(metric, []).extend(text)
    specs = tuple(_spec(rng, ns, model) for ns, model in objects)
    return Case(number, specs, datetime.fromtimestamp(at + rng.uniform(-2, 2), tz=UTC))


@dataclass(frozen=True)
class FleetEnv:
    url: str
    family: tuple[Case, ...]
    wide: Case


def _wide(at: int, lines: dict[str, list[str]]) -> Case:
    """A fleet whose every query is longer than a GET carries (sent as a form POST): 150 long model names."""
    rng = random.Random(SEED)
    specs = tuple(ReadSpec(Target("wide", f"s{i}", f"model-with-a-long-name-{i:04d}"), 99, 60) for i in range(150))
    for spec in specs[::10]:
        for metric, text in _pod_lines(
            rng, "wide", spec.target.model, f"10.255.{spec.target.name[1:]}.1", at, False
        ).items():
            lines.setdefault(metric, []).extend(text)
    return Case(-1, specs, datetime.fromtimestamp(at, tz=UTC))


@pytest.fixture(scope="module")
def fleet_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetEnv]:
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        pytest.fail("prometheus/promtool not found: apt-get install -y --no-install-recommends prometheus")
    tmp = tmp_path_factory.mktemp("fleet-prometheus")
    at = int(time.time()) - 3600  # an hour ago: inside any retention, and no scrape writes there
    lines: dict[str, list[str]] = {}
    family = tuple(generate(i, at, lines) for i in range(cases(FULL)))
    wide = _wide(at, lines)
    source = tmp / "series.om"
    # OpenMetrics: each metric's samples together, series by series in time order.
    source.write_text("".join(line + "\n" for metric in sorted(lines) for line in lines[metric]) + "# EOF\n")
    data = tmp / "data"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True, capture_output=True
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "prometheus.log"
    (tmp / "prometheus.yml").write_text("global: {}\n")
    with log.open("wb") as out:
        argv = [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(url, proc, log)
        yield FleetEnv(url, family, wide)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _per_object_and_fleet(url: str, case: Case) -> tuple[list[Signal], list[Signal | Exception]]:
    client = HttpPromClient(url, timeout_seconds=10)
    alone = [PrometheusReader.for_spec(client, spec).read_signal(case.at) for spec in case.specs]
    return alone, FleetReader(client).read(case.specs, case.at)


def test_the_fleet_reader_gives_every_object_the_per_object_readers_signal(fleet_prom: FleetEnv) -> None:
    kinds: set[str] = set()
    for case in fleet_prom.family:
        alone, together = _per_object_and_fleet(fleet_prom.url, case)
        for spec, one, fleet in zip(case.specs, alone, together, strict=True):
            assert fleet == one, f"case {case.number}, {spec.target.namespace}/{spec.target.model}"
            kinds |= {one.source, "served" if one.observation.request_rate else "idle or absent"}
            kinds |= {"ambiguous"} if one.ambiguous else set()
    # The sample holds what the fleet must split right: each source, traffic and none.
    assert {"tritonSummary", "histogram", "userQuery", "served", "idle or absent"} <= kinds


def test_a_fleet_too_wide_for_a_url_is_read_alike(fleet_prom: FleetEnv) -> None:
    case = fleet_prom.wide
    alone, together = _per_object_and_fleet(fleet_prom.url, case)
    assert together == alone
    served = sum(s.observation.request_rate is not None for s in alone)
    assert 0 < served < len(case.specs)
    assert len("|".join(s.target.model for s in case.specs)) > MAX_GET_QUERY_CHARS  # sent as a form POST
