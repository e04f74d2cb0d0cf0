"""Cost in the what-if runner: every policy's replica-seconds, the `min-cost` oracle and the `static-max` baseline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tailtune.offline.whatif import Setup, run_policy, summarize
from tailtune.sim.curves import PiecewiseCurve
from tests.sampling import cases

# t(b) = 5 ms x b: 200 req/s a replica whatever the batch, so the replicas a load needs do not depend on the config.
LINEAR_5MS = PiecewiseCurve(tuple((b, 5.0 * b) for b in (1, 2, 4, 8)), "linear-5ms")
# 50 req/s for 90 s (one replica holds 50 ms), then 250 req/s for 90 s (one is overloaded, two hold).
STEP_UP = ((0.0, 90.0, 50.0), (90.0, 180.0, 250.0))


def _knob_integral(knobs: list[tuple[float, int, int, int]], end: float) -> float:
    times = [k[0] for k in knobs] + [end]
    return sum(k[3] * (min(times[i + 1], end) - min(k[0], end)) for i, k in enumerate(knobs))


def test_a_static_fleet_pays_its_replicas_times_the_trace_on_generated_traces() -> None:
    rng = np.random.default_rng(38)
    for case in range(cases(100)):
        bounds = np.cumsum(rng.uniform(10.0, 60.0, int(rng.integers(1, 5))))
        segments = tuple(
            (float(a), float(b), float(rng.uniform(0.0, 60.0)))
            for a, b in zip([0.0, *bounds[:-1]], bounds, strict=True)
        )
        replicas = int(rng.integers(1, 5))
        setup = Setup(
            curve=LINEAR_5MS,
            segments=segments,
            slo_ms=50.0,
            replicas=replicas,
            replicas_max=int(rng.integers(replicas, 6)),
            start_max_batch=int(rng.choice([1, 4, 8])),
            interval_s=float(rng.choice([10.0, 30.0])),
            seed=case,
        )
        for policy, paid in (
            ("triton-default", replicas),
            (f"static:{rng.integers(1, 9)}:0", replicas),
            ("static-max", setup.replicas_max),
        ):
            s = summarize(setup, policy)
            assert s["replica_seconds"] == pytest.approx(paid * setup.end_s, abs=1e-3), (case, policy)
            assert s["replica_seconds_ready"] == s["replica_seconds"], (case, policy)


def test_tailtune_pays_the_replicas_it_decided_each_from_its_request() -> None:
    """From one replica on a step up to where it needs two: the replica-seconds are the integral of the counts it
    applied; a scale-out's start is paid but not ready."""
    curve = PiecewiseCurve(((1, 2.4), (2, 3.0), (4, 4.1), (8, 6.2), (16, 10.5), (32, 19.0)), "l4")
    setup = Setup(curve, ((0.0, 60.0, 200.0), (60.0, 240.0, 1600.0)), 30.0, replicas=1, replicas_max=3, seed=2)
    run = run_policy(setup, "tailtune")
    assert max(k[3] for k in run.knobs) > 1, run.knobs  # it scaled out: the case tests something
    assert run.replica_seconds == pytest.approx(_knob_integral(run.knobs, setup.end_s))
    outs = sum(max(0, b[3] - a[3]) for a, b in zip(run.knobs, run.knobs[1:], strict=False))
    starting = run.replica_seconds - run.replica_seconds_ready
    assert 0 < starting <= outs * setup.pod_start_s + 1e-9


@pytest.mark.parametrize(("pod_start_s", "paid"), [(15.0, 75 + 2 * 105), (30.0, 60 + 2 * 120), (45.0, 45 + 2 * 135)])
def test_min_cost_asks_for_the_fewest_replicas_one_pod_start_ahead(pod_start_s: float, paid: float) -> None:
    """One replica until one pod start before the rise at 90 s, two from then: paid from the request, ready for the
    rise (1 x 180 + 1 x 90 = 270 ready), every window in the SLO; the fleet sized for the peak pays 2 x 180."""
    setup = Setup(LINEAR_5MS, STEP_UP, 50.0, replicas=2, replicas_max=2, seed=1, pod_start_s=pod_start_s)
    s = summarize(setup, "min-cost")
    assert s["replica_seconds"] == pytest.approx(paid)
    assert s["replica_seconds_ready"] == pytest.approx(270.0)
    assert s["windows_in_slo"] == s["windows"] == 6
    assert s["timeline"][0]["replicas"] == 1 and s["final"]["replicas"] == 2
    static_max = summarize(setup, "static-max")
    assert static_max["replica_seconds"] == pytest.approx(360.0) and static_max["windows_in_slo"] == 6
    assert summarize(setup, "oracle")["replica_seconds"] == pytest.approx(360.0)  # every replica from t = 0


def test_min_cost_gives_back_a_replica_a_quiet_window_does_not_need_after_a_peak() -> None:
    """260 req/s for 90 s (two replicas of 200 req/s hold it, one falls behind by 60 req/s), then 50 req/s (one
    holds it). min-cost pays two replicas for the peak and one from its end (2 x 90 + 1 x 180 = 360), every window
    in the SLO in the replay (caught: a plan that judged each count on a run held at that count through the whole
    trace, where one replica still drained the peak's 5,400 requests in the quiet windows after it: two replicas
    there too, 420)."""
    setup = Setup(LINEAR_5MS, ((0.0, 90.0, 260.0), (90.0, 270.0, 50.0)), 50.0, replicas=2, replicas_max=2, seed=3)
    s = summarize(setup, "min-cost")
    assert [w["replicas"] for w in s["timeline"]] == [2, 2, 2, 1, 1, 1, 1, 1, 1]
    assert s["replica_seconds"] == pytest.approx(360.0)
    assert s["windows_in_slo"] == s["windows"] == 9


def test_min_cost_where_nothing_holds_takes_the_most_replicas() -> None:
    """At 600 req/s two replicas of 200 req/s fall behind whatever the config: min-cost pays for both, all along."""
    setup = Setup(LINEAR_5MS, ((0.0, 60.0, 600.0),), 50.0, replicas=1, replicas_max=2, seed=4)
    s = summarize(setup, "min-cost")
    assert s["replica_seconds"] == pytest.approx(120.0) and s["windows_in_slo"] == 0


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_simulate_json_reports_replica_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tailtune.offline.simulate import main

    curve = _write(tmp_path, "c.csv", "batch,ms\n1,2\n8,6\n")
    trace = _write(tmp_path, "t.csv", "t_s,rate_rps\n0,20\n60,0\n")
    args = ["--curve", str(curve), "--trace", str(trace), "--slo-ms", "30", "--replicas", "2", "--replicas-max", "3"]
    assert main([*args, "--json", "--policy", "static-max"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["replica_seconds"] == s["replica_seconds_ready"] == 180.0 and s["final"]["replicas"] == 3
    assert main([*args, "--policy", "triton-default"]) == 0
    assert "120 replica-seconds" in capsys.readouterr().out


def test_simulate_refuses_min_cost_past_the_counts_it_sweeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tailtune.offline.simulate import MIN_COST_MAX_REPLICAS, main

    curve = _write(tmp_path, "c.csv", "batch,ms\n1,2\n8,6\n")
    trace = _write(tmp_path, "t.csv", "t_s,rate_rps\n0,20\n60,0\n")
    over = str(MIN_COST_MAX_REPLICAS + 1)
    args = ["--curve", str(curve), "--trace", str(trace), "--slo-ms", "30", "--replicas-max", over]
    assert main([*args, "--policy", "min-cost"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "--replicas-max" in out.err and "Traceback" not in out.err, out
