"""The tuner on a real server (issue 12, item 7): a local tritonserver, a real Prometheus, perf_analyzer load.

One tritonserver (EXPLICIT model control, the nvidia-pytriton wheel) serves the EMULATED accelerator
(`devkit/triton/models/emulated_gpu`: t(b) = base + per_item * b^exponent on one shared device, CPU idle
while it "computes"); a real Prometheus scrapes its metrics endpoint every `--scrape-s` seconds, with the
label `namespace` the tuner's queries select on. Then:

1. the live service-time curve: fixed-size batches (one request of b items at a time) on a quiet server,
   Triton's `batch_stats` deltas per size (`tailtune.triton.stats.BatchStatsReader`), written as
   `curve.csv` (`batch,ms`) in `--out` (the simulator benchmark's measured family,
   `bench/tuner/curves/tritonserver-emulated.csv`, changes only when asked with `--curve-out`: its scenarios and
   their stored baselines are drawn from it);
2. the load, unless `--rate` gives it: Triton's default (64) on a ladder of loads (fractions of the measured
   curve's best capacity, lowest first) until it breaks the SLO, the load where the sweep's best config should
   hold it and the default does not (the default's collapse on a superlinear curve is metastable: a fixed
   load falls either side of it from one run to the next); then ground truth: a perf_analyzer sweep of static
   configs (max batch 1..64, delay 0), each reloaded with `tailtune.triton.control.apply_config`, at that
   Poisson rate over gRPC; client P99 and throughput from perf_analyzer's per-request export;
3. the tuner (`tailtune.tuner.loop.tune_once`: `PrometheusReader` on the real Prometheus, `batch_stats`
   from the server's gRPC statistics, an applier that hot-reloads the batching, a recorder) from Triton's
   default (max batch 64) and from max batch 1, each under the same load; per window: client P99,
   throughput, the config in force and the decision.

Writes `<out>/report.md`, `<out>/tuner_real.png`, `<out>/raw.json` and prints the tables. Exits non-zero
with a message when a component (tritonserver, Prometheus, perf_analyzer) fails to start.

Usage: python bench/triton/tuner_real.py [--rate R] [--slo-ms 30] [--exponent 1.6] [--sweep-s 25]
                                         [--run-s 240] [--interval-s 15] [--out bench/out/triton-tuner]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devkit.ports import free_port  # noqa: E402
from devkit.prometheus import PrometheusError, scalar, start_prometheus  # noqa: E402
from devkit.triton.local import LocalTriton, TritonNotFound, TritonStartError, start_tritonserver  # noqa: E402
from devkit.triton.perf import (  # noqa: E402
    PerfAnalyzer,
    PerfAnalyzerUnavailable,
    RequestRecord,
    ensure_perf_analyzer,
    read_profile_export,
)
from devkit.triton.repository import local_model_input, write_model_repository  # noqa: E402
from tailtune.api.v1alpha1 import Batching  # noqa: E402
from tailtune.triton import control  # noqa: E402
from tailtune.triton.config import ModelConfigInput, render_json  # noqa: E402
from tailtune.triton.stats import BatchStatsReader  # noqa: E402
from tailtune.tuner.loop import tune_once  # noqa: E402
from tailtune.tuner.prom import PrometheusReader, Target  # noqa: E402
from tailtune.tuner.servicetime import BatchSample, CurvePoint  # noqa: E402
from tailtune.tuner.types import Decision, InForce, Observation, Policy, TunerState  # noqa: E402

MODEL = "emulated_gpu"
NAMESPACE = "bench"
SWEEP_SIZES = (1, 2, 4, 8, 16, 32, 64)
CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64)
DIM = 16


class ComponentFailed(RuntimeError):
    """A component did not start; the message says which and why."""


# ------------------------------------------------------------------------------------------ components


@dataclass
class Bench:
    server: LocalTriton
    inp: ModelConfigInput
    prom_url: str
    pa: PerfAnalyzer
    work: Path

    def apply(self, batching: Batching) -> float:
        """Hot-apply a batching config (the whole config re-sent, as the operator does); seconds taken."""
        cfg = render_json(self.inp.model_copy(update={"batching": batching}))
        return control.apply_config(self.server.grpc_url, MODEL, cfg).seconds


def prometheus_config(target: str, scrape_s: int) -> str:
    import yaml

    doc = {
        "global": {"scrape_interval": f"{scrape_s}s", "evaluation_interval": f"{scrape_s}s"},
        "scrape_configs": [
            {
                "job_name": "tritonserver",
                "scrape_interval": f"{scrape_s}s",
                "scrape_timeout": f"{scrape_s}s",
                "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE, "pod": "local"}}],
            }
        ],
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


# ------------------------------------------------------------------------------------------ load


@dataclass
class LoadRun:
    records: list[RequestRecord]
    rc: int
    output: str
    start_ns: int
    end_ns: int


class PerfLoad:
    """perf_analyzer sending open-loop Poisson load over gRPC until `stop()` (SIGINT, then it drains).

    Short measurement windows with an unreachable stability threshold keep it running; every request's
    send and response time comes from its profile export.
    """

    def __init__(self, bench: Bench, rate: float, export: Path, max_s: float) -> None:
        self.export = export
        if export.exists():
            export.unlink()
        args = [
            "-m", MODEL, "-u", bench.server.grpc_url, "-i", "grpc", "-a",
            "--request-rate-range", f"{rate:g}", "--request-distribution", "poisson",
            "--measurement-interval", "2000", "--max-trials", str(int(max_s / 2) + 30), "-s", "0.001",
            "--percentile", "99", "--input-data", "zero", "--profile-export-file", str(export),
        ]  # fmt: skip
        self.start_ns = time.time_ns()
        self.proc = subprocess.Popen(
            [str(bench.pa.binary), *args], env=bench.pa.env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self._out: list[str] = []
        self._reader = threading.Thread(target=lambda: self._out.extend(self.proc.stdout or []), daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> LoadRun:
        end = time.time_ns()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._reader.join(timeout=10)
        records = read_profile_export(self.export) if self.export.exists() else []
        return LoadRun(records, rc, "".join(self._out), self.start_ns, end)


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if len(values) else float("nan")


def window_stats(records: list[RequestRecord], a_ns: int, b_ns: int) -> dict[str, float]:
    """Client P99 of the requests sent in [a, b); throughput: responses received in [a, b) per second."""
    sent = [r for r in records if a_ns <= r.sent_ns < b_ns]
    lat = [r.latency_ms for r in sent if r.latency_ms is not None]
    got = sum(1 for r in records if r.response_ns is not None and a_ns <= r.response_ns < b_ns)
    span = (b_ns - a_ns) / 1e9
    return {
        "sent": len(sent),
        "answered": len(lat),
        "p99_ms": p99(lat),
        "p50_ms": float(np.percentile(lat, 50)) if lat else float("nan"),
        "throughput_rps": got / span if span > 0 else float("nan"),
        "offered_rps": len(sent) / span if span > 0 else float("nan"),
    }


# ------------------------------------------------------------------------------------------ 1. curve


def measure_curve(bench: Bench, per_size: int) -> list[tuple[int, float, int]]:
    """(batch, mean ms, executions) per size from batch_stats deltas after fixed-size batches, quiet server."""
    import tritonclient.grpc as grpcclient

    bench.apply(Batching(max_batch_size=max(CURVE_SIZES)))
    reader = BatchStatsReader(MODEL)
    addr = bench.server.grpc_url
    client = grpcclient.InferenceServerClient(addr)
    out: list[tuple[int, float, int]] = []
    try:
        for b in CURVE_SIZES:
            x = np.zeros((b, DIM), dtype=np.float32)
            inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            for _ in range(2):  # the first execution of a size is slow: outside the deltas
                client.infer(MODEL, [inp])
            reader.read([addr])  # baseline
            for _ in range(per_size):
                client.infer(MODEL, [inp])
            deltas = {size: (n, ms) for size, n, ms in reader.read([addr])}
            if b not in deltas:
                raise RuntimeError(f"batch_stats show no execution of size {b}: {deltas}")
            n, ms = deltas[b]
            out.append((b, ms, n))
            print(f"  batch {b:3d}: {ms:7.2f} ms over {n} executions", flush=True)
    finally:
        client.close()
    return out


# ------------------------------------------------------------------------------------------ 2. load, sweep

# The load is chosen from the measured curve: fractions of the best capacity (max over b of b / t(b)), lowest
# first, until Triton's default breaks the SLO there (item 7 asks for a load where it does not hold).
PROBE_FRACTIONS = (0.66, 0.72, 0.78, 0.84, 0.90)


def probe_rate(
    bench: Bench, curve: list[tuple[int, float, int]], slo_ms: float, seconds: float, settle_s: float
) -> tuple[float, list[dict[str, Any]]]:
    """The lowest load of the ladder at which Triton's default (max batch 64) breaks the SLO, and the probes."""
    peak = max(1000.0 * b / ms for b, ms, _ in curve)
    probes: list[dict[str, Any]] = []
    for frac in PROBE_FRACTIONS:
        rate = float(round(peak * frac / 10) * 10)
        bench.apply(Batching(max_batch_size=64))
        load = PerfLoad(bench, rate, bench.work / f"probe-{rate:g}.json", seconds)
        time.sleep(seconds)
        run = load.stop()
        first = run.records[0].sent_ns if run.records else run.start_ns
        row = {"rate": rate, "fraction": frac, **window_stats(run.records, first + int(settle_s * 1e9), run.end_ns)}
        probes.append(row)
        print(f"  {rate:g} req/s ({frac:.2f} of {peak:.0f}): Triton's default P99 {row['p99_ms']:.1f} ms", flush=True)
        drain(bench)
        if not row["p99_ms"] <= slo_ms:  # NaN (nothing answered) breaks it too
            return rate, probes
    return probes[-1]["rate"], probes


def sweep(bench: Bench, rate: float, seconds: float, settle_s: float) -> list[dict[str, Any]]:
    rows = []
    for mb in SWEEP_SIZES:
        apply_s = bench.apply(Batching(max_batch_size=mb))
        load = PerfLoad(bench, rate, bench.work / f"sweep-{mb}.json", seconds)
        time.sleep(seconds)
        run = load.stop()
        if not run.records:
            raise RuntimeError(
                f"perf_analyzer exported nothing for max batch {mb} (rc {run.rc}):\n{run.output[-2000:]}"
            )
        first = run.records[0].sent_ns
        a, b = first + int(settle_s * 1e9), run.end_ns
        row = {"max_batch": mb, "apply_s": apply_s, "rc": run.rc, **window_stats(run.records, a, b)}
        row["unanswered"] = sum(1 for r in run.records if r.response_ns is None)
        rows.append(row)
        print(
            f"  max batch {mb:3d}: P99 {row['p99_ms']:9.1f} ms  P50 {row['p50_ms']:7.1f} ms  "
            f"throughput {row['throughput_rps']:6.1f} req/s (offered {row['offered_rps']:.1f})",
            flush=True,
        )
        drain(bench)
    return rows


def drain(bench: Bench, timeout_s: float = 120.0) -> None:
    """Wait until the server has no pending request (after an overloaded run perf_analyzer left a backlog)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _metrics_text(bench.server)
        pending = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_pending_request_count") and f'model="{MODEL}"' in line
        ]
        if not pending or sum(pending) == 0:
            return
        time.sleep(0.5)


def _metrics_text(server: LocalTriton) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(server.metrics_url, timeout=3) as r:
            return str(r.read().decode())
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------ 3. tuner


class Applier:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.applies: list[dict[str, Any]] = []

    def apply(self, batching: Batching, replicas: int) -> None:
        t0 = time.time_ns()
        seconds = self.bench.apply(batching)
        self.applies.append({"start_ns": t0, "seconds": seconds, "batching": batching.model_dump()})


class Recorder:
    def __init__(self, label: str, t0_ns: int) -> None:
        self.label = label
        self.t0_ns = t0_ns
        self.decisions: list[dict[str, Any]] = []

    def record(self, decision: Decision, observation: Observation) -> None:
        t = (time.time_ns() - self.t0_ns) / 1e9
        b = decision.batching
        row = {
            "t_s": round(t, 1),
            "action": decision.action,
            "code": decision.reason_code,
            "reason": decision.reason,
            "max_batch": b.max_batch_size,
            "delay_us": b.max_queue_delay_microseconds,
            "preferred": list(b.preferred_batch_sizes),
            "prom_p99_ms": observation.p_latency_ms,
            "prom_rate_rps": observation.request_rate,
            "avg_batch": observation.avg_batch,
            "queue_growth_rps": observation.queue_growth_rps,
            "batch_stats": [s.model_dump() for s in observation.batch_stats],
            "demand_rps": decision.demand_rps,
            "capacity_rps": decision.capacity_rps,
        }
        self.decisions.append(row)
        p = "-" if observation.p_latency_ms is None else f"{observation.p_latency_ms:.1f}"
        print(
            f"  [{self.label} t={t:5.0f}s] prom P99 {p} ms, {decision.action} {decision.reason_code}: "
            f"{decision.reason}",
            flush=True,
        )


class LiveReader:
    """The operator's reader (PrometheusReader) plus the observation's batch_stats from Triton over gRPC."""

    def __init__(self, prom: PrometheusReader, stats: BatchStatsReader, grpc_url: str) -> None:
        self.prom, self.stats, self.grpc_url = prom, stats, grpc_url

    def read(self, window_end: datetime) -> Observation:
        try:
            obs = self.prom.read(window_end)
        except Exception as exc:  # the operator holds on a missing signal; so does this loop
            print(f"  Prometheus read failed: {exc}", flush=True)
            obs = Observation(window_end=window_end, span_seconds=60.0)
        try:
            deltas = self.stats.read([self.grpc_url])
        except Exception as exc:
            print(f"  batch statistics unavailable: {exc}", flush=True)
            deltas = ()
        samples = tuple(BatchSample(batch=b, count=n, ms=ms) for b, n, ms in deltas if n > 0 and ms > 0)
        return obs.model_copy(update={"batch_stats": samples, "ready_replicas": 1})


def tuner_run(
    bench: Bench, label: str, start_mb: int, policy: Policy, rate: float, seconds: float, window_s: float
) -> dict[str, Any]:
    bench.apply(Batching(max_batch_size=start_mb))
    applied_at = datetime.now(UTC)
    prom = PrometheusReader.connect(
        bench.prom_url, Target(namespace=NAMESPACE, name=MODEL, model=MODEL), policy.percentile, window_s
    )
    reader = LiveReader(prom, BatchStatsReader(MODEL), bench.server.grpc_url)
    applier = Applier(bench)
    load = PerfLoad(bench, rate, bench.work / f"tuner-{label}.json", seconds)
    recorder = Recorder(label, load.start_ns)
    state = TunerState()
    # The starting config was (re)loaded just now: the law must not judge windows from before it.
    in_force = InForce(batching=Batching(max_batch_size=start_mb), replicas=1, changed_at=applied_at)
    timeline: list[dict[str, Any]] = []
    tick = 0
    errors: list[str] = []
    while True:
        tick += 1
        due = load.start_ns + int(tick * policy.interval_seconds * 1e9)
        if (due - load.start_ns) / 1e9 > seconds:
            break
        time.sleep(max(0.0, (due - time.time_ns()) / 1e9))
        if not load.alive():
            errors.append("perf_analyzer exited early")
            break
        before = in_force.batching
        try:
            state, in_force, _ = tune_once(reader, applier, recorder, state, in_force, policy, datetime.now(UTC))
        except Exception as exc:  # apply failed: keep the old state and config, as the loop's contract says
            errors.append(f"tick {tick}: {type(exc).__name__}: {exc}")
            print(f"  [{label}] tick failed: {exc}", flush=True)
        timeline.append({"tick": tick, "t_ns": due, "in_force_before": before.model_dump()})
    run = load.stop()
    drain(bench)
    windows = []
    for i, w in enumerate(timeline):
        a = load.start_ns + int(i * policy.interval_seconds * 1e9)
        b = w["t_ns"]
        st = window_stats(run.records, a, b)
        dec = recorder.decisions[i] if i < len(recorder.decisions) else {}
        windows.append(
            {
                "window": i + 1,
                "t0_s": (a - load.start_ns) / 1e9,
                "t1_s": (b - load.start_ns) / 1e9,
                "max_batch": w["in_force_before"]["max_batch_size"],
                "delay_us": w["in_force_before"]["max_queue_delay_microseconds"],
                **st,
                "decision": dec.get("code"),
                "action": dec.get("action"),
                "new_max_batch": dec.get("max_batch"),
                "prom_p99_ms": dec.get("prom_p99_ms"),
            }
        )
    return {
        "label": label,
        "start_max_batch": start_mb,
        "rc": run.rc,
        "windows": windows,
        "decisions": recorder.decisions,
        "applies": applier.applies,
        "errors": errors,
        "requests": len(run.records),
        "unanswered": sum(1 for r in run.records if r.response_ns is None),
        "overall": window_stats(run.records, load.start_ns, run.end_ns),
    }


# ------------------------------------------------------------------------------------------ report


def fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def report(args: argparse.Namespace, curve: list[tuple[int, float, int]], probes: list[dict[str, Any]],
           rows: list[dict[str, Any]],
           best: dict[str, Any] | None, runs: list[dict[str, Any]], load_avg: tuple[float, ...]) -> str:  # fmt: skip
    default = next(r for r in rows if r["max_batch"] == 64)
    lines = [
        "# tailtune's tuner on a real tritonserver (issue 12, item 7)",
        "",
        f"Model `{MODEL}`: EMULATED accelerator, t(b) = {args.base_ms:g} ms + {args.per_item_ms:g} ms·b^"
        f"{args.exponent:g}"
        " on one shared device (CPU idle while it computes), Python backend, tritonserver 2.51 (nvidia-pytriton),",
        "EXPLICIT model control, one KIND_CPU instance. Load: perf_analyzer 2.41.1 over gRPC, async,",
        f"Poisson {args.rate:g} req/s. SLO: P{args.percentile:g} {args.slo_ms:g} ms. "
        f"Prometheus scrapes every {args.scrape_s} s.",
        f"Host: {os.cpu_count()} cores shared with other work; load average at the end "
        f"{load_avg[0]:.1f} / {load_avg[1]:.1f} / {load_avg[2]:.1f}.",
        "",
        "## Live service-time curve (batch_stats deltas, fixed-size batches on a quiet server)",
        "",
        "| batch | ms | executions | model's nominal ms | capacity (req/s) |",
        "|---|---|---|---|---|",
    ]
    for b, ms, n in curve:
        nominal = args.base_ms + args.per_item_ms * b**args.exponent
        lines.append(f"| {b} | {ms:.2f} | {n} | {nominal:.2f} | {1000 * b / ms:.0f} |")
    if probes:
        lines += [
            "",
            "## The load: Triton's default on a ladder (lowest load where it breaks the SLO is used)",
            "",
            "| load (req/s) | fraction of the curve's best capacity | default's client P99 (ms) | throughput (req/s) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {p['rate']:g} | {p['fraction']:.2f} | {fmt(p['p99_ms'])} | {fmt(p['throughput_rps'])} |" for p in probes
        ]
    lines += [
        "",
        f"## Ground truth: static configs at {args.rate:g} req/s "
        f"(delay 0, {args.sweep_s:g} s each, first {args.settle_s:g} s left out)",
        "",
        "| max batch | client P99 (ms) | P50 (ms) | throughput (req/s) | offered (req/s) | holds SLO |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if r["p99_ms"] <= args.slo_ms else "no"
        mark = " (Triton's default)" if r["max_batch"] == 64 else ""
        mark += " **best**" if best is not None and r["max_batch"] == best["max_batch"] else ""
        lines.append(
            f"| {r['max_batch']}{mark} | {fmt(r['p99_ms'])} | {fmt(r['p50_ms'])} | {fmt(r['throughput_rps'])} | "
            f"{fmt(r['offered_rps'])} | {ok} |"
        )
    holds = best is not None and best["p99_ms"] <= args.slo_ms
    lines += [
        "",
        f"Best static config: max batch {best['max_batch'] if best else '-'} "
        f"(P99 {fmt(best['p99_ms'] if best else None)} ms);"
        f" Triton's default (64): P99 {fmt(default['p99_ms'])} ms at {fmt(default['throughput_rps'])} req/s."
        + ("" if holds and default["p99_ms"] > args.slo_ms else " **The load does not separate them as intended.**"),
    ]
    for run in runs:
        settle = args.settle_windows
        after = [w for w in run["windows"] if w["window"] > settle]
        worst = max(after, key=lambda w: w["p99_ms"] if not math.isnan(w["p99_ms"]) else -1, default=None)
        in_slo = sum(1 for w in after if w["p99_ms"] <= args.slo_ms)
        lines += [
            "",
            f"## Tuner from max batch {run['start_max_batch']} ({run['label']})",
            "",
            f"Requests {run['requests']}, unanswered {run['unanswered']}, perf_analyzer rc {run['rc']}; "
            "overall client P99 "
            f"{fmt(run['overall']['p99_ms'])} ms, throughput {fmt(run['overall']['throughput_rps'])} req/s.",
            f"After the first {settle} windows: {in_slo}/{len(after)} windows within the SLO; worst window "
            + (f"{worst['window']} (max batch {worst['max_batch']}): P99 {fmt(worst['p99_ms'])} ms." if worst else "-"),
            f"Errors: {run['errors'] or 'none'}.",
            "",
            "| window | t (s) | max batch in force | client P99 (ms) | throughput (req/s) | Prom P99 (ms) | decision | "
            f"vs best static (P99 {fmt(best['p99_ms'] if best else None)} ms, "
            f"{fmt(best['throughput_rps'] if best else None)} req/s) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for w in run["windows"]:
            change = f" → {w['new_max_batch']}" if w["action"] == "change" else ""
            ratio = w["p99_ms"] / best["p99_ms"] if best and best["p99_ms"] else float("nan")
            lines.append(
                f"| {w['window']} | {w['t0_s']:.0f}-{w['t1_s']:.0f} | {w['max_batch']} | {fmt(w['p99_ms'])} | "
                f"{fmt(w['throughput_rps'])} | {fmt(w['prom_p99_ms'])} | {w['decision']}{change} | "
                f"P99 x{fmt(ratio, 2)} |"
            )
        lines += ["", "Decisions (reason strings):", ""]
        for d in run["decisions"]:
            lines.append(f"- t={d['t_s']:.0f} s `{d['action']}` `{d['code']}`: {d['reason']}")
    lines += ["", "![P99, throughput and max batch per window](tuner_real.png)", ""]
    return "\n".join(lines)


def plot(args: argparse.Namespace, runs: list[dict[str, Any]], best: dict[str, Any] | None,
         default: dict[str, Any], path: Path) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    colors = {"from-default": "tab:red", "from-1": "tab:blue"}
    for run in runs:
        if not run["windows"]:
            continue
        edges = [w["t0_s"] for w in run["windows"]] + [run["windows"][-1]["t1_s"]]  # each window over its span
        c = colors.get(run["label"])
        name = f"tuner from max batch {run['start_max_batch']}"
        axes[0].stairs([w["p99_ms"] for w in run["windows"]], edges, color=c, label=name, baseline=None)
        axes[1].stairs([w["throughput_rps"] for w in run["windows"]], edges, color=c, label=name, baseline=None)
        axes[2].stairs([w["max_batch"] for w in run["windows"]], edges, color=c, label=name, baseline=None)
    axes[0].axhline(args.slo_ms, color="k", lw=1, label=f"SLO {args.slo_ms:g} ms")
    if best is not None:
        axes[0].axhline(
            best["p99_ms"], color="tab:green", ls="--", lw=1, label=f"best static (max batch {best['max_batch']}) P99"
        )
        axes[1].axhline(best["throughput_rps"], color="tab:green", ls="--", lw=1, label="best static throughput")
        axes[2].axhline(best["max_batch"], color="tab:green", ls="--", lw=1, label="best static max batch")
    axes[0].axhline(default["p99_ms"], color="tab:gray", ls=":", lw=1, label="Triton default (64) P99")
    axes[1].axhline(args.rate, color="k", ls=":", lw=0.8, label="offered")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("client P99 per window (ms)")
    axes[1].set_ylabel("throughput (req/s)")
    axes[2].set_ylabel("max batch in force")
    axes[2].set_yscale("log", base=2)
    axes[2].set_xlabel("time since the load started (s); each tuner window over its span")
    for ax in axes:
        ax.legend(fontsize=7, loc="best")
    axes[0].set_title(f"tuner on a real tritonserver, Poisson {args.rate:g} req/s over gRPC, emulated accelerator")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ main


def start(args: argparse.Namespace, work: Path) -> tuple[Bench, Any]:
    try:
        pa = ensure_perf_analyzer()
    except PerfAnalyzerUnavailable as e:
        raise ComponentFailed(f"perf_analyzer: {e}") from e
    repo = work / "repo"
    inp = write_model_repository(
        repo,
        "emulated_gpu",
        MODEL,
        local_model_input("emulated_gpu", MODEL, dim=DIM, batching=Batching(max_batch_size=64)),
        base_ms=args.base_ms,
        per_item_ms=args.per_item_ms,
        exponent=args.exponent,
        device_lock=str(work / "device.lock"),
    )
    try:
        server = start_tritonserver(repo, load_models=[MODEL], log_path=work / "tritonserver.log", exit_timeout_secs=5)
    except (TritonNotFound, TritonStartError) as e:
        raise ComponentFailed(f"tritonserver: {e}") from e
    if not control.is_model_ready(server.grpc_url, MODEL):
        server.stop()
        raise ComponentFailed(f"tritonserver: model {MODEL} not ready:\n{server.log_tail()}")
    port = free_port()
    try:
        prom = start_prometheus(
            prometheus_config(f"{server.host}:{server.metrics_port}", args.scrape_s), work / "prometheus", port
        )
    except PrometheusError as e:
        server.stop()
        raise ComponentFailed(f"prometheus: {e}") from e
    prom_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while scalar(prom_url, f'count(nv_inference_count{{namespace="{NAMESPACE}",model="{MODEL}"}})') is None:
        if time.monotonic() > deadline:
            prom.stop()
            server.stop()
            raise ComponentFailed("prometheus: no Triton series scraped after 30 s")
        time.sleep(0.5)
    return Bench(server, inp, prom_url, pa, work), prom


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Poisson req/s of every run (default: the lowest load of a ladder where Triton's default breaks the SLO)",
    )
    parser.add_argument("--slo-ms", type=float, default=30.0)
    parser.add_argument("--percentile", type=float, default=99.0)
    parser.add_argument("--base-ms", type=float, default=2.0)
    parser.add_argument("--per-item-ms", type=float, default=0.4)
    parser.add_argument("--exponent", type=float, default=1.6)
    parser.add_argument("--sweep-s", type=float, default=25.0, help="seconds of load per static config")
    parser.add_argument("--settle-s", type=float, default=3.0, help="left out at the start of each sweep run")
    parser.add_argument("--run-s", type=float, default=240.0, help="seconds of each tuner run")
    parser.add_argument("--interval-s", type=float, default=15.0, help="tuner interval (= cooldown, = window)")
    parser.add_argument(
        "--window-s", type=float, default=30.0, help="the reader's rate window (P99: Triton's 60 s summary)"
    )
    parser.add_argument("--scrape-s", type=int, default=2)
    parser.add_argument("--curve-execs", type=int, default=20, help="executions per size for the curve")
    parser.add_argument("--build-curve", choices=("measured", "none"), default="measured",
                        help="the tuner's build curve: the measured one, or none (live statistics only)")  # fmt: skip
    parser.add_argument("--settle-windows", type=int, default=6, help="windows left out of 'after settling'")
    parser.add_argument("--runs", default="default,1", help="starting configs: 'default' (64) and/or max batch N")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "triton-tuner")
    parser.add_argument(
        "--curve-out",
        type=Path,
        default=None,
        help="where to write the measured curve (default: curve.csv in --out; the benchmark's measured family is "
        "bench/tuner/curves/tritonserver-emulated.csv)",
    )
    args = parser.parse_args()
    args.curve_out = args.curve_out or args.out / "curve.csv"
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tailtune-tuner-real-"))
    t_start = time.monotonic()
    try:
        bench, prom = start(args, work)
    except ComponentFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"tritonserver {bench.server.grpc_url} (gRPC), Prometheus {bench.prom_url}; work dir {work}", flush=True)
    try:
        print("1. live service-time curve (batch_stats deltas):", flush=True)
        curve = measure_curve(bench, args.curve_execs)
        args.curve_out.parent.mkdir(parents=True, exist_ok=True)
        args.curve_out.write_text("batch,ms\n" + "".join(f"{b},{ms:.3f}\n" for b, ms, _ in curve))
        probes: list[dict[str, Any]] = []
        if args.rate is None:
            print("2a. the load: Triton's default on a ladder of loads (fractions of the curve's best capacity):")
            args.rate, probes = probe_rate(bench, curve, args.slo_ms, args.sweep_s, args.settle_s)
        print(f"2. sweep of static configs at {args.rate:g} req/s:", flush=True)
        rows = sweep(bench, args.rate, args.sweep_s, args.settle_s)
        holding = [r for r in rows if r["p99_ms"] <= args.slo_ms]
        best = min(holding or rows, key=lambda r: (-r["throughput_rps"] if holding else 0, r["p99_ms"]))
        if holding:  # all carry the load: the best is the lowest P99 among those at full throughput
            top = max(r["throughput_rps"] for r in holding)
            best = min((r for r in holding if r["throughput_rps"] >= 0.98 * top), key=lambda r: r["p99_ms"])
        build = (
            tuple(CurvePoint(batch=b, ms=ms, samples=n, source="build") for b, ms, n in curve)
            if args.build_curve == "measured"
            else ()
        )
        policy = Policy(
            slo_ms=args.slo_ms,
            percentile=args.percentile,
            window_seconds=args.window_s,
            interval_seconds=args.interval_s,
            cooldown_seconds=args.interval_s,
            batch_min=1,
            batch_max=64,
            build_curve=build,
        )
        runs = []
        for spec in args.runs.split(","):
            mb = 64 if spec == "default" else int(spec)
            label = "from-default" if spec == "default" else f"from-{mb}"
            print(f"3. tuner {label} ({args.run_s:g} s at {args.rate:g} req/s):", flush=True)
            runs.append(tuner_run(bench, label, mb, policy, args.rate, args.run_s, args.window_s))
    except Exception as e:
        print(f"error: {type(e).__name__}: {e}\n{bench.server.log_tail(2000)}", file=sys.stderr)
        prom.stop()
        bench.server.stop()
        return 1
    load_avg = os.getloadavg()
    prom.stop()
    bench.server.stop()
    default = next(r for r in rows if r["max_batch"] == 64)
    text = report(args, curve, probes, rows, best, runs, load_avg)
    (args.out / "report.md").write_text(text)
    plot(args, runs, best, default, args.out / "tuner_real.png")
    raw = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "curve": curve,
        "probes": probes,
        "sweep": rows,
        "best": best,
        "runs": runs,
    }
    (args.out / "raw.json").write_text(json.dumps(raw, indent=1, default=str))
    print(text)
    print(
        f"\nwall time {time.monotonic() - t_start:.0f} s; wrote {args.out}/report.md, tuner_real.png, raw.json; "
        f"{args.curve_out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
