"""n model instances on one device: the queueing model against the simulator and a real tritonserver (issue 38).

    python bench/tuner/instances.py                 # model and simulator, then the real server (~10 min)
    python bench/tuner/instances.py --no-real       # model and simulator only (~1 min)
    python bench/tuner/instances.py --plot-only     # the report again from results.json, the model recomputed

Per case a curve t(b) = a + c b^p (overhead-dominated, linear, power law), max batch 8, a queue delay (0 or
2 ms), 1, 2 or 4 instances and a Poisson load (a share of the model's capacity):

- model: `tailtune.tuner.model.predict` (P99 and capacity);
- simulator: `tailtune.sim.batcher.Replica` on SIM_ARRIVALS Poisson arrivals (the first tenth left out);
- real: a local tritonserver (the pytriton wheel's 2.51) serving the EMULATED accelerator
  (`devkit/triton/models/emulated_gpu`: one shared device, executions serialized on a file lock) with
  `instance_group [{count: n, kind: KIND_CPU}]`, driven by perf_analyzer (open-loop Poisson over gRPC; client-side
  latency from its per-request export). The simulator is run again on the very send times perf_analyzer recorded
  ("sim, same arrivals") and, to tell the curve apart from the scheduling, on the device times the emulator
  logged per batch size ("sim, measured t(b)").

Errors are ratios model / measured, worst (furthest from 1 in log) first. Writes bench/out/instances/report.md,
results.json and instances.png. The real runs share the machine's CPUs with whatever else runs: the server's
own overhead (request handling, the Python backend's IPC, ~0.3-0.6 ms an execution outside the device) shows in
them and in no model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tailtune.api.v1alpha1 import Batching  # noqa: E402
from tailtune.sim.batcher import Replica  # noqa: E402
from tailtune.tuner.model import capacity, predict  # noqa: E402

OUT = ROOT / "bench" / "out" / "instances"
MAX_BATCH = 8
# Curves (a ms, c ms, p): slow enough that the load at capacity stays within what perf_analyzer and the server
# sustain on two shared cores (a few hundred requests per second).
CURVES: dict[str, tuple[float, float, float]] = {
    "overhead": (40.0, 1.0, 1.0),
    "linear": (2.0, 6.0, 1.0),
    "power": (16.0, 3.2, 1.3),
}
INSTANCES = (1, 2, 4)
SIM_LOADS = (0.3, 0.5, 0.7, 0.85, 0.95)
REAL_LOADS = (0.3, 0.6, 0.85)
# Queue delays as shares of t(max batch): those the law tries with several instances
# (`tailtune.tuner.control.objective.DELAY_SHARES_OF_BATCH`), and none.
DELAY_SHARES = (0.0, 0.25, 0.5, 1.0)
# The real server with a delay: this share, on the power-law curve, at REAL_DELAY_LOAD.
REAL_DELAY_SHARE = 0.5
REAL_DELAY_LOAD = 0.6
SIM_ARRIVALS = 40_000
# perf_analyzer's window; it measures three (a stability threshold it always meets: 1000 %).
MEASUREMENT_MS = 5000


@dataclass
class Row:
    curve: str
    instances: int
    delay_us: int
    load: float  # share of the model's capacity
    rate_rps: float
    model_p99: float  # predict
    model_capacity: float
    sim_p99: float
    sim_batch: float
    real_p99: float | None = None
    real_rate: float | None = None
    real_batch: float | None = None
    sim_same_p99: float | None = None  # the simulator on perf_analyzer's send times
    sim_measured_p99: float | None = None  # ... and on the device times the emulator logged


def curve_fn(name: str) -> Callable[[float], float]:
    a, c, p = CURVES[name]
    return lambda b: a + c * b**p


def simulate(
    exec_ms: list[float], delay_us: int, instances: int, arrivals: npt.NDArray[np.float64]
) -> tuple[float, float]:
    """(P99 ms, mean batch per execution) of one replica over `arrivals` (s), the first tenth left out."""
    batching = Batching(max_batch_size=MAX_BATCH, max_queue_delay_microseconds=delay_us)
    replica = Replica([0.0, *exec_ms], batching, instances=instances)
    replica.add_arrivals(arrivals)
    end = float(arrivals[-1])
    replica.run_until(end + 60.0)
    w = replica.window(0.1 * end, end + 60.0)
    # w.batch is per request: len / sum(1 / b) is the mean over executions (what the emulator's log gives).
    return float(np.percentile(w.latency_s * 1000, 99)), float(len(w.batch) / np.sum(1.0 / w.batch))


def delay_us(t: Callable[[float], float], share: float) -> int:
    return int(share * t(MAX_BATCH) * 1000)


def model_and_sim(seed: int) -> list[Row]:
    rows = []
    for name in CURVES:
        t = curve_fn(name)
        exec_ms = [t(b) for b in range(1, MAX_BATCH + 1)]
        for share in DELAY_SHARES:
            delay = delay_us(t, share)
            cap = capacity(t, MAX_BATCH, delay)
            for n in INSTANCES:
                for k, load in enumerate(SIM_LOADS):
                    rate = load * cap
                    arrivals = np.cumsum(np.random.default_rng(seed + k).exponential(1.0 / rate, SIM_ARRIVALS))
                    sim_p99, sim_batch = simulate(exec_ms, delay, n, arrivals)
                    pred = predict(t, MAX_BATCH, delay, n, rate)
                    rows.append(Row(name, n, delay, load, rate, pred.p_ms, pred.capacity_rps, sim_p99, sim_batch))
    return rows


def real_runs(work: Path) -> list[Row]:
    """The real server on REAL_LOADS for each curve and instance count (delay 0)."""
    from devkit.triton.local import start_tritonserver
    from devkit.triton.perf import ensure_perf_analyzer
    from devkit.triton.repository import local_model_input, write_model_repository
    from tailtune.triton import control

    pa = ensure_perf_analyzer()
    repo = work / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    server = start_tritonserver(repo, log_path=work / "tritonserver.log", exit_timeout_secs=2)
    out = []
    configs: list[tuple[str, int, float, tuple[float, ...]]] = [
        (name, n, 0.0, REAL_LOADS) for name in CURVES for n in INSTANCES
    ]
    configs += [("power", n, REAL_DELAY_SHARE, (REAL_DELAY_LOAD,)) for n in INSTANCES]
    try:
        for name, n, share, loads in configs:
            a, c, p = CURVES[name]
            t = curve_fn(name)
            delay = delay_us(t, share)
            cap = capacity(t, MAX_BATCH, delay)
            model = f"{name}_{n}_{delay}"
            counter = work / f"{model}.executions"
            counter.unlink(missing_ok=True)
            batching = Batching(max_batch_size=MAX_BATCH, max_queue_delay_microseconds=delay)
            inp = local_model_input("emulated_gpu", model, dim=4, batching=batching, instances=n)
            write_model_repository(
                repo, "emulated_gpu", model, inp, base_ms=a, per_item_ms=c, exponent=p,
                device_lock=str(work / f"{model}.lock"), counter_file=str(counter),
            )  # fmt: skip
            control.load_model(server.grpc_url, model)
            try:
                for load in loads:
                    out.append(
                        _one_real(pa, server.grpc_url, model, name, t, n, delay, load * cap, load, counter, work)
                    )
                    print(_fmt(out[-1]), flush=True)
            finally:
                control.unload_model(server.grpc_url, model)
    finally:
        server.stop()
    return out


def _one_real(pa: Any, url: str, model: str, curve: str, t: Callable[[float], float], n: int, delay: int,
              rate: float, load: float, counter: Path, work: Path) -> Row:  # fmt: skip
    from devkit.triton.perf import read_profile_export

    export = work / f"{model}-{load}.json"
    export.unlink(missing_ok=True)
    before = len(counter.read_text().splitlines()) if counter.exists() else 0
    args = [
        "-m", model, "-u", url, "-i", "grpc", "-a", "--request-rate-range", f"{rate:g}",
        "--request-distribution", "poisson", "--measurement-interval", str(MEASUREMENT_MS), "-s", "1000",
        "--percentile", "99", "--input-data", "zero", "--profile-export-file", str(export),
    ]  # fmt: skip
    done = pa.run(args, timeout=180)
    if not export.exists():
        raise RuntimeError(f"perf_analyzer exported nothing (rc {done.returncode}): {done.stdout[-1500:]}")
    records = read_profile_export(export)
    lat = np.array([r.latency_ms for r in records if r.latency_ms is not None])
    sent = np.array([r.sent_ns for r in records], dtype=np.float64) / 1e9
    sent -= sent[0]
    lines = [ln.split() for ln in counter.read_text().splitlines()[before:]]
    sizes = np.array([int(x[0]) for x in lines])
    device_ms = np.array([(float(x[2]) - float(x[1])) * 1000 for x in lines])
    nominal = [t(b) for b in range(1, MAX_BATCH + 1)]
    measured = [
        float(device_ms[sizes == b].mean()) if np.any(sizes == b) else nominal[b - 1] for b in range(1, MAX_BATCH + 1)
    ]
    real_rate = len(records) / float(sent[-1])
    pred = predict(t, MAX_BATCH, delay, n, real_rate)
    same_p99, sim_batch = simulate(nominal, delay, n, np.sort(sent))
    measured_p99, _ = simulate(measured, delay, n, np.sort(sent))
    return Row(
        curve, n, delay, load, rate, pred.p_ms, pred.capacity_rps, same_p99, sim_batch,
        real_p99=float(np.percentile(lat, 99)), real_rate=real_rate, real_batch=float(sizes.mean()),
        sim_same_p99=same_p99, sim_measured_p99=measured_p99,
    )  # fmt: skip


def _fmt(r: Row) -> str:
    real = "" if r.real_p99 is None else f" real {r.real_p99:.1f} (batch {r.real_batch:.2f})"
    return (
        f"{r.curve:8s} n={r.instances} delay={r.delay_us} load={r.load:.2f}: model {r.model_p99:.1f} "
        f"sim {r.sim_p99:.1f} (batch {r.sim_batch:.2f}){real}"
    )


def _worst(r: npt.NDArray[np.float64]) -> float:
    """The ratio furthest from 1 (in log)."""
    return float(r[np.argmax(np.abs(np.log(r)))]) if len(r) else math.nan


def report(sim_rows: list[Row], real_rows: list[Row], seconds: float) -> str:
    lines = ["# n instances on one device: model vs simulator vs real tritonserver", ""]
    lines += [
        "Command: `python bench/tuner/instances.py`" + (" (real runs included)" if real_rows else " --no-real"),
        "",
    ]
    lines += ["## Model vs simulator (P99 ratio model / simulated)", ""]
    lines += ["Delay as a share of t(max batch).", "", "| instances | delay share | cases | worst | median |",
              "|---|---|---|---|---|"]  # fmt: skip
    for n in INSTANCES:
        for share in DELAY_SHARES:
            sel = [x for x in sim_rows if x.instances == n and x.delay_us == delay_us(curve_fn(x.curve), share)]
            r = np.array([x.model_p99 / x.sim_p99 for x in sel])
            lines.append(f"| {n} | {share:g} | {len(r)} | {_worst(r):.2f} | {np.median(r):.2f} |")
    lines += ["", "Worst cases first:", "",
              "| curve | n | delay us | load | model ms | sim ms | ratio | sim batch |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for x in sorted(sim_rows, key=lambda x: -abs(math.log(x.model_p99 / x.sim_p99)))[:12]:
        lines.append(
            f"| {x.curve} | {x.instances} | {x.delay_us} | {x.load:.2f} | {x.model_p99:.1f} | "
            f"{x.sim_p99:.1f} | {x.model_p99 / x.sim_p99:.2f} | {x.sim_batch:.2f} |"
        )
    if real_rows:
        lines += ["", f"## Real tritonserver (emulated accelerator, ~{seconds:.0f} s of Poisson load per point)", ""]
        lines += [
            "Ratios median (worst). A real P99 far above the simulator's on the same send times is the shared machine",
            "stalling the server or perf_analyzer (load average ~10 on 2 cores during this run), not the batcher.",
            "",
            "| instances | points | model/real | sim/real (same arrivals) | sim (measured t(b))/real |",
            "|---|---|---|---|---|",
        ]
        for n in INSTANCES:
            sel = [x for x in real_rows if x.instances == n and x.real_p99]
            if not sel:
                continue
            cells = []
            for column in ("model_p99", "sim_same_p99", "sim_measured_p99"):
                r = np.array([float(getattr(x, column)) / float(x.real_p99 or math.nan) for x in sel])
                cells.append(f"{np.median(r):.2f} ({_worst(r):.2f})")
            lines.append(f"| {n} | {len(sel)} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| curve | n | delay us | load | rate | real P99 | model | sim (same arrivals) | sim (measured t) "
            "| model/real | real batch | sim batch |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for x in sorted(real_rows, key=lambda x: -abs(math.log(x.model_p99 / (x.real_p99 or 1.0)))):
            lines.append(
                f"| {x.curve} | {x.instances} | {x.delay_us} | {x.load:.2f} | {x.real_rate:.0f} | {x.real_p99:.1f} | "
                f"{x.model_p99:.1f} | {x.sim_same_p99:.1f} | {x.sim_measured_p99:.1f} | "
                f"{x.model_p99 / (x.real_p99 or 1.0):.2f} | {x.real_batch:.2f} | {x.sim_batch:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot(sim_rows: list[Row], real_rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    colours = {1: "tab:blue", 2: "tab:orange", 4: "tab:red"}
    for n in INSTANCES:
        pts = [(x.sim_p99, x.model_p99) for x in sim_rows if x.instances == n]
        axes[0].scatter(*zip(*pts, strict=True), s=12, c=colours[n], label=f"{n} instance(s)")
        rp = [(x.real_p99, x.model_p99) for x in real_rows if x.instances == n and x.real_p99]
        if rp:
            axes[1].scatter(*zip(*rp, strict=True), s=18, c=colours[n], label=f"{n}: model")
            sp = [(x.real_p99, x.sim_same_p99) for x in real_rows if x.instances == n and x.real_p99]
            axes[1].scatter(*zip(*sp, strict=True), s=18, c=colours[n], marker="x", label=f"{n}: simulator")
    for ax, xl in ((axes[0], "simulated P99 (ms)"), (axes[1], "real tritonserver P99 (ms)")):
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("predicted P99 (ms)")
        ax.legend(fontsize=7)
    axes[0].set_title("model vs simulator")
    axes[1].set_title("model / simulator vs real server")
    fig.tight_layout()
    fig.savefig(OUT / "instances.png", dpi=110)


def _repredict(row: Row) -> Row:
    """The row with the model's columns from the model as it is now (at the rate measured, where measured)."""
    t = curve_fn(row.curve)
    rate = row.real_rate or row.rate_rps
    row.model_p99 = predict(t, MAX_BATCH, row.delay_us, row.instances, rate).p_ms
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-real", action="store_true", help="model and simulator only")
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument(
        "--plot-only",
        action="store_true",
        help="re-render from results.json, the model's columns recomputed (the model is pure; measurements stay)",
    )
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    seconds = 3 * MEASUREMENT_MS / 1000
    if args.plot_only:
        doc = json.loads((OUT / "results.json").read_text())
        # (An earlier run's `greedy_p99`, the fixed point alone before the delay's windows, is not read.)
        fields = set(Row.__dataclass_fields__)
        sim_rows = [_repredict(Row(**{k: v for k, v in r.items() if k in fields})) for r in doc["sim"]]
        real_rows = [_repredict(Row(**{k: v for k, v in r.items() if k in fields})) for r in doc["real"]]
    else:
        started = time.process_time()
        sim_rows = model_and_sim(args.seed)
        print(f"model and simulator: {len(sim_rows)} cases, {time.process_time() - started:.0f} CPU-s", flush=True)
        real_rows = [] if args.no_real else real_runs(OUT / "work")
        (OUT / "results.json").write_text(
            json.dumps({"sim": [asdict(r) for r in sim_rows], "real": [asdict(r) for r in real_rows]}, indent=1)
        )
    text = report(sim_rows, real_rows, seconds)
    (OUT / "report.md").write_text(text)
    plot(sim_rows, real_rows)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
