"""tune_once wires reader, law, applier and recorder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.loop import tune_once
from tailtune.tuner.types import CurvePoint, Decision, Observation, Policy, TunerState

T0 = datetime(2025, 1, 1, tzinfo=UTC)


class Reader:
    def __init__(self, p: float) -> None:
        self.p = p

    def read(self, window_end: datetime) -> Observation:
        return Observation(
            window_end=window_end,
            span_seconds=60,
            p_latency_ms=self.p,
            request_rate=400,
            queue_ms=3,
            compute_ms=40,
            avg_batch=32,
            ready_replicas=1,
            sample_count=10_000,
        )


class Applier:
    def __init__(self, fail: bool = False) -> None:
        self.applied: list[tuple[Batching, int]] = []
        self.fail = fail

    def apply(self, batching: Batching, replicas: int) -> None:
        if self.fail:
            raise RuntimeError("model control unavailable")
        self.applied.append((batching, replicas))


class Recorder:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def record(self, decision: Decision, observation: Observation) -> None:
        self.decisions.append(decision)


POLICY = Policy(slo_ms=50, batch_max=64, max_batch_step=64)
START = TunerState(
    batching=Batching(max_batch_size=32),
    replicas=1,
    curve=(CurvePoint(batch=1, ms=2.4), CurvePoint(batch=8, ms=8.0), CurvePoint(batch=32, ms=40.0)),
)


def test_applies_and_records_a_change() -> None:
    applier, recorder = Applier(), Recorder()
    st = START
    for i in range(2):
        st, decision = tune_once(Reader(90), applier, recorder, st, POLICY, T0 + timedelta(seconds=30 * i))
    assert decision.changed
    assert applier.applied == [(decision.batching, 1)]
    assert [d.reason_code for d in recorder.decisions] == ["ConfirmingBadWindows", "BatchingTightened"]
    assert st.batching.max_batch_size < 32
    assert st.last_change == T0 + timedelta(seconds=30)


def test_hold_applies_nothing() -> None:
    applier, recorder = Applier(), Recorder()
    st, decision = tune_once(Reader(20), applier, recorder, START, POLICY, T0)
    assert not decision.changed and applier.applied == [] and len(recorder.decisions) == 1
    assert st == decision.state


def test_failed_apply_keeps_the_old_state() -> None:
    st = START.model_copy(update={"bad_windows": 1})
    with pytest.raises(RuntimeError):
        tune_once(Reader(90), Applier(fail=True), Recorder(), st, POLICY, T0)
