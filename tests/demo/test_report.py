"""The demo's own numbers: settle time, the stretches it compares, and its check."""

from __future__ import annotations

import io
import itertools
import math
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from devkit.demo import _plain_line, _wrap, live_table
from devkit.load import Samples, window_stats
from devkit.report import (
    Breakdown,
    Decision,
    Tick,
    before_after,
    markdown,
    plot,
    rolling_p99,
    server_breakdown,
    server_p99,
    settle_time,
    summarize,
    write_report,
)

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


# ----------------------------------------------------------------------------------- issue 15: one clock, like for like


def test_before_and_after_tuning_compare_the_same_load() -> None:
    samples = run(step_at=30, end=120, latency=40, bad_until=50)
    decisions = [Decision(45.0, "max batch 4, delay 0 us, 2 replicas", "P99 2000 ms: larger batches")]
    s = summarize(samples, ticks(120, 45), decisions, slo_ms=SLO, step_at=30, low_rps=40, high_rps=130,
                  end_s=120, time_to_first_ready_s=21.0, timings_s={"cluster up": 5.0}, load_start_s=25.0)  # fmt: skip
    assert s.untuned_high is not None
    assert "130 req/s offered" in s.untuned_high.label and "130 req/s offered" in s.after.label
    assert "40 req/s offered" in s.before.label and "before tuning" not in s.before.label
    line = before_after(s)
    assert line.startswith("At 130 req/s offered: before tuning (initial config, t = 30-45 s) served ")
    assert "after tuning served" in line
    text = markdown(s)
    assert "t = 0, 25 s after the command" in text
    # Command-clock timings are also given on the load clock, the x-axis of the PNG.
    assert "- cluster up: t = -20.0 s (5 s after the command)" in text
    assert "first Ready pod: 21 s (t = -4.0 s)" in text


def test_no_untuned_stretch_says_so() -> None:
    samples = run(step_at=30, end=120, latency=40, bad_until=31)
    decisions = [Decision(31.0, "max batch 4, delay 0 us, 2 replicas", "why")]
    s = summarize(samples, ticks(120, 31), decisions, slo_ms=SLO, step_at=30, low_rps=40, high_rps=130,
                  end_s=120, time_to_first_ready_s=None, timings_s={})  # fmt: skip
    assert s.untuned_high is None
    assert "no untuned stretch at that load" in before_after(s)


def _tick(**kw: object) -> Tick:
    base: dict[str, object] = dict(
        t=61.0, offered_rps=100.0, phase="PodsNotReady; SLOMet=Unknown", max_batch=16, delay_us=12_500,
        replicas_desired=3, replicas_ready=2, status_p99_ms=123.456, prom_p99_ms=1234.5, prom_rps=99.9,
        tuner="raise-batch-and-replicas-under-backlog",
        decision="P99 1234.5 ms over the aim 120 ms at 100 req/s offered: max batch 16, delay 12500 us, 3 replicas "
        "[planned from the measured curve: 2.4 ms at batch 1, 9.7 ms at batch 16]",
    )  # fmt: skip
    base.update(kw)
    return Tick(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("width", [80, 120])
def test_live_table_fits_80_columns_and_keeps_numbers_with_units(width: int) -> None:
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    table = live_table(_tick(), 1999.95, 98.0, t=61.4, duration_s=120, name="tailtune-demo/mlp", slo_ms=150)
    with console.capture() as cap:
        console.print(table)
    lines = cap.get().splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    for expected in ("2000.0 ms / 150 ms", "1234.5 ms", "123.5 ms", "16 / 12500 us", "2/3", "100 / 98"):
        assert expected in text, text
    # A wrapped line never ends with a bare number whose unit starts the next line.
    cells = [line.strip("│ ").split("│")[-1].strip() for line in lines if line.startswith("│")]
    for this, nxt in itertools.pairwise(cells):
        if re.search(r"\d$", this):
            assert not re.match(r"(ms|us|s|req/s|%|replicas?)\b", nxt), (this, nxt)
    assert "[planned from the measured curve" in text  # free text is not taken for rich markup


def test_wrap_glues_numbers_to_units() -> None:
    for width in range(8, 40):
        wrapped = _wrap("P99 1234.5 ms over the aim 120 ms at 100 req/s with 3 replicas", width)
        for line in wrapped.splitlines():
            assert not re.match(r"(ms|req/s|replicas)\b", line), wrapped


def test_the_report_png_has_a_legend_for_every_line_and_marker(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    samples = run(step_at=30, end=60, latency=40, bad_until=40)
    decisions = [Decision(40.0, "max batch 4", "why"), Decision(50.0, "max batch 8", "why")]
    tks = [_tick(t=float(t), delay_us=0, replicas_desired=2 if t >= 40 else 1, replicas_ready=1) for t in range(1, 61)]
    s = summarize(samples, tks, decisions, slo_ms=SLO, step_at=30, low_rps=40, high_rps=130, end_s=60,
                  time_to_first_ready_s=20, timings_s={}, load_start_s=25.0)  # fmt: skip
    captured: list[object] = []
    real_close = plt.close
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "close", lambda fig: captured.append(fig))
        plot(tmp_path / "report.png", s, tks, samples)
    fig = captured[0]
    axes = fig.axes  # type: ignore[attr-defined]
    labels = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in axes]
    everything = [x for ax_labels in labels for x in ax_labels]
    for expected in (
        "SLO 100 ms",
        "load step 40 -> 130 req/s",
        "tuner change",
        "replicas desired (status)",
        "replicas ready (serving)",
        "max queue delay (live in Triton)",
        "max batch size (live in Triton)",
        "offered",
    ):
        assert expected in everything, labels
    # Each marker once per legend, however many decisions.
    assert all(ax_labels.count("tuner change") == 1 for ax_labels in labels)
    lat, _rps, _batch, delay, _rep = axes
    # A delay of 0 is drawn above the axis, not on it.
    assert delay.get_ylim()[0] < 0
    # The log latency axis labels its 1-2-5 ticks in plain milliseconds.
    fig.canvas.draw()  # type: ignore[attr-defined]
    ticks_shown = [t.get_text() for t in lat.get_yticklabels() if t.get_text()]
    assert {"20", "50", "100", "200", "500"} <= set(ticks_shown), ticks_shown
    assert "t = 0 is 25 s after the command" in axes[-1].get_xlabel()
    assert lat.get_xlim()[0] == 0
    real_close(fig)


def test_plain_progress_lines_fit_80_columns() -> None:
    text = _plain_line(_tick(), 41.04, 32.0, 150)
    lines = text.splitlines()
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines), text
    assert "P99 client 41.0 ms" in text.replace("\n  ", " ")
    for line in lines[1:]:
        assert line.startswith("  ") and not re.match(r"\s*(ms|us|req/s)\b", line), text


def test_decisions_come_from_the_config_in_force_annotation() -> None:
    """The demo's decision markers read the one annotation that records the config in force and its change time."""
    from datetime import UTC, datetime

    from devkit.demo import Demo
    from tailtune.api.keys import APPLIED_ANNOTATION
    from tailtune.api.v1alpha1 import Batching
    from tailtune.tuner.types import InForce

    def isvc(config: InForce) -> dict[str, object]:
        return {"metadata": {"annotations": {APPLIED_ANNOTATION: config.to_annotation()}}}

    changed = InForce(
        batching=Batching(max_batch_size=4, max_queue_delay_microseconds=500),
        replicas=3,
        changed_at=datetime(2026, 1, 1, tzinfo=UTC),
        reason="scale out",
    )
    assert Demo.last_change(isvc(changed)) == (1767225600.0, "max batch 4, delay 500 us, 3 replicas")
    assert Demo.last_change(isvc(InForce(batching=Batching(max_batch_size=1), replicas=1))) is None
    assert Demo.last_change({"metadata": {"annotations": {APPLIED_ANNOTATION: "{not json"}}}) is None
    assert Demo.last_change({"metadata": {}}) is None


# ----------------------------------------------------------------------------------- issue 14: client vs server


def test_client_measured_vs_server_measured_per_stretch() -> None:
    samples = run(step_at=30, end=120, latency=40, bad_until=50)
    with_server = [replace(k, prom_p99_ms=30.0 if k.t >= 60 else None) for k in ticks(120, 45)]
    s = summarize(samples, with_server, [], slo_ms=SLO, step_at=30, low_rps=40, high_rps=130, end_s=120,
                  time_to_first_ready_s=None, timings_s={})  # fmt: skip
    assert s.server_p99_ms[s.after.label] == 30.0 and s.server_p99_ms[s.before.label] is None
    assert server_p99(with_server, 0, 59) is None
    text = markdown(s)
    assert "## Client-measured vs server-measured" in text
    assert s.after.p99_ms is not None
    outside = round(s.after.p99_ms - 30.0, 2)
    assert f"| {s.after.label} | {s.after.p99_ms:g} | 30 | {outside:g} |" in text
    assert f"| {s.before.label} | {s.before.p99_ms:g} | n/a | n/a |" in text


def test_the_report_shows_where_the_server_time_goes_per_stretch() -> None:
    """status.latency.breakdown, collected per tick, becomes a queue vs compute table per stretch."""
    from types import SimpleNamespace

    from devkit.demo import Demo

    samples = run(step_at=30, end=120, latency=40, bad_until=50)
    parts = [replace(k, queue_ms=20.0 if k.t >= 30 else 1.0, compute_ms=6.0, rest_ms=0.5) for k in ticks(120, 45)]
    s = summarize(samples, parts, [], slo_ms=SLO, step_at=30, low_rps=40, high_rps=130, end_s=120,
                  time_to_first_ready_s=None, timings_s={})  # fmt: skip
    assert s.breakdown_ms[s.before.label] == Breakdown(1.0, 6.0, 0.5)
    assert s.breakdown_ms[s.after.label] == Breakdown(20.0, 6.0, 0.5)
    assert server_breakdown(ticks(120, 45), 0, 120) == Breakdown(None, None, None)
    text = markdown(s)
    assert "## Where the server's time goes" in text
    assert f"| {s.after.label} | 20 | 6 | 0.5 | 75% |" in text
    assert f"| {s.before.label} | 1 | 6 | 0.5 | 13% |" in text

    # The demo's tick reads the breakdown off status.latency (compute = input + infer + output).
    demo = Demo.__new__(Demo)
    demo.plan = SimpleNamespace(low_rps=40.0, high_rps=130.0, step_at_s=30.0)  # type: ignore[assignment]
    demo.live_knobs = lambda ips: (None, None)  # type: ignore[method-assign]
    status = {"latency": {"breakdown": {"queueMs": 3.5, "computeInputMs": 0.25, "computeInferMs": 5.0,
                                        "computeOutputMs": 0.25, "restMs": 0.4}}}  # fmt: skip
    tick = demo.tick({"status": status}, [], 10.0, None, None)
    assert (tick.queue_ms, tick.compute_ms, tick.rest_ms) == (3.5, 5.5, 0.4)
    empty = demo.tick({"status": {}}, [], 10.0, None, None)
    assert (empty.queue_ms, empty.compute_ms, empty.rest_ms) == (None, None, None)
