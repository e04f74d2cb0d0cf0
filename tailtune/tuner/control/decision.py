"""What a decision says: its reason codes (CamelCase, for Events and conditions), `hold`, and the change's
batching, code and description."""

from __future__ import annotations

from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.types import Decision, InForce, Policy, TunerState

WINDOW_ALREADY_SEEN = "WindowAlreadySeen"
SIGNAL_MISSING = "SignalMissing"
NO_TRAFFIC = "NoTraffic"
STALE_WINDOW = "StaleWindow"
REPLICAS_NOT_READY = "ReplicasNotReady"
CONFIRMING = "ConfirmingBadWindows"
WITHIN_BAND = "WithinBand"
COOLDOWN = "Cooldown"
SETTLED = "Settled"
AT_LIMITS = "AtLimits"
SLO_INFEASIBLE = "SLOInfeasible"
BATCHING_TIGHTENED = "BatchingTightened"
BATCHING_WIDENED = "BatchingWidened"
SCALED_OUT = "ScaledOut"
SCALED_IN = "ScaledIn"
BACKLOG_DRAINING = "BacklogDraining"


def hold(
    st: TunerState,
    in_force: InForce,
    code: str,
    reason: str,
    *,
    missing: bool = False,
    infeasible: bool = False,
    demand_rps: float | None = None,
    capacity_rps: float | None = None,
    bound_by: str = "",
) -> Decision:
    """A decision that keeps the config in force, with why (the state remembers the reason code) and the gate or
    guard that held it."""
    return Decision(
        action="hold",
        in_force=in_force,
        reason=reason,
        reason_code=code,
        state=st.model_copy(update={"last_reason_code": code}),
        signal_missing=missing,
        infeasible=infeasible,
        demand_rps=demand_rps,
        capacity_rps=capacity_rps,
        bound_by=bound_by,
    )


def reset(st: TunerState) -> TunerState:
    """The state with the bad and good window counts started over."""
    return st.model_copy(update={"bad_windows": 0, "good_windows": 0, "calm_windows": 0})


def batching_for(max_batch: int, delay_us: int, policy: Policy) -> Batching:
    """The batching of a (max batch, delay) candidate, with the spec's preferred sizes that fit under it."""
    preferred = [c for c in policy.preferred_candidates if c <= max_batch]
    return Batching(max_batch_size=max_batch, preferred_batch_sizes=preferred, max_queue_delay_microseconds=delay_us)


def change_code(in_force: InForce, batching: Batching, replicas: int) -> str:
    """The reason code of a change: replicas first, then whether the batching widens or tightens."""
    if replicas > in_force.replicas:
        return SCALED_OUT
    if replicas < in_force.replicas:
        return SCALED_IN
    old = in_force.batching
    if (batching.max_batch_size, batching.max_queue_delay_microseconds) > (
        old.max_batch_size,
        old.max_queue_delay_microseconds,
    ):
        return BATCHING_WIDENED
    return BATCHING_TIGHTENED


def describe(b: Batching, replicas: int) -> str:
    """A config in a reason: max batch, delay, replicas."""
    return f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us, {replicas} replica(s)"
