"""One tuning step: read a window, decide, apply, record. Thin on purpose; the law is in `law.py`.

The operator plugs in the three sides: the Prometheus reader, the Triton model control (plus the
Deployment's replicas), and the status/Event recorder. The simulator plugs in its own.

Between ticks, `FastPath.check` runs the fast path (`surge.py`) on each read of the pods' own counters; the
operator and the simulator call it alike.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.forecast import ahead
from tailtune.tuner.law import decide
from tailtune.tuner.surge import (
    CHECK_SECONDS,
    PANIC_WINDOW_SECONDS,
    PodReading,
    SurgeDecision,
    SurgeState,
    decide_surge,
    read_window,
    record_scale_out,
)
from tailtune.tuner.types import Decision, InForce, Observation, Policy, TunerState


class ObservationReader(Protocol):
    """Reads the window of the latency signal that ends at `window_end`."""

    def read(self, window_end: datetime) -> Observation: ...


class ConfigApplier(Protocol):
    """Puts a batching config and a replica count in force (hot reload or rolling update)."""

    def apply(self, batching: Batching, replicas: int) -> None: ...


class DecisionRecorder(Protocol):
    """Records a decision: status (batching, latency, conditions) and an Event on a change."""

    def record(self, decision: Decision, observation: Observation) -> None: ...


def tune_once(
    reader: ObservationReader,
    applier: ConfigApplier,
    recorder: DecisionRecorder,
    state: TunerState,
    in_force: InForce,
    policy: Policy,
    now: datetime,
) -> tuple[TunerState, InForce, Decision]:
    """Read, decide, apply a change if any, record; return the state and config in force to keep.

    If applying fails the exception propagates and the caller keeps the old state and config, so the change
    is decided again on the next tick instead of being believed done.
    """
    observation = reader.read(now)
    decision = decide(state, in_force, observation, policy, now)
    if policy.forecast:  # a replica floor ahead of a predicted rise; never fewer replicas than the law's
        decision = ahead(decision, in_force, observation, policy, now)
    if decision.changed:
        applier.apply(decision.batching, decision.replicas)
    recorder.record(decision, observation)
    return decision.state, decision.in_force, decision


@dataclass
class FastPath:
    """The fast path of one service between checks: the pod reads of the panic window and what `decide_surge`
    remembers."""

    reads: deque[tuple[PodReading, ...]] = field(default_factory=deque)
    state: SurgeState = field(default_factory=SurgeState)

    def check(
        self,
        readings: tuple[PodReading, ...],
        in_force: InForce,
        tuner: TunerState,
        policy: Policy,
        now: datetime,
    ) -> tuple[SurgeDecision, TunerState, InForce]:
        """Decide on this read against the oldest read within the panic window; on a scale-out, the tuner state and
        config in force to keep (`surge.record_scale_out`), else the ones given. The caller applies the replicas."""
        # (Half a check's slack: a read due exactly a panic window ago that came a little late still counts.)
        horizon = now - timedelta(seconds=PANIC_WINDOW_SECONDS + CHECK_SECONDS / 2)
        while self.reads and (not self.reads[0] or min(r.at for r in self.reads[0]) < horizon):
            self.reads.popleft()
        window = read_window(self.reads[0] if self.reads else (), readings)
        decision = decide_surge(window, self.state, in_force, tuner, policy, now)
        self.state = decision.state
        self.reads.append(readings)
        if decision.scale_out:
            tuner, in_force = record_scale_out(tuner, in_force, decision, now)
        return decision, tuner, in_force
