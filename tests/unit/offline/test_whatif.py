"""The what-if runner behind `tailtune simulate`: its input files, its summary, and do-no-harm."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tailtune.offline.whatif import PLAN, InputError, Setup, excess_by_rule, read_curve, read_trace, summarize
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner.servicetime import ladder


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("size,ms\n1,2\n", 1),
        ("batch\n1\n", 1),
        ("batch,ms\n1,2\n2,fast\n", 3),
        ("batch,ms\n1,2\n2.5,3\n", 3),
        ("batch,ms\n1,2\n4,3\n1,2.5\n", 4),
        ("batch,ms\n1,2\n0,3\n", 3),
        ("batch,ms\n1,-2\n", 2),
        ("batch,ms\n1,2\n2,\n", 3),
        ("batch,ms\n1,2,3\n", 2),
        ("batch,ms\n1,2\n100000000,5\n", 3),
    ],
    ids=[
        "bad-header",
        "one-column",
        "non-numeric",
        "fractional-batch",
        "duplicate",
        "zero",
        "negative",
        "empty",
        "extra",
        "past-the-spec's-max-batch",
    ],
)
def test_bad_curve_names_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = _write(tmp_path, "curve.csv", text)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}:{line}: "):
        read_curve(path)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("time,rate\n0,1\n10,1\n", 1),
        ("t_s,rate_rps\n0,1\nten,1\n", 3),
        ("t_s,rate_rps\n0,1\n10,2\n10,3\n", 4),
        ("t_s,rate_rps\n0,1\n10,2\n5,3\n", 4),
        ("t_s,rate_rps\n0,1\n10,-2\n", 3),
        ("t_s,rate_rps\n0,1\n10,inf\n", 3),
    ],
    ids=["bad-header", "non-numeric", "repeated-time", "decreasing-time", "negative-rate", "infinite-rate"],
)
def test_bad_trace_names_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = _write(tmp_path, "trace.csv", text)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}:{line}: "):
        read_trace(path)


@pytest.mark.parametrize(
    "text",
    ["t_s,rate_rps\n0,10\n", "t_s,rate_rps\n", "t_s,rate_rps\n5,1\n10,1\n"],
    ids=["single-row", "no-rows", "not-from-zero"],
)
def test_trace_without_a_usable_span_names_the_file(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, "trace.csv", text)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: "):
        read_trace(path)


def test_missing_or_empty_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.csv: cannot read"):
        read_curve(tmp_path / "nope.csv")
    with pytest.raises(InputError, match=r"curve\.csv: no points"):
        read_curve(_write(tmp_path, "curve.csv", "batch,ms\n"))


def test_a_file_that_is_not_text_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "curve.csv"
    path.write_bytes(b"\xff\xfe\x00batch,ms\n")
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: not UTF-8 text"):
        read_curve(path)


def test_a_spreadsheets_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "curve.csv"
    path.write_bytes("batch,ms\n1,2\n8,5\n".encode("utf-8-sig"))
    assert read_curve(path).points == ((1, 2.0), (8, 5.0))


def test_good_files_parse(tmp_path: Path) -> None:
    curve = read_curve(_write(tmp_path, "l4.csv", "batch,ms\n4,3.0\n1,2.0\n 8 , 5.5\n"))
    assert curve.points == ((1, 2.0), (4, 3.0), (8, 5.5)) and curve.name == "l4" and curve.engine_max == 8
    assert curve.ms(2) == pytest.approx(2 + 1 / 3) and curve.ms(1) == 2.0
    trace = read_trace(_write(tmp_path, "t.csv", "t_s,rate_rps\n0,10\n30,20.5\n60,0\n"))
    assert trace == ((0.0, 30.0, 10.0), (30.0, 60.0, 20.5))


def _curve(a: float, c: float, p: float, top: int) -> PiecewiseCurve:
    return PiecewiseCurve(tuple((b, a + c * b**p) for b in ladder(top)), f"power-{p:g}")


def test_summary_has_the_documented_keys() -> None:
    setup = Setup(curve=_curve(2, 0.4, 1.3, 32), segments=((0.0, 120.0, 40.0),), slo_ms=50.0, seed=3)
    for policy in ("triton-default", "tailtune"):
        s = summarize(setup, policy)
        assert {
            "goodput_rps",
            "offered_rps",
            "windows",
            "windows_in_slo",
            "windows_excluding_steps",
            "windows_in_slo_excluding_steps",
            "changes",
            "settle_intervals",
            "final",
            "timeline",
        } <= set(s)
        assert set(s["final"]) == {"max_batch", "delay_us", "replicas"}
        assert s["windows"] == len(s["timeline"]) == 4
        assert s["offered_rps"] == 40.0
        # Poisson noise on 4 800 requests: a few percent at most.
        assert 0 < s["goodput_rps"] <= s["offered_rps"] * 1.05
        assert 0 <= s["windows_in_slo"] <= s["windows"]
        assert s["windows_excluding_steps"] == s["windows"]  # no step in a constant trace
        assert s["windows_in_slo_excluding_steps"] <= s["windows_excluding_steps"]
        assert all({"t_s", "p_ms", "goodput_rps", "max_batch", "decision"} <= set(row) for row in s["timeline"])
    default = summarize(setup, "triton-default")
    assert default["final"] == {"max_batch": 32, "delay_us": 0, "replicas": 1} and default["changes"] == 0


# Short seeded scenarios: (curve, trace segments, SLO ms, replicas max, seed).
SCENARIOS = [
    (_curve(2, 0.4, 1.3, 64), ((0.0, 60.0, 100.0), (60.0, 180.0, 400.0)), 50.0, 2, 1),
    (_curve(3, 0.2, 1.5, 64), ((0.0, 90.0, 150.0), (90.0, 180.0, 250.0)), 80.0, 1, 2),
    (_curve(1, 0.5, 1.0, 32), ((0.0, 180.0, 300.0),), 40.0, 3, 3),
    (_curve(2, 0.3, 1.2, 128), ((0.0, 60.0, 50.0), (60.0, 120.0, 500.0), (120.0, 180.0, 200.0)), 60.0, 2, 4),
    (_curve(4, 0.1, 1.4, 64), ((0.0, 180.0, 600.0),), 100.0, 1, 5),
]


def _goodputs(start_at_default: bool) -> list[tuple[int, float, float]]:
    out = []
    for k, (curve, segments, slo, replicas_max, seed) in enumerate(SCENARIOS):
        start = curve.engine_max if start_at_default else 1
        setup = Setup(curve, segments, slo, replicas_max=replicas_max, seed=seed, start_max_batch=start)
        ours, default = summarize(setup, "tailtune"), summarize(setup, "triton-default")
        out.append((k, ours["goodput_rps"], default["goodput_rps"]))
    return out


def test_do_no_harm_from_tritons_default() -> None:
    """Started from Triton's default config, tuning never serves fewer requests within the SLO."""
    runs = _goodputs(start_at_default=True)
    assert all(ours >= 0.97 * default for _, ours, default in runs), runs


def test_do_no_harm_from_the_operators_start_config() -> None:
    runs = _goodputs(start_at_default=False)
    assert all(ours >= 0.97 * default for _, ours, default in runs), runs


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--slo-ms", "0"], "--slo-ms"),
        (["--slo-ms", "inf"], "--slo-ms"),
        (["--percentile", "100"], "--percentile"),
        (["--interval-s", "nan"], "--interval-s"),
        (["--p99-noise", "1.5"], "--p99-noise"),
        (["--gap", "300"], "--gap"),
        (["--gap", "300:0"], "--gap"),
        (["--gap", "nan:2"], "--gap"),
        (["--duration-s", "0"], "--duration-s"),
        (["--seed", "-1"], "--seed"),
        (["--replicas", "2", "--replicas-max", "1"], "--replicas-max"),
        (["--policy", "static:0:0"], "static:0:0"),
        (["--instances", "17"], "--instances"),
        (["--replicas", "1001"], "--replicas"),
        (["--replicas-max", "1001"], "--replicas-max"),
        (["--interval-s", "0.001"], "--interval-s"),
        (["--plot", "plot.jpgx"], "--plot"),
        (["--plot", "no/such/folder/plot.png"], "--plot"),
        (["--target-utilization", "0.99"], "--target-utilization"),
        (["--target-utilization", "nan"], "--target-utilization"),
    ],
)
def test_simulate_bad_flags_exit_2_naming_the_flag(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    named: str,
) -> None:
    """`tailtune simulate` on a bad flag: exit 2 and one line on stderr that names it; no summary, no traceback."""
    from tailtune.offline.simulate import main

    monkeypatch.chdir(tmp_path)  # relative --plot paths land here, whatever happens

    curve = _write(tmp_path, "c.csv", "batch,ms\n1,2\n8,6\n")
    trace = _write(tmp_path, "t.csv", "t_s,rate_rps\n0,100\n60,0\n")
    args = ["--curve", str(curve), "--trace", str(trace), "--slo-ms", "30", *flags]
    # A later --slo-ms wins in argparse: the flag under test is the one given last.
    assert main(args) == 2
    out = capsys.readouterr()
    assert out.out == "" and named in out.err and "Traceback" not in out.err, out


def test_simulate_refuses_a_trace_past_what_it_can_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace asking for more requests than the simulator can keep in memory: exit 2 naming the trace and the
    way out, instead of a MemoryError traceback; --duration-s that brings it under the limit is accepted."""
    from tailtune.offline.simulate import MAX_REQUESTS, _parser, _setup, main

    curve = _write(tmp_path, "c.csv", "batch,ms\n1,2\n8,6\n")
    rate = 2 * MAX_REQUESTS / 100
    trace = _write(tmp_path, "t.csv", f"t_s,rate_rps\n0,{rate}\n100,0\n")
    args = ["--curve", str(curve), "--trace", str(trace), "--slo-ms", "30"]
    assert main(args) == 2
    out = capsys.readouterr()
    assert out.out == "" and "t.csv" in out.err and "--duration-s" in out.err and "Traceback" not in out.err, out
    setup = _setup(_parser().parse_args([*args, "--duration-s", "40"]))
    assert setup.end_s == 40


def test_simulate_refuses_a_trace_of_more_windows_than_it_can_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long idle trace asks for no requests but billions of tuner decisions: exit 2 naming the trace and the
    way out, at once (it ran for hours before)."""
    from tailtune.offline.simulate import MAX_WINDOWS, main

    curve = _write(tmp_path, "c.csv", "batch,ms\n1,2\n8,6\n")
    trace = _write(tmp_path, "t.csv", f"t_s,rate_rps\n0,0\n{30 * (MAX_WINDOWS + 1)},0\n")
    assert main(["--curve", str(curve), "--trace", str(trace), "--slo-ms", "30"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "t.csv" in out.err and "--duration-s" in out.err and "--interval-s" in out.err, out
    assert "Traceback" not in out.err


def test_rate_at_finds_the_segment_of_a_long_trace_and_of_one_out_of_order() -> None:
    """A recorded trace has a row a second: the rate at t is found by bisection, and is the same as a scan of the
    segments (first match) at every point, with gaps between segments, at their edges, before and after them; a
    segment list out of order is scanned."""
    rng = np.random.default_rng(5)
    curve = PiecewiseCurve(((1, 2.0), (8, 6.0)), "t")
    for case in range(20):
        starts = np.cumsum(rng.uniform(0.0, 3.0, 40))
        ends = starts + rng.uniform(0.0, 3.0, 40) * (rng.uniform(size=40) < 0.8)
        ends = np.minimum(ends, np.append(starts[1:], np.inf))
        segs = tuple(
            (float(a), float(b), float(r)) for a, b, r in zip(starts, ends, rng.uniform(0, 100, 40), strict=True)
        )
        shuffled = segs if case % 2 == 0 else tuple(rng.permutation(np.asarray(segs)).tolist())
        setup = Setup(curve=curve, segments=shuffled, slo_ms=30.0)
        points = [*starts, *ends, *rng.uniform(-1.0, float(ends[-1]) + 1.0, 200)]
        for t in points:
            expected = next((r for a, b, r in shuffled if a <= t < b), 0.0)
            assert setup.rate_at(float(t)) == expected, (case, t)


def test_window_goodput_does_not_depend_on_the_order_of_the_requests() -> None:
    """Per-window goodput and percentile slice each window's requests out of the arrival-sorted outcomes; given in
    another order, the same figures."""
    from tailtune.offline.whatif import Run, windows_goodput

    rng = np.random.default_rng(9)
    curve = PiecewiseCurve(((1, 2.0), (8, 6.0)), "t")
    setup = Setup(curve=curve, segments=((0.0, 300.0, 50.0),), slo_ms=30.0, interval_s=30.0)
    arrivals = np.sort(rng.uniform(0.0, 300.0, 5000))
    # Some windows empty, some never answered (inf), the rest spread around the SLO.
    keep = (arrivals < 90) | (arrivals >= 120)
    arrivals = arrivals[keep]
    latency = rng.lognormal(np.log(0.025), 0.5, len(arrivals))
    latency[rng.uniform(size=len(arrivals)) < 0.01] = np.inf
    good, pct = windows_goodput(Run("x", arrivals, latency), setup)
    order = rng.permutation(len(arrivals))
    good2, pct2 = windows_goodput(Run("x", arrivals[order], latency[order]), setup)
    assert np.array_equal(good, good2) and np.array_equal(pct, pct2)
    for w in range(10):
        mine = latency[(arrivals >= 30 * w) & (arrivals < 30 * (w + 1))]
        assert good[w] == pytest.approx(np.count_nonzero(mine * 1000 <= 30.0) / 30.0)
    assert good[3] == 0.0 and pct[3] == 0.0


def _window(t: float, replicas: int, decision: str = "", bound_by: str = "") -> dict[str, object]:
    return {"t_s": t, "replicas": replicas, "decision": decision, "bound_by": bound_by}


def test_replicas_above_the_least_are_put_down_to_the_rule_that_kept_them() -> None:
    """Each window's replicas above the least count go to the gate or guard the decision before the window names
    (the plan where it names none); a window with fewer replicas takes nothing back."""
    ours = {
        "timeline": [
            _window(0, 5, "NoTraffic", "no-traffic"),
            _window(30, 5, "Settled", "no-scale-in-under-pressure"),
            _window(60, 3, "ScaledIn", ""),
            _window(90, 3),  # no decision at this window's end: the plan's count still holds
            _window(120, 1, "Settled", "scale-in-above-too-few"),
            _window(150, 2),
        ]
    }
    least = {"timeline": [_window(30.0 * i, n) for i, n in enumerate((2, 2, 2, 1, 2, 1))]}
    got = excess_by_rule(ours, least, 30.0)
    assert got == {
        PLAN: (5 - 2) * 30.0 + (3 - 1) * 30.0,
        "no-traffic": 3 * 30.0,
        "no-scale-in-under-pressure": 30.0,
        "scale-in-above-too-few": 30.0,
    }
