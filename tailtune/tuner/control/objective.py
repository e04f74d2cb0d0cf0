"""The plan: one objective over the candidate batchings (what the model says each carries per replica), and the
helpers the guards weigh a plan with (fragility, burst capacity, the share of a demand answered within the SLO, the
replicas that drain a pod's queue, the configs remembered as failed)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from tailtune.tuner.model import capacity as model_capacity
from tailtune.tuner.model import chained, max_rate, share_within
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import Policy, TunerState

# Each constant is the quantity it names; where its value comes from follows it. "Design value": chosen when the
# rule was written, not measured nor derived; the benchmark families (bench/tuner) are how it is judged.

# Milliseconds in a second (t(b) is in ms, rates in req/s).
MS_PER_S = 1000.0
# Microseconds in a millisecond (queue delays are in us).
US_PER_MS = 1000.0
# Intervals within which a backlog is planned to drain (design value: gone within a minute at the default 30 s).
DRAIN_INTERVALS = 2
# Bounds of the calibration factor that candidates other than the config in force get (design value: the residual
# measured on one regime says little of another; symmetric in log, 1/1.25 = 0.8).
CANDIDATE_CALIBRATION = (0.8, 1.25)
# Robust load a candidate must have over the config in force to be worth a reload, a pause on every pod (design
# value: past the few percent the model's calibration moves from window to window).
SWITCH_GAIN = 1.15
# ... or burst capacity (what full batches drain), at no less robust load (a choice, not derived: below SWITCH_GAIN
# because no robust load is given up for it, above the few percent a measured curve point moves between runs).
BURST_GAIN = 1.1
# Short of the SLO whatever the config: share of the demand answered within it a reload must add (the model's:
# the queue-length chain's share errs within a tenth of the demand, `model.chained`; a gain below it is noise).
SHARE_GAIN = 0.1
# Ratio under which a config's burst-safe capacity to the most capable candidate's is fragile, a load step away from
# a backlog; replaced even while the latency holds, first thing while there is no traffic (a choice, not derived: a
# step of half the load again, which the most capable config still drains, backs this one up).
FRAGILE_FACTOR = 1.5
# Largest planned max batch, in multiples of the largest measured size: past it the model is a bet (one octave;
# design value).
EXPLORE_REACH = 2
# Measured sizes planned on per octave: of those in one bin, the most efficient (cost: live statistics measure every
# executed size, and a candidate per size costs a planner pass each: minutes at max batch 1024).
CANDIDATES_PER_OCTAVE = 4
# Float slack of the octave bins (so an exact power of two lands in its own bin).
BIN_EPSILON = 1e-9
# Queue delays tried with several instances per GPU, as shares of a full batch's time (a delay lets a batch fill
# before an idle instance grabs it; beyond one batch time it only adds latency).
DELAY_SHARES_OF_BATCH = (0.25, 0.5, 1.0)
# How long a config a canary rejected (or left for breaking the SLO) stays out of the plan, and the share below
# the demand it failed at within which it does (`TunerState.rejected`; design values).
REJECTED_FOR = timedelta(minutes=30)
REJECTED_DEMAND_SHARE = 0.25
# Max batch ratio within which two configs at the same delay are neighbours, alike under a greedy batcher: a half
# step of the candidate ladder (powers of two and their midpoints are 1.33 to 1.5 apart).
NEIGHBOUR_RATIO = 1.5
# Robust load within which candidates are alike to the planner (2 %: below the model's error).
ROBUST_TIE = 0.98
# Share of the demand within which two configs answer alike short of the SLO (one point: below the model's error).
SHARE_TIE = 0.01
# Decimal digits to which capacity ratios are compared among alike candidates (1 %).
CAPACITY_TIE_DIGITS = 2
# The headroom of a plan that keeps only the SLO (no headroom left for the aim).
NO_HEADROOM = 1.0
# The calibration factor of a model taken as it is (no window has corrected it).
UNCALIBRATED = 1.0
# Least calibration divided by (keeps a target finite; the calibration itself stays within CALIBRATION_RANGE).
MIN_CALIBRATION = 1e-6


@dataclass(frozen=True)
class Candidate:
    """One batching config with what the model says of it for one replica."""

    max_batch: int
    delay_us: int
    capacity_rps: float  # full batches back to back
    robust_rps: float  # most load within the aim (calibrated), capped by capacity at the target utilisation
    extrapolated: bool
    burst_rps: float = 0.0  # what survives a burst: the capacity, past the most efficient batch what full ones drain

    def carries(self) -> float:
        """Load one replica is planned to carry."""
        return self.robust_rps


@dataclass(frozen=True)
class Plan:
    """The cheapest config for a load, or the most capable one when none carries it."""

    candidate: Candidate
    replicas: int
    feasible: bool
    load_rps: float
    # Carries the load within the SLO but not within the aim (the headroom is used up).
    within_slo_only: bool = False
    # Short of the SLO and keeping up: the share of requests the model answers within the SLO at the demand
    # with the candidate (its goodput per request; None when the plan is feasible, or when nothing keeps up).
    share: float | None = None


def keeps_warmup(max_batch: int, policy: Policy) -> bool:
    """Whether a max batch is at least the largest warmup batch the config renders (Triton refuses one below it)."""
    return max_batch >= policy.warmup_max


def safe_capacity(curve: Curve, max_batch: int, delay_us: int) -> float:
    """Capacity that survives a burst: past the most efficient batch, what full batches drain."""
    return min(curve_capacity(curve, max_batch, delay_us), MS_PER_S * max_batch / curve.ms(max_batch))


def is_fragile(curve: Curve, current: Candidate, policy: Policy) -> bool:
    """Below the warmup batch, or far less burst-safe capacity than the most capable measured batch (too small
    a max batch, or one so far past the efficient batch that one burst runs its batches away)."""
    if not keeps_warmup(current.max_batch, policy):
        return True
    sizes = [b for b in candidate_sizes(curve, policy) if b <= max(1, curve.largest)] or [current.max_batch]
    most = max(safe_capacity(curve, b, policy.delay_min_us) for b in sizes)
    now = min(current.capacity_rps, safe_capacity(curve, current.max_batch, current.delay_us))
    return now * FRAGILE_FACTOR < most


def curve_capacity(curve: Curve, max_batch: int, delay_us: int) -> float:
    return _capacity(tuple(curve.sizes), tuple(curve.times), max_batch, delay_us)


@functools.lru_cache(maxsize=8192)
def _capacity(sizes: tuple[int, ...], times: tuple[float, ...], max_batch: int, delay_us: int) -> float:
    """`model.capacity` of a curve given by its points (memoized: the planner asks for it many times)."""
    curve = Curve([CurvePoint(batch=b, ms=ms) for b, ms in zip(sizes, times, strict=True)])
    return model_capacity(curve.ms, max_batch, delay_us)


@functools.lru_cache(maxsize=8192)
def _max_rate(
    sizes: tuple[int, ...],
    times: tuple[float, ...],
    max_batch: int,
    delay_us: int,
    instances: int,
    aim_ms: float,
    percentile: float,
    cap: float,
) -> float:
    """`model.max_rate` of a curve given by its points (memoized like `_capacity`: a tick asks the same candidates
    of an unchanged curve for every plan and rule it weighs, and the next tick asks them again)."""
    curve = Curve([CurvePoint(batch=b, ms=ms) for b, ms in zip(sizes, times, strict=True)])
    known = _predictions(sizes, times, max_batch, delay_us, instances, percentile, cap)
    return max_rate(curve.ms, max_batch, delay_us, instances, aim_ms, percentile, cap, known)


@functools.lru_cache(maxsize=1024)
def _predictions(
    sizes: tuple[int, ...],
    times: tuple[float, ...],
    max_batch: int,
    delay_us: int,
    instances: int,
    percentile: float,
    cap: float,
) -> dict[float, float]:
    """The predictions `max_rate` made for one config of one curve, whatever the aim (the calibration moves the
    aim a little every tick: the next search reuses the steps the two share)."""
    return {}


def candidate(curve: Curve, max_batch: int, delay_us: int, policy: Policy, calibration: float) -> Candidate:
    """What the model says of one batching config for one replica."""
    t = curve.ms
    cap = curve_capacity(curve, max_batch, delay_us)
    points = (tuple(curve.sizes), tuple(curve.times))
    # Every target binds: the load a config carries is the least it carries within any of them.
    robust = min(
        _max_rate(
            *points,
            max_batch,
            delay_us,
            policy.instances,
            policy.headroom * slo / max(calibration, MIN_CALIBRATION),
            pct,
            cap,
        )
        for pct, slo in ((policy.percentile, policy.slo_ms), *policy.other_targets)
    )
    full = MS_PER_S * max_batch / t(max_batch)
    if full < cap:
        # Past the most efficient batch a greedy batcher keeps up only while batches stay small; one burst that
        # fills them runs away to slow full batches. Planned load is what full batches still drain.
        robust = min(robust, policy.util_target * full)
    return Candidate(
        max_batch=max_batch,
        delay_us=delay_us,
        capacity_rps=cap,
        robust_rps=min(robust, policy.util_target * cap),
        extrapolated=max_batch > curve.largest,
        burst_rps=min(cap, full),
    )


def candidate_sizes(curve: Curve, policy: Policy) -> list[int]:
    """Max batch sizes worth evaluating: measured sizes (`measured_sizes`), powers of two and their midpoints,
    the bounds."""
    low = max(policy.batch_min, policy.warmup_max)
    high = max(low, min(policy.batch_max, EXPLORE_REACH * max(1, curve.largest)))
    sizes = {low, high, *measured_sizes(curve)}
    b = 1
    while b <= high:
        sizes.update({b, b + b // 2})
        b *= 2
    return sorted(s for s in sizes if low <= s <= high)


def measured_sizes(curve: Curve) -> set[int]:
    """The measured sizes worth a candidate: in each bin of 1/`CANDIDATES_PER_OCTAVE` of an octave the one that
    serves the most per ms (b / t(b): a plateau's top, where a stepwise curve's best max batch lies), and the
    largest. A ladder of powers of two and their midpoints keeps every size; dense live sizes keep a few."""
    best: dict[int, tuple[float, int]] = {}  # bin -> (requests per ms, size)
    for b, ms in zip(curve.sizes, curve.times, strict=True):
        key = math.floor(CANDIDATES_PER_OCTAVE * math.log2(b) + BIN_EPSILON)
        if key not in best or b / ms >= best[key][0]:
            best[key] = (b / ms, b)
    return {*(b for _, b in best.values()), curve.largest} if curve else set()


def candidate_delays(curve: Curve, max_batch: int, policy: Policy) -> list[int]:
    """Queue delays worth evaluating: the minimum, and with several instances a fraction of a batch time."""
    delays = {policy.delay_min_us}
    if policy.instances > 1 and max_batch > 1:
        t_us = curve.ms(max_batch) * US_PER_MS
        for share in DELAY_SHARES_OF_BATCH:
            delays.add(int(min(policy.delay_max_us, max(policy.delay_min_us, share * t_us))))
    return sorted(delays)


def rejected_now(st: TunerState, demand_rps: float | None, now: datetime) -> frozenset[tuple[int, int]]:
    """(max batch, delay) of the configs rejected recently (by a canary, or left for breaking the SLO) at this
    demand: at about it or less, since what fails at a demand fails at more (any demand: None)."""
    return frozenset(
        (x.batching.max_batch_size, x.batching.max_queue_delay_microseconds)
        for x in st.rejected
        if applies(x.at, x.demand_rps, demand_rps, now)
    )


def applies(at: datetime, failed_at_rps: float | None, demand_rps: float | None, now: datetime) -> bool:
    """Whether a failure seen at `at` under `failed_at_rps` still counts now at `demand_rps` (None: any)."""
    if now - at >= REJECTED_FOR:
        return False
    return demand_rps is None or failed_at_rps is None or failed_at_rps * (1 - REJECTED_DEMAND_SHARE) <= demand_rps


def avoided(max_batch: int, delay_us: int, avoid: frozenset[tuple[int, int]]) -> bool:
    """Whether a config is one of `avoid` or its neighbour (the same delay, a max batch within a half step of the
    candidate ladder: a greedy batcher under load runs both alike)."""
    return any(d == delay_us and max(m, max_batch) < NEIGHBOUR_RATIO * min(m, max_batch) for m, d in avoid)


def best_plan(
    curve: Curve,
    load_rps: float,
    policy: Policy,
    calibration: float = UNCALIBRATED,
    backlog: bool = True,
    avoid: frozenset[tuple[int, int]] = frozenset(),
    peak_rps: float = 0.0,
) -> Plan:
    """The fewest replicas that carry `load_rps`, then the most robust batching, then the smaller batch.
    Configs in `avoid` (rejected by a canary) are skipped unless nothing else is left. Short of the SLO within
    the bounds, only configs that keep up with `peak_rps` (the highest demand seen lately) are considered."""
    every = [
        candidate(curve, b, d, policy, calibration)
        for b in candidate_sizes(curve, policy)
        for d in candidate_delays(curve, b, policy)
    ]
    cands = [c for c in every if not avoided(c.max_batch, c.delay_us, avoid)] or every
    # Keeping up comes before avoiding: a config left for breaking the SLO (or rejected by a canary) still answers
    # the demand late, one that cannot drain it on every replica allowed answers less and less of it, its queue
    # growing without bound. Where no config left in keeps up with the load (at the utilisation target, as
    # `keeping` below), the avoided ones are back in.
    if not any(c.capacity_rps * policy.util_target * policy.replicas_max >= load_rps for c in cands):
        cands = every
    demand = load_rps / policy.demand_margin
    best = max(cands, key=lambda c: (c.carries(), -c.max_batch, -c.delay_us))
    if best.carries() <= 0:
        best = max(cands, key=lambda c: (c.capacity_rps, -c.max_batch))
    # Planned on: measured sizes (or the one that carries the most), and of those only configs with a fair share of
    # the most capacity (a burst past the plan must not find a fragile one). The count is that of these configs: a
    # fragile config's count with a sturdier config's batching leaves the plan short of its load.
    fitting = [c for c in cands if not c.extrapolated or c is best]
    most_rps = max(c.capacity_rps for c in fitting)
    fitting = [c for c in fitting if c.capacity_rps * FRAGILE_FACTOR >= most_rps] or fitting
    top = max(c.carries() for c in fitting)
    need = replicas_for(load_rps, top, policy)
    if need > policy.replicas_max and policy.headroom < NO_HEADROOM:
        # Nothing keeps the aim within the bounds: the SLO itself is the next best target (no headroom left), on
        # every replica the bounds allow (what would keep the aim costs more than that: the fewest that keep only
        # the SLO would plan fewer replicas for more load, and spend the headroom the rest still buy).
        at_slo = best_plan(
            curve, load_rps, policy.model_copy(update={"headroom": NO_HEADROOM}), calibration, backlog, avoid, peak_rps
        )
        if at_slo.feasible:
            return Plan(at_slo.candidate, policy.replicas_max, True, load_rps, within_slo_only=True)
        policy = policy.model_copy(update={"headroom": NO_HEADROOM})
        cands = [candidate(curve, c.max_batch, c.delay_us, policy, calibration) for c in cands]
    if need > policy.replicas_max:
        # Keeping up comes first: a config that cannot carry the demand collapses into a backlog.
        keeping = [c for c in cands if c.capacity_rps * policy.util_target * policy.replicas_max >= load_rps]
        # As where the SLO holds: a burst past the plan (like the highest demand seen lately) must not find a
        # fragile config, where a sturdy one carries about as much within the SLO.
        most_rps = max((c.capacity_rps for c in cands if not c.extrapolated), default=0.0)

        def sturdy(c: Candidate) -> bool:
            return c.capacity_rps * FRAGILE_FACTOR >= most_rps

        near = [c for c in keeping if c.carries() * policy.replicas_max * SWITCH_GAIN >= demand]
        near = [c for c in near if sturdy(c) and c.capacity_rps * policy.replicas_max >= peak_rps] or near
        if not backlog and near:
            # Short of the margin but keeping up with it, at (nearly) the SLO: the most load within the SLO.
            pick = max(near, key=lambda c: (c.carries(), c.capacity_rps, -c.max_batch))
            return Plan(pick, policy.replicas_max, False, load_rps, within_slo_only=True)
        if not backlog:
            # Nothing that keeps up with the margin comes near the SLO: among the configs that keep up with the
            # demand with its margin (and with the highest demand seen lately: a burst like the last ones must
            # find a config that keeps up) at full use, the most load within the SLO at the demand itself ...
            steady = [c for c in cands if c.capacity_rps * policy.replicas_max >= max(load_rps, peak_rps)]
            holding = [c for c in steady if c.carries() * policy.replicas_max >= demand]
            holding = [c for c in holding if sturdy(c)] or holding
            if holding:
                pick = max(holding, key=lambda c: (c.carries(), c.capacity_rps, -c.max_batch))
                return Plan(pick, policy.replicas_max, False, load_rps, within_slo_only=True)
            # ... and short of the SLO even at the demand itself: the most goodput is the largest share of the demand
            # answered within the SLO (a config whose batches at this load take longer than the SLO answers none
            # in time, however much it carries), then the most capacity.
            shares = [(share(curve, c, demand, policy, calibration), c) for c in steady]
            top_share = max((x for x, _ in shares), default=0.0)
            if top_share > 0:
                pick = max(
                    (c for x, c in shares if x >= top_share - SHARE_TIE), key=lambda c: (c.capacity_rps, -c.max_batch)
                )
                return Plan(pick, policy.replicas_max, False, load_rps, within_slo_only=True, share=top_share)
        if not backlog and keeping:
            # Short of the SLO but keeping up: the most load within the SLO is the most goodput.
            pick = max(keeping, key=lambda c: (c.carries(), c.capacity_rps, -c.max_batch))
            return Plan(pick, policy.replicas_max, False, load_rps, within_slo_only=True)
        # Requests pile up: the most capacity, to drain what it can.
        most = max(cands, key=lambda c: (c.capacity_rps if not c.extrapolated else 0.0, -c.max_batch))
        return Plan(most, policy.replicas_max, False, load_rps)
    # Among the most robust (within 2 %): a larger cap costs nothing at low load (a greedy batcher forms small
    # batches) and buys headroom, until the model says it breaks the aim.
    # Among those (which carry the load on as many replicas, within the same 2 %), the most capacity (a burst beyond
    # the plan is served, if late), then the smaller batch.
    near = [c for c in fitting if c.carries() >= ROBUST_TIE * top]
    pick = max(
        near,
        key=lambda c: (
            round(c.capacity_rps / max(c.capacity_rps for c in near), CAPACITY_TIE_DIGITS),
            -c.max_batch,
            -c.delay_us,
        ),
    )
    return Plan(pick, need, True, load_rps)


def drain_replicas(capacity_rps: float, queued: float, demand_rps: float, policy: Policy) -> int:
    """The replicas at which a pod holding `queued` requests (Triton's queue is the pod's: new replicas take none of
    it) drains them within DRAIN_INTERVALS at `capacity_rps` (full batches back to back) while the demand is spread
    over all replicas: n >= demand / (capacity - queued / drain time). The most where a pod cannot drain that
    fast at all."""
    room = capacity_rps - queued / drain_within_s(policy)
    if room <= 0:
        return policy.replicas_max
    return min(policy.replicas_max, max(policy.replicas_min, math.ceil(demand_rps / room)))


def drain_within_s(policy: Policy) -> float:
    """The time within which a backlog is planned to drain: DRAIN_INTERVALS tuning intervals."""
    return DRAIN_INTERVALS * policy.interval_seconds


def drain_seconds(capacity_rps: float, queued: float, demand_rps: float, replicas: int) -> float:
    """Seconds a pod holding `queued` requests takes to drain them at `capacity_rps` while the demand is spread over
    `replicas` (the inverse of `drain_replicas`); inf where its share of the demand is its capacity or more."""
    room = capacity_rps - demand_rps / max(1, replicas)
    return queued / room if room > 0 else math.inf


def replicas_for(load_rps: float, carries_rps: float, policy: Policy) -> int:
    """The replicas that carry `load_rps` at `carries_rps` each (at least the spec's minimum; past the most where
    a replica carries nothing)."""
    need = math.ceil(load_rps / carries_rps) if carries_rps > 0 else policy.replicas_max + 1
    return max(policy.replicas_min, need)


def share(
    curve: Curve, c: Candidate, demand_rps: float, policy: Policy, calibration: float, replicas: int = 0
) -> float:
    """The share of `demand_rps` the model answers within the SLO with `c` on `replicas` (default: the most)."""
    per = demand_rps / max(1, replicas or policy.replicas_max)
    if per >= c.capacity_rps:
        return 0.0
    return min(
        share_within(
            curve.ms,
            c.max_batch,
            c.delay_us,
            policy.instances,
            per,
            slo / max(calibration, MIN_CALIBRATION),
            c.capacity_rps,
        )
        for _pct, slo in ((policy.percentile, policy.slo_ms), *policy.other_targets)
    )


def share_gained(
    target_share: float | None, target: Candidate, current_share: float, current: Candidate, policy: Policy
) -> bool:
    """Short of the SLO: the target answers a good deal more of the demand within the SLO (`target_share`) than the
    config in force (`current`, answering `current_share`), by a share of it, and by a ratio too where either share
    comes from the model's normal spread, whose error runs far past that share (the chain's, `model.chained`, stays
    within it)."""
    if target_share is None or target_share - current_share < SHARE_GAIN:
        return False
    both = all(chained(c.max_batch, c.delay_us, policy.instances) for c in (target, current))
    return both or current_share * SWITCH_GAIN < target_share


def outrun(current: Candidate, target: Candidate, load_rps: float, pods: int) -> bool:
    """On `pods` pods the full batches of the batching in force drain less than `load_rps`, and `target`'s drain
    it: the batching in force runs away at that load where the target keeps up."""
    return current.burst_rps * pods < load_rps <= target.burst_rps * pods


def explain(plan: Plan, load: float, curve: Curve, policy: Policy, alarm: bool = True) -> str:
    """What the plan says, for a reason: the batching, what one replica carries, the count (or, infeasible, the
    count it would take; `alarm`: said as infeasible, else as no margin left)."""
    c = plan.candidate
    bet = f" (past the largest measured batch {curve.largest}: extrapolated)" if c.extrapolated else ""
    if not plan.feasible:
        need = math.ceil(load / c.carries()) if c.carries() > 0 else math.inf
        what = "infeasible within the bounds" if alarm else "the SLO holds, with no margin left within the bounds"
        return (
            f"{what}: {load:.0f} req/s with margin needs {need} replicas at max batch "
            f"{c.max_batch} ({c.carries():.0f} req/s each within the SLO{bet}); at most {policy.replicas_max}"
        )
    target = "the SLO (no headroom left for the aim)" if plan.within_slo_only else "the aim"
    return (
        f"model: max batch {c.max_batch}{bet} carries {c.carries():.0f} req/s per replica within {target} "
        f"(capacity {c.capacity_rps:.0f}); {load:.0f} req/s with margin takes {plan.replicas}"
    )
