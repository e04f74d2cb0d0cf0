"""Child processes of the tests that start real components of their own (the demo brings up a cluster)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

# How long a child given SIGTERM has to tear down what it started (the demo: its operator, Prometheus,
# tritonservers and a cluster of five components, each given 10 s before SIGKILL) before it is killed.
TEARDOWN_GRACE_S = 90.0


def run_to_end(argv: Sequence[str], *, timeout: float, **popen: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`, except that a child cut short (its
    timeout, or the suite itself stopped by SIGTERM or Ctrl-C) gets SIGTERM and TEARDOWN_GRACE_S to stop what it
    started, where `subprocess.run` sends SIGKILL and leaves the child's own children running."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.terminate()
            try:
                proc.communicate(timeout=TEARDOWN_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
