"""A spec change that forbids the config the tuner has in force, on the local cluster with the operator running.

The tuner's recorded config (max batch 8 on 2 replicas, the spec's start being max batch 1 on 1) meets a patch of
`tuning.maxBatchSize.max` to 4: status, the ConfigMap and the Deployment go to max batch 4 on 2 replicas (clamped,
never the spec's start), one ConfigClamped Event names the field, and the replicas never drop on the way. Rolling
mode: the kwok pods run no Triton, so the hot path (a canary aborted, pods reloaded) is covered by the unit tests
(`tests/unit/operator/test_spec_change.py`).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.types import InForce
from tests.e2e.test_faults import events
from tests.e2e.test_operator import OperatorProcess, engine_store, example, wait_condition

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e


def test_bounds_patched_below_the_config_in_force_clamp_it_and_keep_the_replicas(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    doc = example()
    doc["spec"]["serving"]["batching"] = {"maxBatchSize": 1}
    doc["spec"]["warmup"]["batchSizes"] = [1]
    doc["spec"]["tuning"]["mode"] = "rolling"
    doc["spec"]["tuning"]["intervalSeconds"] = 300  # only the spec change wakes the tuner within the test
    tuned = InForce(batching=Batching(max_batch_size=8, max_queue_delay_microseconds=500), replicas=2, reason="tuned")
    doc["metadata"]["annotations"] = {APPLIED_ANNOTATION: tuned.to_annotation()}
    cluster.apply(doc, namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    tis = cluster.get("tis", "resnet50", namespace)
    assert tis["status"]["batching"]["maxBatchSize"] == 8 and tis["status"]["replicas"]["desired"] == 2
    # The tuner's first tick (no Prometheus here: status.latency says so); its next is 300 s away.
    cluster.wait_for("the tuner's first tick", lambda: cluster.get("tis", "resnet50", namespace)["status"]
                     .get("latency", {}).get("problem"), 30)  # fmt: skip

    patch = {"spec": {"tuning": {"maxBatchSize": {"min": 1, "max": 4}}}}
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    patched = time.monotonic()
    desired: list[int] = []

    def clamped() -> dict[str, Any] | None:
        tis = cluster.get("tis", "resnet50", namespace)
        desired.append(cluster.get("deployment", "resnet50-triton", namespace)["spec"]["replicas"])
        assert desired[-1] == 2, f"the replicas moved on the way: {desired}"
        told = [e for e in events(cluster, namespace, "resnet50") if e["reason"] == "ConfigClamped"]
        status = tis["status"]
        done = status["batching"]["maxBatchSize"] == 4 and status["observedGeneration"] == tis["metadata"]["generation"]
        recorded = InForce.from_annotation(tis["metadata"]["annotations"][APPLIED_ANNOTATION])
        return tis if done and told and recorded.batching.max_batch_size == 4 else None

    tis = cluster.wait_for("max batch 4 in status and on record, and one ConfigClamped Event", clamped, 60)
    seconds = time.monotonic() - patched
    assert tis["status"]["replicas"]["desired"] == 2
    assert "maxBatchSize 8 -> 4 (tuning.maxBatchSize.max 4)" in tis["status"]["batching"]["reason"]
    applied = InForce.from_annotation(tis["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert (applied.batching.max_batch_size, applied.batching.max_queue_delay_microseconds, applied.replicas) == (
        4, 500, 2,
    )  # fmt: skip
    cm = cluster.get("configmap", "resnet50-triton-config", namespace)
    assert "max_batch_size: 4" in cm["data"]["config.pbtxt"]
    told = [e for e in events(cluster, namespace, "resnet50") if e["reason"] == "ConfigClamped"]
    assert len(told) == 1 and "tuning.maxBatchSize.max 4" in told[0]["message"]
    print(f"clamped and told {seconds:.1f} s after the patch (tuning interval 300 s)")
