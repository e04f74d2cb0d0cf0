"""Benchmark of load shedding (spec.serving.shedding) in overload surges, in the simulator.

    python bench/tuner/shedding.py               # 12 generated surges (~2 min on 2 cores)
    python bench/tuner/shedding.py --count 40 --jobs 2 --seed 7

Each scenario is drawn from a fixed seed: a curve t(b) = a + c*b^p on a ladder up to the engine's max, an SLO a few
times t(8), 1-2 instances, a fleet of at most 1-4 replicas starting at one, and a trace that steps from a base load
to a surge and back. Half the surges stay within what the most replicas carry (the overload lasts until the
scale-out is ready), half go past it (the overload lasts as long as the surge). Each runs the operator's loop
(`tailtune`, through `tailtune.offline.whatif`, the engine of `tailtune simulate`) with shedding off and on.

Figures per run: goodput (requests answered within the SLO per second, over the trace), the share of arrivals
shedding rejected, the worst answered P99 (fleet-wide, per 5 s of arrivals) after the surge began, and the
recovery: from the surge's start, how long until the answered P99 stays within the SLO to the trace's end (0 when
it never left it; "never" when the last 5 s still miss it). Prints a table, the medians and worst cases, and
whether every run with shedding recovered within RECOVERY_GOAL_S (issue 38's goal). Writes
bench/out/shedding/report.md, results.json and shedding.png (the worst recovery off and on, and every scenario's
recovery, goodput and rejected share).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tuner import report  # noqa: E402
from tailtune.offline.whatif import Setup, run_policy, summarize  # noqa: E402
from tailtune.sim.curves import PiecewiseCurve  # noqa: E402

OUT = ROOT / "bench" / "out" / "shedding"
SEED = 38
INTERVAL_S = 30.0  # the tuner's interval (spec.tuning.intervalSeconds' default)
RECOVERY_GOAL_S = 60.0  # issue 38: the answered P99 back within the SLO at most this long after a surge
BASE_S, SURGE_S, AFTER_S = 120.0, 240.0, 120.0


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "reachable": the most replicas carry the surge; "beyond": they do not
    setup: Setup
    surge_at: float


def _capacity(curve: PiecewiseCurve, slo_ms: float) -> float:
    """Most req/s one replica serves at a batch whose two executions fit in the SLO."""
    fits = [b for b in range(1, curve.engine_max + 1) if 2 * curve.ms(b) <= slo_ms] or [1]
    return max(1000.0 * b / curve.ms(b) for b in fits)


def scenarios(count: int, seed: int) -> list[Scenario]:
    """The generated surges (another seed draws another family)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        engine_max = int(rng.choice([16, 32, 64]))
        a = float(rng.uniform(2.0, 10.0))
        c = a / float(rng.uniform(4.0, 30.0))
        p = float(rng.uniform(0.8, 1.4))
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= engine_max]
        curve = PiecewiseCurve(tuple((b, round(a + c * b**p, 4)) for b in sizes), f"a{a:.1f}c{c:.2f}p{p:.2f}")
        slo = round(float(rng.uniform(3.0, 8.0)) * curve.ms(8), 2)
        replicas_max = int(rng.integers(1, 5))
        instances = int(rng.choice([1, 1, 2]))
        kind = "reachable" if i % 2 == 0 else "beyond"
        fleet = replicas_max * _capacity(curve, slo)
        surge = fleet * float(rng.uniform(0.5, 0.85) if kind == "reachable" else rng.uniform(1.3, 2.5))
        if kind == "reachable" and replicas_max == 1:
            surge = fleet * float(rng.uniform(1.3, 2.5))  # one replica cannot scale: every surge is beyond it
            kind = "beyond"
        base = min(surge, _capacity(curve, slo)) * float(rng.uniform(0.2, 0.5))
        segs = (
            (0.0, BASE_S, base),
            (BASE_S, BASE_S + SURGE_S, surge),
            (BASE_S + SURGE_S, BASE_S + SURGE_S + AFTER_S, base),
        )
        setup = Setup(
            curve=curve,
            segments=segs,
            slo_ms=slo,
            instances=instances,
            replicas=1,
            replicas_max=replicas_max,
            interval_s=INTERVAL_S,
            start_max_batch=8,
            seed=seed * 1000 + i,
        )
        name = f"{i:02d}-{kind}-x{surge / fleet:.2f}-r{replicas_max}-i{instances}"
        out.append(Scenario(name, kind, setup, BASE_S))
    return out


def measure(sc: Scenario) -> dict[str, Any]:
    """Both runs of one scenario and their figures."""
    row: dict[str, Any] = {"name": sc.name, "kind": sc.kind, "slo_ms": sc.setup.slo_ms, "curve": sc.setup.curve.name}
    for label, shed in (("off", False), ("on", True)):
        setup = dataclasses.replace(sc.setup, shed=shed)
        run = run_policy(setup, "tailtune")
        s = summarize(setup, "tailtune", run)
        p99 = report.slot_percentile(run, setup, answered_only=True)
        after = p99[int(sc.surge_at // report.SLOT_S) :]
        row[label] = {
            "goodput_rps": s["goodput_rps"],
            "offered_rps": s["offered_rps"],
            "rejected_share": s["rejected_share"],
            "never_answered_share": float(np.mean(~np.isfinite(run.latency))) - s["rejected_share"],
            "worst_answered_p99_ms": float(np.nanmax(after)) if np.isfinite(after).any() else None,
            "recovery_s": report.recovery_s(p99, setup.slo_ms, sc.surge_at),
            "replica_seconds": s["replica_seconds"],
            "p99_slots": [None if not math.isfinite(x) else round(float(x), 3) for x in p99],
            "replicas": [(r["t_s"], r["replicas"]) for r in s["timeline"]],
            "rejected_windows": [r["rejected_share"] for r in s["timeline"]],
        }
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = [f"{'scenario':<28}", "SLO ms", "goodput off", "goodput on", "rejected on", "worst P99/SLO off", "on"]
    head += ["recovery s off", "on"]
    body = []
    for r in rows:
        off, on = r["off"], r["on"]

        def ratio(x: float | None, slo: float = r["slo_ms"]) -> str:
            return "-" if x is None else f"{x / slo:.2f}"

        body.append(
            [
                f"{r['name']:<28}",
                f"{r['slo_ms']:6.1f}",
                f"{off['goodput_rps']:11.1f}",
                f"{on['goodput_rps']:10.1f}",
                f"{100 * on['rejected_share']:10.1f} %",
                f"{ratio(off['worst_answered_p99_ms']):>17}",
                f"{ratio(on['worst_answered_p99_ms']):>4}",
                f"{report.fmt_s(off['recovery_s']):>14}",
                f"{report.fmt_s(on['recovery_s']):>4}",
            ]
        )
    return report.md_table(head, body)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for kind in ("reachable", "beyond", "all"):
        sel = [r for r in rows if kind in ("all", r["kind"])]
        if not sel:
            continue
        gain = [r["on"]["goodput_rps"] / max(r["off"]["goodput_rps"], 1e-9) for r in sel]
        rej = [100 * r["on"]["rejected_share"] for r in sel]
        rec_off = [r["off"]["recovery_s"] for r in sel]
        rec_on = [r["on"]["recovery_s"] for r in sel]
        out.append(
            f"{kind:>9} ({len(sel)}): goodput on/off median {np.median(gain):.2f} (worst {min(gain):.2f}); "
            f"rejected median {np.median(rej):.1f} % (most {max(rej):.1f} %); recovery off median "
            f"{report.fmt_s(float(np.median(rec_off)))} s (worst {report.fmt_s(max(rec_off))}), on median "
            f"{report.fmt_s(float(np.median(rec_on)))} s (worst {report.fmt_s(max(rec_on))})"
        )
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    worst = max(rows, key=lambda r: (r["on"]["recovery_s"], r["off"]["recovery_s"]))
    fig, axes = report.figure(2, 2, (13, 8))
    ax = axes[0][0]
    report.off_on_percentile(ax, worst, "shedding ")
    ax.axvspan(BASE_S, BASE_S + SURGE_S, color="grey", alpha=0.15, label="surge")
    ax.set_ylabel("answered P99 per 5 s (ms)")
    ax.set_title(f"slowest to recover (shedding on, then off): {worst['name']}", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for label, color in report.OFF_ON:
        reps = worst[label]["replicas"]
        ax.step(
            [t + INTERVAL_S for t, _ in reps],
            [n for _, n in reps],
            color=color,
            where="pre",
            label=f"replicas, {label}",
        )
    share = worst["on"]["rejected_windows"]
    ax2 = ax.twinx()
    ax2.step([(i + 1) * INTERVAL_S for i in range(len(share))], [100 * x for x in share], "C3:", where="pre")
    ax2.set_ylabel("rejected with shedding (%)", color="C3")
    ax.set_ylabel("replicas")
    ax.legend(fontsize=7, loc="upper left")
    idx = np.arange(len(rows))
    ax = axes[1][0]
    cap = 2 * (BASE_S + SURGE_S + AFTER_S)
    report.off_on_bars(ax, rows, lambda run: min(cap, run["recovery_s"]), "shedding ")
    ax.axhline(RECOVERY_GOAL_S, color="black", linestyle="--", label=f"goal {RECOVERY_GOAL_S:.0f} s")
    ax.set_ylabel("recovery of the answered P99 (s; 'never' drawn at the top)")
    ax.legend(fontsize=7)
    ax = axes[1][1]
    ax.bar(
        idx,
        [r["on"]["goodput_rps"] / max(r["off"]["goodput_rps"], 1e-9) for r in rows],
        0.4,
        color="C2",
        label="goodput on / off",
    )
    ax.bar(idx + 0.4, [10 * r["on"]["rejected_share"] for r in rows], 0.4, color="C3", label="rejected share x10")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(idx + 0.2, [r["name"][:2] for r in rows])
    ax.legend(fontsize=7)
    report.save(fig, path)


def main() -> int:
    ap = report.family_parser(__doc__, 12, SEED)
    args = ap.parse_args()
    started = time.time()
    rows = report.run_family(measure, scenarios(args.count, args.seed), args.jobs)
    goal = [r for r in rows if r["on"]["recovery_s"] > RECOVERY_GOAL_S]
    lines = [
        f"# Load shedding in overload surges ({len(rows)} scenarios, seed {args.seed}, {time.time() - started:.0f} s)",
        "",
        *table(rows),
        "",
        *summary(rows),
        "",
        f"goal (answered P99 within the SLO <= {RECOVERY_GOAL_S:.0f} s after the surge, shedding on): "
        + ("met in every scenario" if not goal else f"MISSED in {report.named(goal)}"),
    ]
    report.write_report(OUT, lines, rows, "shedding.png")
    plot(rows, OUT / "shedding.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
