"""Fixtures for end-to-end tests against the local cluster of devkit.cluster (`python -m devkit.cluster`).

The cluster comes up once per session, right after collection when e2e tests are selected (so a cold build
of the binaries does not count against a test's timeout), and goes down at the end if this session started
it (TAILTUNE_KEEP_CLUSTER=1 keeps it up for the next run, which then reuses it). TAILTUNE_KUBECONFIG points
the tests at a running cluster instead; TAILTUNE_SKIP_E2E=1 skips them.
If the cluster cannot be built or started, every e2e test fails: it never silently skips.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import yaml

from devkit.cluster import LocalCluster, state_dir

if TYPE_CHECKING:
    from tests.e2e.test_operator import OperatorProcess

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "hack" / "cluster" / "build.sh"
E2E_DIR = Path(__file__).resolve().parent
T = TypeVar("T")


class KubectlError(AssertionError):
    """kubectl exited non-zero."""


@dataclass(frozen=True)
class Cluster:
    """A running cluster: where its kubeconfig and binaries are, and a kubectl bound to it."""

    kubeconfig: Path
    bin_dir: Path

    @property
    def env(self) -> dict[str, str]:
        """The process environment with KUBECONFIG and the cluster's binaries (kubectl, helm) on PATH."""
        path = f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this cluster; with check, raises KubectlError (stderr included) on failure."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def apply(self, *manifests: dict[str, Any], namespace: str | None = None) -> None:
        """Creates or updates the objects (client-side apply, like a user would)."""
        ns = [f"--namespace={namespace}"] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input=yaml.safe_dump_all(manifests))

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> Any:
        """`kubectl get -o json` parsed; None when the named object does not exist."""
        ns = [f"--namespace={namespace}"] if namespace else []
        result = self.kubectl("get", kind, *([name] if name else []), *ns, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise KubectlError(f"kubectl get {kind} {name or ''} failed: {result.stderr.strip()}")
        return json.loads(result.stdout)

    def wait_for(self, what: str, check: Callable[[], T | None], timeout_s: float = 60) -> T:
        """Polls check() until it returns something truthy, which it returns; fails after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.5)


# ------------------------------------------------------------------------------------ session set-up


@dataclass
class _Session:
    cluster: Cluster | None = None
    error: str | None = None
    started_here: bool = False
    attempted: bool = False


_session = _Session()


def _run_local_cluster(command: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "devkit.cluster", command]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)


def _bin_dir() -> Path:
    """The binaries for a cluster this session did not start: TAILTUNE_CLUSTER_BIN, else build.sh's cache."""
    given = os.environ.get("TAILTUNE_CLUSTER_BIN")
    if given:
        return Path(given)
    result = subprocess.run(["bash", str(BUILD_SH)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"hack/cluster/build.sh failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def _bring_up() -> None:
    """Brings the cluster up once per session, or adopts TAILTUNE_KUBECONFIG; records any error."""
    if not _session.attempted:
        _session.attempted = True
        try:
            given = os.environ.get("TAILTUNE_KUBECONFIG")
            if given:
                _session.cluster = Cluster(Path(given), _bin_dir())
            else:
                _session.started_here = _run_local_cluster("status").returncode != 0
                up = _run_local_cluster("up")
                if up.returncode != 0:
                    raise RuntimeError(f"python -m devkit.cluster up failed:\n{up.stderr[-6000:]}")
                sys.stderr.write(up.stderr)
                local = LocalCluster.load(state_dir() / "cluster.json")
                _session.cluster = Cluster(Path(local.kubeconfig), Path(local.bin_dir))
        except Exception as error:  # reported by every e2e test, as a failure
            _session.error = str(error)


def _is_e2e(item: pytest.Item) -> bool:
    return E2E_DIR in Path(str(item.path)).parents


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = os.environ.get("TAILTUNE_SKIP_E2E") == "1"
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)
            if skip:
                item.add_marker(pytest.mark.skip(reason="TAILTUNE_SKIP_E2E=1"))


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("TAILTUNE_SKIP_E2E") == "1" or session.config.option.collectonly:
        return
    # Only for tests on the session's cluster (the fixture's closure): the generative e2e tests bring up a demo
    # cluster of their own and run in hack/test.sh's other session, which must not start or stop this one.
    if any(_is_e2e(item) and "cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        _bring_up()


# ------------------------------------------------------------------------------- fault → recovery table


@dataclass(frozen=True)
class Recovery:
    """One row of the closing table: a fault, what the user saw, what was lost or duplicated, time to recover."""

    fault: str
    seen: str
    lost: str
    recover_s: float


@dataclass
class RecoveryTable:
    """Rows the fault tests record; written to tests/e2e/out/faults.md and printed at the end of the session."""

    rows: list[Recovery]

    def record(self, fault: str, seen: str, lost: str, recover_s: float) -> None:
        self.rows.append(Recovery(fault, seen, lost, recover_s))

    def markdown(self) -> str:
        lines = ["| fault | what the user saw | lost / duplicated | time to recover |", "|---|---|---|---|"]
        lines += [f"| {r.fault} | {r.seen} | {r.lost} | {r.recover_s:.1f} s |" for r in self.rows]
        return "\n".join(lines) + "\n"


_recoveries = RecoveryTable([])
FAULTS_MD = E2E_DIR / "out" / "faults.md"


@pytest.fixture(scope="session")
def recovery_table() -> RecoveryTable:
    """The session's fault → recovery table (see RecoveryTable)."""
    return _recoveries


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _recoveries.rows:
        FAULTS_MD.parent.mkdir(exist_ok=True)
        FAULTS_MD.write_text(_recoveries.markdown())
        terminalreporter.write_sep("=", f"fault → recovery ({FAULTS_MD.relative_to(REPO)})")
        terminalreporter.write(_recoveries.markdown())


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _session.started_here and os.environ.get("TAILTUNE_KEEP_CLUSTER") != "1":
        result = _run_local_cluster("down")
        if result.returncode != 0:
            sys.stderr.write(f"python -m devkit.cluster down failed:\n{result.stderr}")


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The running local cluster (see the module docstring)."""
    _bring_up()
    if _session.cluster is None:
        pytest.fail(f"the local cluster is not available: {_session.error}", pytrace=False)
    return _session.cluster


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> list[str]:
    """Applies crds/*.yaml (server-side: big schemas overflow the last-applied annotation) and waits until
    every CRD is Established; returns their names."""
    files = sorted((REPO / "crds").glob("*.yaml"))
    names = [
        doc["metadata"]["name"]
        for path in files
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "CustomResourceDefinition"
    ]
    if files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", *(f"--filename={f}" for f in files))
    for name in names:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return names


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, crd_installed: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator (`tailtune operator`, a process of its own) for one test module; its log is printed after the
    module with TAILTUNE_E2E_VERBOSE=1. A module that needs another (an HA pair, other flags) starts its own."""
    from tests.e2e.test_operator import OperatorProcess

    op = OperatorProcess(cluster, tmp_path_factory.mktemp("operator") / "operator.log")
    op.start()
    yield op
    op.stop()
    if os.environ.get("TAILTUNE_E2E_VERBOSE"):
        print(op.log_tail(200))


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted (without waiting) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{slug}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    # The ServiceAccount admission plugin rejects pods until the namespace's default ServiceAccount exists.
    cluster.wait_for(
        f"ServiceAccount default in {name}",
        lambda: cluster.get("serviceaccount", "default", name),
        timeout_s=30,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
