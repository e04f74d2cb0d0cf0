"""Load shedding's rule (tuner.shedding), the tuner's bound under it, and `tailtune simulate --shed`."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from tailtune.api.v1alpha1 import Batching, Replicas, Slo, Tuning
from tailtune.offline import simulate
from tailtune.offline.whatif import Setup, summarize
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner.servicetime import CurvePoint, ladder
from tailtune.tuner.shedding import shed_batch_max, shed_timeout_us
from tailtune.tuner.types import Policy


@pytest.mark.parametrize(
    ("name", "slo_ms", "delay_us", "service_ms", "instances", "want_us"),
    [
        ("the SLO less the max batch with its spread", 30.0, 0, (2.0, 10.0), 1, 30_000 - 11_000),
        ("each instance's batch ahead on the device", 30.0, 0, (2.0, 10.0), 2, 30_000 - 22_000),
        ("floored at a light load's wait: the delay and t(1)", 30.0, 5_000, (2.0, 12.0), 2, 5_000 + 2_000),
        ("a max batch slower than the SLO: the floor", 10.0, 0, (2.0, 40.0), 1, 2_000),
        ("no measured curve: the whole SLO", 30.0, 0, None, 1, 30_000),
        ("no curve and a delay past the SLO: the delay", 30.0, 40_000, None, 1, 40_000),
        ("never 0, which Triton reads as no timeout", 0.0001, 0, None, 1, 1),
    ],
)
def test_shed_timeout(
    name: str, slo_ms: float, delay_us: int, service_ms: tuple[float, float] | None, instances: int, want_us: int
) -> None:
    batching = Batching(max_batch_size=8, max_queue_delay_microseconds=delay_us)
    assert shed_timeout_us(slo_ms, batching, service_ms, instances) == want_us


def _linear(b: int) -> float:
    return 2.0 + b  # t(1) = 3 ms


def test_shed_batch_max_is_the_largest_batch_whose_timeout_is_above_its_floor() -> None:
    # 30 000 - 1.1 x 1000 x (2 + b) >= 3 000 (t(1)): 2 + b <= 24.5, b <= 22.
    assert shed_batch_max(30.0, _linear, instances=1, top=64) == 22
    assert shed_timeout_us(30.0, Batching(max_batch_size=22), (_linear(1), _linear(22)), 1) > 3_000
    assert shed_timeout_us(30.0, Batching(max_batch_size=23), (_linear(1), _linear(23)), 1) == 3_000  # floored
    assert shed_batch_max(30.0, _linear, instances=1, top=16) == 16
    assert shed_batch_max(30.0, _linear, instances=2, top=64) == 10  # 2 x 1.1 x (2 + b) <= 27: 2 + b <= 12.3
    assert shed_batch_max(5.0, _linear, instances=1, top=64) == 0  # not even a batch of one


def test_with_shedding_the_tuner_stays_below_the_floored_max_batches() -> None:
    build = tuple(CurvePoint(batch=b, ms=_linear(b), source="build") for b in ladder(64))
    args = (Slo(latency_ms=30), Tuning(max_batch_size={"min": 1, "max": 64}), Replicas(), 64)
    assert Policy.from_spec(*args, build_curve=build).batch_max == 64
    assert Policy.from_spec(*args, build_curve=build, shedding=True).batch_max == 22
    # Never below the largest warmup batch (Triton refuses a max batch under it), nor without a curve.
    assert Policy.from_spec(*args, build_curve=build, shedding=True, warmup_max=32).batch_max == 32
    assert Policy.from_spec(*args, shedding=True).batch_max == 64


def _overload() -> Setup:
    # One replica at max batch 8: t(8) = 6 ms, about 1 300 req/s at most, offered 2 600.
    curve = PiecewiseCurve(tuple((b, 2.0 + 0.5 * b) for b in ladder(8)), "linear")
    return Setup(curve=curve, segments=((0.0, 60.0, 2600.0),), slo_ms=30.0, interval_s=15.0, seed=4)


def test_shedding_in_overload_answers_within_the_slo_and_counts_what_it_rejected() -> None:
    setup = _overload()
    off = summarize(setup, "static:8:0")
    on = summarize(dataclasses.replace(setup, shed=True), "static:8:0")
    assert off["rejected_share"] == 0 and not off["shedding"]
    assert on["shedding"] and 0.4 < on["rejected_share"] < 0.6
    assert all(w["p_answered_ms"] is not None and w["p_answered_ms"] <= setup.slo_ms for w in on["timeline"])
    assert any(w["p_answered_ms"] > 10 * setup.slo_ms for w in off["timeline"])  # the queue runs away
    # What is rejected is never answered: it counts in neither goodput nor the answered percentile.
    assert on["goodput_rps"] > 2 * off["goodput_rps"]
    assert on["goodput_rps"] <= (1 - on["rejected_share"]) * on["offered_rps"] * 1.02


def test_simulate_shed_reports_the_rejected_share(tmp_path: Path) -> None:
    (tmp_path / "curve.csv").write_text("batch,ms\n1,2.5\n2,3\n4,4\n8,6\n")
    (tmp_path / "trace.csv").write_text("t_s,rate_rps\n0,2600\n60,2600\n")
    args = ["--curve", str(tmp_path / "curve.csv"), "--trace", str(tmp_path / "trace.csv"), "--slo-ms", "30"]
    args += ["--policy", "static:8:0", "--interval-s", "15"]
    out = io.StringIO()
    assert simulate.main([*args, "--shed", "--json"], out) == 0
    report = json.loads(out.getvalue())
    assert report["shedding"] and report["rejected_share"] > 0.3
    text = io.StringIO()
    assert simulate.main([*args, "--shed"], text) == 0
    assert "% rejected by shedding" in text.getvalue()
    plain = io.StringIO()
    assert simulate.main(args, plain) == 0
    assert "rejected" not in plain.getvalue()
