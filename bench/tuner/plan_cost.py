"""What planning on dense live curves costs, and what thinning the candidate sizes gives up.

    python bench/tuner/plan_cost.py                 # 24 curves at max batch 64-256, both ways (~10 min on 2 cores)
    python bench/tuner/plan_cost.py --count 8       # fewer

Live statistics measure every executed size, so the planner (`law.best_plan`) can face a curve with a point
at every batch size. Per case: a curve of a family (linear, power, stepwise, saturating, with 3 % measurement
noise), measured at every size up to a max batch of 64, 128 or 256, a load of 0.3-0.9 of one replica's
capacity and an SLO 2.5-5x a mid-size batch. The planner runs twice in the same process: with every measured
size as a candidate (the baseline: the law before `_measured_sizes`) and with the thinned sizes. Reported:
the time ratio (baseline / thinned) and the load the chosen config carries within the aim (thinned /
baseline: 1.0 is no loss), worst case first. Writes bench/out/plan_cost/report.md and plan_cost.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tailtune.api.v1alpha1 import IntRange, Replicas, Slo, Tuning  # noqa: E402
from tailtune.tuner import law  # noqa: E402
from tailtune.tuner.model import capacity  # noqa: E402
from tailtune.tuner.servicetime import Curve, CurvePoint  # noqa: E402
from tailtune.tuner.types import Policy  # noqa: E402
from tests.unit.tuner.families import KINDS, make_curve  # noqa: E402

OUT = ROOT / "bench" / "out" / "plan_cost"


def case(seed: int, i: int) -> tuple[str, int, Curve, Policy, float]:
    rng = np.random.default_rng([seed, i])
    kind = KINDS[i % len(KINDS)]
    t = make_curve(rng, kind)
    top = int(rng.choice([64, 128, 256]))
    curve = Curve([CurvePoint(batch=b, ms=t(b) * float(rng.uniform(0.97, 1.03))) for b in range(1, top + 1)])
    slo = float(rng.uniform(2.5, 5.0)) * curve.ms(min(top, 8))
    policy = Policy.from_spec(
        Slo(latency_ms=round(slo, 3)), Tuning(max_batch_size=IntRange(min=1, max=top)), Replicas(min=1, max=4), top
    )
    load = float(rng.uniform(0.3, 0.9)) * capacity(curve.ms, top)
    return kind, top, curve, policy, load


def timed(curve: Curve, policy: Policy, load: float) -> tuple[float, float, int]:
    law._capacity.cache_clear()
    t0 = time.perf_counter()
    plan = law.best_plan(curve, load, policy)
    return time.perf_counter() - t0, plan.candidate.carries() * plan.replicas, plan.candidate.max_batch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--count", type=int, default=24)
    args = ap.parse_args(argv)
    rows = []
    for i in range(args.count):
        kind, top, curve, policy, load = case(args.seed, i)
        thin_s, thin_rps, thin_mb = timed(curve, policy, load)
        with mock.patch.object(law, "_measured_sizes", lambda c: set(c.sizes)):
            all_s, all_rps, all_mb = timed(curve, policy, load)
        rows.append((kind, top, all_s / thin_s, thin_rps / all_rps if all_rps > 0 else 1.0, all_mb, thin_mb))
        print(f"{i:02d} {kind:<10} max {top:>3}: {all_s:6.2f} s -> {thin_s:5.2f} s; carries x{rows[-1][3]:.3f} "
              f"(max batch {all_mb} -> {thin_mb})", flush=True)  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    speed = np.array([r[2] for r in rows])
    kept = np.array([r[3] for r in rows])
    lines = [
        "# Planning on dense live curves: every measured size vs the thinned candidates",
        "",
        f"`python bench/tuner/plan_cost.py --seed {args.seed} --count {args.count}`",
        "",
        f"- time, baseline / thinned: min {speed.min():.1f}x, median {np.median(speed):.1f}x",
        f"- load carried within the aim, thinned / baseline: worst {kept.min():.3f}, median {np.median(kept):.3f}",
        "",
        "| curve | max batch | speed-up | carried (thinned / all) | max batch (all -> thinned) |",
        "|---|---|---|---|---|",
        *(f"| {k} | {t} | {s:.1f}x | {c:.3f} | {a} -> {b} |" for k, t, s, c, a, b in sorted(rows, key=lambda r: r[3])),
    ]
    (OUT / "report.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in KINDS:
        pts = [(r[2], r[3]) for r in rows if r[0] == kind]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("planning time, every size / thinned")
    ax.set_ylabel("load carried within the aim, thinned / every size")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "plan_cost.png", dpi=120)
    print("\n".join(lines[:7]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
