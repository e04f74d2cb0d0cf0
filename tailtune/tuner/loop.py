"""One tuning step: read a window, decide, apply, record. Thin on purpose; the law is in `law.py`.

The operator plugs in the three sides: the Prometheus reader, the Triton model control (plus the
Deployment's replicas), and the status/Event recorder. The simulator plugs in its own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.law import decide
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
    if decision.changed:
        applier.apply(decision.batching, decision.replicas)
    recorder.record(decision, observation)
    return decision.state, decision.in_force, decision
