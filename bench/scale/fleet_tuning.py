"""The tuning loop at fleet size: N InferenceServices on kwok GPU nodes with tuning on, read from a real Prometheus.

    .venv/bin/python bench/scale/fleet_tuning.py --count 100 [--count 300 ...] [--interval 30] [--steady-seconds 300]

For each N: a synthetic exporter (bench/scale/exporter.py, one process, one scrape target with honor_labels) serves
Triton's metric families for every pod at a steady rate and latency within the SLO; a real Prometheus scrapes it
every --scrape-seconds and logs every query it answers (`query_log_file`); the operator (`python -m devkit.operator
--namespace NS --metrics-port P`) tunes every object every --interval seconds against that Prometheus. Measured:

- the time until every object is Ready, and until every object has `status.latency.observedMs` (its first window);
- at steady state (after --settle-intervals more intervals, over --steady-seconds, nothing else polling the API):
  Prometheus queries per minute (its own `prometheus_http_requests_total{handler="/api/v1/query"}`), fleet reads per
  minute and queries per read (the query log: one latency-histogram probe per read), the operator's CPU seconds per
  minute (/proc) and peak RSS (VmHWM), API requests per minute by resource and verb (the API server's
  `apiserver_request_total`), per object per tick (ticks: the operator's `tailtune_tick_lag_seconds_count`), the
  tick lag p99 (that histogram's buckets over the window), and the objects whose resourceVersion moved at rest;
- the deletion of all N: seconds until none is left, and the reconciles the operator ran meanwhile (its
  `tailtune_reconciles_total`: a reconcile of an object being deleted returns before counting, so any is a
  re-processed object) and its log lines naming the resync.

Runs on a private local cluster by default (`devkit.cluster` with its own state dir, brought down at the end when this
run started it): on the shared one, other sessions' cluster-wide operators would reconcile these objects too, and the
API server's counts would hold their tests' requests. `--cluster shared` uses the running one, in its own namespace.
Results merge by N into bench/out/fleet/results.json; report.md (a table) and fleet.png (one panel per figure vs N).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402  (bench_scale chose the Agg backend)
from bench_scale import Samples, gpu_nodes, kubectl, proc_stats, request_counts, samples  # noqa: E402

from devkit.ports import free_ports  # noqa: E402
from devkit.prometheus import start_prometheus  # noqa: E402
from tailtune.operator.handlers import RESYNC_SECONDS  # noqa: E402

OUT = ROOT / "bench" / "out" / "fleet"
NAMESPACE = "fleet-bench"
PRIVATE_CLUSTER_DIR = ROOT / ".cache" / "cluster-fleet"
# kwok's heartbeats (node status, leases) are the same at every N of objects: apart from the operator's requests.
HEARTBEAT_RESOURCES = ("leases", "nodes")
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
# spec.slo.windowSeconds' default, which bench_scale's InferenceService keeps.
SLO_WINDOW_S = 60
# The latency-histogram probe opens every fleet read (tailtune.tuner.fleet.FleetReader._read_group): one per read.
READ_PROBE = "count by (namespace, model) (nv_inference_request_duration_us_bucket"
# Targets of issue 41 at 1,000 objects, drawn on the plot.
TARGETS = {"operator_cores": 0.25, "operator_peak_rss_mib": 500, "tick_lag_p99_s": 5.0, "api_per_object_tick": 2.0}


def cluster_pids() -> dict[str, int]:
    """The local cluster's components (`devkit.cluster`'s pid files in its state dir): name -> pid."""
    pids = Path(os.environ.get("TAILTUNE_CLUSTER_DIR", str(ROOT / ".cache" / "cluster"))) / "pids"
    out = {}
    for f in sorted(pids.glob("*.json")) if pids.is_dir() else ():
        pid = int(json.loads(f.read_text())["pid"])
        if Path(f"/proc/{pid}").exists():
            out[f.stem] = pid
    return out


def component_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each cluster component (which one saturates while a fleet comes up)."""
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = proc_stats(pid)[0]
        except OSError:
            continue
    return out


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", flush=True)


def service(i: int, interval: int, prometheus_url: str) -> dict[str, Any]:
    """bench_scale's InferenceService `svc-<i>` in our namespace, tuned every `interval` s from our Prometheus."""
    doc = bench_scale.isvc(i)
    doc["metadata"]["namespace"] = NAMESPACE
    doc["spec"]["metrics"] = {"prometheusUrl": prometheus_url}
    doc["spec"]["tuning"] = {**doc["spec"].get("tuning", {}), "enabled": True, "intervalSeconds": interval}
    return doc


def nodes(count: int) -> list[dict[str, Any]]:
    """bench_scale's kwok L4 nodes under our own names."""
    out = gpu_nodes(count)
    for i, node in enumerate(out):
        node["metadata"]["name"] = f"fleet-l4-{i}"
        node["metadata"]["labels"]["kubernetes.io/hostname"] = f"fleet-l4-{i}"
    return out


def prometheus_config(exporter_port: int, scrape_seconds: int, query_log: Path) -> str:
    """One static target, the exporter, whose namespace/pod/instance labels Prometheus keeps (honor_labels)."""
    doc = {
        "global": {"scrape_interval": f"{scrape_seconds}s", "query_log_file": str(query_log)},
        "scrape_configs": [
            {
                "job_name": "triton-fleet",
                "honor_labels": True,
                "scrape_interval": f"{scrape_seconds}s",
                "scrape_timeout": f"{scrape_seconds}s",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def scrape(url: str) -> Samples:
    """A /metrics page: sample name -> labels -> value."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return samples(r.read().decode())


def total(page: Samples, name: str, **labels: str) -> float:
    """The sum of a sample's values over the series whose labels include these."""
    return sum(v for k, v in page.get(name, {}).items() if set(labels.items()) <= set(k))


@dataclass
class Snapshot:
    """Every counter the benchmark reads, at one instant."""

    t: float
    api: Counter[tuple[str, str]]
    prom_queries: float
    prom_cpu: float
    op_cpu: float
    op_rss_peak: int
    lag_buckets: dict[float, float]
    lag_count: float
    reconciles: float
    query_log_lines: int


def snapshot(env: dict[str, str], prom_url: str, op_pid: int, op_metrics: str, query_log: Path) -> Snapshot:
    prom = scrape(f"{prom_url}/metrics")
    op = scrape(op_metrics)
    cpu, rss = proc_stats(op_pid)
    buckets = {float(dict(k)["le"]): v for k, v in op.get("tailtune_tick_lag_seconds_bucket", {}).items()}
    lines = query_log.read_text().count("\n") if query_log.exists() else 0
    return Snapshot(
        t=time.monotonic(),
        api=request_counts(env),
        prom_queries=total(prom, "prometheus_http_requests_total", handler="/api/v1/query"),
        prom_cpu=total(prom, "process_cpu_seconds_total"),
        op_cpu=cpu,
        op_rss_peak=rss,
        lag_buckets=buckets,
        lag_count=total(op, "tailtune_tick_lag_seconds_count"),
        reconciles=total(op, "tailtune_reconciles_total"),
        query_log_lines=lines,
    )


def quantile(buckets_a: dict[float, float], buckets_b: dict[float, float], q: float) -> float | None:
    """The q-quantile of the observations between two reads of a cumulative histogram (linear within a bucket, as
    PromQL's histogram_quantile)."""
    edges = sorted(buckets_b)
    counts = [buckets_b[e] - buckets_a.get(e, 0.0) for e in edges]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower_edge, lower_count = 0.0, 0.0
    for edge, count in zip(edges, counts, strict=True):
        if count >= rank:
            if math.isinf(edge):
                return lower_edge
            return lower_edge + (edge - lower_edge) * (rank - lower_count) / max(count - lower_count, 1e-9)
        lower_edge, lower_count = edge, count
    return None


def fleet_state(env: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(name, resourceVersion, Ready, status.latency.observedMs) of every object."""
    path = (
        '{range .items[*]}{.metadata.name}{"\\t"}{.metadata.resourceVersion}{"\\t"}'
        '{.status.conditions[?(@.type=="Ready")].status}{"\\t"}{.status.latency.observedMs}{"\\n"}{end}'
    )
    text = kubectl(env, "get", "tis", "-n", NAMESPACE, "-o", f"jsonpath={path}")
    rows = [([*line.split("\t"), "", "", ""])[:4] for line in text.splitlines() if line.strip()]
    return [(name, rv, ready, ms) for name, rv, ready, ms in rows]


def objects(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every object, by name."""
    items = json.loads(kubectl(env, "get", "tis", "-n", NAMESPACE, "-o", "json"))["items"]
    return {item["metadata"]["name"]: item for item in items}


def _flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(doc, dict):
        return {
            k: v for key, value in doc.items() for k, v in _flatten(value, f"{prefix}.{key}" if prefix else key).items()
        }
    if isinstance(doc, list) and doc and all(isinstance(x, dict) and "type" in x for x in doc):  # conditions
        return {k: v for x in doc for k, v in _flatten(x, f"{prefix}[{x['type']}]").items()}
    return {prefix: doc}


# Fields every write moves: they say that an object was written, not what a user reads.
_BOOKKEEPING = ("metadata.resourceVersion", "metadata.managedFields", "metadata.generation")


def moved_fields(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> tuple[dict[str, int], dict[str, list[Any]]]:
    """Each field that moved between two reads of the fleet, on how many objects; and one object's moves (field:
    [before, after]), for the reader to see what moved."""
    moved: Counter[str] = Counter()
    example: dict[str, list[Any]] = {}
    for name, obj in sorted(after.items()):
        a, b = _flatten(before.get(name, {})), _flatten(obj)
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and not k.startswith(_BOOKKEEPING))
        moved.update(keys)
        if keys and not example:
            example = {"object": [name, name]} | {k: [a.get(k), b.get(k)] for k in keys}
    return dict(moved.most_common()), example


def problems(env: dict[str, str]) -> Counter[str]:
    """How many objects' status.latency names each problem (none: within the SLO, judged)."""
    text = kubectl(
        env, "get", "tis", "-n", NAMESPACE, "-o", 'jsonpath={range .items[*]}{.status.latency.problem}{"\\n"}{end}'
    )
    return Counter(line or "none" for line in text.splitlines())


def read_query_log(path: Path, start_line: int, end_line: int) -> tuple[int, int, float]:
    """(queries, fleet reads, Prometheus' summed eval seconds) in the query log's lines [start, end)."""
    queries = reads = 0
    seconds = 0.0
    with path.open() as f:
        for n, line in enumerate(f):
            if n < start_line:
                continue
            if n >= end_line:
                break
            entry = json.loads(line)
            queries += 1
            reads += entry.get("params", {}).get("query", "").startswith(READ_PROBE)
            seconds += float(entry.get("stats", {}).get("timings", {}).get("evalTotalTime", 0.0))
    return queries, reads, seconds


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# kubectl sends one request per object, one after another: a few at once, as a fleet's CI would apply them.
CREATE_CHUNK, CREATE_AT_ONCE = 50, 4


def create_all(env: dict[str, str], docs: list[dict[str, Any]]) -> None:
    """Create the objects, CREATE_AT_ONCE kubectl processes at a time of CREATE_CHUNK objects each."""
    chunks = [docs[i : i + CREATE_CHUNK] for i in range(0, len(docs), CREATE_CHUNK)]
    argv = ["kubectl", "create", "-f", "-"]
    for start in range(0, len(chunks), CREATE_AT_ONCE):
        running = [
            (
                subprocess.Popen(
                    argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                ),
                c,
            )
            for c in chunks[start : start + CREATE_AT_ONCE]
        ]
        for proc, chunk in running:  # kubectl reads all of stdin before it sends anything
            assert proc.stdin is not None
            proc.stdin.write(yaml.safe_dump_all(chunk).encode())
            proc.stdin.close()
        for proc, _ in running:
            assert proc.stderr is not None
            err = proc.stderr.read().decode()
            if proc.wait() != 0:
                raise RuntimeError(f"kubectl create: {err[-2000:]}")


def operator_argv(tree: Path, metrics_port: int, trace_out: Path | None) -> list[str]:
    """The operator of the source tree `tree` (`python -m devkit.operator`), with tracemalloc when `trace_out`."""
    args = ["--namespace", NAMESPACE, "--metrics-port", str(metrics_port)]
    if trace_out is not None:
        return [sys.executable, str(HERE / "traced_operator.py"), str(trace_out), *args]
    return [sys.executable, "-m", "devkit.operator", *args]


def run_one(
    env: dict[str, str], count: int, args: argparse.Namespace, workdir: Path, tree: Path = ROOT
) -> dict[str, Any]:
    """One N, from nothing to nothing: set up, measure, delete, clean up (also on failure). The operator runs from the
    source tree `tree` (this checkout, or another one for a before/after in the same run)."""
    exporter_port, prom_port, metrics_port = free_ports(3)
    prom_url = f"http://127.0.0.1:{prom_port}"
    op_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    query_log = workdir / "query.log"
    node_docs = nodes((count + 7) // 8 + 1)
    procs: list[subprocess.Popen[bytes]] = []
    prom = None
    result: dict[str, Any] = {"count": count, "interval_s": args.interval, "scrape_s": args.scrape_seconds}
    try:
        kubectl(env, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        kubectl(env, "apply", "-f", "-", input=yaml.safe_dump_all(node_docs))
        kubectl(env, "create", "namespace", NAMESPACE, check=False)
        bench_scale.engine_store(env, NAMESPACE, "fleet-engines")
        exporter_argv = [sys.executable, str(HERE / "exporter.py"), "--port", str(exporter_port),
                         "--namespace", NAMESPACE, "--count", str(count)]  # fmt: skip
        procs.append(
            subprocess.Popen(exporter_argv, stdout=(workdir / "exporter.log").open("wb"), stderr=subprocess.STDOUT)
        )
        wait_http(f"http://127.0.0.1:{exporter_port}/metrics", 30)
        history_from = time.monotonic()  # the exporter's counters start at zero: a rate needs a window of them
        prom = start_prometheus(
            prometheus_config(exporter_port, args.scrape_seconds, query_log), workdir / "prom", prom_port
        )
        op_log = workdir / "operator.log"
        trace_out = workdir / "tracemalloc.txt" if args.trace_memory else None
        if trace_out is not None:
            trace_out.unlink(missing_ok=True)
        op_env = {**env, "PYTHONPATH": str(tree)}
        op = subprocess.Popen(
            operator_argv(tree, metrics_port, trace_out), env=op_env, cwd=tree, stdout=op_log.open("wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        procs.append(op)
        wait_http(op_metrics, 60)
        if trace_out is not None:
            os.kill(op.pid, signal.SIGUSR1)  # the census before any object
        log(f"N={count}: exporter :{exporter_port}, Prometheus :{prom_port}, operator pid {op.pid}")

        components = cluster_pids()
        cpu0, api0, t0 = (
            component_cpu(components) | {"operator": proc_stats(op.pid)[0]},
            request_counts(env),
            time.monotonic(),
        )
        create_all(env, [service(i, args.interval, prom_url) for i in range(count)])
        result["create_s"] = round(time.monotonic() - t0, 1)
        ready_s = status_s = None
        poll = 5 if count <= 300 else 10
        while time.monotonic() - t0 < args.timeout:
            state = fleet_state(env)
            ready = sum(r == "True" for _, _, r, _ in state)
            judged = sum(bool(ms) for _, _, _, ms in state)
            elapsed = time.monotonic() - t0
            if ready_s is None and ready >= count:
                ready_s = elapsed
            if judged >= count:
                status_s = elapsed
                break
            rss_mib = _rss(op.pid) / 2**20
            log(f"N={count}: {elapsed:6.0f} s: {ready}/{count} Ready, {judged}/{count} with status.latency, "
                f"operator RSS {rss_mib:.0f} MiB")  # fmt: skip
            if op.poll() is not None:
                raise RuntimeError(f"the operator exited {op.returncode}: see {op_log}")
            time.sleep(poll)
        cpu1 = component_cpu(components) | {"operator": proc_stats(op.pid)[0]}
        took = time.monotonic() - t0
        api_made = request_counts(env) - api0
        result |= {
            # Which component saturates while the fleet comes up: cores of each over the create-to-status window.
            "cores_until_status": {k: round((cpu1[k] - cpu0.get(k, 0.0)) / took, 3) for k in sorted(cpu1)},
            "api_requests_until_status": {
                f"{r}/{v}": c for (r, v), c in api_made.most_common() if c and _operators(r, v)
            },
            "api_requests_until_status_total": sum(c for (r, v), c in api_made.items() if _operators(r, v)),
            "isvc_patches_until_status": api_made.get(("inferenceservices", "PATCH"), 0),
            **{f"cores_until_status_{k}": round((cpu1[k] - cpu0.get(k, 0.0)) / took, 3) for k in sorted(cpu1)},
            "all_ready_s": ready_s,
            "all_status_latency_s": status_s,
            "operator_peak_rss_mib_at_all_status": round(proc_stats(op.pid)[1] / 2**20, 1),
        }
        if trace_out is not None:
            os.kill(op.pid, signal.SIGUSR1)
        log(f"N={count}: all Ready after {ready_s} s, all with status.latency after {status_s} s")

        settle = args.settle_intervals * args.interval
        log(f"N={count}: settling {settle} s (the first windows' checkpoints), then {args.steady_seconds} s at rest")
        # Rates over the SLO window come out low until Prometheus holds a whole window of the exporter's samples.
        time.sleep(max(settle, history_from + SLO_WINDOW_S + 2 * args.scrape_seconds - time.monotonic()))
        before = objects(env)
        a = snapshot(env, prom_url, op.pid, op_metrics, query_log)
        spy = None
        if args.py_spy:  # where the operator's time goes at rest: collapsed stacks over the steady window
            spy = subprocess.Popen(
                [args.py_spy, "record", "--pid", str(op.pid), "--duration", str(args.steady_seconds - 5),
                 "--rate", "20", "--gil", "--format", "raw", "--output", str(workdir / "py-spy.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            )  # fmt: skip
        time.sleep(args.steady_seconds)
        b = snapshot(env, prom_url, op.pid, op_metrics, query_log)
        if spy is not None:
            spy.wait(timeout=60)
        if trace_out is not None:
            os.kill(op.pid, signal.SIGUSR1)
        after = objects(env)
        result |= steady_figures(a, b, count, args.interval, query_log)
        rv = {n: o["metadata"]["resourceVersion"] for n, o in before.items()}
        result["objects_written_at_rest"] = sum(rv.get(n) != o["metadata"]["resourceVersion"] for n, o in after.items())
        result["fields_moved_at_rest"], result["one_object_moved_at_rest"] = moved_fields(before, after)
        result["latency_problems"] = dict(problems(env))
        result["load_average_1m"] = os.getloadavg()[0]
        result["operator_rss_mib_now"] = round(_rss(op.pid) / 2**20, 1)

        log(f"N={count}: deleting all {count}")
        log_offset = op_log.stat().st_size
        d0 = snapshot(env, prom_url, op.pid, op_metrics, query_log)
        kubectl(env, "delete", "tis", "--all", "-n", NAMESPACE, "--wait=false")
        marked, marked_at = scrape(op_metrics), time.monotonic()  # every object has its deletionTimestamp from here
        deleted_s = None
        while time.monotonic() - d0.t < args.timeout:
            left = len(fleet_state(env))
            if left == 0:
                deleted_s = time.monotonic() - d0.t
                break
            time.sleep(2)
        d1 = snapshot(env, prom_url, op.pid, op_metrics, query_log)
        with op_log.open("rb") as f:
            f.seek(log_offset)
            deletion_log = f.read().decode(errors="replace")
        result |= {
            "delete_all_s": None if deleted_s is None else round(deleted_s, 1),
            "reconciles_during_deletion": d1.reconciles - d0.reconciles,
            "reconciles_after_all_marked": d1.reconciles - total(marked, "tailtune_reconciles_total"),
            "delete_command_s": round(marked_at - d0.t, 1),
            "resync_log_lines_during_deletion": sum("resync" in line for line in deletion_log.splitlines()),
            # kopf's own warning when a daemon outlives the object's deletion and has to be cancelled
            "daemons_cancelled_during_deletion": sum("is cancelled" in line for line in deletion_log.splitlines()),
            "api_requests_during_deletion": {f"{r}/{v}": c for (r, v), c in sorted((d1.api - d0.api).items()) if c},
            "operator_peak_rss_mib": round(d1.op_rss_peak / 2**20, 1),
        }
    finally:
        kubectl(env, "delete", "namespace", NAMESPACE, "--timeout=600s", check=False)
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if prom is not None:
            prom.stop()
        kubectl(env, "delete", "pv", "fleet-engines", "--ignore-not-found", check=False)
        kubectl(env, "delete", "node", *(n["metadata"]["name"] for n in node_docs), "--ignore-not-found", check=False)
    return result


def _rss(pid: int) -> int:
    return next(int(x.split()[1]) * 1024 for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith("VmRSS"))  # fmt: skip


def _operators(resource: str, verb: str) -> bool:
    """Whether a request is counted as the operator's at rest: not kwok's heartbeats, not an informer's watch coming
    back (every controller's, now and then), not a non-resource URL (health probes, discovery)."""
    return resource not in HEARTBEAT_RESOURCES and verb != "WATCH" and resource != ""


def steady_figures(a: Snapshot, b: Snapshot, count: int, interval: int, query_log: Path) -> dict[str, Any]:
    """Per minute, per object per tick, and the tick lag, between two snapshots at rest."""
    minutes = (b.t - a.t) / 60
    api = b.api - a.api
    operator_api = Counter({k: v for k, v in api.items() if _operators(*k)})
    ticks = b.lag_count - a.lag_count
    queries, reads, eval_s = read_query_log(query_log, a.query_log_lines, b.query_log_lines)
    writes = sum(v for (_, verb), v in operator_api.items() if verb in WRITE_VERBS)
    return {
        "steady_seconds": round(b.t - a.t, 1),
        "ticks": ticks,
        "ticks_per_object_per_interval": round(ticks / count / (minutes * 60 / interval), 2),
        "prometheus_queries_per_min": round((b.prom_queries - a.prom_queries) / minutes, 1),
        "fleet_reads_per_min": round(reads / minutes, 1),
        "queries_per_fleet_read": round(queries / reads, 1) if reads else None,
        "prometheus_query_eval_s_per_min": round(eval_s / minutes, 2),
        "prometheus_cpu_s_per_min": round((b.prom_cpu - a.prom_cpu) / minutes, 2),
        "operator_cpu_s_per_min": round((b.op_cpu - a.op_cpu) / minutes, 2),
        "operator_cores": round((b.op_cpu - a.op_cpu) / (b.t - a.t), 3),
        "tick_lag_p50_s": _round(quantile(a.lag_buckets, b.lag_buckets, 0.5)),
        "tick_lag_p99_s": _round(quantile(a.lag_buckets, b.lag_buckets, 0.99)),
        "api_requests_per_min_all_clients": round(sum(api.values()) / minutes, 1),
        "api_requests_per_min": round(sum(operator_api.values()) / minutes, 1),
        "api_writes_per_min": round(writes / minutes, 1),
        "inferenceservice_writes_per_min": round(
            sum(v for (r, verb), v in api.items() if r == "inferenceservices" and verb in WRITE_VERBS) / minutes, 1
        ),
        "api_per_object_tick": round(sum(operator_api.values()) / ticks, 2) if ticks else None,
        "api_writes_per_object_tick": round(writes / ticks, 3) if ticks else None,
        "api_per_min_by_resource_verb": {f"{r}/{v}": round(c / minutes, 1) for (r, v), c in sorted(api.items()) if c},
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


ROWS = (
    ("kubectl create of all, s", "create_s"),
    ("all Ready, s (from the create)", "all_ready_s"),
    ("all with status.latency, s", "all_status_latency_s"),
    ("cores until all had a status: operator", "cores_until_status_operator"),
    ("... kube-apiserver", "cores_until_status_kube-apiserver"),
    ("... etcd", "cores_until_status_etcd"),
    ("... kube-controller-manager", "cores_until_status_kube-controller-manager"),
    ("... kwok", "cores_until_status_kwok"),
    ("API requests until all had a status (all clients but heartbeats, watches)", "api_requests_until_status_total"),
    ("InferenceService PATCHes until all had a status", "isvc_patches_until_status"),
    ("Prometheus queries/min", "prometheus_queries_per_min"),
    ("fleet reads/min", "fleet_reads_per_min"),
    ("queries per fleet read", "queries_per_fleet_read"),
    ("operator CPU s/min", "operator_cpu_s_per_min"),
    ("operator cores", "operator_cores"),
    ("operator peak RSS, MiB", "operator_peak_rss_mib"),
    ("operator peak RSS when all had a status, MiB", "operator_peak_rss_mib_at_all_status"),
    ("operator RSS at rest, MiB", "operator_rss_mib_now"),
    ("API requests/min (no heartbeats, watches)", "api_requests_per_min"),
    ("API writes/min (children's applies at the resync included)", "api_writes_per_min"),
    ("InferenceService writes/min (status, annotations)", "inferenceservice_writes_per_min"),
    ("API requests per object per tick", "api_per_object_tick"),
    ("API writes per object per tick", "api_writes_per_object_tick"),
    ("objects written at rest", "objects_written_at_rest"),
    ("tick lag p50, s", "tick_lag_p50_s"),
    ("tick lag p99, s", "tick_lag_p99_s"),
    ("ticks per object per interval", "ticks_per_object_per_interval"),
    ("delete all, s", "delete_all_s"),
    ("reconciles during deletion", "reconciles_during_deletion"),
    ("reconciles after every object was marked deleted", "reconciles_after_all_marked"),
    ("tuner daemons cancelled during deletion", "daemons_cancelled_during_deletion"),
    ("load average (1 min, 2 cores)", "load_average_1m"),
    ("checkout", "checkout"),
)


def table(runs: dict[str, dict[str, Any]]) -> str:
    ns = sorted(runs, key=int)
    lines = ["| figure | " + " | ".join(f"N = {n}" for n in ns) + " |", "| --- |" + " --- |" * len(ns)]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(runs[n].get(key)) for n in ns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


PANELS = (
    ("Prometheus queries/min", "prometheus_queries_per_min", None),
    ("queries per fleet read", "queries_per_fleet_read", None),
    ("operator cores", "operator_cores", "operator_cores"),
    ("operator peak RSS, MiB", "operator_peak_rss_mib", "operator_peak_rss_mib"),
    ("API writes/min", "api_writes_per_min", None),
    ("API requests per object per tick", "api_per_object_tick", "api_per_object_tick"),
    ("tick lag p99, s", "tick_lag_p99_s", "tick_lag_p99_s"),
    ("until all have status, s", "all_status_latency_s", None),
)


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    ns = sorted(runs, key=int)
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, (title, key, target) in zip(axes.flat, PANELS, strict=True):
        points = [(int(n), runs[n][key]) for n in ns if runs[n].get(key) is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o")
        if target is not None:
            ax.axhline(TARGETS[target], color="tab:red", linestyle="--", label="issue 41 target at 1,000")
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("InferenceServices (N)")
        ax.set_xscale("log")
        ax.set_xticks([int(n) for n in ns], [n for n in ns])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
    fig.suptitle("tailtune's tuning loop at fleet size (kwok GPU nodes, real Prometheus, synthetic Triton metrics)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _describe(tree: Path) -> str:
    out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip()


def before_after(baselines: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]]) -> str:
    """Per N run both ways: the baseline tree's figure, this tree's, and after / before."""
    lines = ["| N | figure | before | after | after / before |", "| --- | --- | --- | --- | --- |"]
    for n in sorted(set(baselines) & set(runs), key=int):
        for label, key in ROWS:
            old, new = baselines[n].get(key), runs[n].get(key)
            ratio = new / old if isinstance(old, int | float) and isinstance(new, int | float) and old else None
            lines.append(f"| {n} | {label} | {_cell(old)} | {_cell(new)} | {_cell(_round(ratio))} |")
    return "\n".join(lines)


def private_cluster_env() -> tuple[dict[str, str], bool]:
    """A cluster of our own (its own state dir and ports); whether this run started it."""
    os.environ["TAILTUNE_CLUSTER_DIR"] = str(PRIVATE_CLUSTER_DIR)
    status = subprocess.run([sys.executable, "-m", "devkit.cluster", "status"], cwd=ROOT, capture_output=True)
    return bench_scale.cluster_env(), status.returncode != 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, action="append", help="InferenceServices (repeatable); default 100")
    parser.add_argument("--interval", type=int, default=30, help="spec.tuning.intervalSeconds")
    parser.add_argument("--scrape-seconds", type=int, default=10)
    parser.add_argument("--settle-intervals", type=int, default=4, help="intervals after all have a status")
    # One resync period: every object's forced re-apply (server-side applies of its children) falls in it once.
    parser.add_argument("--steady-seconds", type=int, default=int(RESYNC_SECONDS))
    parser.add_argument("--timeout", type=int, default=1200, help="seconds for all to have a status, or to go")
    parser.add_argument("--cluster", choices=["private", "shared"], default="private")
    parser.add_argument("--keep-cluster", action="store_true", help="leave a private cluster this run started up")
    parser.add_argument("--plot-only", action="store_true", help="only write report.md and fleet.png from results.json")
    parser.add_argument(
        "--baseline-tree", type=Path,
        help="another checkout (e.g. `git worktree add /tmp/base <commit>`): each N runs its operator first, then this "
        "tree's, on the same cluster; both go in before_after.md and baseline.json",
    )  # fmt: skip
    parser.add_argument("--trace-memory", action="store_true", help="the operator under tracemalloc (slower)")
    parser.add_argument("--py-spy", help="py-spy binary: sample the operator's stacks over the steady window")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results_path = OUT / "results.json"
    runs: dict[str, dict[str, Any]] = json.loads(results_path.read_text()) if results_path.exists() else {}
    baseline_path = OUT / "baseline.json"
    baselines: dict[str, dict[str, Any]] = json.loads(baseline_path.read_text()) if baseline_path.exists() else {}
    if args.plot_only:
        args.count = []
    if args.plot_only:
        env, started = dict(os.environ), False
    elif args.cluster == "private":
        env, started = private_cluster_env()
    else:
        env, started = bench_scale.cluster_env(), False
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    code = 0
    try:
        for count in [100] if args.count is None else args.count:
            workdir = OUT / f"n{count}"
            workdir.mkdir(parents=True, exist_ok=True)
            for stale in ("query.log",):
                (workdir / stale).unlink(missing_ok=True)
            if args.baseline_tree is not None:
                base_dir = OUT / f"n{count}-baseline"
                base_dir.mkdir(parents=True, exist_ok=True)
                (base_dir / "query.log").unlink(missing_ok=True)
                base = run_one(env, count, args, base_dir, args.baseline_tree.resolve())
                base |= {"checkout": _describe(args.baseline_tree), "cluster": args.cluster, "when": _now()}
                baselines[str(count)] = base
                baseline_path.write_text(json.dumps(baselines, indent=2))
                log(json.dumps(base, indent=2))
            result = run_one(env, count, args, workdir)
            result |= {"checkout": commit.stdout.strip(), "cluster": args.cluster, "when": _now()}
            runs[str(count)] = result
            results_path.write_text(json.dumps(runs, indent=2))
            log(json.dumps(result, indent=2))
            if result.get("all_status_latency_s") is None:
                code = 1
    finally:
        if started and not args.keep_cluster:
            subprocess.run([sys.executable, "-m", "devkit.cluster", "down"], cwd=ROOT, env=env, check=False)
    report = table(runs)
    (OUT / "report.md").write_text(report + "\n")
    if baselines:
        compared = before_after(baselines, runs)
        (OUT / "before_after.md").write_text(compared + "\n")
        report += "\n\n" + compared
    plot(runs, OUT / "fleet.png")
    print(report)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
