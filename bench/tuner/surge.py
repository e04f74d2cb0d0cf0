"""Benchmark of the surge fast path (`tailtune.tuner.surge`, Knative-style panic mode) in the simulator.

    python bench/tuner/surge.py                  # 12 generated surges, with and without the fast path
    python bench/tuner/surge.py --count 40 --jobs 2 --seed 7
    python bench/tuner/surge.py --tuner-family   # bench/tuner/run.py's 120 scenarios, off and on (~10 min)

Each scenario is drawn from a fixed seed: a curve t(b) = a + c*b^p on a ladder up to the engine's max, an SLO a few
times t(8), 1-2 instances, at most 1-8 replicas starting at one, and a trace from near idle (a few % of one
replica) to a surge of 2-8 replicas' worth (capped at what the most replicas carry), in one of four shapes: a step,
a 20 s ramp, two steps 30 s apart, a spike of twice the surge for 10 s then the surge. The surge starts at a time
drawn between two ticks. Each runs the operator's loop (`tailtune`, through `tailtune.offline.whatif`) with the fast
path off and on, and the per-window oracle (clairvoyant, the most replicas from the start) for goodput.

Figures per run: seconds from the surge's start to the first scale-out asked (the simulator's knobs), the most
requests ever queued on the first pod (a pod's queue is its own: new replicas take none of it), seconds until the
fleet P99 (per 5 s of arrivals, a request never answered counted as late) stays within the SLO, and goodput / the
oracle's. Worst case first (the slowest scale-out with the fast path on). Goal (issue 38 item 4): the scale-out
asked <= 10 s after the surge starts, every scenario, fast path on. Writes bench/out/surge/report.md, results.json
and surge.png.
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
from tailtune.offline.whatif import Run, Setup, run_policy, summarize  # noqa: E402
from tailtune.sim.curves import PiecewiseCurve  # noqa: E402
from tailtune.tuner.surge import SURGE_SCALE_OUT  # noqa: E402

OUT = ROOT / "bench" / "out" / "surge"
SEED = 384
INTERVAL_S = 30.0  # the tuner's interval (spec.tuning.intervalSeconds' default)
GOAL_S = 10.0  # issue 38 item 4: the scale-out asked at most this long after a surge starts
AFTER_S = 600.0  # the surge lasts this long: pod start, the first pod's backlog drained (minutes), the P99 back
SHAPES = ("step", "ramp", "two-steps", "spike")


@dataclass(frozen=True)
class Scenario:
    name: str
    shape: str
    setup: Setup
    surge_at: float


def _capacity(curve: PiecewiseCurve, slo_ms: float) -> float:
    """Most req/s one replica serves at a batch whose two executions fit in the SLO."""
    fits = [b for b in range(1, curve.engine_max + 1) if 2 * curve.ms(b) <= slo_ms] or [1]
    return max(1000.0 * b / curve.ms(b) for b in fits)


def _segments(shape: str, base: float, surge: float, at: float) -> tuple[tuple[float, float, float], ...]:
    end = at + AFTER_S
    if shape == "step":
        return ((0.0, at, base), (at, end, surge))
    if shape == "ramp":  # 20 s in 5 s steps
        steps = [(at + 5 * k, at + 5 * (k + 1), base + (surge - base) * (k + 1) / 4) for k in range(4)]
        return ((0.0, at, base), *steps, (at + 20, end, surge))
    if shape == "two-steps":
        return ((0.0, at, base), (at, at + 30, (base + surge) / 2), (at + 30, end, surge))
    return ((0.0, at, base), (at, at + 10, 2 * surge), (at + 10, end, surge))


def scenarios(count: int, seed: int) -> list[Scenario]:
    """The generated surges (another seed draws another family)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        engine_max = int(rng.choice([16, 32, 64]))
        a = float(rng.uniform(4.0, 20.0))
        c = a / float(rng.uniform(4.0, 30.0))
        p = float(rng.uniform(0.8, 1.4))
        sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= engine_max]
        curve = PiecewiseCurve(tuple((b, round(a + c * b**p, 4)) for b in sizes), f"a{a:.1f}c{c:.2f}p{p:.2f}")
        slo = round(float(rng.uniform(3.0, 8.0)) * curve.ms(8), 2)
        replicas_max = int(rng.integers(1, 9))
        instances = int(rng.choice([1, 1, 2]))
        shape = SHAPES[i % len(SHAPES)]
        one = _capacity(curve, slo)
        worth = float(rng.uniform(2.0, 8.0))
        surge = one * min(worth, 0.8 * max(replicas_max, 1.25))  # what the most carry; one replica: overload
        base = one * float(rng.uniform(0.02, 0.08))
        at = 90.0 + float(rng.uniform(1.0, INTERVAL_S - 1.0))  # between the ticks at 90 and 120 s
        setup = Setup(
            curve=curve,
            segments=_segments(shape, base, surge, at),
            slo_ms=slo,
            instances=instances,
            replicas=1,
            replicas_max=replicas_max,
            interval_s=INTERVAL_S,
            start_max_batch=8,
            seed=seed * 1000 + i,
        )
        name = f"{i:02d}-{shape}-x{surge / one:.1f}-r{replicas_max}-i{instances}"
        out.append(Scenario(name, shape, setup, at))
    return out


def scale_out_s(run: Run, surge_at: float) -> float:
    """Seconds from the surge's start to the first scale-out asked after it; inf when none."""
    start = max((n for t, *_, n in run.knobs if t <= surge_at), default=1)
    return next((t - surge_at for t, *_, n in run.knobs if t > surge_at and n > start), math.inf)


def measure(sc: Scenario) -> dict[str, Any]:
    """Both runs of one scenario and the oracle, and their figures."""
    row: dict[str, Any] = {
        "name": sc.name,
        "shape": sc.shape,
        "slo_ms": sc.setup.slo_ms,
        "surge_at": sc.surge_at,
        "replicas_max": sc.setup.replicas_max,
    }
    oracle = summarize(sc.setup, "oracle")["goodput_rps"]
    for label, fast in (("off", False), ("on", True)):
        setup = dataclasses.replace(sc.setup, fast_path=fast)
        run = run_policy(setup, "tailtune")
        s = summarize(setup, "tailtune", run)
        p99 = report.slot_percentile(run, setup, answered_only=False)
        row[label] = {
            "scale_out_s": scale_out_s(run, sc.surge_at),
            "first_pod_queue_max": run.first_pod_queue_max,
            "recovery_s": report.recovery_s(p99, setup.slo_ms, sc.surge_at),
            "goodput_rps": s["goodput_rps"],
            "goodput_vs_oracle": s["goodput_rps"] / max(oracle, 1e-9),
            "replica_seconds": s["replica_seconds"],
            "p99_slots": [None if math.isnan(x) else round(float(min(x, 1e9)), 3) for x in p99],
            "knobs": [(t, n) for t, *_, n in run.knobs],
        }
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = [f"{'scenario':<26}", "scale-out s off", "on", "first pod queue off", "on", "P99 back s off", "on"]
    head += ["goodput/oracle off", "on"]
    body = [
        [
            f"{r['name']:<26}",
            f"{report.fmt_s(r['off']['scale_out_s']):>15}",
            f"{report.fmt_s(r['on']['scale_out_s']):>3}",
            f"{r['off']['first_pod_queue_max']:19d}",
            f"{r['on']['first_pod_queue_max']:6d}",
            f"{report.fmt_s(r['off']['recovery_s']):>14}",
            f"{report.fmt_s(r['on']['recovery_s']):>5}",
            f"{r['off']['goodput_vs_oracle']:18.3f}",
            f"{r['on']['goodput_vs_oracle']:.3f}",
        ]
        for r in rows
    ]
    return report.md_table(head, body)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    scaled = [r for r in rows if r["replicas_max"] > 1]
    out = []
    for label in ("off", "on"):
        so = [r[label]["scale_out_s"] for r in scaled]
        q = [r[label]["first_pod_queue_max"] for r in rows]
        rec = [r[label]["recovery_s"] for r in rows]
        g = [r[label]["goodput_vs_oracle"] for r in rows]
        out.append(
            f"fast path {label}: scale-out asked after median {report.fmt_s(float(np.median(so)))} s (worst "
            f"{report.fmt_s(max(so))}) over {len(scaled)} scenarios that can scale; first pod's queue median "
            f"{np.median(q):.0f} (most {max(q)}); P99 back within the SLO median "
            f"{report.fmt_s(float(np.median(rec)))} s "
            f"(worst {report.fmt_s(max(rec))}); goodput / oracle median {np.median(g):.3f} (worst {min(g):.3f})"
        )
    ratio = [r["on"]["first_pod_queue_max"] / max(r["off"]["first_pod_queue_max"], 1) for r in scaled]
    gain = [r["on"]["goodput_vs_oracle"] / max(r["off"]["goodput_vs_oracle"], 1e-9) for r in rows]
    out.append(
        f"on / off: first pod's queue median {np.median(ratio):.2f} (worst {max(ratio):.2f}); goodput median "
        f"{np.median(gain):.3f} (worst {min(gain):.3f})"
    )
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    worst = rows[0]
    fig, axes = report.figure(2, 2, (13, 8))
    ax = axes[0][0]
    report.off_on_percentile(ax, worst, "fast path ")
    ax.axvline(worst["surge_at"], color="grey", linestyle=":", label="surge")
    ax.set_ylabel("fleet P99 per 5 s of arrivals (ms)")
    ax.set_title(f"worst (slowest scale-out, fast path on): {worst['name']}", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for label, color in report.OFF_ON:
        knobs = worst[label]["knobs"]
        ax.step([t for t, _ in knobs] + [worst["surge_at"] + AFTER_S], [n for _, n in knobs] + [knobs[-1][1]],
                color=color, where="post", label=f"replicas asked, {label}")  # fmt: skip
    ax.axvline(worst["surge_at"], color="grey", linestyle=":")
    ax.set_ylabel("replicas")
    ax.legend(fontsize=7)
    ax = axes[1][0]
    report.off_on_bars(ax, rows, lambda run: min(60.0, run["scale_out_s"]), "")
    ax.axhline(GOAL_S, color="black", linestyle="--", label=f"goal {GOAL_S:.0f} s")
    ax.set_ylabel("surge start -> scale-out asked (s; none drawn at 60)")
    ax.legend(fontsize=7)
    ax = axes[1][1]
    report.off_on_bars(ax, rows, lambda run: max(1, run["first_pod_queue_max"]), "")
    ax.set_yscale("log")
    ax.set_ylabel("most requests queued on the first pod")
    ax.legend(fontsize=7)
    report.save(fig, path)


def tuner_family(jobs: int) -> int:
    """bench/tuner/run.py's in-sample family with the fast path off and on: where it fires, and goodput and
    replica-seconds on / off (a fast path that fires where the law copes costs replicas)."""
    from bench.tuner.run import scenarios as tuner_scenarios

    started = time.time()
    rows = report.run_family(_both, tuner_scenarios(False), jobs)
    gain = [on[0] / max(off[0], 1e-9) for _, off, on, _ in rows]
    cost = [on[1] / max(off[1], 1e-9) for _, off, on, _ in rows]
    fired = [name for name, *_, n in rows if n]
    print(
        f"{len(rows)} scenarios of bench/tuner/run.py ({time.time() - started:.0f} s): the fast path fired in "
        f"{len(fired)} ({', '.join(fired) or 'none'}); goodput on / off median {np.median(gain):.3f} (min "
        f"{min(gain):.3f}, max {max(gain):.3f}); replica-seconds on / off median {np.median(cost):.3f} (max "
        f"{max(cost):.3f})"
    )
    return 0


def _both(sc: Any) -> tuple[str, tuple[float, float], tuple[float, float], int]:
    out = []
    fired = 0
    for fast in (False, True):
        setup = dataclasses.replace(sc.setup, fast_path=fast)
        run = run_policy(setup, "tailtune")
        s = summarize(setup, "tailtune", run)
        out.append((s["goodput_rps"], s["replica_seconds"]))
        fired = sum(1 for _, code, _ in run.codes if code == SURGE_SCALE_OUT)
    return sc.name, out[0], out[1], fired


def main() -> int:
    ap = report.family_parser(__doc__, 12, SEED)
    ap.add_argument("--tuner-family", action="store_true", help="bench/tuner/run.py's 120 scenarios, off and on")
    args = ap.parse_args()
    if args.tuner_family:
        return tuner_family(args.jobs)
    started = time.time()
    rows = report.run_family(measure, scenarios(args.count, args.seed), args.jobs)
    rows.sort(key=lambda r: (-r["on"]["scale_out_s"] if r["replicas_max"] > 1 else 0.0, -r["on"]["recovery_s"]))
    missed = [r for r in rows if r["replicas_max"] > 1 and r["on"]["scale_out_s"] > GOAL_S]
    lines = [
        f"# Surge fast path ({len(rows)} scenarios, seed {args.seed}, {time.time() - started:.0f} s), worst first",
        "",
        *table(rows),
        "",
        *summary(rows),
        "",
        f"goal (scale-out asked <= {GOAL_S:.0f} s after the surge starts, fast path on, where the spec allows one): "
        + ("met in every scenario" if not missed else f"MISSED in {report.named(missed)}"),
    ]
    report.write_report(OUT, lines, rows, "surge.png")
    plot(rows, OUT / "surge.png")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
