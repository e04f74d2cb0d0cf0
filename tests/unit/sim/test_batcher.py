"""Triton dynamic-batcher semantics of the simulator, with deterministic arrivals."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tailtune.api.v1alpha1 import Batching
from tailtune.sim import SimCluster, deterministic, linear_power, poisson
from tailtune.sim.batcher import Replica
from tailtune.sim.curves import LinearPower, bert_base_l4, named_curve

FLAT_10MS = LinearPower(a_ms=10.0, c_ms=0.0, p=1.0)


def _run(
    times: list[float], batching: Batching, *, instances: int = 1, max_queue_size: int = 0, until: float = 5.0
) -> Replica:
    rep = Replica(
        [0.0] + [FLAT_10MS.ms(b) for b in range(1, 65)],
        batching,
        instances=instances,
        max_queue_size=max_queue_size,
    )
    rep.add_arrivals(np.asarray(times))
    rep.run_until(until)
    return rep


def _served(rep: Replica) -> list[tuple[float, float]]:
    """(arrival, latency) of served requests, rounded to the microsecond."""
    arr, lat = rep.outcomes()
    return [(round(float(a), 6), round(float(x), 6)) for a, x in zip(arr, lat, strict=True) if np.isfinite(x)]


@pytest.mark.parametrize(
    ("name", "times", "batching", "expected"),
    [
        (
            "a preferred size goes at once, without waiting for the delay",
            [0.0, 0.001, 0.002, 0.003],
            Batching(max_batch_size=8, preferred_batch_sizes=[4], max_queue_delay_microseconds=100_000),
            [(0.0, 0.013), (0.001, 0.012), (0.002, 0.011), (0.003, 0.010)],
        ),
        (
            "max batch reached goes at once",
            [0.0, 0.001],
            Batching(max_batch_size=2, max_queue_delay_microseconds=100_000),
            [(0.0, 0.011), (0.001, 0.010)],
        ),
        (
            "no preferred or max batch formable: the oldest waits the delay",
            [0.0, 0.001],
            Batching(max_batch_size=8, max_queue_delay_microseconds=5_000),
            [(0.0, 0.015), (0.001, 0.014)],
        ),
        (
            "delay 0: a free instance takes what is queued",
            [0.0, 0.001, 0.002],
            Batching(max_batch_size=8),
            [(0.0, 0.010), (0.001, 0.019), (0.002, 0.018)],
        ),
        (
            "max batch caps what a free instance takes",
            [0.0, 0.001, 0.002, 0.003],
            Batching(max_batch_size=2),
            [(0.0, 0.010), (0.001, 0.019), (0.002, 0.018), (0.003, 0.027)],
        ),
        (
            "largest preferred size <= queue goes, the rest waits",
            [0.0, 0.0, 0.0, 0.0, 0.0],
            Batching(max_batch_size=8, preferred_batch_sizes=[2, 4], max_queue_delay_microseconds=50_000),
            [(0.0, 0.010)] * 4 + [(0.0, 0.060)],
        ),
    ],
)
def test_batching_semantics(
    name: str, times: list[float], batching: Batching, expected: list[tuple[float, float]]
) -> None:
    assert _served(_run(times, batching)) == expected, name


def test_full_queue_rejects() -> None:
    rep = _run([0.0, 0.001, 0.002, 0.003, 0.004], Batching(max_batch_size=1), max_queue_size=2)
    # The first is taken at once; two wait in the queue; the last two find it full.
    assert rep.rejected == 2
    assert _served(rep) == [(0.0, 0.010), (0.001, 0.019), (0.002, 0.028)]


def test_instances_serialize_on_one_device() -> None:
    rep = _run([0.0, 0.0], Batching(max_batch_size=1), instances=2)
    assert _served(rep) == [(0.0, 0.010), (0.0, 0.020)]
    stats = rep.window(0.0, 1.0)
    # Like Triton's compute time on a shared device, the second execution counts its wait for the device.
    assert sorted(np.round(stats.compute_s, 6)) == [0.01, 0.02]
    assert list(stats.queue_s) == [0.0, 0.0]


def test_reload_applies_to_later_batches() -> None:
    rep = Replica([0.0] + [FLAT_10MS.ms(b) for b in range(1, 9)], Batching(max_batch_size=8))
    rep.add_arrivals(np.asarray([0.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
    rep.run_until(0.5)
    rep.set_batching(Batching(max_batch_size=1), at=0.5)
    rep.run_until(2.0)
    assert sorted(set(rep.window(0.0, 2.0).batch.tolist())) == [1.0, 3.0]


def test_cluster_routes_round_robin_and_observes() -> None:
    trace = deterministic([i * 0.01 for i in range(100)], duration_s=2.0)
    cluster = SimCluster(FLAT_10MS, trace.arrivals, Batching(max_batch_size=4), replicas=2)
    cluster.advance(2.0)
    obs = cluster.observe(window_s=2.0, percentile=99)
    assert obs.request_rate == pytest.approx(50.0)
    assert obs.sample_count == 100
    # 50 req/s per replica, 10 ms per batch: each request finds an idle replica.
    assert obs.avg_batch == pytest.approx(1.0)
    assert obs.p_latency_ms == pytest.approx(10.0)
    assert obs.compute_ms == pytest.approx(10.0)
    assert obs.queue_ms == pytest.approx(0.0)
    assert obs.ready_replicas == 2
    assert obs.queue_growth_rps == pytest.approx(0.0)


def test_scale_out_waits_for_startup_and_scale_in_drains() -> None:
    trace = poisson(200.0, 60.0, seed=1)
    cluster = SimCluster(FLAT_10MS, trace.arrivals, Batching(max_batch_size=8), startup_s=10.0)
    cluster.advance(5.0)
    cluster.apply(Batching(max_batch_size=8), replicas=2)
    assert cluster.ready_replicas() == 1
    cluster.advance(20.0)
    assert cluster.ready_replicas() == 2
    cluster.apply(Batching(max_batch_size=8), replicas=1)
    cluster.advance(60.0)
    _, lat = cluster.outcomes()
    assert np.isfinite(lat).all()


def test_empty_window_has_no_latency() -> None:
    cluster = SimCluster(FLAT_10MS, np.asarray([5.0]), Batching())
    cluster.advance(2.0)
    obs = cluster.observe(window_s=2.0, percentile=99)
    assert obs.p_latency_ms is None
    assert obs.request_rate == 0.0


def test_overload_shows_backlog_growth() -> None:
    # 10 ms per request, batch 1: 100 req/s capacity against 200 req/s.
    cluster = SimCluster(FLAT_10MS, poisson(200.0, 30.0, seed=2).arrivals, Batching(max_batch_size=1))
    cluster.advance(30.0)
    obs = cluster.observe(window_s=10.0, percentile=99)
    assert obs.request_rate == pytest.approx(100.0, rel=0.02)
    assert obs.queue_growth_rps == pytest.approx(100.0, rel=0.15)


def test_the_tail_demand_shows_a_crowd_that_entered_part_way_through_the_window() -> None:
    """The tail demand (completions plus queue growth over the window's last seconds) is the crowd's rate where it
    entered part way through the window, the window's own rate where the load held across it; with a backlog too
    (completions capped by the one replica, the queue growth carries the rest)."""
    step = np.concatenate([poisson(50.0, 20.0, seed=4).arrivals, 20.0 + poisson(80.0, 10.0, seed=5).arrivals])
    cluster = SimCluster(FLAT_10MS, step, Batching(max_batch_size=1))
    cluster.advance(30.0)
    obs = cluster.observe(window_s=30.0, percentile=99, tail_s=10.0)
    assert obs.request_rate == pytest.approx(60.0, rel=0.1)
    assert obs.tail_demand_rps == pytest.approx(80.0, rel=0.1)
    # Past what one replica drains (100 req/s at batch 1): completions flat, the queue grows from the step on.
    crowd = np.concatenate([poisson(50.0, 20.0, seed=6).arrivals, 20.0 + poisson(200.0, 10.0, seed=7).arrivals])
    over = SimCluster(FLAT_10MS, crowd, Batching(max_batch_size=1))
    over.advance(30.0)
    obs = over.observe(window_s=30.0, percentile=99, tail_s=10.0)
    demand = (obs.request_rate or 0.0) + (obs.queue_growth_rps or 0.0)
    assert demand == pytest.approx(100.0, rel=0.1)
    assert obs.tail_demand_rps == pytest.approx(200.0, rel=0.1)
    steady = SimCluster(FLAT_10MS, poisson(80.0, 30.0, seed=8).arrivals, Batching(max_batch_size=1))
    steady.advance(30.0)
    obs = steady.observe(window_s=30.0, percentile=99, tail_s=10.0)
    assert obs.tail_demand_rps == pytest.approx(obs.request_rate, rel=0.15)
    assert cluster.observe(window_s=30.0, percentile=99).tail_demand_rps is None


def test_reading_between_advances_changes_nothing() -> None:
    """The replicas keep their records in typed arrays that reads view without copying: reading every window (and
    every outcome) between advances, as the tuner's loop does, gives the same requests and latencies as one run
    read once at the end, and the windows' completions add up to the requests served by then."""
    # 400 req/s, and 2000 req/s for 10 s: past what two replicas drain (800 req/s each), so queues fill and reject.
    arrivals = np.sort(
        np.concatenate([poisson(400.0, 60.0, seed=11).arrivals, 20 + poisson(1600.0, 10.0, seed=12).arrivals])
    )
    b = Batching(max_batch_size=8, max_queue_delay_microseconds=2000)
    read = SimCluster(FLAT_10MS, arrivals, b, replicas=2, max_queue_size=50, seed=3)
    once = SimCluster(FLAT_10MS, arrivals, b, replicas=2, max_queue_size=50, seed=3)
    completed = 0
    for t in range(5, 61, 5):
        read.advance(float(t))
        stats = read.observe(window_s=5.0, percentile=99, stats_since=t - 5.0, tail_s=2.0)
        completed += stats.sample_count or 0
        arr, lat = read.outcomes()
        assert len(arr) == len(lat) == len(arrivals)
    once.advance(60.0)
    a1, l1 = read.outcomes()
    a2, l2 = once.outcomes()
    assert np.array_equal(a1, a2) and np.array_equal(l1, l2)
    assert read.rejected == once.rejected > 0
    assert completed == int(np.count_nonzero(a1 + l1 < 60.0))


def test_fast_enough() -> None:
    trace = poisson(1000.0, 600.0, seed=3)
    start = time.perf_counter()
    cluster = SimCluster(linear_power(), trace.arrivals, Batching(max_batch_size=16))
    for t in range(30, 601, 30):
        cluster.advance(float(t))
        cluster.observe(60.0, 99.0)
    # Ten minutes at 1000 req/s: a few seconds on a slow shared core.
    assert time.perf_counter() - start < 20.0


def test_curves() -> None:
    lp = linear_power()
    assert lp.ms(1) == pytest.approx(2.4)
    assert lp.ms(8) == pytest.approx(2 + 0.4 * 8**1.3)
    bert = bert_base_l4()
    assert bert.ms(1) == pytest.approx(4.0)
    # Superlinear past 8: doubling the batch more than doubles the time.
    assert bert.ms(32) > 2 * bert.ms(16) > 4 * bert.ms(8) / 2
    assert bert.ms(12) == pytest.approx(6.3 * (11.0 / 6.3) ** (np.log(12 / 8) / np.log(2)))
    assert named_curve("bert-base-l4") == bert
    with pytest.raises(ValueError, match="unknown curve"):
        named_curve("nope")


def test_the_pending_count_is_the_fullest_replicas_and_stays_there_after_a_scale_out() -> None:
    """A replica's queue is its own: a replica added under a backlog takes new arrivals only, and the fullest
    replica's pending count (not the sum) is what the window reports."""
    # 10 ms per request at batch 1: 100 req/s per replica against 150 req/s, so one replica queues 50 req/s.
    cluster = SimCluster(FLAT_10MS, poisson(150.0, 40.0, seed=9).arrivals, Batching(max_batch_size=1), startup_s=10.0)
    cluster.advance(20.0)
    obs = cluster.observe(window_s=10.0, percentile=99)
    assert obs.pending_max == pytest.approx(20.0 * 50.0, rel=0.15)
    cluster.apply(Batching(max_batch_size=1), replicas=2)
    cluster.advance(30.0)
    queued = cluster.observe(window_s=10.0, percentile=99).pending_max
    # Still one replica for the first 10 s: another 500 queued there; the new replica's queue stays near empty,
    # so the fullest pod's count is the old pod's, ~1,500 (a sum would be the same; a mean half of it).
    assert queued == pytest.approx(30.0 * 50.0, rel=0.15)
    cluster.advance(40.0)
    # Then the old replica gets 75 req/s of the 150 and drains the rest of its 100 req/s: 25 req/s for 10 s.
    drained = cluster.observe(window_s=10.0, percentile=99).pending_max
    assert drained == pytest.approx(queued - 250.0, rel=0.15)
