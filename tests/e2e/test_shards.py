"""Two operators on disjoint shards (`tailtune operator --shard`) serve one namespace side by side, each object by
exactly one of them, on the local cluster (a kwok GPU node of the test's own)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.e2e.test_faults import scale_node
from tests.e2e.test_operator import OperatorProcess, condition, engine_store, example

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

SHARD_LABEL = "tailtune.io/shard"
SHARDS = {"a": f"{SHARD_LABEL}=a", "rest": f"{SHARD_LABEL}!=a"}  # disjoint, and every object is in one
SHARD_PRODUCT = "TAILTUNE-SHARDS"


@pytest.fixture(scope="module")
def shard_operators(
    cluster: Cluster, crd_installed: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, OperatorProcess]]:
    path = tmp_path_factory.mktemp("shards")
    ops = {
        shard: OperatorProcess(cluster, path / f"{shard}.log", args=("--shard", selector))
        for shard, selector in SHARDS.items()
    }
    for op in ops.values():
        op.start()
    yield ops
    for op in ops.values():
        op.stop()


def test_each_object_is_served_by_exactly_one_shard(
    cluster: Cluster, shard_operators: dict[str, OperatorProcess]
) -> None:
    """Both objects become Ready, and each operator's log names only its own shard's object (kopf prefixes each line
    with namespace/name). Caught: without the shard filter both operators reconciled (and tuned) every object."""
    namespace = f"shards-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for("ServiceAccount default", lambda: cluster.get("serviceaccount", "default", namespace), 30)
    node = scale_node(f"{namespace}-node", 4)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = SHARD_PRODUCT
    cluster.apply(node)
    try:
        engine_store(cluster, namespace)
        docs = []
        for name, shard in (("in-a", "a"), ("in-b", "b"), ("unlabelled", None)):
            doc = example(name)
            doc["spec"]["serving"]["gpu"]["product"] = SHARD_PRODUCT
            doc["spec"]["serving"]["resources"] = {}
            doc["spec"]["metrics"] = {"prometheusUrl": "http://127.0.0.1:1"}
            if shard is not None:
                doc["metadata"]["labels"] = {SHARD_LABEL: shard}
            docs.append(doc)
        cluster.apply(*docs, namespace=namespace)

        def ready() -> bool:
            items = cluster.get("tis", namespace=namespace)["items"]
            return sum(1 for t in items if (condition(t, "Ready") or {}).get("status") == "True") == len(docs)

        cluster.wait_for("every object Ready", ready, 60)
        # kopf's line for each InferenceService handler that ran ("[ns/name] Handler 'on_change' succeeded"); child
        # events of another shard's object are seen by every operator and dropped after one read of the owner.
        served = {
            shard: {
                name
                for name in ("in-a", "in-b", "unlabelled")
                if f"[{namespace}/{name}] Handler 'on_change" in op.log_tail(100000)
            }
            for shard, op in shard_operators.items()
        }
        assert served == {"a": {"in-a"}, "rest": {"in-b", "unlabelled"}}, served
        assert all(op.alive() for op in shard_operators.values())
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", node["metadata"]["name"], "--wait=false", check=False)
