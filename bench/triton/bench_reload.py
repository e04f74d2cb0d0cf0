"""Hot reconfiguration of Triton's dynamic batching vs a server restart, under steady Poisson load.

One real tritonserver (the nvidia-pytriton wheel), one model: the EMULATED accelerator (t(b) = 2 ms +
0.4 ms * b^1.3 on one shared device, CPU idle while it computes), with warmup. perf_analyzer sends open-loop
Poisson load and exports every request's send and response time. Measured, in one run:

1. control: perf_analyzer stops at the first failed request (shown by unloading the model under load), so
   a clean exit over the swap run means no request failed on the client side;
2. 20 hot applies over gRPC (load with config override, alternating two batching configs) under load:
   failed requests, client P99 of the requests sent during each swap vs the baseline, apply time; then
   3 more with the load sent over HTTP, which holds every HTTP request of that server until it ends;
3. restarts of the server with the new config (stop, start with --load-model, model ready): time.

Writes `<out>/report.md`, `<out>/reload.png` and `<out>/raw.json`.
Usage: python bench/triton/bench_reload.py [--rate 200] [--swaps 20] [--http-swaps 3] [--restarts 3]
                                          [--out bench/out/triton]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devkit.triton.local import LocalTriton, start_tritonserver
from devkit.triton.perf import PerfAnalyzer, RequestRecord, ensure_perf_analyzer, read_profile_export
from devkit.triton.repository import local_model_input, write_model_repository
from tailtune.api.v1alpha1 import Batching, Warmup
from tailtune.triton import control
from tailtune.triton.config import ModelConfigInput, render_json, render_pbtxt
from tailtune.triton.metrics import ModelCounters, scrape_model_counters

MODEL = "emulated_gpu"
CONFIG_A = Batching(max_batch_size=8, max_queue_delay_microseconds=500)
CONFIG_B = Batching(max_batch_size=16, preferred_batch_sizes=[4, 8], max_queue_delay_microseconds=1000)
WARMUP = Warmup(batch_sizes=[1, 8], count=1)
COLORS = {"grpc": "orange", "http": "purple"}


@dataclass
class Swap:
    index: int
    batching: dict[str, Any]
    start_ns: int
    end_ns: int
    seconds: float
    error: str | None
    protocol: str


def perf_args(server: LocalTriton, rate: float, window_ms: int, export: Path) -> list[str]:
    """Open-loop Poisson load that runs until 3 clean measurement windows in a row.

    A window in which the model reloads fails perf_analyzer's server-statistics step ("failed to find the
    requested model version") and does not count; a failed request, unlike that, ends the run at once.
    `-s 1000` accepts any 3 clean windows as stable, so the load lasts through the swaps and ~3 windows more.
    """
    return [
        "-m", MODEL, "-u", f"{server.host}:{server.http_port}", "-a",
        "--request-rate-range", str(rate), "--request-distribution", "poisson",
        "--measurement-interval", str(window_ms), "--max-trials", "200", "-s", "1000",
        "--percentile", "99", "--input-data", "zero", "--profile-export-file", str(export),
    ]  # fmt: skip


def control_run(pa: PerfAnalyzer, server: LocalTriton, rate: float, work: Path) -> dict[str, Any]:
    """Unload the model under load: perf_analyzer must notice (it exits at the first failed request)."""

    def chaos() -> None:
        time.sleep(2.0)
        control.unload_model(server.grpc_url, MODEL)
        time.sleep(0.5)
        control.load_model(server.grpc_url, MODEL)

    t = threading.Thread(target=chaos)
    t.start()
    done = pa.run(perf_args(server, rate, 3000, work / "control.json"), timeout=120)
    t.join()
    errors = [line.strip() for line in (done.stdout + done.stderr).splitlines() if "error" in line.lower()]
    return {"rc": done.returncode, "first_error": errors[0] if errors else None}


def apply_over_http(server: LocalTriton, config_json: str) -> float:
    """The same hot apply with the load sent over HTTP (the contrast: it stalls all HTTP inference)."""
    import tritonclient.http as httpclient

    t0 = time.monotonic()
    client = httpclient.InferenceServerClient(f"{server.host}:{server.http_port}", network_timeout=300)
    try:
        client.load_model(MODEL, config=config_json)
    finally:
        client.close()
    while not control.is_model_ready(server.grpc_url, MODEL):
        time.sleep(0.05)
    return time.monotonic() - t0


def swap_run(
    pa: PerfAnalyzer,
    server: LocalTriton,
    inp: ModelConfigInput,
    rate: float,
    swaps: int,
    http_swaps: int,
    work: Path,
) -> dict[str, Any]:
    configs = [CONFIG_B, CONFIG_A]
    # Baseline shorter than 3 windows, gaps shorter than a window: perf_analyzer cannot stop before the end.
    window_ms, baseline_s, gap_s = 4000, 6.0, 1.5
    export = work / "swaps.json"
    before = scrape_model_counters(server.metrics_url, MODEL)
    proc = subprocess.Popen(
        [str(pa.binary), *perf_args(server, rate, window_ms, export)],
        env=pa.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout or []))
    reader.start()
    time.sleep(baseline_s)
    done: list[Swap] = []
    for i in range(swaps + http_swaps):
        if proc.poll() is not None:
            break
        batching = configs[i % 2]
        config_json = render_json(inp.model_copy(update={"batching": batching}))
        protocol = "grpc" if i < swaps else "http"
        start = time.time_ns()
        t0 = time.monotonic()
        try:
            if protocol == "grpc":
                seconds, error = control.apply_config(server.grpc_url, MODEL, config_json).seconds, None
            else:
                seconds, error = apply_over_http(server, config_json), None
        except Exception as e:  # a refused apply is a result, not a crash of the benchmark
            seconds, error = time.monotonic() - t0, str(e)
        done.append(Swap(i + 1, batching.model_dump(), start, time.time_ns(), seconds, error, protocol))
        time.sleep(gap_s)
    rc = proc.wait(timeout=200 * window_ms / 1000 + 60)
    reader.join()
    after = scrape_model_counters(server.metrics_url, MODEL)
    records = read_profile_export(export) if export.exists() else []
    return {
        "rc": rc,
        "perf_analyzer_output": "".join(out),
        "window_ms": window_ms,
        "swaps": done,
        "records": records,
        "server": after - before,
    }


def restart_times(
    server: LocalTriton, repo: Path, inp: ModelConfigInput, restarts: int
) -> tuple[LocalTriton, list[float]]:
    """Stop the server, write the other config, start it with --load-model, wait for model ready."""
    times = []
    for i in range(restarts):
        batching = [CONFIG_B, CONFIG_A][i % 2]
        (repo / MODEL / "config.pbtxt").write_text(render_pbtxt(inp.model_copy(update={"batching": batching})))
        t0 = time.monotonic()
        server.stop()
        server = start_tritonserver(repo, host=server.host, load_models=[MODEL], log_path=server.log_path)
        while not control.is_model_ready(server.grpc_url, MODEL):
            time.sleep(0.02)
        times.append(time.monotonic() - t0)
        live = control.get_model_config(server.grpc_url, MODEL)
        assert live.max_batch_size == batching.max_batch_size, live
    return server, times


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def analyse(run: dict[str, Any]) -> dict[str, Any]:
    records: list[RequestRecord] = run["records"]
    swaps: list[Swap] = run["swaps"]
    answered = [r for r in records if r.response_ns is not None]
    t_first = records[0].sent_ns if records else 0

    def latencies(a: int, b: int) -> list[float]:
        return [r.latency_ms for r in answered if a <= r.sent_ns <= b and r.latency_ms is not None]

    # Baseline: steady load away from swaps: after perf_analyzer's ramp-up and before the first swap, and
    # from 2 s after the last swap on. A swap's requests: those sent between its load call and ready.
    end = max((r.sent_ns for r in records), default=0)
    baseline = latencies(t_first + 1_000_000_000, swaps[0].start_ns - 1) if swaps else latencies(t_first, end)
    if swaps:
        baseline += latencies(swaps[-1].end_ns + 2_000_000_000, end)
    per_swap = []
    for s in swaps:
        lat = latencies(s.start_ns, s.end_ns)
        after = latencies(s.end_ns, s.end_ns + 1_000_000_000)  # the old instance's teardown lands here
        per_swap.append(
            {
                "index": s.index,
                "protocol": s.protocol,
                "seconds": s.seconds,
                "error": s.error,
                "requests": len(lat),
                "p99_ms": p99(lat),
                "max_ms": max(lat, default=float("nan")),
                "p99_after_ms": p99(after),
            }
        )
    return {
        "sent": len(records),
        "answered": len(answered),
        "baseline_p99_ms": p99(baseline),
        "baseline_p50_ms": float(np.percentile(baseline, 50)) if baseline else float("nan"),
        "baseline_requests": len(baseline),
        "per_swap": per_swap,
    }


def plot(run: dict[str, Any], stats: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records: list[RequestRecord] = [r for r in run["records"] if r.response_ns is not None]
    t0 = records[0].sent_ns if records else 0
    t = np.array([(r.sent_ns - t0) / 1e9 for r in records])
    lat = np.array([r.latency_ms for r in records])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 7), gridspec_kw={"height_ratios": [2, 1]})
    ax1.scatter(t, lat, s=2, alpha=0.35, color="tab:blue", label="request latency (client)")
    if len(t):
        edges = np.arange(0, t[-1] + 1, 1.0)
        idx = np.digitize(t, edges)
        centers = [edges[i - 1] + 0.5 for i in np.unique(idx)]
        roll = [np.percentile(lat[idx == i], 99) for i in np.unique(idx)]
        ax1.plot(centers, roll, color="tab:red", lw=1.2, label="P99 per 1 s")
    labelled: set[str] = set()
    for s in run["swaps"]:
        label = None if s.protocol in labelled else f"hot apply over {s.protocol} (load → ready)"
        labelled.add(s.protocol)
        span = ((s.start_ns - t0) / 1e9, (s.end_ns - t0) / 1e9)
        ax1.axvspan(*span, color=COLORS[s.protocol], alpha=0.25, lw=0, label=label)
    ax1.axhline(stats["baseline_p99_ms"], color="k", ls="--", lw=0.8, label="baseline P99")
    if len(lat):
        ax1.set_yscale("log")
    ax1.set_xlabel("time since first request (s)")
    ax1.set_ylabel("latency (ms)")
    ax1.legend(loc="upper right", fontsize=8)
    ax1.set_title(f"Triton hot reconfiguration under Poisson load ({MODEL}, emulated accelerator)")
    sw = stats["per_swap"]
    ax2.bar([s["index"] for s in sw], [s["p99_ms"] for s in sw], color=[COLORS[s["protocol"]] for s in sw],
            label="P99 during swap (orange: gRPC, purple: HTTP)")  # fmt: skip
    ax2.set_yscale("log")
    ax2.axhline(stats["baseline_p99_ms"], color="k", ls="--", lw=0.8, label="baseline P99")
    ax2.set_xlabel("swap")
    ax2.set_ylabel("P99 (ms)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    args: argparse.Namespace, ctl: dict[str, Any], run: dict[str, Any], stats: dict[str, Any],
    restarts: list[float], load: tuple[float, float, float],
) -> str:  # fmt: skip
    hot = [s.seconds for s in run["swaps"] if s.error is None and s.protocol == "grpc"]
    hot_med = statistics.median(hot) if hot else float("nan")
    restart_med = statistics.median(restarts) if restarts else float("nan")
    server: ModelCounters = run["server"]
    rc = run["rc"]
    failed = stats["sent"] - stats["answered"] if rc == 0 else f">= 1 (perf_analyzer exited {rc})"
    refused = [s for s in run["swaps"] if s.error]
    base_p99 = stats["baseline_p99_ms"]

    def spread(xs: list[float]) -> str:
        nan = float("nan")
        med = statistics.median(xs) if xs else nan
        return f"{med:.2f} s | {min(xs, default=nan):.2f} s | {max(xs, default=nan):.2f} s | {len(xs)}"

    lines = [
        "# Triton hot reconfiguration vs restart",
        "",
        f"Model `{MODEL}`: EMULATED accelerator (t(b) = 2 ms + 0.4 ms·b^1.3, one shared device),",
        "Python backend on tritonserver 2.51 (nvidia-pytriton 0.7.0), KIND_CPU x1, warmup batch sizes",
        f"{WARMUP.batch_sizes}. Load: perf_analyzer 2.41.1, async HTTP, Poisson {args.rate:g} req/s.",
        f"Host load average at the end of the swap run: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}",
        f"on {os.cpu_count()} cores (shared with other work).",
        "",
        f"Configs alternate between A = `{CONFIG_A.model_dump()}`",
        f"and B = `{CONFIG_B.model_dump()}`.",
        "",
        "## Apply time",
        "",
        "| | median | min | max | n |",
        "|---|---|---|---|---|",
        f"| hot apply over gRPC (load with config override → ready, read back) | {spread(hot)} |",
        f"| restart (SIGTERM → new server with --load-model → model ready) | {spread(restarts)} |",
        "",
        f"Restart / hot apply = **{restart_med / hot_med:.1f}x**. During a restart the server serves nothing",
        "(the HTTP port is closed until load and warmup finish); during a hot apply the old model serves.",
        "",
        "## Requests during the swaps (client side)",
        "",
        f"- {len(run['swaps'])} hot applies under load ({args.swaps} over gRPC, then {args.http_swaps} over",
        f"  HTTP for contrast; {len(refused)} refused), perf_analyzer exit {rc};",
        f"  requests sent {stats['sent']}, answered {stats['answered']}: **failed = {failed}**.",
        f"- Server counters over the run: success {server.success:.0f}, failure {server.failure:.0f},",
        f"  average batch {server.average_batch_size or float('nan'):.2f}.",
        f"- Control run: unloading the model under the same load made perf_analyzer exit {ctl['rc']}",
        f"  (`{ctl['first_error']}`), so a clean exit means no client-side failure.",
        "",
        f"Baseline (requests sent outside swaps, n={stats['baseline_requests']}):",
        f"P50 {stats['baseline_p50_ms']:.1f} ms, P99 {base_p99:.1f} ms.",
        "",
        "| swap | over | apply (s) | sent during | P99 (ms) | max (ms) | P99/base | P99 in 1 s after (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in stats["per_swap"]:
        ratio = w["p99_ms"] / base_p99 if base_p99 else float("nan")
        cells = [
            str(w["index"]),
            w["protocol"],
            f"{w['seconds']:.2f}",
            str(w["requests"]),
            f"{w['p99_ms']:.1f}",
        ]
        cells += [f"{w['max_ms']:.1f}", f"{ratio:.2f}", f"{w['p99_after_ms']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for protocol in ("grpc", "http"):
        swap_p99 = [w["p99_ms"] for w in stats["per_swap"] if w["protocol"] == protocol and not math.isnan(w["p99_ms"])]
        after = [w["p99_after_ms"] for w in stats["per_swap"] if w["protocol"] == protocol]
        if swap_p99:
            lines += [
                "",
                f"P99 during swaps over {protocol}: median {statistics.median(swap_p99):.1f} ms, worst "
                f"{max(swap_p99):.1f} ms; in the second after: median {statistics.median(after):.1f} ms,",
                f"worst {max(after):.1f} ms (baseline {base_p99:.1f} ms).",
            ]
    lines += ["", "![latency over time](reload.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--swaps", type=int, default=20, help="hot applies over gRPC (the product path)")
    parser.add_argument("--http-swaps", type=int, default=3, help="then hot applies over HTTP, for contrast")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/out/triton"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pa = ensure_perf_analyzer()
    work = Path(tempfile.mkdtemp(prefix="tailtune-bench-reload-"))
    repo = work / "repo"
    inp = write_model_repository(
        repo,
        "emulated_gpu",
        MODEL,
        local_model_input("emulated_gpu", MODEL, batching=CONFIG_A, warmup=WARMUP),
    )
    server = start_tritonserver(repo, load_models=[MODEL], log_path=args.out / "tritonserver.log")
    try:
        print(f"swap run: {args.swaps} hot applies at {args.rate:g} req/s...", flush=True)
        run = swap_run(pa, server, inp, args.rate, args.swaps, args.http_swaps, work)
        load = os.getloadavg()
        print(f"  perf_analyzer rc={run['rc']}, {len(run['records'])} requests", flush=True)
        if run["rc"] != 0:
            print(run["perf_analyzer_output"][-3000:], flush=True)
        # Last on this server: after an unload under load, perf_analyzer cannot start on it again.
        print("control run (unload under load)...", flush=True)
        ctl = control_run(pa, server, args.rate, work)
        print(f"  perf_analyzer rc={ctl['rc']}: {ctl['first_error']}", flush=True)
        print(f"restarts x{args.restarts}...", flush=True)
        server, restarts = restart_times(server, repo, inp, args.restarts)
    finally:
        server.stop()
    stats = analyse(run)
    plot(run, stats, args.out / "reload.png")
    (args.out / "report.md").write_text(report(args, ctl, run, stats, restarts, load))
    raw = {
        "control": ctl,
        "rc": run["rc"],
        "window_ms": run["window_ms"],
        "swaps": [asdict(s) for s in run["swaps"]],
        "restarts_s": restarts,
        "stats": stats,
        "server": asdict(run["server"]),
        "perf_analyzer_output": run["perf_analyzer_output"][-6000:],
    }
    (args.out / "raw.json").write_text(json.dumps(raw, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)
    print((args.out / "report.md").read_text())


if __name__ == "__main__":
    main()
