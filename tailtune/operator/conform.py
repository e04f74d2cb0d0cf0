"""A spec change that the config in force or the rollout in flight no longer fits, and what the tuner does at once.

The config in force is clamped to the new bounds field by field (`inforce.clamp_to_spec`), never sent back to the
spec's start. A rollout whose target or previous config the new spec forbids is aborted, not re-planned: its canary
was judging a config the spec no longer allows, and the law plans again within the new bounds from its next
window. In hot mode every ready pod that runs another batching than the clamped one is reloaded to it in the same
tick, so no pod runs outside the bounds for longer than one reload. Pure: the tuner's tick does the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from tailtune.api.v1alpha1 import Batching, InferenceService
from tailtune.operator.inforce import clamp_batching, clamp_message, clamp_to_spec, in_force, recorded
from tailtune.operator.rollout import PodObservation, RolloutState
from tailtune.triton.config import batching_equivalent
from tailtune.tuner.types import InForce

# Reason codes (Events, the tuner's last decision).
CONFIG_CLAMPED = "ConfigClamped"
ROLLOUT_ABORTED = "RolloutAborted"


@dataclass(frozen=True)
class SpecConform:
    """What a spec change asks of the tuner now: the config to have in force (clamped, stamped `now`, with why),
    whether the pods' batching must be brought to it, and the rollout it ends (None: none was in flight)."""

    in_force: InForce
    code: str
    message: str
    reload: bool
    aborted: RolloutState | None = None


def decide_conform(isvc: InferenceService, rollout: RolloutState | None, now: datetime) -> SpecConform | None:
    """What to do about a spec that forbids the recorded config in force or the rollout in flight; None when the
    spec allows both. Pure."""
    kept = recorded(isvc)
    notes = clamp_to_spec(kept, isvc)[1] if kept is not None else ()
    target_notes = clamp_batching(rollout.target, isvc)[1] if rollout is not None else ()
    previous_notes = clamp_batching(rollout.previous, isvc)[1] if rollout is not None else ()
    if not notes and not target_notes and not previous_notes:
        return None
    force = in_force(isvc)
    batching_moved = kept is not None and not batching_equivalent(kept.batching, force.batching)
    if rollout is not None:
        why = target_notes or previous_notes
        whose = "its target" if target_notes else "the config it started from"
        message = (
            f"rollout of {describe(rollout.target)} on canary {rollout.canary} aborted: the spec now forbids "
            f"{whose} ({'; '.join(why)}); every pod to {describe(force.batching)}"
        )
        if notes:
            message += f"; {clamp_message(notes)}"
        return SpecConform(_stamped(force, message, now), ROLLOUT_ABORTED, message, True, rollout)
    message = clamp_message(notes)
    return SpecConform(_stamped(force, message, now), CONFIG_CLAMPED, message, batching_moved)


def conform_reloads(pods: Mapping[str, PodObservation], to: Batching) -> tuple[tuple[str, Batching], ...]:
    """The reloads that bring every ready pod to `to`: those that run another batching, and those whose config
    could not be read (a reload of the same config is harmless; a pod left outside the bounds is not). Pure."""
    return tuple(
        (ip, to)
        for ip, p in sorted(pods.items())
        if p.ready and not (p.batching is not None and batching_equivalent(p.batching, to))
    )


def describe(b: Batching) -> str:
    """max batch 4, delay 100 us."""
    return f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us"


def _stamped(config: InForce, message: str, now: datetime) -> InForce:
    return config.model_copy(update={"changed_at": now, "reason": message})
