"""Benchmark of the pure reconcile path: desired objects + status for one InferenceService.

Figures are ratios against a baseline measured in the same run (parsing the object with pydantic, the cost
every reconcile pays anyway), because this machine is shared and noisy. Writes bench/out/reconcile/.
Run: .venv/bin/python bench/reconcile/bench_reconcile.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tailtune.api import InferenceService  # noqa: E402
from tailtune.api.v1alpha1 import LatencyStatus  # noqa: E402
from tailtune.operator import status as st  # noqa: E402
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed  # noqa: E402
from tailtune.operator.reconcile import batching_status, desired_state  # noqa: E402
from tests.unit.factories import make_isvc  # noqa: E402

OUT = ROOT / "bench" / "out" / "reconcile"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def per_call_us(fn: Callable[[], object], repeat: int = 7, number: int = 200) -> float:
    """Median over `repeat` rounds of the mean time of one call, in microseconds."""
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - t0) / number * 1e6)
    return statistics.median(rounds)


def main() -> int:
    raw = make_isvc("bench").dict()
    isvc = InferenceService.model_validate(raw)
    ready = Observed(
        job=JobObservation(succeeded=True),
        deployment=DeploymentObservation(replicas=2, ready_replicas=2, ready_pod_ips=("10.0.0.1", "10.0.0.2")),
    )

    def full() -> object:
        desired = desired_state(isvc, ready)
        return st.compute_status(
            isvc, ready,
            engine_info=st.engine_status(desired.cache_key, "s", desired.engine_info, isvc.status.engine),
            batching=batching_status(desired.applied), desired_replicas=2, latency=LatencyStatus(), now=NOW,
        )  # fmt: skip

    cases = {
        "parse (baseline)": lambda: InferenceService.model_validate(raw),
        "desired: build Job only": lambda: desired_state(isvc, Observed()),
        "desired: serving objects": lambda: desired_state(isvc, ready),
        "desired + status": full,
    }
    results = {name: per_call_us(fn) for name, fn in cases.items()}
    base = results["parse (baseline)"]
    OUT.mkdir(parents=True, exist_ok=True)
    lines = ["| step | µs per resource | x parse |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v:.0f} | {v / base:.1f} |" for k, v in results.items()]
    (OUT / "report.md").write_text("# Pure reconcile path\n\n" + "\n".join(lines) + "\n")
    (OUT / "results.json").write_text(
        json.dumps({"us": results, "ratio_to_parse": {k: v / base for k, v in results.items()}}, indent=2)
    )
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(list(results), [v / base for v in results.values()], color="#4c72b0")
    ax.set_xlabel("time per resource, x pydantic parse of the same object")
    ax.set_title("tailtune pure reconcile path")
    fig.tight_layout()
    fig.savefig(OUT / "reconcile.png", dpi=120)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
