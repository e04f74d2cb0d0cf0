"""The local cluster of tests/e2e for the chart's cluster-level tests (marked e2e explicitly: they live here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e import conftest as e2e

HERE = Path(__file__).resolve().parent
cluster = e2e.cluster
namespace = e2e.namespace


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TAILTUNE_SKIP_E2E") == "1":
        for item in items:
            if HERE in Path(str(item.path)).parents and item.get_closest_marker("e2e"):
                item.add_marker(pytest.mark.skip(reason="TAILTUNE_SKIP_E2E=1"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # tests/e2e/conftest.py tears down the cluster it started, but only when pytest loaded it as a conftest,
    # i.e. when tests/e2e was collected too.
    if not session.config.pluginmanager.is_registered(e2e):
        e2e.pytest_sessionfinish(session)
