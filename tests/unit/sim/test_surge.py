"""The fast path in the simulator (`Setup.fast_path`, the operator's loop through `tailtune.offline.whatif`): a surge
from near idle gets its scale-out request within 10 s of its start, against the next tick without it."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

from tailtune.offline import simulate
from tailtune.offline.whatif import Run, Setup, run_policy
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner.surge import SURGE_SCALE_OUT

# A slow device (t(8) = 80 ms: one replica serves ~100 req/s) keeps the run to a few thousand requests.
CURVE = PiecewiseCurve(tuple((b, 20.0 + 4.0 * b**1.3) for b in (1, 2, 4, 8, 16)), "slow")
SURGE_AT = 95.0  # between the ticks at 90 and 120 s
SETUP = Setup(
    curve=CURVE,
    segments=((0.0, SURGE_AT, 5.0), (SURGE_AT, 150.0, 400.0)),
    slo_ms=5 * CURVE.ms(8),
    replicas=1,
    replicas_max=8,
    interval_s=30.0,
    start_max_batch=8,
    seed=3,
)


def _first_scale_out(run: Run) -> float:
    return next(t for t, *_, n in run.knobs if t > 0 and n > 1)


def test_a_surge_from_idle_is_met_within_10_s_with_the_fast_path_and_at_the_next_tick_without() -> None:
    """Idle to four replicas' worth at t = 95 s: with the fast path the scale-out is asked by 105 s (a SurgeScaleOut
    in the trace) and the first pod's queue stays below what the tick interval piles up without it (caught: a
    fast path that waits for the next tick, or never runs between ticks)."""
    off = run_policy(SETUP, "tailtune")
    on = run_policy(dataclasses.replace(SETUP, fast_path=True), "tailtune")
    assert _first_scale_out(off) == 120.0  # the next tick
    assert _first_scale_out(on) - SURGE_AT <= 10.0
    assert any(code == SURGE_SCALE_OUT for _, code, _ in on.codes)
    assert on.first_pod_queue_max < off.first_pod_queue_max


def test_simulate_fast_path_flag_reaches_the_loop(tmp_path: Path) -> None:
    """`tailtune simulate --fast-path` runs the fast path: the same surge pays for its replicas from earlier on
    (caught: a flag parsed but never handed to the simulator's loop)."""
    curve, trace = tmp_path / "curve.csv", tmp_path / "trace.csv"
    curve.write_text("batch,ms\n" + "".join(f"{b},{CURVE.ms(b)}\n" for b in (1, 2, 4, 8, 16)))
    trace.write_text("t_s,rate_rps\n0,5\n95,400\n150,400\n")
    common = ["--curve", str(curve), "--trace", str(trace), "--slo-ms", str(SETUP.slo_ms), "--replicas-max", "8"]
    common += ["--start-max-batch", "8", "--seed", "3", "--json"]
    costs = []
    for extra in ([], ["--fast-path"]):
        out = io.StringIO()
        assert simulate.main([*common, *extra], out) == 0
        costs.append(json.loads(out.getvalue())["replica_seconds"])
    assert costs[1] > costs[0]
