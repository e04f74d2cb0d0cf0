"""`tailtune plan` prints the starting config and its prediction."""

from __future__ import annotations

import io

import pytest

from tailtune.offline.plan import main


def test_plan_for_the_emulated_curve_at_high_load() -> None:
    out = io.StringIO()
    assert main(["--rate", "700", "--slo-ms", "50", "--seconds", "30"], out) == 0
    text = out.getvalue()
    assert "linear-power(2,0.4,1.3) at 700 req/s, SLO P99 <= 50 ms" in text
    start = next(line for line in text.splitlines() if line.startswith("start config"))
    batch = int(start.split("max_batch_size ")[1].split(",")[0])
    # Near the cost minimum of 2 + 0.4 b^1.3, far below the engine's 64.
    assert 6 <= batch <= 9
    assert "max_queue_delay_microseconds 0" in start
    ours = next(line for line in text.splitlines() if "tailtune start" in line)
    assert ours.split()[-1] == "100.0%"


def test_plan_says_when_one_replica_is_not_enough_with_margin() -> None:
    # 850 req/s is within one replica's raw capacity at batch 7 (~1000 req/s) but not with the 15 % queueing
    # margin: the plan says what it would take and exits 1 instead of promising a P99.
    out = io.StringIO()
    assert main(["--rate", "850", "--slo-ms", "50", "--seconds", "30"], out) == 1
    text = out.getvalue()
    assert "infeasible within --replicas-max 1" in text and "Raise --replicas-max to 2" in text


def test_plan_scales_out_when_one_replica_cannot_serve() -> None:
    out = io.StringIO()
    args = [
        "--curve",
        "bert-base-l4",
        "--rate",
        "3000",
        "--slo-ms",
        "50",
        "--replicas-max",
        "4",
        "--seconds",
        "20",
    ]
    assert main(args, out) == 0
    start = next(line for line in out.getvalue().splitlines() if line.startswith("start config"))
    assert start.endswith("replicas 3")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--rate", "-5"], "--rate"),
        (["--rate", "nan"], "--rate"),
        (["--slo-ms", "0"], "--slo-ms"),
        (["--percentile", "100"], "--percentile"),
        (["--headroom", "2"], "--headroom"),
        (["--target-utilization", "1"], "--target-utilization"),
        (["--target-utilization", "0.3"], "--target-utilization"),
        (["--p", "-3"], "--p"),
        (["--p", "200"], "--p"),
        (["--a-ms", "0", "--c-ms", "0"], "--a-ms"),
        (["--engine-max-batch", "100000"], "--engine-max-batch"),
        (["--replicas-max", "100000"], "--replicas-max"),
        (["--instances", "0"], "--instances"),
        (["--seconds", "1e9"], "--seconds"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_plan_bad_flags_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    """A bad flag: exit 2 and one line on stderr that names it, before any planning (each of these was a
    traceback, a hang or a nan table before)."""
    out = io.StringIO()
    assert main(["--rate", "100", "--slo-ms", "30", *flags], out) == 2
    err = capsys.readouterr().err
    assert out.getvalue() == "" and named in err and "Traceback" not in err, err
