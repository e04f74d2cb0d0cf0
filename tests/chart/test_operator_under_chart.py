"""The operator as two real processes with kopf peering, under the chart's ServiceAccount token (not admin).

The full flow working through that token proves the chart's RBAC is enough; the standby taking over after
the active one is killed, with no duplicate children, proves the HA set-up.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.chart.kubeconfig import service_account_kubeconfig
from tests.chart.test_chart_cluster import installed

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def start_operator(
    cluster: Cluster, kubeconfig: Path, peering: str, priority: int, log: Path
) -> subprocess.Popen[bytes]:
    env = {**cluster.env, "KUBECONFIG": str(kubeconfig), "TAILTUNE_PEERING_LIFETIME": "10"}
    args = [sys.executable, "-m", "tailtune", "operator", f"--peering={peering}", f"--priority={priority}"]
    return subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)


def edit_config_and_wait_repaired(cluster: Cluster, namespace: str) -> float:
    """Edits the Triton config by hand (max batch 8 -> 2) and waits (15 s at most) for the operator to restore it;
    the seconds that took."""
    cm = "resnet50-triton-config"
    config = cluster.get("configmap", cm, namespace)["data"]["config.pbtxt"]
    edited = json.dumps({"data": {"config.pbtxt": config.replace("max_batch_size: 8", "max_batch_size: 2")}})
    edit = time.monotonic()
    cluster.kubectl("patch", "configmap", cm, "-n", namespace, "--type=merge", "-p", edited)
    time.sleep(0.3)
    cluster.wait_for(
        "the ConfigMap repaired", lambda: cluster.get("configmap", cm, namespace)["data"]["config.pbtxt"] == config, 15
    )
    return time.monotonic() - edit


def ready(obj: dict[str, Any] | None) -> bool:
    conditions = (obj or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_two_peered_operators_under_the_chart_account(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    from tests.e2e.test_operator import engine_store, example, jobs

    # The test binds its own engine store (a hostPath PV and the claim), as the e2e tests do.
    with installed(cluster, namespace, "engineStore.create=false") as (release, _):
        kubeconfig = service_account_kubeconfig(cluster, namespace, release)
        active = start_operator(cluster, kubeconfig, release, 200, tmp_path / "active.log")
        standby: subprocess.Popen[bytes] | None = None
        try:
            # kopf has a start-up race: two peers started in the same instant may both act for a moment (harmless
            # here: same field manager, deterministic names). Start the active one first, as a rollout would.
            cluster.wait_for(
                "the active operator to run",
                lambda: "Resuming operations" in (tmp_path / "active.log").read_text(),
                60,
            )
            standby = start_operator(cluster, kubeconfig, release, 100, tmp_path / "standby.log")
            cluster.wait_for(
                "the standby to start",
                lambda: "Initial authentication has finished" in (tmp_path / "standby.log").read_text(),
                60,
            )
            time.sleep(3)  # its first look at the peering object
            engine_store(cluster, namespace)
            cluster.apply(example(), namespace=namespace)
            cluster.wait_for(
                "Ready under the chart's account", lambda: ready(cluster.get("tis", "resnet50", namespace)), 120
            )
            time.sleep(2)  # time for a standby that had not paused to show itself in its log
            # Only the higher priority handled the object; the standby stayed paused (kopf logs that pause only
            # when it saw the peer after starting, so the handlers' own log lines are what is compared).
            assert "Handler 'on_change'" in (tmp_path / "active.log").read_text()
            assert "Handler 'on_change'" not in (tmp_path / "standby.log").read_text(), "the standby acted"
            assert "their hand edits are repaired by the resync only" not in (tmp_path / "active.log").read_text()

            # A hand edit of the ConfigMap is seen through the chart's list/watch and repaired at once (without
            # it, only the 300 s resync would).
            took = edit_config_and_wait_repaired(cluster, namespace)
            print(f"ConfigMap hand edit repaired under the chart's account in {took:.1f} s")

            active.send_signal(signal.SIGKILL)
            active.wait(timeout=10)
            patch = (
                '{"spec": {"serving": {"batching": {"maxBatchSize": 4, "preferredBatchSizes": [4]}},'
                ' "warmup": {"batchSizes": [1]}}}'
            )
            cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", patch)

            def taken_over() -> bool:
                cm = cluster.get("configmap", "resnet50-triton-config", namespace)
                return bool(cm) and "max_batch_size: 4" in cm["data"]["config.pbtxt"]

            try:
                cluster.wait_for("the standby to take over", taken_over, 90)
            except BaseException:
                print((tmp_path / "standby.log").read_text()[-4000:], file=sys.stderr)
                raise
            assert "Resuming operations" in (tmp_path / "standby.log").read_text()
            assert len(jobs(cluster, namespace)) == 1
            triton = cluster.kubectl(
                "get", "deployments", "-n", namespace, "-l", "app.kubernetes.io/component=triton", "-o", "name"
            ).stdout.split()
            assert triton == ["deployment.apps/resnet50-triton"]

            # An engine change: once the new engine is Ready, the obsolete build Job is deleted under the chart's
            # account (its one delete), and only that Job.
            first = [j["metadata"]["name"] for j in jobs(cluster, namespace)]
            cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p",
                            '{"spec": {"engine": {"precision": "fp32"}}}')  # fmt: skip

            def only_the_new_job() -> bool:
                tis = cluster.get("tis", "resnet50", namespace)
                names = [j["metadata"]["name"] for j in jobs(cluster, namespace)]
                return ready(tis) and names == [tis["status"]["engine"]["cacheKey"]] and names != first

            cluster.wait_for("the obsolete build Job deleted under the chart's account", only_the_new_job, 90)
            assert "may not delete obsolete build Job" not in (tmp_path / "standby.log").read_text()
            cluster.kubectl("delete", "tis", "resnet50", "-n", namespace, "--wait=true", "--timeout=60s")
        finally:
            for proc in (active, standby):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=20)
            kubeconfig.unlink(missing_ok=True)


def test_operator_restricted_to_a_namespace_repairs_hand_edits_at_once(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """Under the chart's watchNamespaces (a Role per namespace, nothing cluster-wide) the operator asks for
    list/watch where it watches: ConfigMap hand edits are seen at the event, not at the 300 s resync."""
    from tests.e2e.test_operator import engine_store, example

    with installed(cluster, namespace, "engineStore.create=false", f"watchNamespaces={{{namespace}}}") as (
        release,
        _,
    ):
        kubeconfig = service_account_kubeconfig(cluster, namespace, release)
        env = {**cluster.env, "KUBECONFIG": str(kubeconfig)}
        log = tmp_path / "operator.log"
        args = [sys.executable, "-m", "tailtune", "operator", f"--peering={release}", f"--namespace={namespace}"]
        proc = subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)
        try:
            engine_store(cluster, namespace)
            cluster.apply(example(), namespace=namespace)
            cluster.wait_for(
                "Ready under a namespaced install", lambda: ready(cluster.get("tis", "resnet50", namespace)), 120
            )
            assert "their hand edits are repaired by the resync only" not in log.read_text()
            took = edit_config_and_wait_repaired(cluster, namespace)
            print(f"ConfigMap hand edit repaired under a namespaced install in {took:.1f} s")
            cluster.kubectl("delete", "tis", "resnet50", "-n", namespace, "--wait=true", "--timeout=60s")
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)
            kubeconfig.unlink(missing_ok=True)
