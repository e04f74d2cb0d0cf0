"""Suite-wide: a stop by signal (SIGTERM, SIGHUP: a CI timeout, a closed terminal) unwinds like Ctrl-C.

Python's default for SIGTERM ends the process at once: no fixture teardown, no `pytest_sessionfinish`, so the
local cluster, Prometheus and the tritonservers the suite started were left running with no parent. Raised as
KeyboardInterrupt instead, pytest stops the run, tears down every fixture (session-scoped ones included) and runs
the session-finish hooks (tests/e2e/conftest.py's stops the cluster it started). The first signal starts that
unwinding; further ones are ignored so they cannot cut the cleanup short (a SIGKILL still can, as always).
`tests/e2e/test_cleanup.py` checks it: the cluster fixture in a subprocess, SIGTERM, no process of it left.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _unwind(signum: int, frame: FrameType | None) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}: tearing down what the suite started")


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _unwind)
