"""tune_once wires reader, law, applier and recorder; a failed apply leaves the caller's config untouched."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.law import decide
from tailtune.tuner.loop import tune_once
from tailtune.tuner.types import Decision, Observation
from tests.sampling import cases, floor
from tests.unit.tuner.families import NOW, make_case


class Reader:
    def __init__(self, obs: Observation) -> None:
        self.obs = obs
        self.asked: list[datetime] = []

    def read(self, window_end: datetime) -> Observation:
        self.asked.append(window_end)
        return self.obs


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
        self.recorded: list[tuple[Decision, Observation]] = []

    def record(self, decision: Decision, observation: Observation) -> None:
        self.recorded.append((decision, observation))


def test_returns_the_laws_decision_and_applies_only_changes() -> None:
    rng = np.random.default_rng(41)
    changes = holds = 0
    for i in range(cases(150)):
        case = make_case(rng)
        reader, applier, recorder = Reader(case.obs), Applier(), Recorder()
        state, in_force, decision = tune_once(reader, applier, recorder, case.state, case.in_force, case.policy, NOW)
        assert decision == decide(case.state, case.in_force, case.obs, case.policy, NOW), i
        assert (state, in_force) == (decision.state, decision.in_force)
        assert reader.asked == [NOW]
        assert recorder.recorded == [(decision, case.obs)]
        if decision.changed:
            changes += 1
            assert applier.applied == [(decision.batching, decision.replicas)]
        else:
            holds += 1
            assert applier.applied == [] and in_force == case.in_force
    assert changes >= floor(20, 150) and holds >= floor(20, 150)


def test_a_failed_apply_propagates_and_changes_nothing() -> None:
    rng = np.random.default_rng(42)
    failed = 0
    for i in range(cases(150)):
        case = make_case(rng)
        if not decide(case.state, case.in_force, case.obs, case.policy, NOW).changed:
            continue
        failed += 1
        state, in_force = case.state, case.in_force
        frozen = (state.model_dump(), in_force.model_dump())
        recorder = Recorder()
        with pytest.raises(RuntimeError, match="model control unavailable"):
            tune_once(Reader(case.obs), Applier(fail=True), recorder, state, in_force, case.policy, NOW)
        # Nothing believed done: the caller's values are as they were, nothing recorded.
        assert (state.model_dump(), in_force.model_dump()) == frozen, i
        assert recorder.recorded == []
        # The next tick decides the same change again.
        retry = Applier()
        _, again, decision = tune_once(Reader(case.obs), retry, Recorder(), state, in_force, case.policy, NOW)
        assert decision.changed and retry.applied == [(again.batching, again.replicas)], i
    assert failed >= floor(20, 150)


def test_a_window_judged_twice_is_held() -> None:
    case = make_case(np.random.default_rng(43))
    reader, applier = Reader(case.obs), Applier()
    state, in_force, _ = tune_once(reader, applier, Recorder(), case.state, case.in_force, case.policy, NOW)
    later = NOW + timedelta(seconds=1)
    _, in_force2, decision = tune_once(reader, applier, Recorder(), state, in_force, case.policy, later)
    assert decision.reason_code == "WindowAlreadySeen" and in_force2 == in_force
