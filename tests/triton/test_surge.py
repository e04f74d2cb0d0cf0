"""Against a real tritonserver: the fast path reads the model's pending-request gauge and request counters from
Triton's own metrics endpoint, and a queue that builds past what the pod serves within the SLO asks for replicas at
once."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from devkit.triton.local import LocalTriton
from devkit.triton.repository import local_model_input
from tailtune.api.v1alpha1 import Batching
from tailtune.operator.fastpath import read_pods
from tailtune.tuner.loop import FastPath
from tailtune.tuner.servicetime import CurvePoint
from tailtune.tuner.types import InForce, Policy, TunerState

from .conftest import Deployer, Load

pytestmark = pytest.mark.triton

BATCH_MS = 50.0  # the emulated device: every batch of one takes 50 ms (20 req/s)


def test_a_queue_building_on_a_real_triton_asks_for_replicas(triton: LocalTriton, deployer: Deployer) -> None:
    """Eight clients against one 50 ms batch at a time queue ~7 requests; at an SLO of 100 ms the pod serves 2 within
    it: the reads show the queue and the completions, and the check asks for more replicas (caught: a gauge that Triton
    names otherwise, or counters of another model, read as no queue)."""
    batching = Batching(max_batch_size=1)
    inp = local_model_input("emulated_gpu", "surge", dim=4, batching=batching)
    deployer.deploy("emulated_gpu", inp, base_ms=BATCH_MS, per_item_ms=0.0, exponent=1.0)
    policy = Policy(
        slo_ms=100.0,
        batch_max=1,
        replicas_max=4,
        build_curve=(CurvePoint(batch=1, ms=BATCH_MS, source="build"),),
    )
    fast, state, in_force = FastPath(), TunerState(), InForce(batching=batching, replicas=1)
    idle = read_pods([triton.host], "surge", datetime.now(UTC), port=triton.metrics_port)
    assert [(r.pending, r.completed) for r in idle] == [(0.0, 0.0)]
    fast.check(idle, in_force, state, policy, idle[0].at)
    with Load(triton, "surge", dim=4, clients=8):
        time.sleep(2.0)
        busy = read_pods([triton.host], "surge", datetime.now(UTC), port=triton.metrics_port)
    [pod] = busy
    assert pod.pending >= 3 and pod.completed >= 10, pod
    decision, state, in_force = fast.check(busy, in_force, state, policy, pod.at)
    assert decision.panic and decision.scale_out and in_force.replicas > 1, decision.reason
