"""Writes at rest: what a tuner tick writes when nothing a user reads moved (nothing), and the state it carries."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import numpy as np

from tailtune.api.keys import TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import Batching, LatencyBreakdown, LatencyStatus, TargetStatus
from tailtune.operator.atrest import FIGURE_TOLERANCE, TunerMemory, latency_moved, state_moved
from tailtune.operator.inforce import tuner_state, tuner_state_annotation
from tailtune.operator.tuning import tune_step
from tailtune.tuner.servicetime import MIN_LIVE_SAMPLES, BatchSample, CurvePoint
from tailtune.tuner.types import Observation, RejectedConfig, TunerState
from tests.sampling import cases
from tests.unit.operator.test_tuning import SERVING, FakeTunerCluster, FixedReader, serving_isvc

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _latency(p99: float, rps: float, end: datetime, **extra: object) -> LatencyStatus:
    return LatencyStatus(
        observed_ms=p99, percentile=99.0, throughput_rps=rps, observed_at=end.isoformat(),
        window_start=(end - timedelta(seconds=60)).isoformat(), window_end=end.isoformat(), source="histogram",
        clean_ms=p99, clean_window_end=end.isoformat(),
        targets=[TargetStatus(percentile=99.0, target_ms=50.0, observed_ms=p99, met=p99 <= 50.0)],
        breakdown=LatencyBreakdown(queue_ms=p99 / 4, compute_infer_ms=p99 / 2), **extra,
    )  # fmt: skip


def test_the_window_alone_never_makes_a_latency_write() -> None:
    old = _latency(20.0, 300.0, NOW)
    assert not latency_moved(old, _latency(20.0, 300.0, NOW + timedelta(minutes=7)))


def test_a_figure_is_rewritten_past_the_tolerance_and_not_within() -> None:
    """Generated: every figure of status.latency moved by a share just within and just past FIGURE_TOLERANCE."""
    rng = np.random.default_rng(61)
    for _ in range(cases(200)):
        p99, rps = float(rng.uniform(0.5, 5000.0)), float(rng.uniform(0.1, 1e5))
        old = _latency(p99, rps, NOW)
        end = NOW + timedelta(seconds=30)
        inside = float(rng.uniform(0.0, 0.95)) * FIGURE_TOLERANCE * float(rng.choice([-1, 1]))
        outside = float(rng.uniform(1.05, 5.0)) * FIGURE_TOLERANCE * float(rng.choice([-1, 1]))
        assert not latency_moved(old, _latency(p99 * (1 + inside), rps * (1 + inside), end)), (p99, inside)
        assert latency_moved(old, _latency(p99 * (1 + outside), rps, end)), (p99, outside)
        assert latency_moved(old, _latency(p99, rps * (1 + outside), end)), (rps, outside)


def test_what_a_user_reads_besides_figures_is_always_written() -> None:
    old = _latency(20.0, 300.0, NOW)
    later = NOW + timedelta(seconds=30)
    assert latency_moved(old, _latency(20.0, 300.0, later, problem="SignalStale", message="old"))
    assert latency_moved(old, _latency(20.0, 300.0, later, infeasible="demand beyond the bounds"))
    assert latency_moved(old, _latency(20.0, 300.0, later, overlaps_change=True))
    assert latency_moved(old, _latency(20.0, 300.0, later).model_copy(update={"observed_ms": None}))
    # A target's verdict flips at the target even where the figure moves within the tolerance.
    at = _latency(49.9, 300.0, NOW)
    assert latency_moved(at, _latency(50.1, 300.0, later))


def test_the_checkpoint_moves_with_what_the_law_reads_across_a_restart() -> None:
    base = TunerState(good_windows=1, calibration=1.2, live=(CurvePoint(batch=4, ms=8.0, samples=50, source="live"),))
    # Window bookkeeping and counting past what relaxes a config: no write.
    assert not state_moved(base, base.model_copy(update={"last_window_end": NOW, "missing_windows": 2}), 3)
    many = base.model_copy(update={"good_windows": 3})
    assert state_moved(base, many, 3)  # 1 -> 3: the count that relaxes a config is reached
    assert not state_moved(many, many.model_copy(update={"good_windows": 40}), 3)
    # Estimates: within the tolerance no write, past it a write.
    assert not state_moved(base, base.model_copy(update={"calibration": 1.2 * (1 + FIGURE_TOLERANCE / 2)}), 3)
    assert state_moved(base, base.model_copy(update={"calibration": 1.2 * (1 + 2 * FIGURE_TOLERANCE)}), 3)
    nudged = (CurvePoint(batch=4, ms=8.1, samples=400, source="live"),)
    assert not state_moved(base, base.model_copy(update={"live": nudged}), 3)
    moved = (CurvePoint(batch=4, ms=9.0, samples=400, source="live"),)
    assert state_moved(base, base.model_copy(update={"live": moved}), 3)
    grown = (*base.live, CurvePoint(batch=8, ms=12.0, samples=MIN_LIVE_SAMPLES, source="live"))
    assert state_moved(base, base.model_copy(update={"live": grown}), 3)
    # A verdict always.
    assert state_moved(base, base.model_copy(update={"bad_windows": 1}), 3)
    rejected = (RejectedConfig(batching=Batching(max_batch_size=8), demand_rps=300.0, at=NOW),)
    assert state_moved(base, base.model_copy(update={"rejected": rejected}), 3)


def test_memory_carries_the_state_while_the_object_has_its_checkpoint() -> None:
    memory = TunerMemory()
    isvc = serving_isvc().annotate(TUNER_STATE_ANNOTATION, tuner_state_annotation(TunerState())[TUNER_STATE_ANNOTATION])
    obj = isvc.obj()
    ahead = TunerState(good_windows=2)
    memory.keep(obj, {}, ahead)
    assert memory.recall(obj, tuner_state(obj)) == ahead
    # Someone else wrote the annotation (a failover, a user): theirs is taken.
    theirs = TunerState(bad_windows=1)
    other = isvc.annotate(TUNER_STATE_ANNOTATION, tuner_state_annotation(theirs)[TUNER_STATE_ANNOTATION]).obj()
    assert memory.recall(other, tuner_state(other)) == theirs
    memory.forget(obj.metadata.uid)
    assert memory.recall(obj, tuner_state(obj)) == TunerState()


def _steady(i: int, p99: float) -> Observation:
    end = NOW + timedelta(seconds=30 * i)
    return Observation(
        window_end=end, span_seconds=60, p_latency_ms=p99, request_rate=100.0, queue_ms=1.0, compute_ms=5.0,
        avg_batch=2.0, ready_replicas=1, sample_count=6000, batch_stats=(BatchSample(batch=2, count=3000, ms=5.0),),
    )  # fmt: skip


def test_a_steady_signal_writes_nothing_after_the_first_ticks_and_the_good_windows_still_count() -> None:
    """The object as the API server would hold it across ticks: each tick's patches applied to it. On a steady
    good signal (P99 jittering within the tolerance) the writes stop, and the law's good-window count goes on in
    memory (the count a scale-in waits for is reached without a write per tick)."""
    memory = TunerMemory()
    builder = serving_isvc().set("spec.tuning.mode", "rolling")
    isvc = builder.obj()
    rng = np.random.default_rng(7)
    writes: list[int] = []
    for i in range(12):
        cluster = FakeTunerCluster(SERVING)
        p99 = 10.0 * (1 + float(rng.uniform(-0.4, 0.4)) * FIGURE_TOLERANCE)
        now = NOW + timedelta(seconds=30 * i + 1)
        asyncio.run(tune_step(isvc, cluster, FixedReader(_steady(i, p99)), now, memory=memory))
        writes.append(len(cluster.annotations) + (cluster.latency is not None))
        annotations = {**isvc.metadata.annotations, **cluster.annotations}
        status = isvc.status
        if cluster.latency is not None:
            status = status.model_copy(update={"latency": cluster.latency})
        isvc = isvc.model_copy(
            update={"metadata": isvc.metadata.model_copy(update={"annotations": annotations}), "status": status}
        )
    assert sum(writes[-6:]) == 0, writes
    assert memory.recall(isvc, tuner_state(isvc)).good_windows >= 10, memory.kept
