"""How `tailtune simulate` scales with the length of a recorded trace: time and memory per request.

    python bench/tuner/sim_scale.py                          # traces of 5, 20, 40 and 80 minutes (~2 min)
    python bench/tuner/sim_scale.py --minutes 5 40 --rate 3000
    python bench/tuner/sim_scale.py --baseline-tree /tmp/old # also an older checkout, in the same run

Users bring their own recorded traces, hours long at thousands of requests per second; the simulator keeps
every request. Each run is `python -m tailtune simulate --json` in a child process on a diurnal-shaped trace
(mean `--rate`) of each length, for the tailtune policy and Triton's default; measured per run: wall seconds
and the child's peak RSS (`os.wait4`). Reported: the marginal cost per million requests between successive
lengths, and its ratio to the first such cost of the same tree and policy in the same run (1.0: linear in the
trace's length; the machine is shared, so absolute seconds drift and ratios less). With `--baseline-tree`, the
same runs of that checkout, and the ratios this tree / baseline. Writes bench/out/sim_scale/report.md and sim_scale.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out" / "sim_scale"
CURVE = "batch,ms\n1,2\n2,2.5\n4,3.2\n8,5\n16,9\n32,20\n64,48\n"
POLICIES = ("tailtune", "triton-default")


def write_trace(path: Path, minutes: float, rate: float) -> float:
    """A diurnal-shaped trace (one period over its length, a row a minute); returns the expected requests."""
    rows, total = ["t_s,rate_rps"], 0.0
    end = int(minutes * 60)
    for t in range(0, end, 60):
        r = rate * (1 + 0.8 * math.sin(2 * math.pi * t / end))
        rows.append(f"{t},{r:.3f}")
        total += r * min(60, end - t)
    rows.append(f"{end},0")
    path.write_text("\n".join(rows) + "\n")
    return total


def run_one(tree: Path, curve: Path, trace: Path, policy: str, replicas_max: int) -> dict[str, Any]:
    """One `tailtune simulate` in a child process: wall seconds, peak RSS (MB), its summary."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OPENBLAS_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "tailtune", "simulate", "--curve", str(curve), "--trace", str(trace)]
    # tailtune starts on one replica and scales; a static policy runs on them all (on one it would fall behind and
    # serve next to nothing, which costs next to nothing).
    start = 1 if policy == "tailtune" else replicas_max
    args += ["--slo-ms", "30", "--policy", policy, "--replicas", str(start), "--replicas-max", str(replicas_max)]
    args += ["--json"]
    out_path, err_path = trace.with_suffix(f".{policy}.out"), trace.with_suffix(f".{policy}.err")
    t0 = time.perf_counter()
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(args, cwd=tree, env=env, stdout=out, stderr=err)
        # Reaped here, not by Popen: wait4 gives this child's own peak RSS.
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"{tree}: simulate {policy} {trace.name} failed ({proc.returncode}): {err_path.read_text()[-2000:]}"
        )
    summary = json.loads(out_path.read_text())
    return {"wall_s": wall, "rss_mb": usage.ru_maxrss / 1024, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lengths = [5.0, 20.0, 40.0, 80.0]
    ap.add_argument("--minutes", type=float, nargs="+", default=lengths, help="trace lengths (default 5 20 40 80)")
    ap.add_argument("--rate", type=float, default=1000.0, help="mean offered rate, req/s (default 1000)")
    ap.add_argument("--baseline-tree", type=Path, default=None, help="an older checkout to compare with")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    curve = args.out / "curve.csv"
    curve.write_text(CURVE)
    trees = [("this", ROOT)] + ([("baseline", args.baseline_tree.resolve())] if args.baseline_tree else [])
    # Enough replicas for the trace's peak (1.8x the mean) at one replica's most req/s on the curve.
    points = [tuple(map(float, line.split(","))) for line in CURVE.splitlines()[1:]]
    per_replica = max(1000.0 * b / ms for b, ms in points)
    replicas_max = max(1, math.ceil(args.rate * 1.8 / per_replica))
    rows: list[dict[str, Any]] = []
    for minutes in sorted(args.minutes):
        trace = args.out / f"trace-{minutes:g}min.csv"
        expected = write_trace(trace, minutes, args.rate)
        for label, tree in trees:
            for policy in POLICIES:
                r = run_one(tree, curve, trace, policy, replicas_max)
                million = expected / 1e6
                rows.append(
                    {
                        "tree": label,
                        "policy": policy,
                        "minutes": minutes,
                        "requests_m": million,
                        "wall_s": r["wall_s"],
                        "rss_mb": r["rss_mb"],
                        "goodput_rps": r["summary"]["goodput_rps"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    report(rows, args, replicas_max)
    return 0


def report(rows: list[dict[str, Any]], args: argparse.Namespace, replicas_max: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        "# `tailtune simulate` on long traces",
        "",
        f"`python bench/tuner/sim_scale.py {' '.join(sys.argv[1:])}`: mean {args.rate:g} req/s, 1 to "
        f"{replicas_max} replicas (Triton's default on all of them). Per run: wall seconds and the child's peak "
        "RSS. 'Marginal': what the requests "
        "added since the next shorter trace cost, per million (the interpreter's start and imports drop out); "
        "'x first': that marginal cost / the first one of the same tree and policy (1.0 = linear in the "
        "trace's length, above 1 = worse than linear).",
        "",
        "| tree | policy | minutes | requests (M) | s | RSS MB | marginal s per M | x first "
        "| marginal MB per M | x first | this / baseline s | this / baseline RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tree in dict.fromkeys(r["tree"] for r in rows):
        for policy in POLICIES:
            rs = sorted((r for r in rows if r["tree"] == tree and r["policy"] == policy), key=lambda r: r["minutes"])
            first: tuple[float, float] | None = None
            for prev, r in zip([None, *rs], rs, strict=False):
                marg = ""
                if prev is not None:
                    dm = r["requests_m"] - prev["requests_m"]
                    ds, dr = (r["wall_s"] - prev["wall_s"]) / dm, (r["rss_mb"] - prev["rss_mb"]) / dm
                    first = first or (ds, dr)
                    marg = f"{ds:.2f} | {ds / first[0]:.2f} | {dr:.0f} | {dr / first[1]:.2f}"
                else:
                    marg = " | | | "
                vs = " | "
                base = [x for x in rows if x["tree"] == "baseline" and x["policy"] == policy]
                if tree == "this" and base:
                    b = next(x for x in base if x["minutes"] == r["minutes"])
                    vs = f"{r['wall_s'] / b['wall_s']:.2f} | {r['rss_mb'] / b['rss_mb']:.2f}"
                lines.append(
                    f"| {tree} | {policy} | {r['minutes']:g} | {r['requests_m']:.2f} | {r['wall_s']:.1f} "
                    f"| {r['rss_mb']:.0f} | {marg} | {vs} |"
                )
    lines += ["", "![scaling](sim_scale.png)", ""]
    (args.out / "report.md").write_text("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for tree in dict.fromkeys(r["tree"] for r in rows):
        for policy in POLICIES:
            rs = [r for r in rows if r["tree"] == tree and r["policy"] == policy]
            style = "-" if tree == "this" else "--"
            xs = [r["requests_m"] for r in rs]
            axes[0].plot(xs, [r["wall_s"] for r in rs], style, marker="o", label=f"{tree} {policy}")
            axes[1].plot(xs, [r["rss_mb"] for r in rs], style, marker="o", label=f"{tree} {policy}")
    for ax, what in ((axes[0], "wall seconds"), (axes[1], "peak RSS (MB)")):
        ax.set_xlabel("requests in the trace (millions)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("tailtune simulate: cost vs trace length")
    fig.tight_layout()
    fig.savefig(args.out / "sim_scale.png", dpi=90)
    print(f"report {args.out / 'report.md'}")


if __name__ == "__main__":
    raise SystemExit(main())
