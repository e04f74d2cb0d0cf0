"""Benchmark of the SLO tuner against the oracle and the known baselines, in the simulator.

    python bench/tuner/run.py            # full: 5 traces x 2 curves, 15 min each (~10 min on 2 cores)
    python bench/tuner/run.py --quick    # 3 traces x 2 curves, 6 min each (~1 min)

Every policy sees the same arrivals (same seeds) and the same service-time noise. Policies:

- triton-default: max_batch_size = engine max (64), no delay, never changed;
- best-static: the best config of a sweep at the first load level, then kept (an oracle for that level);
- aimd: Clipper-style additive increase (+2) / multiplicative decrease (x0.9) of max batch on P99 vs SLO,
  from the default (64), every interval;
- model-analyzer: an offline quick search: max batch in powers of two, each measured at rising loads,
  keeping the one with the highest load served under the SLO (Model Analyzer's throughput objective);
- tailtune: `tailtune.tuner.loop.tune_once` with the simulator as reader and applier, starting from the
  InferenceService's default batching (max batch 8, no delay); tailtune@64 starts from Triton's default;
- oracle: per window, the best of all swept static configs (no reload cost, clairvoyant).

Writes bench/out/tuner/report.md and one PNG per scenario (P99 vs SLO, max batch and replicas over time).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tailtune.api.v1alpha1 import Batching, IntRange, Replicas, Slo, Tuning
from tailtune.sim import SimCluster, Trace, diurnal, mmpp, named_curve, poisson, step
from tailtune.sim.curves import ServiceCurve
from tailtune.tuner.loop import tune_once
from tailtune.tuner.simobs import observation_from_sim
from tailtune.tuner.types import Decision, Observation, Policy, TunerState

OUT = Path(__file__).resolve().parents[2] / "bench" / "out" / "tuner"
ENGINE_MAX = 64
INTERVAL = 30.0
WINDOW = 60.0
NOISE = 0.03
SEED = 42
SLO_MS = 30.0
STATIC_POLICIES = ("triton-default", "best-static", "model-analyzer")


@dataclass(frozen=True)
class Scenario:
    name: str
    curve: str
    trace: Trace
    slo_ms: float
    replicas_max: int = 1

    @property
    def first_rate(self) -> float:
        return self.trace.segments[0][2]


@dataclass
class Run:
    """One policy on one scenario: per-request outcomes and the knobs over time."""

    policy: str
    arrivals: npt.NDArray[np.float64]
    latency: npt.NDArray[np.float64]
    knobs: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, max batch, delay, replicas)
    changes: int = 0


def capacity(curve: ServiceCurve) -> float:
    """Most requests/s one device serves, at its most efficient batch."""
    return max(1000.0 * b / curve.ms(b) for b in range(1, ENGINE_MAX + 1))


def scenarios(quick: bool) -> list[Scenario]:
    duration = 360.0 if quick else 900.0
    third = duration / 2 if quick else duration / 3
    out = []
    for curve_name in ("linear-power", "bert-base-l4"):
        cap = capacity(named_curve(curve_name))
        traces = [
            step([(0, 0.4 * cap), (third, 0.85 * cap)], duration, SEED, name="step-up"),
            mmpp((0.35 * cap, 0.8 * cap), (60.0, 40.0), duration, SEED),
        ]
        if not quick:
            traces += [
                step([(0, 0.85 * cap), (third, 0.4 * cap)], duration, SEED, name="step-down"),
                diurnal(0.25 * cap, 0.85 * cap, duration, duration, SEED),
            ]
        out += [Scenario(f"{t.name}/{curve_name}", curve_name, t, SLO_MS) for t in traces]
        levels = [(0, 0.4 * cap), (duration / 3, 1.6 * cap)] + ([] if quick else [(2 * third, 0.4 * cap)])
        scale = step(levels, duration, SEED, name="scale")
        out.append(Scenario(f"scale/{curve_name}", curve_name, scale, SLO_MS, replicas_max=3))
    return out


def cluster(sc: Scenario, batching: Batching, replicas: int, trace: Trace | None = None) -> SimCluster:
    tr = trace or sc.trace
    return SimCluster(
        named_curve(sc.curve),
        tr.arrivals,
        batching,
        replicas,
        engine_max_batch=ENGINE_MAX,
        seed=SEED,
        noise_sigma=NOISE,
    )


def run_static(sc: Scenario, batching: Batching, replicas: int, name: str) -> Run:
    c = cluster(sc, batching, replicas)
    c.advance(sc.trace.duration_s + 30.0)
    arr, lat = c.outcomes()
    return Run(
        name, arr, lat, [(0.0, batching.max_batch_size, batching.max_queue_delay_microseconds, replicas)]
    )


Controller = Callable[[float, Observation, SimCluster], tuple[Batching, int] | None]


def run_dynamic(sc: Scenario, name: str, start: Batching, controller: Controller) -> Run:
    c = cluster(sc, start, 1)
    knobs = [(0.0, start.max_batch_size, start.max_queue_delay_microseconds, 1)]
    changes = 0
    t = INTERVAL
    while t <= sc.trace.duration_s:
        c.advance(t)
        obs = observation_from_sim(c.observe(WINDOW, 99.0, span_s=60.0))
        new = controller(t, obs, c)
        if new is not None and (new[0] != c.batching or new[1] != c.replicas):
            c.apply(*new)
            changes += 1
            knobs.append((t, new[0].max_batch_size, new[0].max_queue_delay_microseconds, new[1]))
        t += INTERVAL
    c.advance(sc.trace.duration_s + 30.0)
    arr, lat = c.outcomes()
    return Run(name, arr, lat, knobs, changes)


class _SimSide:
    """The simulator as the tuner loop's reader, applier and recorder."""

    def __init__(self, c: SimCluster, obs: Observation) -> None:
        self.c, self.obs = c, obs
        self.applied: tuple[Batching, int] | None = None

    def read(self, window_end: datetime) -> Observation:
        return self.obs

    def apply(self, batching: Batching, replicas: int) -> None:
        self.applied = (batching, replicas)

    def record(self, decision: Decision, observation: Observation) -> None:
        pass


def run_tailtune(sc: Scenario, start: Batching, name: str) -> Run:
    tuning = Tuning(max_batch_size=IntRange(min=1, max=ENGINE_MAX), max_batch_step=32)
    policy = Policy.from_spec(
        Slo(latency_ms=sc.slo_ms), tuning, Replicas(min=1, max=sc.replicas_max), ENGINE_MAX
    )
    state = TunerState.initial(start, 1)

    def control(t: float, obs: Observation, c: SimCluster) -> tuple[Batching, int] | None:
        nonlocal state
        side = _SimSide(c, obs)
        state, _ = tune_once(side, side, side, state, policy, c.clock(t))
        return side.applied

    return run_dynamic(sc, name, start, control)


def run_aimd(sc: Scenario) -> Run:
    mb = ENGINE_MAX

    def control(t: float, obs: Observation, c: SimCluster) -> tuple[Batching, int] | None:
        nonlocal mb
        if obs.p_latency_ms is None:
            return None
        over = obs.p_latency_ms > sc.slo_ms
        mb = max(1, min(mb - 1, math.floor(mb * 0.9))) if over else min(ENGINE_MAX, mb + 2)
        return Batching(max_batch_size=mb), 1

    return run_dynamic(sc, "aimd", Batching(max_batch_size=ENGINE_MAX), control)


# --- static searches -----------------------------------------------------------------------------------


def sweep_grid(sc: Scenario, quick: bool) -> list[tuple[Batching, int]]:
    sizes: tuple[int, ...] = (1, 4, 8, 16, 32, 64) if quick else (1, 2, 4, 8, 12, 16, 24, 32, 64)
    delays = (0,) if quick else (0, 2000)
    replicas = range(1, sc.replicas_max + 1)
    if sc.replicas_max > 1:
        sizes = (4, 8, 16, 32) if quick else (4, 8, 12, 16, 24, 32)
    return [
        (Batching(max_batch_size=b, max_queue_delay_microseconds=d), r)
        for b in sizes
        for d in delays
        for r in replicas
    ]


def _measure(sc: Scenario, batching: Batching, rate: float, seconds: float) -> tuple[float, float]:
    """(goodput req/s, P99 ms) of a config at a constant Poisson load, after a 10 s warm-up."""
    tr = poisson(rate, seconds + 10.0, SEED + 7)
    c = cluster(sc, batching, 1, tr)
    c.advance(tr.duration_s + 5.0)
    arr, lat = c.outcomes()
    keep = arr >= 10.0
    lat = lat[keep]
    good = float(np.sum(lat <= sc.slo_ms / 1000)) / seconds
    return good, float(np.percentile(lat, 99, method="higher")) * 1000 if len(lat) else math.inf


def best_static_first_level(sc: Scenario, quick: bool) -> Batching:
    """Best config of the sweep at the first load level: most goodput, then lowest P99."""
    scored = []
    for batching, r in sweep_grid(sc, quick):
        if r != 1:
            continue
        good, p99 = _measure(sc, batching, sc.first_rate, 60.0 if quick else 120.0)
        scored.append((-good, p99, batching.max_batch_size, batching))
    return min(scored, key=lambda s: s[:3])[3]


def model_analyzer_quick(sc: Scenario) -> Batching:
    """Powers of two; for each, the highest of a few loads it serves under the SLO; best of those."""
    cap = capacity(named_curve(sc.curve))
    best: tuple[float, float, Batching] | None = None
    for b in (1, 2, 4, 8, 16, 32, 64):
        batching = Batching(max_batch_size=b)
        served = 0.0
        p_at = math.inf
        for share in (0.3, 0.5, 0.7, 0.9):
            _, p99 = _measure(sc, batching, share * cap, 30.0)
            if p99 <= sc.slo_ms:
                served, p_at = share * cap, p99
        if best is None or (served, -p_at) > (best[0], -best[1]):
            best = (served, p_at, batching)
    assert best is not None
    return best[2]


# --- metrics -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Windows:
    good: npt.NDArray[np.float64]  # requests under the SLO, per window (by arrival)
    total: npt.NDArray[np.float64]
    p99_ms: npt.NDArray[np.float64]


def windows(run: Run, sc: Scenario) -> Windows:
    n = int(sc.trace.duration_s // INTERVAL)
    edges = np.searchsorted(run.arrivals, np.arange(n + 1) * INTERVAL)
    good, total, p99 = np.zeros(n), np.zeros(n), np.full(n, np.nan)
    slo_s = sc.slo_ms / 1000
    for i in range(n):
        lat = run.latency[edges[i] : edges[i + 1]]
        total[i] = len(lat)
        good[i] = np.sum(lat <= slo_s)
        if len(lat):
            p99[i] = np.percentile(lat, 99, method="higher") * 1000
    return Windows(good, total, p99)


def excluded(sc: Scenario, n: int) -> npt.NDArray[np.bool_]:
    """Windows within two intervals after a load step."""
    out = np.zeros(n, dtype=bool)
    for s in sc.trace.steps:
        first = int(s // INTERVAL)
        out[first : first + 2] = True
    return out


def settle_intervals(run: Run, w: Windows, sc: Scenario) -> list[float]:
    """Per step: intervals until the last bad window or config change before the next step."""
    out = []
    bounds = [*sc.trace.steps, sc.trace.duration_s]
    for k, s in enumerate(sc.trace.steps):
        first, last = int(s // INTERVAL), int(bounds[k + 1] // INTERVAL)
        bad = [i for i in range(first, last) if not w.p99_ms[i] <= sc.slo_ms]
        if bad and bad[-1] == last - 1:
            out.append(math.inf)
            continue
        end = (bad[-1] + 1) * INTERVAL if bad else s
        moves = [t for t, *_ in run.knobs if s <= t < bounds[k + 1]]
        if moves:
            end = max(end, moves[-1])
        out.append((end - s) / INTERVAL)
    return out


@dataclass(frozen=True)
class Row:
    scenario: str
    policy: str
    windows_ok: float
    windows_ok_ex: float
    requests_ok: float
    goodput_share: float
    settle: list[float]
    changes: int
    replica_seconds: float


def replica_seconds(run: Run, duration: float) -> float:
    total = 0.0
    for k, (t, _, _, r) in enumerate(run.knobs):
        end = run.knobs[k + 1][0] if k + 1 < len(run.knobs) else duration
        total += r * (end - t)
    return total


# --- driver --------------------------------------------------------------------------------------------


def run_scenario(args: tuple[Scenario, bool]) -> tuple[Scenario, list[Run], Windows, list[str]]:
    sc, quick = args
    notes = []
    t0 = time.perf_counter()
    sweep = [
        run_static(sc, b, r, f"sweep {b.max_batch_size}/{b.max_queue_delay_microseconds}/{r}")
        for b, r in sweep_grid(sc, quick)
    ]
    sweep_w = [windows(r, sc) for r in sweep]
    good = np.vstack([w.good for w in sweep_w])
    best = good.argmax(axis=0)
    oracle_good = good.max(axis=0)
    oracle_knobs = []
    for i, k in enumerate(best):
        b, r = sweep_grid(sc, quick)[k]
        oracle_knobs.append((i * INTERVAL, b.max_batch_size, b.max_queue_delay_microseconds, r))
    oracle_p99 = np.array([sweep_w[k].p99_ms[i] for i, k in enumerate(best)])
    oracle_w = Windows(oracle_good, sweep_w[0].total, oracle_p99)

    static_best = best_static_first_level(sc, quick)
    analyzer = model_analyzer_quick(sc)
    notes.append(
        f"best-static picked max batch {static_best.max_batch_size}, delay "
        f"{static_best.max_queue_delay_microseconds} us; model-analyzer picked max batch "
        f"{analyzer.max_batch_size}"
    )
    runs = [
        run_static(sc, Batching(max_batch_size=ENGINE_MAX), 1, "triton-default"),
        run_static(sc, static_best, 1, "best-static"),
        run_aimd(sc),
        run_static(sc, analyzer, 1, "model-analyzer"),
        run_tailtune(sc, Batching(), "tailtune"),
        run_tailtune(sc, Batching(max_batch_size=ENGINE_MAX), "tailtune@64"),
    ]
    oracle = Run("oracle", np.empty(0), np.empty(0), oracle_knobs)
    runs.append(oracle)
    notes.append(f"{sc.name}: {time.perf_counter() - t0:.0f} s")
    return sc, runs, oracle_w, notes


def rows_for(sc: Scenario, runs: list[Run], oracle_w: Windows) -> list[Row]:
    rows = []
    n = len(oracle_w.good)
    ex = excluded(sc, n)
    oracle_total = float(oracle_w.good.sum())
    for run in runs:
        w = oracle_w if run.policy == "oracle" else windows(run, sc)
        ok = w.p99_ms <= sc.slo_ms
        settle = [] if run.policy == "oracle" else settle_intervals(run, w, sc)
        rows.append(
            Row(
                scenario=sc.name,
                policy=run.policy,
                windows_ok=float(ok.mean()),
                windows_ok_ex=float(ok[~ex].mean()),
                requests_ok=float(w.good.sum() / max(1.0, w.total.sum())),
                goodput_share=float(w.good.sum()) / oracle_total,
                settle=settle,
                changes=run.changes,
                replica_seconds=replica_seconds(run, sc.trace.duration_s),
            )
        )
    return rows


COLORS = {
    "triton-default": "tab:blue",
    "best-static": "tab:orange",
    "aimd": "tab:green",
    "model-analyzer": "tab:brown",
    "tailtune": "tab:red",
    "tailtune@64": "tab:purple",
    "oracle": "tab:gray",
}


def plot(sc: Scenario, runs: list[Run], oracle_w: Windows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if sc.replicas_max > 1 else 2
    fig, axes = plt.subplots(panels, 1, figsize=(10, 3.2 * panels), sharex=True)
    ax = axes[0]
    mid = (np.arange(len(oracle_w.good)) + 0.5) * INTERVAL
    for run in runs:
        w = oracle_w if run.policy == "oracle" else windows(run, sc)
        p = np.where(np.isfinite(w.p99_ms), w.p99_ms, 1e5)
        ours = run.policy.startswith("tailtune")
        ax.plot(
            mid,
            p,
            "-" if ours else "--",
            color=COLORS[run.policy],
            label=run.policy,
            linewidth=2 if ours else 1,
        )
    ax.axhline(sc.slo_ms, color="k", linestyle=":", label="SLO")
    ax.set_yscale("log")
    ax.set_ylabel("P99 per 30 s window (ms)")
    ax.set_title(f"{sc.name}, SLO P99 <= {sc.slo_ms:g} ms (grey: offered load)")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    rate = ax.twinx()
    ts = np.arange(0, sc.trace.duration_s, 1.0)
    rate.plot(ts, [sc.trace.rate_at(t) for t in ts], color="grey", alpha=0.3)
    rate.set_ylabel("offered req/s", color="grey")
    for k, (label, col) in enumerate((("max batch", 1), ("replicas", 3))[: panels - 1]):
        a = axes[k + 1]
        for run in runs:
            if run.policy in STATIC_POLICIES and col == 3:
                continue
            xs = [kn[0] for kn in run.knobs] + [sc.trace.duration_s]
            ys = [kn[col] for kn in run.knobs]
            a.step(xs, [*ys, ys[-1]], where="post", color=COLORS[run.policy], label=run.policy)
        a.set_ylabel(label)
        a.legend(fontsize=7, ncol=4, loc="upper left")
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def fmt_settle(s: Sequence[float]) -> str:
    return ", ".join("never" if math.isinf(x) else f"{x:.0f}" for x in s) or "-"


def report(all_rows: list[Row], notes: list[str], quick: bool, elapsed: float) -> str:
    lines = [
        "# Tuner benchmark (simulator)",
        "",
        f"Mode: {'quick' if quick else 'full'}; {elapsed:.0f} s. Interval {INTERVAL:g} s, window "
        f"{WINDOW:g} s (Triton's 60 s summary), SLO P99 <= {SLO_MS:g} ms, engine max batch {ENGINE_MAX}, "
        f"one model instance per GPU, service-time noise {NOISE:.0%} (lognormal), seed {SEED}, new "
        "replicas ready after 30 s. "
        "tailtune starts from the InferenceService default (max batch 8, no delay), tailtune@64 from "
        "Triton's default; both with maxBatchSize 1-64, maxBatchStep 32, the rest of Tuning at its defaults.",
        "",
        "Columns: windows in SLO (all / outside the 2 intervals after a step), requests under the SLO, "
        "goodput (requests served within the SLO) as a share of the oracle's, intervals to settle after "
        "each step, config changes, replica-seconds.",
        "",
        "| scenario | policy | windows ok | ok ex-steps | requests ok | goodput / oracle | settle | changes "
        "| replica-s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in all_rows:
        lines.append(
            f"| {r.scenario} | {r.policy} | {r.windows_ok:.1%} | {r.windows_ok_ex:.1%} | {r.requests_ok:.2%} "
            f"| {r.goodput_share:.1%} | {fmt_settle(r.settle)} | {r.changes} | {r.replica_seconds:.0f} |"
        )
    lines += ["", "## Target check", ""]
    lines += [
        "| scenario | >= 95% oracle goodput | >= 99% windows ok ex-steps | settles <= 5 | beats AIMD "
        "| beats best-static |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r.scenario, r.policy): r for r in all_rows}

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    def beats(t: Row, other: Row) -> str:
        if t.goodput_share > other.goodput_share + 0.001:
            return "yes"
        return "tie" if t.goodput_share >= other.goodput_share - 0.001 else "**no**"

    for sc_name, who in (
        (n, w) for n in dict.fromkeys(r.scenario for r in all_rows) for w in ("tailtune", "tailtune@64")
    ):
        t = by[(sc_name, who)]
        a, s = by[(sc_name, "aimd")], by[(sc_name, "best-static")]
        lines.append(
            f"| {sc_name} {who} | {yes(t.goodput_share >= 0.95)} ({t.goodput_share:.1%}) "
            f"| {yes(t.windows_ok_ex >= 0.99)} ({t.windows_ok_ex:.1%}) "
            f"| {yes(all(x <= 5 for x in t.settle))} ({fmt_settle(t.settle)}) "
            f"| {beats(t, a)} | {beats(t, s)} |"
        )
    lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter traces (~1 min)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    work = [(sc, args.quick) for sc in scenarios(args.quick)]
    all_rows: list[Row] = []
    notes: list[str] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for sc, runs, oracle_w, sc_notes in pool.map(run_scenario, work):
            all_rows += rows_for(sc, runs, oracle_w)
            notes += sc_notes
            plot(sc, runs, oracle_w, args.out / f"{sc.name.replace('/', '_')}.png")
            print(f"done {sc.name}", file=sys.stderr)
    text = report(all_rows, notes, args.quick, time.perf_counter() - start)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
