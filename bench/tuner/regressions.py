"""Regression checks on named benchmark scenarios: the law against the simulator on pinned curves and traces.

    python bench/tuner/regressions.py            # every check (~3 min on 2 cores)
    python bench/tuner/regressions.py -k crowd   # the checks whose name holds "crowd"

Each check replays one or a few scenarios the tuner benchmark once found the law wanting on (their bench seed and
number are in the docstrings), runs tailtune and the policies it is measured against through `tailtune.offline.whatif`
(the simulator behind `tailtune simulate`), and asserts what the fix promised. They were unit tests; they are
benchmark regressions (a scenario's figures are not a unit's property), so they run here and print their figures:
per check, every simulated run's goodput, offered load and changes, then PASS or FAIL with the assertion's text.
Exits 1 when any check fails. Writes bench/out/regressions/report.md.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tailtune.offline import whatif  # noqa: E402
from tailtune.offline.whatif import Setup  # noqa: E402
from tailtune.sim.curves import PiecewiseCurve  # noqa: E402
from tests.unit.tuner.families import stepwise_edge  # noqa: E402

OUT = ROOT / "bench" / "out" / "regressions"
_figures: list[str] = []


def summarize(setup: Setup, policy: str) -> dict[str, Any]:
    """`whatif.summarize`, with the run's figures recorded for the report."""
    s = whatif.summarize(setup, policy)
    timeline = s.get("timeline") or []
    windows_in_slo = sum(1 for w in timeline if w["p_ms"] is not None and w["p_ms"] <= setup.slo_ms)
    _figures.append(
        f"{setup.curve.name:>22} {policy:<16} goodput {float(s['goodput_rps']):9.1f} req/s of "
        f"{float(s['offered_rps']):9.1f} offered; windows in SLO {windows_in_slo}/{len(timeline)}; "
        f"changes {s.get('changes', '-')}"
    )
    return s


def check_short_of_the_slo_everywhere_the_law_keeps_the_most_goodput() -> None:
    """Overloaded at the bounds: tailtune answers at least as many requests within the SLO as Triton's default
    (max batch = the engine's), and most of what the best small static config answers (which it has to find
    first: two windows to confirm, one to reload), on every case."""
    rng = np.random.default_rng(1207)
    ratios = []
    for i in range(4):
        curve = stepwise_edge(rng)
        a = curve.ms(1)
        slo = round(3.0 * a, 2)
        rate = round(float(rng.uniform(0.75, 0.85)) * 1000.0 * 4 / a, 1)  # 75-85 % of what batches of 4 drain
        setup = Setup(
            curve=curve,
            segments=((0.0, 480.0, rate),),
            slo_ms=slo,
            instances=int(rng.choice([1, 2])),
            start_max_batch=1,
            seed=50 + i,
        )
        tailtune = summarize(setup, "tailtune")["goodput_rps"]
        default = summarize(setup, "triton-default")["goodput_rps"]
        small = max(summarize(setup, f"static:{b}:0")["goodput_rps"] for b in (4, 8))
        # The family is what it says: the engine's max batch loses most of the goodput a small one keeps.
        assert default < 0.8 * small, (i, default, small)
        assert tailtune >= default - 0.01 * rate, (i, curve.name, tailtune, default)
        ratios.append(tailtune / small)
    # Known gap: with two instances sharing the device the model can still rank a large max batch above the small
    # one that holds most of the demand (case 3 here: 0.18). The law before this test stayed at max batch 64
    # on all four (under 0.1).
    assert sum(1 for r in ratios if r >= 0.8) >= 3, ratios


# Two benchmark scenarios (bench/tuner, seed 20261130), two instances on one device, short of the SLO at the
# peak: 021, saturating curve, bursts that return every 15-60 s from Triton's default; 062, stepwise curve, a
# diurnal ramp to near what the largest max batch drains, from max batch 1.
SATURATING = ((1, 13.53), (2, 17.07), (4, 23.0), (8, 31.39), (12, 36.73), (16, 40.24), (24, 44.41), (32, 46.89))
SATURATING += ((48, 50.41), (64, 53.52))
BURSTS = (0.0, 18.4, 57.8, 107.9, 129.0, 164.0, 200.4, 239.5, 275.0, 299.6, 329.2, 347.6, 364.0, 403.3, 446.9, 471.9)
STEPWISE = ((1, 3.54), (2, 3.54), (4, 3.54), (8, 5.51), (12, 7.58), (16, 7.7), (24, 7.93), (32, 8.16), (48, 8.62))
STEPWISE += ((64, 9.08), (96, 13.24), (128, 14.62))


def _collapsed(summary: dict[str, object], slo_ms: float) -> int:
    """Windows whose P99 ran past 3x the SLO (or that left requests unanswered)."""
    timeline = summary["timeline"]
    assert isinstance(timeline, list)
    return sum(1 for w in timeline if w["p_ms"] is None or w["p_ms"] > 3 * slo_ms)


def check_short_of_the_slo_the_law_keeps_up_with_returning_bursts_and_a_rising_ramp() -> None:
    """Short of the SLO at the peak, the law trades capacity for latency only as far as the bursts seen lately
    and a ramp that goes on past its projection allow: it never lets the queue run away where Triton's default
    keeps up, and answers at least as many requests within the SLO. (With a model that rates small batches
    better, the law picked max batch 14 between bursts in 021 and max batch 37 on the ramp in 062: both
    collapsed when the demand came back or rose on, 0.915 and 0.891 of the oracle's goodput.)"""
    bursts = tuple((a, b, 687.48 if k % 2 else 187.08) for k, (a, b) in enumerate(itertools.pairwise((*BURSTS, 480.0))))
    n = 20
    ramp = tuple(
        (24.0 * k, 24.0 * (k + 1), 1430.21 + (5676.24 - 1430.21) * (1 - math.cos(2 * math.pi * (k + 0.5) / n)) / 2)
        for k in range(n)
    )
    setups = (
        Setup(PiecewiseCurve(SATURATING, "021"), bursts, 125.94, instances=2, start_max_batch=64, seed=1021),
        Setup(PiecewiseCurve(STEPWISE, "062"), ramp, 24.59, instances=2, start_max_batch=1, seed=1062),
    )
    for setup in setups:
        tailtune = summarize(setup, "tailtune")
        default = summarize(setup, "triton-default")
        offered = float(tailtune["offered_rps"])
        assert _collapsed(default, setup.slo_ms) == 0, setup.curve.name  # the scenario is what it says
        assert _collapsed(tailtune, setup.slo_ms) == 0, (setup.curve.name, tailtune["timeline"])
        assert float(tailtune["goodput_rps"]) >= float(default["goodput_rps"]) - 0.01 * offered, setup.curve.name


def check_a_lull_between_bursts_never_cuts_the_capacity_the_bursts_need() -> None:
    """Between bursts the demand reads low and a smaller max batch meets the aim there; on a linear curve it has
    less capacity, and the next burst runs it past the SLO. While the SLO holds, the law keeps what the bursts of
    the stabilization window need. (Seen out of sample on a bursts trace, seed 17's 018: max batch 64 -> 34 at a
    lull, three windows at 67-80 ms for a 42.7 ms SLO, 0.93 of Triton's default's goodput.)"""
    points = (
        (1, 7.5503),
        (2, 7.6607),
        (4, 7.8813),
        (8, 8.3226),
        (12, 8.7638),
        (16, 9.2051),
        (24, 10.0876),
        (32, 10.9701),
        (48, 12.7352),
        (64, 14.5002),
    )
    curve = PiecewiseCurve(points, "linear")
    edges = (
        0.0, 20.53743708641077, 46.552980780160354, 59.74281913232083, 100.92654313545961, 155.53935392210835,
        195.31299952681593, 213.81669262407166, 250.72163382273442, 273.7154598253185, 302.89160558031494,
        313.0176584064829, 370.96853595106865, 407.11462006325627, 445.69020949689667, 460.4257366164803,
        477.01435565512327,
    )  # fmt: skip
    bursts = tuple(
        (a, b, 6034.472179548657 if k % 2 else 2379.88404967268)
        for k, (a, b) in enumerate(itertools.pairwise((*edges, 480.0)))
    )
    setup = Setup(curve, bursts, 42.71, instances=2, replicas=2, replicas_max=2, start_max_batch=8, seed=1035)
    tailtune = summarize(setup, "tailtune")
    default = summarize(setup, "triton-default")

    def broken(summary: dict[str, object]) -> set[int]:
        timeline = summary["timeline"]
        assert isinstance(timeline, list)
        return {i for i, w in enumerate(timeline) if w["p_ms"] is None or w["p_ms"] > setup.slo_ms}

    assert not broken(default) - {0}, default["timeline"]  # the scenario is what it says: the default holds
    assert not broken(tailtune) - broken(default) - {0}, tailtune["timeline"]
    offered = float(tailtune["offered_rps"])
    assert float(tailtune["goodput_rps"]) >= float(default["goodput_rps"]) - 0.01 * offered


def check_a_flash_crowd_finds_no_reload_that_drains_no_faster() -> None:
    """A flash crowd past what the bounds drain: the law leaves the batching alone unless another drains the queue
    faster (a reload for a few percent of latency robustness is worth nothing under a backlog), and it judges the
    config in force by the model, not by the completions, in the window the crowd entered part way through (they
    mix the calm with the backlog). Seed 7's 024 (linear curve, 3 replicas of 2 instances, a crowd at 4.5x from
    max batch 32 with a queue delay): max batch 32 -> 25 -> 32 during the crowd, 0.985 of Triton's default."""
    points = ((1, 6.4802), (2, 6.582), (4, 6.7856), (8, 7.1928), (12, 7.6), (16, 8.0072), (24, 8.8217), (32, 9.6361))
    start, base = 205.60991922393788, 2476.356831849864
    crowd = ((0.0, start, base), (start, start + 40.0, 11105.477529789301), (start + 40.0, 480.0, base))
    setup = Setup(
        PiecewiseCurve(points, "024"),
        crowd,
        26.42,
        instances=2,
        replicas=3,
        replicas_max=3,
        start_max_batch=1,
        seed=1031,
        service_noise=0.03,
    )
    tailtune = summarize(setup, "tailtune")
    default = summarize(setup, "triton-default")
    offered = float(tailtune["offered_rps"])
    assert float(tailtune["goodput_rps"]) >= float(default["goodput_rps"]) - 0.005 * offered
    timeline = tailtune["timeline"]
    assert isinstance(timeline, list)
    assert len({w["max_batch"] for w in timeline if start - 30.0 <= w["t_s"] <= start + 40.0}) == 1, timeline


def check_seed_7_008_a_foretold_collapse_is_left_after_one_window() -> None:
    """Bench seed 7's 008 (stepwise curve with edges at 4 and 8, 2 instances, 1 replica, 459 req/s from t = 0):
    the config in force (max batch 64) answers about a quarter of the demand within the SLO, max batch 4 about
    three quarters. The law left it after two windows (0.863 of the oracle's goodput); after one now."""
    points = ((1, 6.9628), (2, 6.9628), (4, 6.9628), (8, 16.161), (12, 26.3812), (16, 27.4033), (24, 29.4473))
    points += ((32, 31.4914), (48, 35.5794), (64, 39.6675))
    setup = Setup(
        PiecewiseCurve(points, "seed7-008"), ((0.0, 120.0, 459.37),), 21.15, instances=2, start_max_batch=64, seed=1015
    )
    tailtune = summarize(setup, "tailtune")
    timeline = tailtune["timeline"]
    assert isinstance(timeline, list)
    assert timeline[0]["max_batch"] == 64 and timeline[1]["max_batch"] < 64, timeline
    # ... for a batching that answers more within the SLO than the one left.
    assert timeline[1]["goodput_rps"] > 1.5 * timeline[0]["goodput_rps"], timeline


def check_out_of_sample_crowds_are_met_in_their_first_window() -> None:
    """Two crowds that filled their first window (the steps fall on a window's start), each from a calm that broke
    nothing: the law moves after that first window, no longer waiting for a second (out-of-sample bench seed 23's
    044, stepwise curve, 2 instances, P99 noise: 0.944 -> 0.976 of the oracle's goodput; seed 11's 041, the curve
    measured on the local tritonserver, a metrics gap right after the crowd's first window: 0.927 -> 0.985)."""
    stepwise = ((1, 8.4562), (2, 8.4562), (4, 8.4562), (8, 8.4562), (12, 17.4296), (16, 17.686), (24, 18.1987))
    stepwise += ((32, 18.7115), (48, 31.0179), (64, 33.069), (96, 51.5286), (128, 57.6818))
    measured = ((1, 2.926), (2, 3.516), (4, 6.186), (8, 14.087), (16, 36.932), (32, 105.634), (64, 313.559))
    setups = (
        Setup(
            PiecewiseCurve(stepwise, "seed23-044"),
            ((0.0, 150.0, 230.38), (150.0, 480.0, 735.37)),
            31.13,
            instances=2,
            start_max_batch=128,
            p99_noise=0.15,
            seed=1067,
        ),
        Setup(
            PiecewiseCurve(measured, "seed11-041"),
            ((0.0, 150.0, 93.21), (150.0, 480.0, 495.39)),
            12.76,
            start_max_batch=8,
            gap=(190.0, 3),
            seed=1052,
        ),
    )
    for setup in setups:
        timeline = summarize(setup, "tailtune")["timeline"]
        assert isinstance(timeline, list)
        crowd = [w for w in timeline if w["t_s"] >= 150.0]
        # The window after the crowd's first runs another batching, one that answers more of the crowd in time.
        assert crowd[1]["max_batch"] < crowd[0]["max_batch"], (setup.curve.name, timeline)
        assert crowd[1]["goodput_rps"] > crowd[0]["goodput_rps"], (setup.curve.name, timeline)


def check_a_config_short_of_the_demand_that_answers_far_more_of_it_in_time_is_taken_after_one_window() -> None:
    """Out-of-sample seed 31's 032 (a plateau to batch 16, then a profile edge; 2 replicas from max batch 32; a load
    ramping down from 3100 req/s): max batch 32 breaks the SLO as the model foretold (65 ms for 31.87), max batch 16
    answers about 98 % of the demand within it though it carries a little less than the demand within the SLO.
    The law waited a second window (0.892 of the oracle's goodput); it moves after the first now (0.926: the oracle
    knows the first window's load before it comes)."""
    points = ((1, 8.7069), (2, 8.7069), (4, 8.7069), (8, 8.7069), (12, 8.7069), (16, 8.7069), (24, 18.8394))
    points += ((32, 20.2869),)
    ramp = tuple((40.0 * k, 40.0 * (k + 1), 3102.12 - 258.47 * k) for k in range(12))
    setup = Setup(
        PiecewiseCurve(points, "seed31-032"), ramp, 31.87, replicas=2, replicas_max=2, start_max_batch=32, seed=1063
    )
    timeline = summarize(setup, "tailtune")["timeline"]
    assert isinstance(timeline, list)
    assert timeline[0]["max_batch"] == 32 and timeline[1]["max_batch"] <= 16, timeline
    assert timeline[1]["goodput_rps"] > 2 * timeline[0]["goodput_rps"], timeline


def check_a_scale_out_reloads_a_batching_that_cannot_carry_the_load_while_the_new_pods_start() -> None:
    """A scale-out keeps the batching in force where it carries its share at the new count, but until the new pod
    is ready (a cold start: 30 s here, a whole window) the pod in force carries everything. Out of sample (a
    power-law curve, exponent 1.48; a sawtooth 109 -> 234 req/s; 1 of 2 replicas from max batch 16; P95 within
    206.5 ms): max batch 16's full batches drain 195 req/s, the plan's load with its margin was 206; kept through
    the scale-out, its batches ran away on the lone pod (P95 3.6 s; 0.925 of the oracle's goodput). The reload now
    goes with the scale-out, to a batching whose full batches keep up there."""
    points = ((1, 12.4125), (2, 14.4902), (4, 20.3051), (8, 36.5788), (12, 57.4888), (16, 82.1233))
    points += ((24, 140.6429), (32, 209.5862), (48, 373.3619), (64, 566.3101))
    period, levels = 90.2262527371082, 6
    saw = tuple(
        (period * k + period / levels * i, period * k + period / levels * (i + 1), 109.1643 + 24.9501 * i)
        for k in range(6)
        for i in range(levels)
        if period * k + period / levels * i < 510.0
    )
    saw = (*saw[:-1], (saw[-1][0], 510.0, saw[-1][2]))
    setup = Setup(
        PiecewiseCurve(points, "ood-power-sawtooth"),
        saw,
        206.5,
        percentile=95.0,
        replicas=1,
        replicas_max=2,
        start_max_batch=16,
        seed=5032,
    )
    summary = summarize(setup, "tailtune")
    timeline = summary["timeline"]
    assert isinstance(timeline, list)
    out = next(w for w, row in enumerate(timeline) if row["replicas"] > 1)
    mb = timeline[out]["max_batch"]
    # The batching that came with the scale-out keeps up on the lone pod by what its full batches drain ...
    assert mb < 16 and 1000.0 * mb / setup.curve.ms(mb) > 1000.0 * 16 / setup.curve.ms(16), timeline[out]
    # ... and the run loses less than 5 % of the oracle's goodput (the oracle runs both replicas from the start; the
    # saw's top, 234 req/s, still overruns the lone pod for a few seconds before the second is ready).
    oracle = summarize(setup, "oracle")["goodput_rps"]
    assert summary["goodput_rps"] >= 0.95 * oracle, (summary["goodput_rps"], oracle, timeline)


CHECKS: tuple[Callable[[], None], ...] = tuple(
    f for name, f in sorted(globals().items()) if name.startswith("check_") and callable(f)
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="run only the checks whose name holds this")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lines, failed = ["# Regression checks on named benchmark scenarios", ""], 0
    for check in CHECKS:
        if args.k not in check.__name__:
            continue
        _figures.clear()
        t0 = time.monotonic()
        try:
            check()
            verdict = "PASS"
        except AssertionError:
            failed += 1
            verdict = "FAIL\n" + traceback.format_exc(limit=1)[-3000:]
        block = [f"## {check.__name__} ({time.monotonic() - t0:.0f} s)", "```", *_figures, verdict, "```", ""]
        print("\n".join(block), flush=True)
        lines += block
    lines.append(f"{failed} failed")
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"{failed} failed; wrote {args.out / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
