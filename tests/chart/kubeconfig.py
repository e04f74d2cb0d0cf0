"""A kubeconfig that authenticates as a ServiceAccount, as the operator's pod would, instead of as the admin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster


def service_account_kubeconfig(cluster: Cluster, namespace: str, sa: str, *, duration_s: int = 3600) -> Path:
    """Mints a token for namespace/sa (TokenRequest, `kubectl create token`) and writes a kubeconfig using it,
    with the admin kubeconfig's server and CA, next to that kubeconfig; returns its path."""
    token = cluster.kubectl("create", "token", sa, f"--namespace={namespace}", f"--duration={duration_s}s").stdout
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    server = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"system:serviceaccount:{namespace}:{sa}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": server}],
        "users": [{"name": user, "user": {"token": token.strip()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "cluster", "user": user, "namespace": namespace}}],
        "current-context": "sa",
        "preferences": {},
    }
    path = cluster.kubeconfig.parent / f"sa-{namespace}-{sa}.kubeconfig"
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path
