"""Not collected by the suite (no test_ prefix): `tests/e2e/test_cleanup.py` runs it in a pytest of its own.

It takes the suite's session cluster fixture, says so on stdout, and waits to be stopped by a signal.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

READY = "SIGTERM-PROBE-READY"


def test_holds_the_cluster_until_stopped(cluster: Cluster) -> None:
    assert cluster.get("nodes") is not None
    sys.stdout.write(f"{READY}\n")
    sys.stdout.flush()
    time.sleep(600)
