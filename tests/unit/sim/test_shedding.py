"""The simulator's queue timeout (Triton's default_queue_policy, timeout_action REJECT): load shedding."""

from __future__ import annotations

import numpy as np
import pytest

from tailtune.api.v1alpha1 import Batching
from tailtune.sim import SimCluster, poisson
from tailtune.sim.batcher import Replica
from tailtune.sim.curves import LinearPower
from tests.sampling import cases

FLAT_10MS = LinearPower(a_ms=10.0, c_ms=0.0, p=1.0)


def _replica(batching: Batching, timeout_s: float, *, instances: int = 1) -> Replica:
    return Replica(
        [0.0] + [FLAT_10MS.ms(b) for b in range(1, 65)], batching, instances=instances, queue_timeout_s=timeout_s
    )


def _served(rep: Replica) -> list[tuple[float, float]]:
    arr, lat = rep.outcomes()
    return [(round(float(a), 6), round(float(x), 6)) for a, x in zip(arr, lat, strict=True) if np.isfinite(x)]


def test_a_request_that_waited_past_the_timeout_is_rejected_when_the_batcher_looks() -> None:
    # Four at t=0, max batch 1, 10 ms a batch, timeout 15 ms: the first goes at 0, the second at 10 ms (waited 10),
    # the last two have waited 20 ms when the batcher looks again at 20 ms: both rejected then.
    rep = _replica(Batching(max_batch_size=1), timeout_s=0.015)
    rep.add_arrivals(np.asarray([0.0, 0.0, 0.0, 0.0]))
    rep.run_until(1.0)
    assert _served(rep) == [(0.0, 0.010), (0.0, 0.020)]
    assert rep.shed().tolist() == [0.0, 0.0]
    assert rep.shed_between(0.0, 0.020) == 0 and rep.shed_between(0.020, 0.021) == 2
    assert rep.pending(0.015) == 2 and rep.pending(0.020) == 0
    arr, lat = rep.outcomes()  # every request is accounted for, the rejected ones never answered
    assert sorted(arr.tolist()) == [0.0] * 4 and int(np.isinf(lat).sum()) == 2
    assert rep.rejected == 0  # the full-queue count stays apart


def test_no_timeout_serves_everyone_late() -> None:
    rep = _replica(Batching(max_batch_size=1), timeout_s=0.0)
    rep.add_arrivals(np.asarray([0.0, 0.0, 0.0, 0.0]))
    rep.run_until(1.0)
    assert _served(rep) == [(0.0, 0.010), (0.0, 0.020), (0.0, 0.030), (0.0, 0.040)]
    assert rep.shed().tolist() == []


def test_the_survivors_of_a_timeout_form_the_next_batch() -> None:
    # Max batch 2: at 10 ms the two oldest (t=0) have waited 10 ms > 5 ms and go; the two at 8 ms (waited 2) batch.
    rep = _replica(Batching(max_batch_size=2), timeout_s=0.005)
    rep.add_arrivals(np.asarray([0.0, 0.0, 0.0, 0.0, 0.008, 0.008]))
    rep.run_until(1.0)
    assert _served(rep) == [(0.0, 0.010), (0.0, 0.010), (0.008, 0.012), (0.008, 0.012)]
    assert rep.shed().tolist() == [0.0, 0.0]


def test_a_reload_brings_its_own_timeout() -> None:
    rep = _replica(Batching(max_batch_size=1), timeout_s=0.0)
    rep.add_arrivals(np.asarray([0.0, 0.0, 0.0, 0.0]))
    rep.run_until(0.005)
    rep.set_batching(Batching(max_batch_size=1), at=0.005, queue_timeout_s=0.015)
    rep.run_until(1.0)
    assert len(rep.shed()) == 2


def test_no_answered_request_waited_past_the_timeout_in_overload() -> None:
    """The invariant: with shedding, every answered request's queue wait is within the timeout; what is not answered
    was rejected, none lost in between. Over a family of overloads (rate, batching, instances, delay, timeout)."""
    rng = np.random.default_rng(38)
    for case in range(cases(50)):
        mb = int(rng.choice([1, 2, 4, 8]))
        timeout_s = float(rng.uniform(0.003, 0.05))
        curve = LinearPower(a_ms=2.0, c_ms=float(rng.uniform(0.3, 2.0)), p=1.0)
        rate = mb / (curve.ms(mb) / 1000.0) * float(rng.uniform(1.2, 3.0))  # past the capacity
        batching = Batching(max_batch_size=mb, max_queue_delay_microseconds=int(rng.choice([0, 2000])))
        rep = Replica(
            [0.0] + [curve.ms(b) for b in range(1, 9)],
            batching,
            instances=int(rng.integers(1, 3)),
            queue_timeout_s=timeout_s,
            noise_sigma=0.05,
            rng=np.random.default_rng(case),
        )
        rep.add_arrivals(poisson(rate, 20.0, seed=case).arrivals)
        rep.run_until(20.0)
        waits = rep.window(0.0, 20.0).queue_s
        assert waits.max() <= timeout_s + 1e-9, f"case {case}: waited {waits.max()} > {timeout_s}"
        rep.run_until(21.0)  # nothing arrives after 20 s: the rest is answered or rejected
        _, lat = rep.outcomes()
        assert len(rep.shed()) > 0, f"case {case}: an overload shed nothing"
        assert int(np.isinf(lat).sum()) == len(rep.shed()), f"case {case}: a request neither answered nor rejected"


def test_the_cluster_reloads_the_timeout_with_the_batching() -> None:
    seen: list[int] = []

    def timeout(b: Batching) -> float:
        seen.append(b.max_batch_size)
        return 0.02 if b.max_batch_size == 1 else 0.0

    cluster = SimCluster(
        FLAT_10MS,
        poisson(300.0, 10.0, seed=3).arrivals,
        Batching(max_batch_size=1),
        queue_timeout=timeout,
        engine_max_batch=8,
    )
    cluster.advance(5.0)
    shed_before = len(cluster.shed())
    assert shed_before > 0
    cluster.apply(Batching(max_batch_size=8), replicas=1)
    cluster.advance(10.0)
    assert len(cluster.shed()) == shed_before  # max batch 8 carries no timeout here
    assert seen == [1, 8]


@pytest.mark.parametrize("instances", [1, 2])
def test_shedding_keeps_the_answered_tail_within_timeout_plus_the_batches_ahead(instances: int) -> None:
    # Twice the capacity of one replica at max batch 4 (10 ms a batch): every answered request is within the
    # timeout plus its batch and the other instances' batches ahead of it on the device.
    timeout_s = 0.03
    rep = _replica(Batching(max_batch_size=4), timeout_s, instances=instances)
    rep.add_arrivals(poisson(800.0, 20.0, seed=5).arrivals)
    rep.run_until(20.0)
    assert rep.window(0.0, 20.0).latency_s.max() <= timeout_s + instances * 0.010 + 1e-9
    assert len(rep.shed()) > 0
