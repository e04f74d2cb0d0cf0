"""The batching the first Triton pods start with, through the real API server and kwok's fake GPU nodes: a start the
build's measured curve shows fragile is left before any pod serves (reconcile, `inforce.chosen_before_serving`).

kwok runs no builder: the build pod's termination message (the report a real build writes, with its service-time
ladder) comes from the `kwok.tailtune.io/report` annotation (hack/cluster/kwok/pod-complete.yaml).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.tuner.types import InForce
from tests.e2e.test_faults import events
from tests.e2e.test_operator import OperatorProcess, engine_store, example, wait_condition

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

# A ladder on which max batch 1 is fragile: a batch of 8 takes 4 ms where one takes 2.25 (four times the capacity).
LADDER_MS = {b: 2 + 0.25 * b for b in (1, 2, 4, 8, 16, 32)}


def _ready(cluster: Cluster, operator: OperatorProcess, namespace: str, *, keep: bool) -> dict[str, Any]:
    """The naive start applied (spec.tuning.keepSpecStart `keep`) and Ready: the InferenceService as it is then."""
    engine_store(cluster, namespace)
    cluster.apply(_naive(keep), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    tis: dict[str, Any] = cluster.get("tis", "resnet50", namespace)
    return tis


def _naive(keep: bool) -> dict[str, Any]:
    doc = example()
    spec = doc["spec"]
    spec["serving"]["batching"] = {"maxBatchSize": 1, "maxQueueDelayMicroseconds": 0}
    spec["warmup"]["batchSizes"] = [1]
    spec["tuning"]["keepSpecStart"] = keep
    report = {
        "inputs": spec["model"]["inputs"],
        "outputs": spec["model"]["outputs"],
        "serviceTime": [{"batch": b, "ms": ms} for b, ms in LADDER_MS.items()],
    }
    spec["engine"]["podAnnotations"] = {"kwok.tailtune.io/report": json.dumps(report)}
    return doc


def _rendered_max_batch(cluster: Cluster, namespace: str) -> int:
    text = cluster.get("configmap", "resnet50-triton-config", namespace)["data"]["config.pbtxt"]
    found = re.search(r"max_batch_size:\s*(\d+)", text)
    assert found, text
    return int(found.group(1))


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_a_fragile_start_is_left_before_the_first_pod_serves(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    tis = _ready(cluster, operator, namespace, keep=False)
    applied = InForce.from_annotation(tis["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert applied.batching.max_batch_size > 1 and applied.changed_at is not None
    # Chosen before the Deployment existed, and what the pods were given from the start.
    deployment = cluster.get("deployment", "resnet50-triton", namespace)
    created = _time(deployment["metadata"]["creationTimestamp"])
    assert applied.changed_at.replace(microsecond=0) <= created, (applied.changed_at, created)
    assert _rendered_max_batch(cluster, namespace) == applied.batching.max_batch_size
    assert tis["status"]["batching"]["maxBatchSize"] == applied.batching.max_batch_size
    told = [e["message"] for e in events(cluster, namespace, "resnet50") if e["reason"] == "BatchingWidened"]
    assert len(told) == 1 and told[0].startswith("before the first pod serves: "), told


def test_keep_spec_start_serves_the_spec_batching_first(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    tis = _ready(cluster, operator, namespace, keep=True)
    assert APPLIED_ANNOTATION not in tis["metadata"].get("annotations", {})
    assert _rendered_max_batch(cluster, namespace) == 1
    # The report was read (the curve is in status): the spec's start was kept by choice, not for want of a curve.
    assert [p["batch"] for p in tis["status"]["serviceTime"]["points"]] == list(LADDER_MS)
