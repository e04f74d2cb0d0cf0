"""The property tests over their whole generated families: where each property's full sweep runs.

    python bench/tuner/properties.py                  # every family whole (~15 min on 2 cores)
    python bench/tuner/properties.py -k test_b_       # some of them (pytest's -k)

The suite (`bash hack/test.sh`, `pytest tests/unit tests/loop`) runs each property on a small seeded sample of its
family (`tests/sampling.py`: the first cases of the same seeded draw, so a failure here replays there by its case
number). This runs the same tests with `TAILTUNE_FULL_FAMILIES=1`: every case of every family, every assertion as
written. It prints, per test, the cases drawn in the suite and here, its time and its outcome, writes
bench/out/properties/report.md and durations.png (time per test, sample vs whole family), and exits 1 when any
property fails (the failing case numbers are in pytest's output above the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out" / "properties"
# The modules whose tests loop over generated families (tests/sampling.py's `cases`).
FAMILY_MODULES = (
    "tests/unit/tuner/test_law.py",
    "tests/unit/tuner/test_model.py",
    "tests/unit/tuner/test_servicetime.py",
    "tests/unit/tuner/test_loop.py",
    "tests/unit/tuner/test_forecast.py",
    "tests/unit/tuner/test_surge.py",
    "tests/unit/sim/test_shedding.py",
    "tests/unit/operator/test_atrest.py",
    # The closed-loop tier: the law driving the simulators over whole traces.
    "tests/loop/test_short_of_slo.py",
    "tests/loop/test_cost.py",
    "tests/loop/test_whatif_cost.py",
    "tests/loop/test_novel_family.py",
    "tests/loop/test_generative_planner.py",
    "tests/prometheus/test_fleet_reader.py",  # a real Prometheus (Debian's `prometheus`, with promtool)
)


def run(full: bool, args: argparse.Namespace, report: Path) -> tuple[int, dict[str, tuple[str, float]]]:
    """pytest over FAMILY_MODULES (whole families when `full`); (exit code, {test id: (outcome, seconds)})."""
    env = {**os.environ, "TAILTUNE_FULL_FAMILIES": "1" if full else "0", "OPENBLAS_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=3600", *FAMILY_MODULES]
    argv += ["--junitxml", str(report)]
    if args.k:
        argv += ["-k", args.k]
    code = subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode
    return code, parse_junit(report)


def parse_junit(path: Path) -> dict[str, tuple[str, float]]:
    """{classname::name: (passed | failed | skipped, seconds)} from pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    out: dict[str, tuple[str, float]] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        out[f"{case.get('classname')}::{case.get('name')}"] = (outcome, float(case.get("time") or 0.0))
    return out


def plot(rows: list[tuple[str, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r[2])[-30:]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], [r[2] for r in rows], height=0.4, label="whole family (this benchmark)")
    ax.barh([y - 0.2 for y in ys], [r[1] for r in rows], height=0.4, label="sample (the suite)")
    ax.set_yticks(list(ys), [r[0].split("::")[-1][:70] for r in rows], fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_title("Property tests: time per test, the suite's sample vs the whole family (30 slowest)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="pytest -k expression: run only some properties")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        _, sample = run(False, args, Path(tmp) / "sample.xml")
        t1 = time.monotonic()
        code, full = run(True, args, Path(tmp) / "full.xml")
        t2 = time.monotonic()
    rows = [(name, sample.get(name, ("-", 0.0))[1], secs) for name, (_, secs) in full.items()]
    failed = sorted(name for name, (outcome, _) in full.items() if outcome == "failed")
    lines = [
        "# Property tests over their whole families",
        "",
        f"sample (the suite): {t1 - t0:.0f} s wall; whole families: {t2 - t1:.0f} s wall, "
        f"{(t2 - t1) / max(1e-9, t1 - t0):.1f}x the sample; {len(full)} tests, {len(failed)} failed",
        "",
        "| test | outcome | sample s | whole family s |",
        "|---|---|---|---|",
    ]
    for name, s, f in sorted(rows, key=lambda r: -r[2]):
        lines.append(f"| {name} | {full[name][0]} | {s:.2f} | {f:.2f} |")
    report = "\n".join(lines) + "\n"
    (args.out / "report.md").write_text(report)
    (args.out / "results.json").write_text(json.dumps({"sample": sample, "full": full}, indent=1))
    if rows:
        plot(rows, args.out / "durations.png")
    print(report)
    print(f"wrote {args.out / 'report.md'} and durations.png")
    return 1 if code != 0 or failed else 0


if __name__ == "__main__":
    sys.exit(main())
