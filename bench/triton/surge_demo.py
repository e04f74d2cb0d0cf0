"""The surge fast path on the demo runtime: real tritonservers as pods, a real Prometheus, the operator, a load step
from near idle to more than one replica carries; the scale-out's time with the fast path off and on.

    python bench/triton/surge_demo.py [--high-rps 150] [--duration 120] [--only on|off]

Each run is `tailtune demo` (devkit.demo) on a variant of examples/demo.yaml: the default tuning interval (30 s,
not the demo's 5 s), a slower emulated device (t(b) = 20 + 4 b^1.3 ms: max batch 8 serves ~100 req/s a pod, so a
surge of 1.5 pods' worth stays within what two shared cores send), max batch 8 from the start, an SLO of 300 ms and
at most 3 replicas. The load steps from --low-rps to --high-rps a quarter in. The fast path is off in the first run
(the operator started with TAILTUNE_FAST_PATH=0) and on in the second. Figures: seconds from the load step to the
first scale-out the operator recorded (the config in force's changedAt, load clock), the client-side P99 of the
30 s after the step, and each run's decisions. Writes bench/out/surge_demo/report.md and results.json; exits 1 when
the scale-out with the fast path comes later than 10 s after the step (issue 38 item 4).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devkit.checkout import find_checkout  # noqa: E402
from devkit.demo import Demo, parser  # noqa: E402
from tailtune.operator.handlers import FAST_PATH_ENV  # noqa: E402

OUT = ROOT / "bench" / "out" / "surge_demo"
GOAL_S = 10.0  # issue 38 item 4
DEVICE = {  # the emulated device (devkit.emulation's annotations)
    "emulated-gpu.dev.tailtune.io/base-ms": "20",
    "emulated-gpu.dev.tailtune.io/per-item-ms": "4",
    "emulated-gpu.dev.tailtune.io/exponent": "1.3",
}


def variant(example: dict[str, Any]) -> dict[str, Any]:
    """examples/demo.yaml with the default tuning interval, a slower device, max batch 8 and a 300 ms SLO."""
    doc = copy.deepcopy(example)
    spec = doc["spec"]
    spec["engine"]["podAnnotations"] = dict(DEVICE)
    spec["serving"]["podAnnotations"] = dict(DEVICE)
    spec["serving"]["replicas"] = {"min": 1, "max": 3}
    spec["serving"]["batching"] = {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 0}
    spec["slo"] = {"latencyMs": 300, "percentile": 99, "windowSeconds": 30}
    spec["tuning"]["intervalSeconds"] = 30
    spec["tuning"]["cooldownSeconds"] = 30
    return doc


def _replicas(config: str) -> int:
    m = re.search(r"(\d+) replicas", config)
    return int(m.group(1)) if m else 0


def run_once(fast: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One demo run; its summary's figures for the step."""
    checkout = find_checkout()
    label = "on" if fast else "off"
    out, work = OUT / label, checkout.cache / f"surge-demo-{label}"
    demo_args = parser(checkout).parse_args(
        [
            "--duration",
            str(args.duration),
            "--low-rps",
            str(args.low_rps),
            "--high-rps",
            str(args.high_rps),
            "--out",
            str(out),
            "--workdir",
            str(work),
        ]
    )
    example = variant(yaml.safe_load((checkout.examples / "demo.yaml").read_text()))
    os.environ[FAST_PATH_ENV] = "1" if fast else "0"  # the operator inherits the demo's environment
    started = time.time()
    code = Demo(demo_args, Console(), checkout, example).run()
    summary = json.loads((out / "summary.json").read_text())
    step = float(summary["step_at_s"])
    before = max([_replicas(d["config"]) for d in summary["decisions"] if d["t"] <= step] or [1])
    scale_out = next(
        (d["t"] - step for d in summary["decisions"] if d["t"] > step and _replicas(d["config"]) > before), None
    )
    return {
        "fast_path": label,
        "exit": code,
        "wall_s": round(time.time() - started),
        "step_at_s": step,
        "scale_out_s": scale_out,
        "after": summary.get("after"),
        "decisions": summary["decisions"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--low-rps", type=float, default=3.0, help="load before the step (default 3 req/s)")
    ap.add_argument("--high-rps", type=float, default=150.0, help="load after the step (default 150 req/s)")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load; the step is at 1/4")
    ap.add_argument("--only", choices=("on", "off"), help="one run only")
    args = ap.parse_args()
    runs = [run_once(fast, args) for fast in (False, True) if args.only in (None, "on" if fast else "off")]
    lines = [f"# Surge fast path on the demo runtime ({args.low_rps:g} -> {args.high_rps:g} req/s)", ""]
    for r in runs:
        so = "none" if r["scale_out_s"] is None else f"{r['scale_out_s']:.1f} s"
        lines.append(
            f"- fast path {r['fast_path']}: scale-out {so} after the step (demo exit {r['exit']}, {r['wall_s']} s)"
        )
        lines += [f"  - t = {d['t']:.1f} s: {d['config']} — {d['reason'][:160]}" for d in r["decisions"]]
    print("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.md").write_text("\n".join(lines) + "\n")
    (OUT / "results.json").write_text(json.dumps(runs, indent=1, default=str))
    on = [r for r in runs if r["fast_path"] == "on"]
    return 1 if on and (on[0]["scale_out_s"] is None or on[0]["scale_out_s"] > GOAL_S) else 0


if __name__ == "__main__":
    sys.exit(main())
