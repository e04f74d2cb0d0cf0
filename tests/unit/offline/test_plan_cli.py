"""`tailtune plan`'s messages and exit codes when the SLO or the replica bound cannot be met (issue 15)."""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tailtune.offline.plan import main


def _plan(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main([*args, "--seconds", "5"], out), out.getvalue()


def _named_count(text: str) -> int:
    match = re.search(r"more replicas would do: (\d+) replicas", text)
    assert match, text
    return int(match.group(1))


def test_more_replicas_would_do_exits_1_with_the_count() -> None:
    code, text = _plan("--rate", "3000", "--slo-ms", "10")
    assert code == 1
    assert "infeasible within --replicas-max 1" in text
    count = _named_count(text)
    assert count > 1
    assert f"Raise --replicas-max to {count}." in text
    assert "inf" not in text.replace("infeasible", "")


def test_the_count_it_names_is_what_the_plan_then_uses() -> None:
    count = _named_count(_plan("--rate", "3000", "--slo-ms", "10")[1])
    code, text = _plan("--rate", "3000", "--slo-ms", "10", "--replicas-max", str(count))
    assert code == 0
    start = next(line for line in text.splitlines() if line.startswith("start config"))
    assert start.endswith(f"replicas {count}")
    assert "triton default (batch 64)" in text


def test_slo_below_one_request_is_refused_with_exit_2() -> None:
    code, text = _plan("--rate", "3000", "--slo-ms", "1")
    assert code == 2
    assert "no config can meet P99 <= 1 ms" in text
    assert "one request alone takes 2.4 ms" in text
    assert "start config" not in text
    assert "keep P99 under 0.8" not in text


def test_slo_below_two_requests_is_refused_with_exit_2() -> None:
    code, text = _plan("--rate", "100", "--slo-ms", "4")
    assert code == 2
    assert "no batching config keeps P99 under 4 ms" in text
    assert "Raise --slo-ms to at least 6.0" in text


def test_feasible_plan_exits_0() -> None:
    code, text = _plan("--rate", "300", "--slo-ms", "10")
    assert code == 0
    assert "start config: max_batch_size" in text


def test_the_command_line_exit_codes() -> None:
    """The same codes through `tailtune plan`, as a script sees them."""
    run = [sys.executable, "-m", "tailtune", "plan", "--seconds", "2"]
    slo = subprocess.run([*run, "--rate", "3000", "--slo-ms", "1"], capture_output=True, text=True, check=False)
    assert slo.returncode == 2, slo.stdout + slo.stderr
    reps = subprocess.run([*run, "--rate", "3000", "--slo-ms", "10"], capture_output=True, text=True, check=False)
    assert reps.returncode == 1, reps.stdout + reps.stderr
    assert "more replicas would do" in reps.stdout


def test_the_readme_plan_commands_exit_as_the_readme_says() -> None:
    """README "Your own model" lists `tailtune plan` lines with the exit code each gets."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    lines = re.findall(r"^tailtune plan (.+?)\s+# (.*)$", readme, re.M)
    assert len(lines) >= 3
    for args, comment in lines:
        expected = int(m.group(1)) if (m := re.match(r"exit (\d)", comment)) else 0
        code, text = _plan(*shlex.split(args))
        assert code == expected, (args, text)
