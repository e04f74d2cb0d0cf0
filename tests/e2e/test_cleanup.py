"""A suite stopped by SIGTERM (a CI timeout) leaves nothing behind: the cluster fixture's processes all end.

A pytest of its own runs `probes/sigterm_probe.py`, which holds the session's cluster fixture (a cluster of its
own: TAILTUNE_CLUSTER_DIR is a temporary folder, so the suite's cluster is not touched). Once the probe says the
cluster is up, the pytest gets SIGTERM; within the grace below no process mentions that folder, the recorded pid
files are gone with it, and pytest reports the run as interrupted.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devkit.procs import processes_mentioning
from tests.e2e.probes.sigterm_probe import READY

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "probes" / "sigterm_probe.py"
UP_S = 240.0  # the probe's cluster up (etcd, API server, controller-manager, scheduler, kwok; binaries cached)
# Stopping: `devkit.cluster down` gives each of its 5 components SIGTERM and up to 10 s before SIGKILL.
DOWN_S = 60.0


def _read_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """proc's stdout up to the line holding `marker` (or all it wrote when it exits or the time runs out)."""
    assert proc.stdout is not None
    seen: list[str] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sel.select(timeout=1.0):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            break
    return "".join(seen)


@pytest.mark.timeout(UP_S + DOWN_S + 60)
def test_sigterm_stops_every_process_the_cluster_fixture_started(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    env = {k: v for k, v in os.environ.items() if k not in ("TAILTUNE_KUBECONFIG", "TAILTUNE_KEEP_CLUSTER")}
    env |= {"TAILTUNE_CLUSTER_DIR": str(state), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(PROBE)]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out = _read_until(proc, READY, UP_S)
        assert READY in out, f"the probe never held its cluster:\n{out[-4000:]}"
        started = processes_mentioning(str(state))
        assert len(started) >= 4, started  # the probe's cluster runs: etcd, API server, controllers, kwok
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=DOWN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert processes_mentioning(str(state)) == [], (out + rest)[-4000:]
    assert not state.exists() or not list(state.glob("pids/*.json")), sorted(state.rglob("*"))
    # pytest's exit code for a run stopped by KeyboardInterrupt.
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, (proc.returncode, rest[-3000:])
