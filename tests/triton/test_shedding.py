"""Against a real tritonserver: the queue policy spec.serving.shedding renders loads, reads back, and rejects a
request that waited past its timeout while the others are answered."""

from __future__ import annotations

import time

import pytest

from devkit.triton.local import LocalTriton
from devkit.triton.repository import local_model_input
from tailtune.api.v1alpha1 import Batching, ServiceTimePoint
from tailtune.operator.modelconfig import queue_policy_in_force
from tailtune.operator.observed import EngineInfo
from tailtune.triton import control
from tailtune.triton.config import build_model_config, config_differences, config_from_json, queue_policy_from_config
from tailtune.triton.metrics import scrape, scrape_model_counters
from tests.unit.factories import make_isvc

from .conftest import Deployer, Load

pytestmark = pytest.mark.triton

BATCH_MS = 50.0  # the emulated device: every batch of one takes 50 ms


def test_the_shedding_policy_loads_and_rejects_what_waited_past_it(triton: LocalTriton, deployer: Deployer) -> None:
    isvc = make_isvc().set("spec.slo.latencyMs", 200).set("spec.serving.shedding", {"enabled": True}).obj()
    batching = Batching(max_batch_size=1)
    info = EngineInfo(service_time=(ServiceTimePoint(batch=1, ms=BATCH_MS, source="build"),))
    policy = queue_policy_in_force(isvc, batching, info)
    assert policy.timeout_microseconds == 200_000 - 55_000  # the SLO less t(1) with its spread
    inp = local_model_input("emulated_gpu", "shed", dim=4, batching=batching, queue_policy=policy)
    deployer.deploy("emulated_gpu", inp, base_ms=BATCH_MS, per_item_ms=0.0, exponent=1.0)
    live = control.get_model_config_json(triton.grpc_url, "shed")
    assert config_differences(build_model_config(inp), config_from_json(live)) == []
    assert queue_policy_from_config(live) == policy

    before = scrape_model_counters(triton.metrics_url, "shed")
    # Eight clients against one 50 ms batch at a time: a request queues behind up to seven, 350 ms, past 145 ms.
    with Load(triton, "shed", dim=4, clients=8) as load:
        time.sleep(3.0)
    counters = scrape_model_counters(triton.metrics_url, "shed") - before
    assert load.ok > 0 and load.failed > 0, (load.ok, load.failed, load.errors[:3])
    assert all("timeout" in e.lower() for e in load.errors), load.errors[:3]
    assert counters.failure >= load.failed
    # Triton's failure counter names why: what a Prometheus reader would count as shed demand.
    assert 'reason="REJECTED"' in scrape(triton.metrics_url)
    # Answered: queue wait within the timeout, then one batch, plus Triton's own request path on this machine.
    worst = max(seconds for _, seconds in load.latencies)
    assert worst < (policy.timeout_microseconds / 1e6) + BATCH_MS / 1000 + 0.25, worst
