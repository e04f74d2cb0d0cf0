"""The demo's own numbers: settle time, the stretches it compares, and its check."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from devkit.load import Samples, window_stats
from devkit.report import Decision, Tick, markdown, rolling_p99, settle_time, summarize, write_report

SLO = 100.0


def run(
    step_at: float, end: float, latency: float, bad_until: float, rate: float = 50.0
) -> tuple[list[float], list[float], list[bool]]:
    """Requests every 1/rate s: `latency` ms, except 2000 ms between the step and `bad_until`."""
    samples = Samples()
    rng = random.Random(1)
    t = 0.0
    while t < end:
        slow = step_at <= t < bad_until
        samples.add(t, 2000.0 if slow else latency * (0.5 + rng.random() / 2), True)
        t += 1 / rate
    return samples.snapshot()


def test_settle_time_is_when_the_rolling_p99_goes_under_the_slo_for_good() -> None:
    rolling = [(float(t), 50.0) for t in range(5, 61)]
    assert settle_time(rolling, 20, SLO) == 0.0
    rolling = [(float(t), 500.0 if 20 <= t < 35 else 50.0) for t in range(5, 61)]
    # (t, p99) describes the window [t - 5, t): the first good one for good is [30, 35), 10 s after the step.
    assert settle_time(rolling, 20, SLO) == 10.0
    assert settle_time([(float(t), 500.0 if t > 50 else 50.0) for t in range(5, 61)], 20, SLO) is None
    assert settle_time([(float(t), None) for t in range(5, 61)], 20, SLO) is None


def test_rolling_p99_counts_failures_as_infinitely_slow() -> None:
    sent, lat, ok = [0.5, 1.0, 1.5, 2.0], [10.0, 10.0, math.nan, 10.0], [True, True, False, True]
    assert rolling_p99(sent, lat, ok, 5.0) == [(5.0, math.inf)]
    assert window_stats(sent, lat, ok, 0, 1.2).p99_ms == 10.0


def ticks(end: int, change_at: float) -> list[Tick]:
    return [
        Tick(t=float(t), offered_rps=130.0, max_batch=1 if t < change_at else 4, delay_us=0,
             replicas_desired=1 if t < change_at else 2, replicas_ready=1 if t < change_at else 2)
        for t in range(1, end + 1)
    ]  # fmt: skip


def test_a_run_that_settles_passes() -> None:
    samples = run(step_at=30, end=120, latency=40, bad_until=50)
    decisions = [Decision(45.0, "max batch 4, delay 0 us, 2 replicas", "P99 2000 ms: larger batches")]
    s = summarize(samples, ticks(120, 45), decisions, slo_ms=SLO, step_at=30, low_rps=40, high_rps=130,
                  end_s=120, time_to_first_ready_s=21.04, timings_s={"cluster up": 5.0})  # fmt: skip
    assert s.passed, s.verdict
    assert s.settle_s is not None and 19 <= s.settle_s <= 21
    assert s.before.p99_ms is not None and s.before.p99_ms <= 40
    assert s.untuned_high is not None and s.untuned_high.end_s == 45.0
    assert s.after.start_s == 120 - 22.5
    assert s.final_config == "max batch 4, delay 0 us, 2 replicas"
    assert s.time_to_first_ready_s == 21.0
    text = markdown(s)
    assert "PASS" in text and "time from command to first Ready pod: 21 s" in text


def test_a_run_still_over_the_slo_at_the_end_fails() -> None:
    samples = run(step_at=30, end=120, latency=40, bad_until=200)
    s = summarize(samples, ticks(120, 200), [], slo_ms=SLO, step_at=30, low_rps=40, high_rps=130, end_s=120,
                  time_to_first_ready_s=None, timings_s={})  # fmt: skip
    assert not s.passed
    assert "over the SLO" in s.verdict and "never settled" in s.verdict
    assert s.untuned_high is not None and s.untuned_high.end_s == 120


def test_the_report_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    samples = run(step_at=30, end=60, latency=40, bad_until=40)
    s = summarize(samples, ticks(60, 40), [Decision(40.0, "max batch 4", "why")], slo_ms=SLO, step_at=30,
                  low_rps=40, high_rps=130, end_s=60, time_to_first_ready_s=20, timings_s={})  # fmt: skip
    files = write_report(tmp_path, s, ticks(60, 40), samples)
    assert [f.name for f in files] == ["report.png", "summary.json", "summary.md", "timeline.json"]
    assert all(f.stat().st_size > 0 for f in files)
    assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
