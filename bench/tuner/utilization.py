"""What spec.tuning.targetUtilization trades: replica-seconds on the cost family against harm out of sample.

    python bench/tuner/utilization.py                        # targets 0.85, 0.9, 0.95 (~1.5 h of CPU: --jobs)
    python bench/tuner/utilization.py --targets 0.85,0.95 --jobs 2 \\
        --cost-baselines bench/out/cost/results.json --wide-baselines bench/out/wide/results.json

For each target the cost family (`run.py --cost`: an hour of a daily swing or on/off phases on 4-8 replicas) and
the wide family (`run.py --wide`: 50 scenarios along axes the law was not tuned on) run with tailtune at that
target; the other policies do not read it, so they run once (or come from --*-baselines, results.json of an
earlier run of the same simulator and scenarios). Per target: tailtune / min-cost's replica-seconds (median, worst,
within 1.25x), the saving against static-max, the fair windows in SLO; on the wide family goodput >= 95 % of the
oracle, do no harm (>= max(Triton default, AIMD) - 1 point) and the worst goodput / oracle. Writes
bench/out/utilization/report.md, utilization.png and each run's folder beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tuner import run  # noqa: E402

OUT = ROOT / "bench" / "out" / "utilization"
TARGETS = (0.85, 0.9, 0.95)


def _family(flag: str, target: float, jobs: int, baselines: Path | None, out: Path) -> list[dict[str, Any]]:
    argv = [flag, "--jobs", str(jobs), "--out", str(out), "--target-utilization", str(target)]
    run.main(argv + (["--baselines", str(baselines)] if baselines else []))
    results: list[dict[str, Any]] = json.loads((out / "results.json").read_text())
    return results


def figures(cost: list[dict[str, Any]], wide: list[dict[str, Any]]) -> dict[str, float]:
    """One target's figures from its two families' results."""
    draw = {s.name: s for s in run.cost_scenarios()}
    c = [run.metrics(r, draw[r["name"]].setup if r["name"] in draw else None) for r in cost]
    w = [run.metrics(r) for r in wide]
    ratios = [x["cost_vs_min"] for x in c]
    return {
        "cost_median": float(np.median(ratios)),
        "cost_worst": max(ratios),
        "cost_within": sum(x <= run.COST_VS_MIN for x in ratios),
        "cost_n": len(ratios),
        "saving_median": float(np.median([x["saving_vs_static_max"] for x in c])),
        "fair_windows_min": min(x.get("in_slo_reachable", 1.0) for x in c),
        "wide_oracle": sum(x["vs_oracle"] >= run.GOODPUT_VS_ORACLE for x in w),
        "wide_harmless": sum(x["vs_best_baseline"] >= run.NO_HARM for x in w),
        "wide_worst": min(x["vs_oracle"] for x in w),
        "wide_worst_harm": min(x["vs_best_baseline"] for x in w),
        "wide_n": len(w),
    }


def plot(rows: list[tuple[float, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [u for u, _ in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(xs, [f["cost_median"] for _, f in rows], "o-", label="median")
    a.plot(xs, [f["cost_worst"] for _, f in rows], "s--", label="worst")
    a.axhline(run.COST_VS_MIN, color="grey", lw=0.8)
    a.set(xlabel="spec.tuning.targetUtilization", ylabel="replica-seconds / min-cost's", title="cost family")
    a.legend()
    b.plot(xs, [f["wide_worst"] for _, f in rows], "o-", label="worst goodput / oracle")
    b.plot(xs, [f["wide_worst_harm"] for _, f in rows], "s--", label="worst goodput / max(default, AIMD)")
    b.axhline(run.GOODPUT_VS_ORACLE, color="grey", lw=0.8)
    b.set(xlabel="spec.tuning.targetUtilization", ylabel="ratio", title="wide family (out of sample)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(map(str, TARGETS)), help="comma-separated targets")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--cost-baselines", type=Path, help="results.json of an earlier --cost run (its baselines)")
    ap.add_argument("--wide-baselines", type=Path, help="results.json of an earlier --wide run (its baselines)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"report folder (default {OUT})")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for u in (float(x) for x in args.targets.split(",")):
        cost = _family("--cost", u, args.jobs, args.cost_baselines, args.out / f"cost-{u:g}")
        wide = _family("--wide", u, args.jobs, args.wide_baselines, args.out / f"wide-{u:g}")
        rows.append((u, figures(cost, wide)))
    lines = [
        f"# spec.tuning.targetUtilization: cost against harm ({time.perf_counter() - t0:.0f} s)",
        "",
        "| target | cost / min-cost median | worst | within 1.25x | saving vs static-max median "
        "| fair windows in SLO min (cost) | wide >= 95 % of oracle | wide do no harm | wide worst / oracle "
        "| wide worst / max(default, AIMD) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for u, f in rows:
        lines.append(
            f"| {u:g} | {f['cost_median']:.3f} | {f['cost_worst']:.3f} | {f['cost_within']}/{f['cost_n']} "
            f"| {f['saving_median']:.1%} | {f['fair_windows_min']:.3f} | {f['wide_oracle']}/{f['wide_n']} "
            f"| {f['wide_harmless']}/{f['wide_n']} | {f['wide_worst']:.3f} | {f['wide_worst_harm']:.3f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text("\n".join([*lines, "", "![utilization](utilization.png)", ""]))
    plot(rows, args.out / "utilization.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
