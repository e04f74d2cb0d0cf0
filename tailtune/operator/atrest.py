"""What is worth an API write on a tuner tick, and the tuner state carried between ticks in this process.

Every write to an InferenceService is a watch event for every client of it (kubectl, dashboards, other
controllers), so a tick that holds on a steady signal writes nothing (kueue and cluster-api likewise write
status only on change):

- `status.latency` is written when something a user reads moves: a verdict, a problem, a message, a source, or a
  figure by more than `FIGURE_TOLERANCE` of itself. The window's timestamps alone never make a write; they are
  the window of the figures shown, so they move with them.
- The tuner-state annotation is a checkpoint for a restarted operator, written when what the law reads from it
  moves materially (`state_moved`); between checkpoints the state lives in `TunerMemory`, so counters such as
  the good windows before a scale-in go on counting without a write per tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tailtune.api.keys import TUNER_STATE_ANNOTATION
from tailtune.api.v1alpha1 import InferenceService, LatencyStatus
from tailtune.tuner.servicetime import MIN_LIVE_SAMPLES, CurvePoint
from tailtune.tuner.types import TunerState

# A figure in status.latency (P99, rate, a target's figure, the breakdown's times) is rewritten when it moves by
# more than this share of itself. The value is the tuner's own resolution: the law's GROWTH_SHARE (5 %) is the
# least relative change of demand it acts on, and a window's P99 moves by more than that from window to window
# on a steady load (the sampling error of a tail percentile over a 30-60 s window of a few thousand requests).
# Below it a figure is noise to the reader as it is to the law.
FIGURE_TOLERANCE = 0.05
# The same resolution for what the checkpoint keeps of the law's estimates (the model's calibration, the
# live service times): a restart that resumes from an estimate within 5 % of the one in memory plans as the law
# would plan on the next window's noise.
ESTIMATE_TOLERANCE = FIGURE_TOLERANCE

# Fields of status.latency that say when, not what: written with the figures, never the reason for a write.
_WHEN = frozenset({"observed_at", "window_start", "window_end", "clean_window_end"})
# Fields of the tuner state the checkpoint leaves to memory: window bookkeeping (an operator that restarts reads
# the next window anew; the forecast's demand history moves every window and goes out with the next checkpoint),
# compared below with their own rule.
_BOOKKEEPING = frozenset({"last_window_end", "missing_windows", "recent_demand", "demand_history"})
_ESTIMATES = frozenset({"calibration", "live", "good_windows"})


def _moved(old: Any, new: Any) -> bool:
    """Whether a user reading `old` would read something else in `new`: numbers beyond FIGURE_TOLERANCE, every
    other value exactly, recursively through dicts and lists."""
    if isinstance(old, bool) or isinstance(new, bool) or old is None or new is None:
        return bool(old != new)
    if isinstance(old, int | float) and isinstance(new, int | float):
        return not _close(float(old), float(new), FIGURE_TOLERANCE)
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() != new.keys() or any(_moved(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) != len(new) or any(_moved(a, b) for a, b in zip(old, new, strict=True))
    return bool(old != new)


def _close(old: float, new: float, tolerance: float) -> bool:
    if old == new:
        return True
    if not (math.isfinite(old) and math.isfinite(new)):
        return False
    return abs(new - old) <= tolerance * max(abs(old), abs(new))


def latency_moved(old: LatencyStatus, new: LatencyStatus) -> bool:
    """Whether `new` is worth writing over `old`: what it says, not when it was read."""
    return _moved(old.model_dump(exclude=set(_WHEN)), new.model_dump(exclude=set(_WHEN)))


def _live_moved(old: tuple[CurvePoint, ...], new: tuple[CurvePoint, ...]) -> bool:
    before = {p.batch: p for p in old}
    if before.keys() != {p.batch for p in new}:
        return True
    for p in new:
        q = before[p.batch]
        # A size that crosses MIN_LIVE_SAMPLES starts (or stops) replacing the build's figure: the law plans anew.
        if (q.samples >= MIN_LIVE_SAMPLES) != (p.samples >= MIN_LIVE_SAMPLES) or q.source != p.source:
            return True
        if not _close(q.ms, p.ms, ESTIMATE_TOLERANCE):
            return True
    return False


def state_moved(checkpoint: TunerState, new: TunerState, good_windows_needed: int) -> bool:
    """Whether the tuner state `new` is worth writing over the `checkpoint` on the object: anything the law reads
    across a restart moved (a verdict, a rejection, a replica floor, a measured start-up), the good windows
    counted up to the `good_windows_needed` that relax a config (more say nothing new), or an estimate by more
    than ESTIMATE_TOLERANCE."""
    skip = set(_BOOKKEEPING | _ESTIMATES)
    if checkpoint.model_dump(exclude=skip) != new.model_dump(exclude=skip):
        return True
    if min(checkpoint.good_windows, good_windows_needed) != min(new.good_windows, good_windows_needed):
        return True
    if not _close(checkpoint.calibration, new.calibration, ESTIMATE_TOLERANCE):
        return True
    return _live_moved(checkpoint.live, new.live)


@dataclass
class TunerMemory:
    """The tuner state of each InferenceService between ticks, in this operator process.

    The annotation on the object is the checkpoint: while it is the one this process wrote (or read) last, the
    state carried on is the one in memory, which may be ahead of it by what `state_moved` found not worth a
    write. An annotation written by someone else (another operator replica after a failover, a user) is taken
    as it is.
    """

    kept: dict[str, tuple[str, TunerState]] = field(default_factory=dict)  # uid -> (annotation, state)

    def recall(self, isvc: InferenceService, from_annotation: TunerState) -> TunerState:
        """The state to tick from: memory's while the object carries the checkpoint memory knows."""
        entry = self.kept.get(isvc.metadata.uid or "")
        raw = isvc.metadata.annotations.get(TUNER_STATE_ANNOTATION, "")
        return entry[1] if entry is not None and entry[0] == raw else from_annotation

    def keep(self, isvc: InferenceService, written: dict[str, str], state: TunerState) -> None:
        """After a tick: the state it ended with, against the annotation now on the object (the one it wrote, if
        it wrote one)."""
        if not isvc.metadata.uid:
            return
        raw = written.get(TUNER_STATE_ANNOTATION, isvc.metadata.annotations.get(TUNER_STATE_ANNOTATION, ""))
        self.kept[isvc.metadata.uid] = (raw, state)

    def forget(self, uid: str | None) -> None:
        """The object is gone (or this process stopped tuning it)."""
        self.kept.pop(uid or "", None)
