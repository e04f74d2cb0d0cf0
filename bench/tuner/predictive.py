"""Benchmark of the seasonal forecast (spec.tuning.forecast) on load that repeats, in the simulator.

    python bench/tuner/predictive.py                  # 18 generated scenarios (~10 min on one core)
    python bench/tuner/predictive.py --count 36 --jobs 2 --seed 7

Each scenario is drawn from a fixed seed: a curve t(b) = a + c*b^p on a ladder up to the engine's max, an SLO a few
times t(8), one instance, at most 2-4 replicas starting at one, the simulator's pod start (30 s) and a 30 s tuning
interval, and a trace of one of three families:

- `bursts`: a base load and a spike every 3-10 minutes (six periods), shorter than a pod start (10-25 s), of one
  of three shapes (a square, a ramp up over two steps, two spikes 30 s apart), up to 55-90 % of what the most
  replicas carry;
- `diurnal`: five compressed days of 20-30 minutes: a night (longer than the law's scale-in stabilization), a
  sharp morning rise (within one interval), a day with a midday dip, an evening decline;
- `random`: the controls, bursts of the same heights and lengths at random times (no period), where the
  forecast must not act.

Each runs the operator's loop (`tailtune.offline.whatif`, the engine of `tailtune simulate`) as `tailtune` (reactive)
and `predictive` (the forecast on), the per-window `oracle` (the best static config of a sweep at the most replicas,
clairvoyant) and `static-max`. Figures per run: goodput (requests answered within the SLO per second) against the
oracle's, over the whole trace and over the windows after the third period (the forecast needs three periods before
it acts), the windows in the SLO, replica-seconds, and how many decisions the forecast made (ScaledOutAhead,
HeldForForecast). Prints and writes bench/out/predictive/report.md (worst first: the scenario where the forecast
gains least), results.json and predictive.png.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tuner.report import family_parser, figure, md_table, run_family, save, write_report  # noqa: E402
from tailtune.offline.whatif import Setup, summarize  # noqa: E402
from tailtune.sim.curves import PiecewiseCurve  # noqa: E402
from tailtune.tuner.forecast import HELD_FOR_FORECAST, MIN_REPEATS, SCALED_OUT_AHEAD  # noqa: E402

OUT = ROOT / "bench" / "out" / "predictive"
SEED = 385
INTERVAL_S = 30.0  # the tuner's interval (spec.tuning.intervalSeconds' default)
POD_START_S = 30.0  # the simulator's pod start (Setup.pod_start_s)
PERIODS = 6  # periods per trace: three to learn the period, three where the forecast may act
DAYS = 5  # compressed days per trace (longer periods: three to learn, two where the forecast may act)
FAMILIES = ("bursts", "diurnal", "random")
SHAPES = ("square", "ramp", "double")
FORECAST_CODES = (SCALED_OUT_AHEAD, HELD_FOR_FORECAST)
POLICIES = ("tailtune", "predictive", "static-max")


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    setup: Setup
    period_s: float  # the trace's period (for `random`, the mean gap between bursts)


def _capacity(curve: PiecewiseCurve, slo_ms: float) -> float:
    """Most req/s one replica serves at a batch whose two executions fit in the SLO."""
    fits = [b for b in range(1, curve.engine_max + 1) if 2 * curve.ms(b) <= slo_ms] or [1]
    return max(1000.0 * b / curve.ms(b) for b in fits)


def _spike(shape: str, at: float, length: float, base: float, peak: float) -> list[tuple[float, float, float]]:
    """One spike of `length` s from `at` over `base`: its segments."""
    if shape == "ramp":
        half = length / 2
        return [(at, at + half, (base + peak) / 2), (at + half, at + length, peak)]
    if shape == "double":
        return [(at, at + length / 2, peak), (at + length / 2, at + 30, base), (at + 30, at + 30 + length / 2, peak)]
    return [(at, at + length, peak)]


def _fill(spikes: list[tuple[float, float, float]], base: float, end: float) -> tuple[tuple[float, float, float], ...]:
    """The spikes (in order, not overlapping) with the base load between them, to `end`."""
    segs: list[tuple[float, float, float]] = []
    t = 0.0
    for a, b, r in spikes:
        if a >= end:
            break
        if a > t:
            segs.append((t, a, base))
        segs.append((a, min(b, end), r))
        t = min(b, end)
    if t < end:
        segs.append((t, end, base))
    return tuple((float(a), float(b), float(r)) for a, b, r in segs if b > a)


def _diurnal(period: float, low: float, peak: float, rng: np.random.Generator) -> list[tuple[float, float, float]]:
    """One compressed day of `period` s in 10 s steps: night, a rise within one interval, a day with a dip at
    midday, a decline in the evening."""
    # A night longer than the law's scale-in stabilization (300 s), so the reactive law gives replicas back.
    rise_at = float(rng.uniform(0.35, 0.45)) * period
    fall_at = float(rng.uniform(0.75, 0.85)) * period
    step = 10.0
    out = []
    for k in range(int(period // step)):
        t = k * step
        if t < rise_at:
            r = low
        elif t < rise_at + INTERVAL_S:
            r = low + (peak - low) * (t - rise_at + step) / INTERVAL_S
        elif t < fall_at:
            mid = (rise_at + fall_at) / 2
            r = peak * (1 - 0.25 * np.exp(-(((t - mid) / (0.08 * period)) ** 2)))
        else:
            r = max(low, peak - (peak - low) * (t - fall_at) / (0.1 * period))
        out.append((t, t + step, float(r)))
    return out


def scenarios(count: int, seed: int) -> list[Scenario]:
    """The generated family (another seed draws another)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        family = FAMILIES[i % len(FAMILIES)]
        shape = SHAPES[(i // len(FAMILIES)) % len(SHAPES)]
        engine_max = int(rng.choice([16, 32]))
        a = float(rng.uniform(10.0, 30.0))  # slow enough that a trace of six periods stays under a few M requests
        c = a / float(rng.uniform(4.0, 20.0))
        p = float(rng.uniform(0.9, 1.3))
        sizes = [b for b in (1, 2, 4, 8, 16, 32) if b <= engine_max]
        curve = PiecewiseCurve(tuple((b, round(a + c * b**p, 4)) for b in sizes), f"a{a:.1f}c{c:.2f}p{p:.2f}")
        slo = round(float(rng.uniform(3.0, 6.0)) * curve.ms(8), 2)
        replicas_max = int(rng.integers(2, 5))
        fleet = replicas_max * _capacity(curve, slo)
        peak = fleet * float(rng.uniform(0.55, 0.9))
        base = _capacity(curve, slo) * float(rng.uniform(0.1, 0.35))
        length = float(rng.uniform(10.0, 25.0))
        if family == "diurnal":
            period = float(rng.choice([1200.0, 1500.0, 1800.0]))
            day = _diurnal(period, base, peak, rng)
            segs = tuple((a + k * period, b + k * period, r) for k in range(DAYS) for a, b, r in day)
            label = "day"
        else:
            # Mostly past the law's scale-in stabilization (300 s): below it the reactive law keeps the replicas of
            # one spike until the next.
            period = float(rng.choice([180.0, 360.0, 480.0, 600.0]))
            first = float(rng.uniform(30.0, period))
            if family == "bursts":
                starts = [first + k * period for k in range(PERIODS)]
            else:  # as many bursts at random times, at least a spike and a pod start apart
                gaps = rng.exponential(period - 60.0, size=PERIODS) + 60.0
                starts = list(first + np.cumsum(gaps) - gaps[0])
            spikes = [s for at in starts for s in _spike(shape, at, length, base, peak)]
            segs = _fill(spikes, base, PERIODS * period + first)
            label = shape
        setup = Setup(
            curve=curve,
            segments=segs,
            slo_ms=slo,
            instances=1,
            replicas=1,
            replicas_max=replicas_max,
            interval_s=INTERVAL_S,
            start_max_batch=8,
            seed=seed * 1000 + i,
            pod_start_s=POD_START_S,
        )
        name = f"{i:02d}-{family}-{label}-P{period:.0f}-r{replicas_max}"
        out.append(Scenario(name, family, setup, period))
    return out


def measure(sc: Scenario) -> dict[str, Any]:
    """The runs of one scenario and their figures."""
    setup = sc.setup
    learn_until = MIN_REPEATS * sc.period_s + setup.segments[0][1]  # the forecast acts only after three periods
    oracle = summarize(setup, "oracle")
    good_oracle = np.array([r["goodput_rps"] for r in oracle["timeline"]])
    late = np.array([r["t_s"] >= learn_until for r in oracle["timeline"]])
    row: dict[str, Any] = {
        "name": sc.name,
        "family": sc.family,
        "period_s": sc.period_s,
        "slo_ms": setup.slo_ms,
        "oracle_goodput_rps": oracle["goodput_rps"],
        "oracle_goodput_after_rps": float(good_oracle[late].mean()) if late.any() else None,
    }
    for policy in POLICIES:
        s = summarize(setup, policy)
        tl = s["timeline"]
        good = np.array([r["goodput_rps"] for r in tl])
        in_slo = np.array([r["p_ms"] is not None and r["p_ms"] <= setup.slo_ms for r in tl])
        row[policy] = {
            "goodput_rps": s["goodput_rps"],
            "goodput_vs_oracle": s["goodput_rps"] / max(oracle["goodput_rps"], 1e-9),
            "goodput_after_vs_oracle": float(good[late].sum() / max(good_oracle[late].sum(), 1e-9))
            if late.any()
            else None,
            "windows_in_slo": s["windows_in_slo"],
            "windows": s["windows"],
            "windows_in_slo_after": int(in_slo[late].sum()),
            "windows_after": int(late.sum()),
            "replica_seconds": s["replica_seconds"],
            "forecast_decisions": sum(1 for r in tl if r["decision"] in FORECAST_CODES),
            "summary": s if policy != "static-max" else None,
        }
    return row


def _gain(r: dict[str, Any]) -> float:
    return float(r["predictive"]["goodput_after_vs_oracle"] - r["tailtune"]["goodput_after_vs_oracle"])


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = ["scenario", "goodput/oracle reactive", "predictive", "after 3 periods: reactive", "predictive"]
    head += ["windows in SLO reactive", "predictive", "replica-s reactive", "predictive", "static-max"]
    head += ["forecast decisions"]
    body = []
    for r in sorted(rows, key=_gain):
        a, b, m = r["tailtune"], r["predictive"], r["static-max"]
        body.append(
            [
                r["name"],
                f"{a['goodput_vs_oracle']:.3f}",
                f"{b['goodput_vs_oracle']:.3f}",
                f"{a['goodput_after_vs_oracle']:.3f}",
                f"{b['goodput_after_vs_oracle']:.3f}",
                f"{a['windows_in_slo']}/{a['windows']}",
                f"{b['windows_in_slo']}/{b['windows']}",
                f"{a['replica_seconds']:.0f}",
                f"{b['replica_seconds']:.0f}",
                f"{m['replica_seconds']:.0f}",
                f"{b['forecast_decisions']}",
            ]
        )
    return md_table(head, body)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for family in FAMILIES:
        sel = [r for r in rows if r["family"] == family]
        if not sel:
            continue
        react = [r["tailtune"]["goodput_after_vs_oracle"] for r in sel]
        pred = [r["predictive"]["goodput_after_vs_oracle"] for r in sel]
        cost = [r["predictive"]["replica_seconds"] / max(r["tailtune"]["replica_seconds"], 1e-9) for r in sel]
        slo_r = sum(r["tailtune"]["windows_in_slo_after"] for r in sel)
        slo_p = sum(r["predictive"]["windows_in_slo_after"] for r in sel)
        after = sum(r["tailtune"]["windows_after"] for r in sel)
        acted = sum(1 for r in sel if r["predictive"]["forecast_decisions"] > 0)
        worst = min(sel, key=_gain)
        out.append(
            f"{family:>8} ({len(sel)}): goodput/oracle after 3 periods, reactive median {np.median(react):.3f} "
            f"(worst {min(react):.3f}), predictive median {np.median(pred):.3f} (worst {min(pred):.3f}); windows in "
            f"SLO after 3 periods {slo_r}/{after} -> {slo_p}/{after}; replica-seconds predictive/reactive median "
            f"{np.median(cost):.2f} (most {max(cost):.2f}); the forecast acted in {acted} of {len(sel)}; least gain: "
            f"{worst['name']} ({_gain(worst):+.3f})"
        )
    return out


def plot(rows: list[dict[str, Any]], path: Path, family: dict[str, Scenario]) -> None:
    from tailtune.offline.whatif import plot as plot_run

    fig, axes = figure(1, 2, (13, 5))
    colors = {"bursts": "C0", "diurnal": "C1", "random": "C2"}
    for fam, color in colors.items():
        sel = [r for r in rows if r["family"] == fam]
        axes[0].scatter(
            [r["tailtune"]["goodput_after_vs_oracle"] for r in sel],
            [r["predictive"]["goodput_after_vs_oracle"] for r in sel],
            color=color,
            label=fam,
        )
        axes[1].scatter(
            [r["predictive"]["replica_seconds"] / max(r["tailtune"]["replica_seconds"], 1e-9) for r in sel],
            [_gain(r) for r in sel],
            color=color,
            label=fam,
        )
    axes[0].plot([0, 1], [0, 1], "k--", lw=0.8)
    axes[0].set_xlabel("reactive goodput / oracle (after 3 periods)")
    axes[0].set_ylabel("predictive goodput / oracle (after 3 periods)")
    axes[1].axhline(0, color="black", lw=0.8)
    axes[1].axvline(1, color="black", lw=0.8)
    axes[1].set_xlabel("replica-seconds predictive / reactive")
    axes[1].set_ylabel("goodput / oracle gained (after 3 periods)")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    save(fig, path)
    # The worst scenario of each family (the least gain), run by run.
    for fam in FAMILIES:
        sel = [r for r in rows if r["family"] == fam]
        if sel:
            worst = min(sel, key=_gain)
            plot_run(
                family[worst["name"]].setup,
                [worst["tailtune"]["summary"], worst["predictive"]["summary"]],
                path.with_name(f"worst-{fam}.png"),
                title=f"least gain ({fam}): {worst['name']}",
            )


def main() -> int:
    ap = family_parser(__doc__, 18, SEED, ": 6 per family")
    args = ap.parse_args()
    started = time.time()
    family = scenarios(args.count, args.seed)
    rows = run_family(measure, family, args.jobs)
    lines = [
        f"# Seasonal forecast on repeating load ({len(rows)} scenarios, seed {args.seed}, "
        f"{time.time() - started:.0f} s)",
        "",
        "Worst first (the least goodput gained after three periods, predictive - reactive, as a share of the "
        "oracle's).",
        "",
        *table(rows),
        "",
        *summary(rows),
    ]
    slim = [{**r, **{p: {k: v for k, v in r[p].items() if k != "summary"} for p in POLICIES}} for r in rows]
    write_report(OUT, lines, slim, "predictive.png, worst-*.png")
    plot(rows, OUT / "predictive.png", {sc.name: sc for sc in family})
    return 0


if __name__ == "__main__":
    sys.exit(main())
