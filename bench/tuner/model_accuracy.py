"""The queueing model (`tailtune.tuner.model`) against the discrete-event simulator, on a generated family.

    python bench/tuner/model_accuracy.py              # 300 accuracy cases, 100 ranking cases (~1 min)
    python bench/tuner/model_accuracy.py --seed 4     # another draw of the family

Accuracy: per case a curve (linear, power, stepwise, saturating), a max batch, 1 or 2 instances on one device
and a load (0.2-0.97 of the model's capacity); the model's P99 against the simulator's over 12,000 Poisson
arrivals. The error is log(predicted / simulated), by regime (instances, max batch, lambda t(1)).

Ranking: per case a curve, a load and an SLO 0.95-1.3x the best simulated P99 (tight SLOs, where the choice
matters); the max batch the model ranks first (lowest predicted P99 among those predicted within the SLO, else
the largest predicted share within it) against the simulator's best: the ratio of requests answered within the
SLO. Writes bench/out/model/report.md and accuracy.png (predicted vs simulated, log-log).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tailtune.tuner.model import capacity, predict  # noqa: E402
from tests.unit.tuner.families import KINDS, make_curve, ranking_ratios, simulate  # noqa: E402


def accuracy(seed: int, cases: int) -> list[tuple[int, int, float, float, float, str]]:
    """(instances, max batch, lambda t(1), predicted ms, simulated ms, kind) per case."""
    rng = np.random.default_rng(seed)
    rows = []
    for case in range(cases):
        kind = KINDS[case % len(KINDS)]
        t = make_curve(rng, kind)
        max_batch = int(rng.choice([1, 2, 3, 4, 6, 8, 16, 32, 64]))
        instances = int(rng.choice([1, 2]))
        rate = float(rng.uniform(0.2, 0.97)) * capacity(t, max_batch, 0)
        simulated = simulate(t, max_batch, instances, rate, 12_000, case).p99_ms
        predicted = predict(t, max_batch, 0, instances, rate).p_ms
        if math.isfinite(simulated) and math.isfinite(predicted):
            rows.append((instances, max_batch, rate * t(1) / 1000, predicted, simulated, kind))
    return rows


def regime_table(rows: list[tuple[int, int, float, float, float, str]]) -> list[str]:
    """Markdown rows: error by instances, max batch range and lambda t(1) range."""
    lines = [
        "| instances | max batch | lambda t(1) | cases | mean log error | mean abs log error |",
        "|---|---|---|---|---|---|",
    ]
    for instances in (1, 2):
        for lo, hi in ((1, 1), (2, 4), (6, 16), (32, 64)):
            for l1, l2 in ((0.0, 0.7), (0.7, 1.2), (1.2, math.inf)):
                e = [
                    math.log(p / s) for i, b, lt, p, s, _ in rows if i == instances and lo <= b <= hi and l1 <= lt < l2
                ]
                if e:
                    mean, spread = np.mean(e), np.mean(np.abs(e))
                    lines.append(f"| {instances} | {lo}-{hi} | {l1:g}-{l2:g} | {len(e)} | {mean:+.3f} | {spread:.3f} |")
    return lines


def plot(rows: list[tuple[int, int, float, float, float, str]], path: Path) -> None:
    """Predicted vs simulated P99, log-log, one colour per instance count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    for instances, colour in ((1, "tab:blue"), (2, "tab:orange")):
        pts = [(s, p) for i, _, _, p, s, _ in rows if i == instances]
        ax.scatter([s for s, _ in pts], [p for _, p in pts], s=10, c=colour, label=f"{instances} instance(s)")
    lo = min(min(r[3], r[4]) for r in rows)
    hi = max(max(r[3], r[4]) for r in rows)
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [2 * lo, 2 * hi], "k:", lw=0.6)
    ax.plot([lo, hi], [lo / 2, hi / 2], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("simulated P99 (ms)")
    ax.set_ylabel("model P99 (ms)")
    ax.set_title("queueing model vs simulator (dotted: x2, x0.5)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--ranking-cases", type=int, default=100)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "model")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = accuracy(args.seed, args.cases)
    ranks = ranking_ratios(args.seed, args.ranking_cases)
    e = np.array([math.log(p / s) for _, _, _, p, s, _ in rows])
    lines = [
        "# Queueing model vs simulator",
        "",
        f"`python bench/tuner/model_accuracy.py --seed {args.seed}`: {len(rows)} accuracy cases, "
        f"{args.ranking_cases} ranking cases x 2 instance counts.",
        "",
        f"Accuracy: mean |log(predicted/simulated)| {np.mean(np.abs(e)):.3f}, mean {np.mean(e):+.3f}, "
        f"worst {e.min():+.2f} / {e.max():+.2f}.",
        "",
        *regime_table(rows),
        "",
        "Ranking at tight SLOs (share within the SLO of the model's first choice / the simulator's best):",
        "",
        "| instances | min | 10th percentile | mean | cases under 0.99 |",
        "|---|---|---|---|---|",
    ]
    for instances in (1, 2):
        r = np.array([x for i, x in ranks if i == instances])
        under = f"{int((r < 0.99).sum())}/{len(r)}"
        lines.append(f"| {instances} | {r.min():.3f} | {np.percentile(r, 10):.3f} | {r.mean():.4f} | {under} |")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    plot(rows, args.out / "accuracy.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
