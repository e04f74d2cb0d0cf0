"""The chart installed into the local cluster; its ServiceAccount's token may do what the operator needs, no more."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.chart import rbac
from tests.chart.helm import CHART, REPO, helm
from tests.chart.kubeconfig import service_account_kubeconfig
from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e


def can_i(cluster: Cluster, kubeconfig: Path, verb: str, resource: str, namespace: str | None) -> bool:
    """`kubectl auth can-i` (a SelfSubjectAccessReview) as the account of kubeconfig; `resource` may name a
    subresource (`pods/exec`), which kubectl itself would read as an object's name."""
    base, _, sub = resource.partition("/")
    args = [f"--namespace={namespace}"] if namespace else []
    args += [f"--subresource={sub}"] if sub else []
    result = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "auth", "can-i", verb, base, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def as_account(
    cluster: Cluster, kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@contextmanager
def installed(cluster: Cluster, namespace: str, *sets: str) -> Iterator[tuple[str, str]]:
    """helm install into namespace (CRDs included; no --wait: RBAC is under test, not the kwok pods); uninstalls
    after, which also removes its cluster-scoped objects (ClusterRole, binding, peering)."""
    release = f"tailtune-{secrets.token_hex(3)}"
    args = [f"--set={s}" for s in (f"peering.name={release}", *sets)]
    result = helm("install", release, str(CHART), f"--namespace={namespace}", *args, env=cluster.env, timeout_s=300)
    assert result.returncode == 0, result.stderr
    try:
        yield release, result.stdout
    finally:
        helm("uninstall", release, f"--namespace={namespace}", "--wait", env=cluster.env, timeout_s=300)


class Release(NamedTuple):
    name: str
    kubeconfig: Path  # of its ServiceAccount
    output: str  # helm's, NOTES included


@pytest.fixture
def clusterwide(cluster: Cluster, namespace: str) -> Iterator[Release]:
    """The chart installed into `namespace`, watching every namespace."""
    with installed(cluster, namespace) as (name, output):
        kubeconfig = service_account_kubeconfig(cluster, namespace, name)
        yield Release(name, kubeconfig, output)
        kubeconfig.unlink()


def test_install_creates_the_operator_and_its_peering(cluster: Cluster, namespace: str, clusterwide: Release) -> None:
    release, output = clusterwide.name, clusterwide.output
    deployment = cluster.get("deployment", release, namespace)
    assert deployment["spec"]["replicas"] == 2
    assert cluster.get("clusterkopfpeering", release) is not None
    for crd in ("inferenceservices.tailtune.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    notes = output.split("NOTES:", 1)[1]
    assert f"kubectl --namespace {namespace} rollout status deployment/{release}" in notes
    # The engine store is created in the release namespace, so that is where the example goes.
    assert 'created PersistentVolumeClaim "tailtune-engines"' in notes
    assert f"kubectl apply --namespace {namespace} -f examples/resnet-l4.yaml" in notes
    assert f"kubectl get tis --namespace {namespace} --watch" in notes
    pvc = cluster.get("persistentvolumeclaim", "tailtune-engines", namespace)
    assert pvc is not None and pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_service_account_may_do_what_the_operator_needs(cluster: Cluster, namespace: str, clusterwide: Release) -> None:
    kubeconfig = clusterwide.kubeconfig
    denied = [
        f"{verb} {resource}"
        for group, name, verbs in (*rbac.NAMESPACED, rbac.CLUSTER_PEERINGS, rbac.CRDS)
        for verb in sorted(verbs)
        for resource in [rbac.kubectl_resource(group, name)]
        if not can_i(cluster, kubeconfig, verb, resource, namespace)
    ]
    assert denied == []


def test_service_account_may_not_do_more(cluster: Cluster, namespace: str, clusterwide: Release) -> None:
    kubeconfig = clusterwide.kubeconfig
    allowed = [
        f"{verb} {resource}"
        for verb, resource, namespaced in rbac.FORBIDDEN
        if can_i(cluster, kubeconfig, verb, resource, namespace if namespaced else None)
    ]
    assert allowed == []


def test_real_requests_under_the_token(cluster: Cluster, namespace: str, clusterwide: Release) -> None:
    """Not only the review: the API server itself lets the operator's writes through and stops the rest."""
    release, kubeconfig = clusterwide.name, clusterwide.kubeconfig
    config_map = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: probe, namespace: {namespace}}}\ndata: {{a: b}}\n"
    # Server-side apply creating an object: what kube.py does for every child.
    applied = as_account(
        cluster, kubeconfig, "apply", "--server-side", "--field-manager=tailtune-operator", "-f", "-", stdin=config_map
    )
    assert applied.returncode == 0, applied.stderr
    peering = as_account(cluster, kubeconfig, "get", "clusterkopfpeering", release, "-o", "name")
    assert peering.returncode == 0, peering.stderr
    secrets_list = as_account(cluster, kubeconfig, "get", "secrets", f"--namespace={namespace}")
    assert secrets_list.returncode != 0 and "Forbidden" in secrets_list.stderr, secrets_list.stderr
    deleted = as_account(cluster, kubeconfig, "delete", "configmap", "probe", f"--namespace={namespace}")
    assert deleted.returncode != 0 and "Forbidden" in deleted.stderr, deleted.stderr


def test_inference_service_writes_under_the_token(cluster: Cluster, namespace: str, clusterwide: Release) -> None:
    """kopf's progress annotation and the status write, on a real InferenceService."""
    kubeconfig = clusterwide.kubeconfig
    cluster.kubectl("apply", f"--namespace={namespace}", "-f", str(REPO / "examples" / "resnet-l4.yaml"))
    ns = f"--namespace={namespace}"
    annotate = '{"metadata": {"annotations": {"tailtune.io/probe": "1"}}}'
    status = '{"status": {"observedGeneration": 1}}'
    for args in (
        ("get", "tis", "resnet50", ns),
        ("patch", "tis", "resnet50", ns, "--type=merge", f"--patch={annotate}"),
        ("patch", "tis", "resnet50", ns, "--subresource=status", "--type=merge", f"--patch={status}"),
    ):
        result = as_account(cluster, kubeconfig, *args)
        assert result.returncode == 0, f"{args}: {result.stderr}"
    assert cluster.get("tis", "resnet50", namespace)["status"]["observedGeneration"] == 1
    deleted = as_account(cluster, kubeconfig, "delete", "tis", "resnet50", ns)
    assert deleted.returncode != 0 and "Forbidden" in deleted.stderr, deleted.stderr


def test_namespaced_install_writes_only_where_it_serves(cluster: Cluster, namespace: str) -> None:
    other = f"{namespace[:50]}-other"
    cluster.kubectl("create", "namespace", other)
    needed = [
        (verb, rbac.kubectl_resource(group, name))
        for group, name, verbs in (*rbac.NAMESPACED, rbac.PEERINGS)
        for verb in sorted(verbs)
    ]
    try:
        with installed(cluster, namespace, f"watchNamespaces[0]={namespace}") as (release, _):
            kubeconfig = service_account_kubeconfig(cluster, namespace, release)
            assert cluster.get("kopfpeering", release, namespace) is not None
            assert [f"{v} {r}" for v, r in needed if not can_i(cluster, kubeconfig, v, r, namespace)] == []
            assert [f"{v} {r}" for v, r in needed if can_i(cluster, kubeconfig, v, r, other)] == []
            assert not can_i(cluster, kubeconfig, "patch", "clusterkopfpeerings.kopf.dev", None)
            assert can_i(cluster, kubeconfig, "watch", "namespaces", None)
            kubeconfig.unlink()
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
