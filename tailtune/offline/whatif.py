"""What-if: a tuning policy on a measured curve and a recorded trace, in the simulator. The benchmark's engine.

Every policy sees the same arrivals (same seed) on the same curve. Policies:

- `tailtune`: the operator's own loop (`tailtune.tuner.loop.tune_once`), the simulator as reader and
  applier, the build's ladder of the curve as its prior, Triton's batch statistics as live data;
- `predictive`: the same loop with the seasonal forecast on (`tailtune.tuner.forecast`, spec.tuning.forecast);
- `triton-default`: max batch = the engine's max, no delay, never changed;
- `static:MAXBATCH:DELAY_US`: a fixed config;
- `aimd`: Clipper-style additive increase (+2) / multiplicative decrease (x0.9) of max batch on the observed
  percentile against the SLO, every interval, from the start config;
- `oracle`: per interval, the best of a sweep of static configs at the most replicas (clairvoyant, no reload
  cost); an upper bound, not a policy one could run;
- `min-cost`: the fewest replica-seconds a clairvoyant plan pays: per interval, the fewest replicas at which a
  config of the same sweep holds the SLO on that interval entered with an empty queue (as it is where the intervals
  before were held) and that config, each scale-out requested one pod start (the simulator's) ahead; replayed in
  the simulator;
- `static-max`: the most replicas and the start config, never changed (what a fleet sized for the peak pays).

Goodput is the requests answered within the SLO per second. Replica-seconds are what the fleet pays over the
trace: each replica from its request (it holds its device while it starts) until it is let go. A window is one
interval of arrivals; it is in the SLO when the percentile of the latencies of the requests that arrived in it is
within the SLO (a request never answered counts as infinitely late).
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tailtune.api.v1alpha1 import DEFAULT_TARGET_UTILIZATION, MAX_BATCH_SIZE, Batching
from tailtune.offline.simobs import observation_from_sim, pod_readings_from_sim
from tailtune.sim import SimCluster
from tailtune.sim.arrivals import piecewise_poisson
from tailtune.sim.cluster import EPOCH
from tailtune.sim.curves import PiecewiseCurve
from tailtune.tuner.control.gates import before_serving
from tailtune.tuner.loop import FastPath, tune_once
from tailtune.tuner.servicetime import Curve, CurvePoint, ladder
from tailtune.tuner.shedding import shed_batch_max, shed_timeout_us
from tailtune.tuner.surge import CHECK_SECONDS, SURGE_SCALE_OUT
from tailtune.tuner.types import TAIL_SHARE, Decision, InForce, Observation, Policy, TunerState

Floats = npt.NDArray[np.float64]
# A rate change of more than this share is a step: the two windows after it are left out of the "excluding
# steps" counts.
STEP_SHARE = 0.2
STEP_WINDOWS = 2
# How long after the trace's (or a judged window's) end a request still queued is waited for before it counts as
# never answered (a bound on the simulation, far past any SLO judged here).
LATE_S = 60.0
# What `excess_by_rule` puts a count down to where the decision names no gate or guard: the plan's own count (the
# demand with its margin, at the target utilisation).
PLAN = "plan"


class InputError(ValueError):
    """A bad curve or trace file: the message names the file, the line and the fix."""


def read_curve(path: Path) -> PiecewiseCurve:
    """CURVE.csv with the header `batch,ms`: measured points, one per line."""
    rows = _rows(path, ("batch", "ms"))
    pts: dict[int, float] = {}
    for line, row in rows:
        try:
            batch = int(row["batch"])
            ms = float(row["ms"])
        except ValueError as exc:
            raise InputError(f"{path}:{line}: batch must be an integer and ms a number ({exc})") from exc
        if batch < 1 or not (ms > 0 and math.isfinite(ms)):
            raise InputError(f"{path}:{line}: batch must be >= 1 and ms > 0, got batch={batch} ms={ms}")
        if batch > MAX_BATCH_SIZE:
            raise InputError(
                f"{path}:{line}: batch {batch} is past {MAX_BATCH_SIZE}, the largest max_batch_size the spec takes "
                "(serving.batching.maxBatchSize); drop the line"
            )
        if batch in pts:
            raise InputError(f"{path}:{line}: batch {batch} is given twice; keep one measurement per size")
        pts[batch] = ms
    if not pts:
        raise InputError(f"{path}: no points; give at least one line `batch,ms`")
    return PiecewiseCurve(tuple(sorted(pts.items())), path.stem)


def read_trace(path: Path) -> tuple[tuple[float, float, float], ...]:
    """TRACE.csv with the header `t_s,rate_rps`: piecewise-constant Poisson rate; the last row ends it."""
    rows = _rows(path, ("t_s", "rate_rps"))
    points: list[tuple[float, float]] = []
    for line, row in rows:
        try:
            t, rate = float(row["t_s"]), float(row["rate_rps"])
        except ValueError as exc:
            raise InputError(f"{path}:{line}: t_s and rate_rps must be numbers ({exc})") from exc
        if not (math.isfinite(t) and math.isfinite(rate)) or rate < 0 or t < 0:
            raise InputError(f"{path}:{line}: t_s and rate_rps must be finite and >= 0, got {t}, {rate}")
        if points and t <= points[-1][0]:
            raise InputError(f"{path}:{line}: t_s={t} is not after the previous row's {points[-1][0]}")
        points.append((t, rate))
    if len(points) < 2:
        raise InputError(f"{path}: needs at least two rows (the last row's time ends the trace)")
    if points[0][0] != 0:
        raise InputError(f"{path}: the first row must start at t_s=0")
    return tuple((points[i][0], points[i + 1][0], points[i][1]) for i in range(len(points) - 1))


def _rows(path: Path, header: tuple[str, str]) -> list[tuple[int, dict[str, str]]]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's export may start with a byte-order mark
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as CSV, UTF-8") from exc
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None or tuple(f.strip() for f in reader.fieldnames) != header:
        raise InputError(f"{path}:1: the header must be `{','.join(header)}`, got {reader.fieldnames!r}")
    out = []
    for row in reader:
        clean = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        if any(v == "" for v in clean.values()) or None in row:
            raise InputError(f"{path}:{reader.line_num}: expected two values `{','.join(header)}`, got {row!r}")
        out.append((reader.line_num, clean))
    return out


@dataclass(frozen=True)
class Setup:
    """Everything a run depends on besides the policy."""

    curve: PiecewiseCurve
    segments: tuple[tuple[float, float, float], ...]
    slo_ms: float
    percentile: float = 99.0
    instances: int = 1
    replicas: int = 1  # at the start (and for the static policies)
    replicas_max: int = 1
    interval_s: float = 30.0
    start_max_batch: int = 1
    p99_noise: float = 0.0
    gap: tuple[float, int] | None = None
    seed: int = 0
    duration_s: float | None = None
    headroom: float = 0.8
    target_utilization: float = DEFAULT_TARGET_UTILIZATION  # spec.tuning.targetUtilization
    service_noise: float = 0.03
    pod_start_s: float = 30.0  # a scale-out's replicas serve this long after the request (the simulator's pod start)
    shed: bool = False  # load shedding: Triton's queue timeout from the SLO under the batching in force
    fast_path: bool = False  # the surge fast path (`tuner.surge`) every CHECK_SECONDS between ticks

    @property
    def end_s(self) -> float:
        """When the run ends."""
        end = self.segments[-1][1]
        return min(end, self.duration_s) if self.duration_s else end

    def rate_at(self, t: float) -> float:
        """Offered rate at time t."""
        starts = self._starts
        if starts is None:
            return next((r for a, b, r in self.segments if a <= t < b), 0.0)
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return 0.0
        a, b, r = self.segments[i]
        return r if a <= t < b else 0.0

    @functools.cached_property
    def _starts(self) -> list[float] | None:
        """The segments' starts where they are in order and do not overlap (a trace's are): rate_at bisects
        them (a recorded trace has a row a second); None otherwise."""
        segs = self.segments
        ordered = all(segs[i][1] <= segs[i + 1][0] and segs[i][0] <= segs[i][1] for i in range(len(segs) - 1))
        return [a for a, _, _ in segs] if ordered else None


@dataclass
class Run:
    """One policy on one setup: per-request outcomes, per-window figures and the knobs over time."""

    policy: str
    arrivals: Floats
    latency: Floats
    knobs: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, max batch, delay, replicas)
    changes: int = 0
    codes: list[tuple[float, str, str]] = field(default_factory=list)  # (t, reason code, reason)
    # (t, the gate or guard a tailtune decision names as bound by; "" where the plan itself set the config)
    bounds: list[tuple[float, str]] = field(default_factory=list)
    replica_seconds: float = 0.0  # over the trace, from each replica's request until it is let go
    replica_seconds_ready: float = 0.0  # the same, from each replica's readiness
    shed: Floats = field(default_factory=lambda: np.empty(0))  # arrivals rejected by the queue timeout (shedding)
    first_pod_queue_max: int = 0  # the most requests ever pending on the first replica (a pod's queue is its own)


def _arrivals(setup: Setup) -> Floats:
    segs = [(a, min(b, setup.end_s), r) for a, b, r in setup.segments if a < setup.end_s]
    return piecewise_poisson(segs, setup.seed)


def _cluster(setup: Setup, arrivals: Floats, batching: Batching, replicas: int) -> SimCluster:
    return SimCluster(
        setup.curve,
        arrivals,
        batching,
        replicas,
        instances=setup.instances,
        engine_max_batch=setup.curve.engine_max,
        seed=setup.seed,
        noise_sigma=setup.service_noise,
        startup_s=setup.pod_start_s,
        queue_timeout=shed_timeout(setup) if setup.shed else None,
    )


def shed_timeout(setup: Setup) -> Callable[[Batching], float]:
    """The queue timeout (s) shedding sets under each batching, as the operator renders it: the SLO, the build's
    ladder of the curve at the max batch in force, the instances."""
    curve = Curve(policy_for(setup).build_curve)

    def timeout_s(batching: Batching) -> float:
        service_ms = (curve.ms(1), curve.ms(batching.max_batch_size))
        return shed_timeout_us(setup.slo_ms, batching, service_ms, setup.instances) / 1e6

    return timeout_s


def _batching(max_batch: int, delay_us: int = 0) -> Batching:
    return Batching(max_batch_size=max_batch, preferred_batch_sizes=[], max_queue_delay_microseconds=delay_us)


def _finish(run: Run, sim: SimCluster, setup: Setup) -> Run:
    """Run to the trace's end, count its replica-seconds, let the last requests finish and record the outcomes."""
    sim.advance(setup.end_s)
    run.replica_seconds = sim.replica_seconds(setup.end_s)
    run.replica_seconds_ready = sim.replica_seconds(setup.end_s, ready_only=True)
    run.shed = sim.shed()
    run.first_pod_queue_max = sim.pending_peak(0, setup.end_s)
    sim.advance(setup.end_s + LATE_S)  # what is still queued then is lost
    run.arrivals, run.latency = sim.outcomes()
    return run


def run_static(setup: Setup, max_batch: int, delay_us: int, replicas: int, name: str) -> Run:
    """A fixed config through the whole trace."""
    arr = _arrivals(setup)
    sim = _cluster(setup, arr, _batching(max_batch, delay_us), replicas)
    return _finish(Run(name, arr, np.empty(0), [(0.0, max_batch, delay_us, replicas)]), sim, setup)


def policy_for(setup: Setup) -> Policy:
    """The tuner's policy for a setup: bounds from the curve and the replicas, the build's ladder as prior."""
    top = setup.curve.engine_max
    build = tuple(CurvePoint(batch=b, ms=setup.curve.ms(b), samples=1, source="build") for b in ladder(top))
    # With shedding, as the operator's policy: no max batch whose timeout would sit at its floor.
    cap = max(1, shed_batch_max(setup.slo_ms, Curve(build).ms, setup.instances, top)) if setup.shed else top
    return Policy(
        slo_ms=setup.slo_ms,
        percentile=setup.percentile,
        window_seconds=setup.interval_s,
        interval_seconds=setup.interval_s,
        cooldown_seconds=setup.interval_s,
        batch_min=1,
        batch_max=cap,
        delay_min_us=0,
        delay_max_us=20_000,
        headroom=setup.headroom,
        util_target=setup.target_utilization,
        replicas_min=1,
        replicas_max=setup.replicas_max,
        instances=setup.instances,
        build_curve=build,
    )


class _Observer:
    """The simulator as the tuner's reader, with the P99 noise and metric gaps of the setup."""

    def __init__(self, sim: SimCluster, setup: Setup) -> None:
        self.sim = sim
        self.setup = setup
        self.rng = np.random.default_rng([setup.seed, 7])
        self.last_read: float | None = None

    def observe(self, t: float) -> Observation:
        setup = self.setup
        stats = self.sim.observe(
            setup.interval_s, setup.percentile, stats_since=self.last_read, tail_s=TAIL_SHARE * setup.interval_s
        )
        self.last_read = t
        obs = observation_from_sim(stats)
        if setup.p99_noise > 0 and obs.p_latency_ms is not None:
            factor = 1.0 + float(self.rng.uniform(-setup.p99_noise, setup.p99_noise))
            obs = obs.model_copy(update={"p_latency_ms": obs.p_latency_ms * factor})
        if setup.gap is not None:
            start, windows = setup.gap
            if start <= t < start + windows * setup.interval_s:
                obs = Observation(window_end=obs.window_end, span_seconds=obs.span_seconds)
        return obs


def run_tailtune(setup: Setup, forecast: bool = False) -> Run:
    """The operator's loop against the simulator (with `forecast`, spec.tuning.forecast.enabled: `predictive`)."""
    arr = _arrivals(setup)
    top = setup.curve.engine_max
    policy = policy_for(setup).model_copy(update={"forecast": forecast})
    # As the operator does before the first pod serves: a start batching the build's curve shows fragile is left
    # then, so the pods start with the choice (no reload at the first tick).
    first = before_serving(
        InForce(batching=_batching(min(setup.start_max_batch, top)), replicas=setup.replicas), policy, EPOCH
    )
    in_force, start = first.in_force, first.in_force.batching
    sim = _cluster(setup, arr, start, setup.replicas)
    observer = _Observer(sim, setup)
    state = TunerState()
    b0 = start.max_batch_size, start.max_queue_delay_microseconds
    run = Run("predictive" if forecast else "tailtune", arr, np.empty(0), [(0.0, *b0, setup.replicas)])
    if first.changed:
        run.changes += 1
        run.codes.append((0.0, first.reason_code, first.reason))
        run.bounds.append((0.0, first.bound_by))

    class Reader:
        def read(self, window_end: datetime) -> Observation:
            return observer.observe(sim.now)

    class Applier:
        def apply(self, batching: Batching, replicas: int) -> None:
            sim.apply(batching, replicas)

    class Recorder:
        def record(self, decision: Decision, observation: Observation) -> None:
            run.codes.append((sim.now, decision.reason_code, decision.reason))
            run.bounds.append((sim.now, decision.bound_by))

    fast = FastPath() if setup.fast_path else None
    # The operator's tuner ticks as soon as a pod is ready, before traffic: one tick at t=0, then every interval.
    t = -setup.interval_s
    while t + setup.interval_s <= setup.end_s + 1e-9:
        # Between ticks the fast path reads the pods every CHECK_SECONDS (the operator's fast check).
        check = t + CHECK_SECONDS
        while fast is not None and t >= 0 and check < t + setup.interval_s - 1e-9:
            sim.advance(check)
            surge, state, in_force = fast.check(pod_readings_from_sim(sim), in_force, state, policy, sim.clock(check))
            if surge.scale_out:
                sim.apply(in_force.batching, in_force.replicas)
                run.changes += 1
                run.codes.append((check, SURGE_SCALE_OUT, surge.reason))
                b = in_force.batching
                run.knobs.append((check, b.max_batch_size, b.max_queue_delay_microseconds, in_force.replicas))
            check += CHECK_SECONDS
        t += setup.interval_s
        sim.advance(t)
        state, in_force, decision = tune_once(Reader(), Applier(), Recorder(), state, in_force, policy, sim.clock(t))
        if decision.changed:
            run.changes += 1
            b = decision.batching
            run.knobs.append((t, b.max_batch_size, b.max_queue_delay_microseconds, decision.replicas))
    return _finish(run, sim, setup)


def run_aimd(setup: Setup) -> Run:
    """Additive increase (+2), multiplicative decrease (x0.9) of max batch on the observed percentile."""
    arr = _arrivals(setup)
    top = setup.curve.engine_max
    mb = min(setup.start_max_batch, top)
    sim = _cluster(setup, arr, _batching(mb), setup.replicas)
    observer = _Observer(sim, setup)
    run = Run("aimd", arr, np.empty(0), [(0.0, mb, 0, setup.replicas)])
    t = 0.0
    while t + setup.interval_s <= setup.end_s + 1e-9:
        t += setup.interval_s
        sim.advance(t)
        obs = observer.observe(t)
        if obs.p_latency_ms is None:
            continue
        new = max(1, math.floor(mb * 0.9)) if obs.p_latency_ms > setup.slo_ms else min(top, mb + 2)
        if new != mb:
            mb = new
            sim.apply(_batching(mb), setup.replicas)
            run.changes += 1
            run.knobs.append((t, mb, 0, setup.replicas))
    return _finish(run, sim, setup)


def sweep_configs(setup: Setup) -> list[tuple[int, int]]:
    """(max batch, delay) configs the oracle chooses from."""
    top = setup.curve.engine_max
    sizes = sorted({*ladder(top), *(b + b // 2 for b in ladder(top) if b + b // 2 < top)})
    delays = [0] if setup.instances == 1 else [0, 2000]
    return [(b, d) for b in sizes for d in delays]


def windows_goodput(run: Run, setup: Setup) -> tuple[Floats, Floats]:
    """Per window: goodput (req/s within the SLO) and the percentile latency (ms) of the window's arrivals."""
    n = round(setup.end_s / setup.interval_s)
    idx = np.minimum((run.arrivals // setup.interval_s).astype(np.int64), n - 1)
    latency = run.latency
    if len(idx) > 1 and np.any(idx[1:] < idx[:-1]):
        order = np.argsort(idx, kind="stable")
        idx, latency = idx[order], latency[order]
    # Each window's requests are one slice (linear in the trace, not windows x requests).
    bounds = np.searchsorted(idx, np.arange(n + 1), side="left")
    good = np.zeros(n)
    pct = np.zeros(n)
    for w in range(n):
        lat = latency[bounds[w] : bounds[w + 1]]
        if len(lat):
            good[w], pct[w] = window_figures(lat, setup)
    return good, pct


def window_figures(latency: Floats, setup: Setup) -> tuple[float, float]:
    """One window's goodput (req/s within the SLO over the interval) and percentile latency (ms), from the
    latencies (s) of its arrivals (at least one)."""
    good = float(np.count_nonzero(latency * 1000 <= setup.slo_ms)) / setup.interval_s
    return good, float(np.percentile(latency, setup.percentile, method="higher")) * 1000


def windows_answered(run: Run, setup: Setup) -> tuple[Floats, Floats]:
    """Per window of arrivals: the percentile latency (ms) of the requests answered (nan where none was), and the
    share of its arrivals the queue timeout rejected (shedding). Arrivals are in order (`SimCluster.outcomes`)."""
    n = round(setup.end_s / setup.interval_s)

    def window(times: Floats) -> npt.NDArray[np.int64]:
        return np.minimum((times // setup.interval_s).astype(np.int64), n - 1)

    idx = window(run.arrivals)
    shed = np.bincount(window(run.shed), minlength=n)[:n]
    share = shed / np.maximum(np.bincount(idx, minlength=n)[:n], 1)
    answered = np.isfinite(run.latency)
    idx, latency = idx[answered], run.latency[answered]
    bounds = np.searchsorted(idx, np.arange(n + 1), side="left")
    pct = np.full(n, np.nan)
    for w in range(n):
        if bounds[w + 1] > bounds[w]:
            pct[w] = float(np.percentile(latency[bounds[w] : bounds[w + 1]], setup.percentile, method="higher")) * 1000
    return pct, share


def run_policy(setup: Setup, policy: str) -> Run:
    """Run one policy by name."""
    if policy == "tailtune":
        return run_tailtune(setup)
    if policy == "predictive":
        return run_tailtune(setup, forecast=True)
    if policy == "triton-default":
        return run_static(setup, setup.curve.engine_max, 0, setup.replicas, policy)
    if policy == "aimd":
        return run_aimd(setup)
    if policy == "min-cost":
        return run_min_cost(setup)
    if policy == "static-max":
        return run_static(setup, setup.start_max_batch, 0, setup.replicas_max, policy)
    if policy.startswith("static:"):
        try:
            _, mb, delay = policy.split(":")
            max_batch, delay_us = int(mb), int(delay)
        except ValueError as exc:
            raise InputError(f"--policy {policy!r}: use static:MAXBATCH:DELAY_US, e.g. static:8:0") from exc
        if not 1 <= max_batch <= setup.curve.engine_max:
            raise InputError(f"--policy {policy!r}: max batch must be 1..{setup.curve.engine_max} (the curve's)")
        return run_static(setup, max_batch, delay_us, setup.replicas, policy)
    raise InputError(
        f"unknown --policy {policy!r}; use tailtune, predictive, triton-default, static:MB:DELAY_US, aimd, oracle, "
        "min-cost, static-max"
    )


@functools.lru_cache(maxsize=8)
def _sweep(setup: Setup, replicas: int) -> tuple[tuple[tuple[int, int], Floats, Floats], ...]:
    """Each config of the sweep held static at `replicas` over the trace: (config, per-window goodput, percentile).
    Kept for the next caller: the oracle and min-cost both read the sweep at the most replicas."""
    out = []
    for mb, delay in sweep_configs(setup):
        good, pct = windows_goodput(run_static(setup, mb, delay, replicas, f"static:{mb}:{delay}"), setup)
        out.append(((mb, delay), good, pct))
    return tuple(out)


def oracle_windows(setup: Setup) -> tuple[Floats, Floats, list[tuple[int, int]]]:
    """Per window, the best goodput of the sweep at the most replicas, its percentile and its config."""
    best_good: Floats | None = None
    best_pct: Floats | None = None
    best_cfg: list[tuple[int, int]] = []
    for (mb, delay), good, pct in _sweep(setup, setup.replicas_max):
        if best_good is None or best_pct is None:
            best_good, best_pct, best_cfg = good, pct, [(mb, delay)] * len(good)
            continue
        better = good > best_good + 1e-9
        best_good = np.where(better, good, best_good)
        best_pct = np.where(better, pct, best_pct)
        best_cfg = [(mb, delay) if b else c for b, c in zip(better, best_cfg, strict=True)]
    assert best_good is not None and best_pct is not None
    return best_good, best_pct, best_cfg


@functools.lru_cache(maxsize=8)
def _window_sweep(setup: Setup, replicas: int) -> tuple[tuple[tuple[int, int], Floats, Floats], ...]:
    """Each config of the sweep at `replicas` on each window's arrivals alone, from an empty queue: (config,
    per-window goodput, percentile). What a count holds in a window it enters without a backlog, as it does where
    the windows before were held: a static run at a low count through the whole trace carries the backlog of an
    earlier peak into every later window, and would ask for replicas a quiet window does not need."""
    arr = _arrivals(setup)
    n = round(setup.end_s / setup.interval_s)
    iv = setup.interval_s
    bounds = np.searchsorted(arr, np.arange(n + 1) * iv, side="left")
    bounds[-1] = len(arr)  # as `windows_goodput`: the last window keeps what arrives after its nominal end
    out = []
    for mb, delay in sweep_configs(setup):
        good, pct = np.zeros(n), np.zeros(n)
        for w in range(n):
            window = arr[bounds[w] : bounds[w + 1]] - w * iv
            if not len(window):
                continue
            sim = _cluster(setup, window, _batching(mb, delay), replicas)
            sim.advance(iv + LATE_S)  # what is still queued then is lost, as in `_finish`
            good[w], pct[w] = window_figures(sim.outcomes()[1], setup)
        out.append(((mb, delay), good, pct))
    return tuple(out)


def min_cost_plan(setup: Setup) -> list[tuple[int, int, int]]:
    """Per window (replicas, max batch, delay): the fewest replicas at which a config of the sweep holds the SLO on
    the window entered without a backlog (`_window_sweep`), and such a config (the window before's where it holds
    too, so nothing reloads for nothing; else the one with the most goodput). Where none holds at the most
    replicas, the oracle's choice: the most replicas and the most goodput. The replay (`run_min_cost`) shows what
    the plan holds when a window's backlog does carry over."""
    n = round(setup.end_s / setup.interval_s)
    # Per window, its count and the configs that hold there with their goodput; counts rise until all are found.
    found: list[tuple[int, list[tuple[tuple[int, int], float]]] | None] = [None] * n
    for replicas in range(1, setup.replicas_max + 1):
        sweep = _window_sweep(setup, replicas)
        for w in range(n):
            if found[w] is None:
                holding = [(cfg, float(good[w])) for cfg, good, pct in sweep if pct[w] <= setup.slo_ms]
                if holding:
                    found[w] = (replicas, holding)
        if all(f is not None for f in found):
            break
    plan: list[tuple[int, int, int]] = []
    prev: tuple[int, int] | None = None
    for w, chosen in enumerate(found):
        if chosen is None:  # nothing holds: the configs with the most goodput at the most replicas
            at_top = [(cfg, float(good[w])) for cfg, good, _ in _sweep(setup, setup.replicas_max)]
            most = max(g for _, g in at_top)
            chosen = (setup.replicas_max, [(cfg, g) for cfg, g in at_top if g >= most - 1e-9])
        replicas, options = chosen
        most = max(g for _, g in options)
        cfg = prev if prev in [c for c, _ in options] else next(c for c, g in options if g == most)
        plan.append((replicas, *cfg))
        prev = cfg
    return plan


def run_min_cost(setup: Setup) -> Run:
    """`min_cost_plan` replayed in the simulator: each window's replicas requested one pod start ahead of it (held
    until its end), its config applied at its start."""
    plan = min_cost_plan(setup)
    n, iv = len(plan), setup.interval_s
    arr = _arrivals(setup)

    def window(t: float) -> int:
        return min(n - 1, int(t / iv + 1e-9))

    def held(t: float, lead: float) -> int:
        # The windows under way at t or starting within one pod start of it.
        return max(plan[w][0] for w in range(window(t), window(t + lead) + 1))

    lead = setup.pod_start_s
    knob = (plan[0][1], plan[0][2], held(0.0, lead))
    sim = _cluster(setup, arr, _batching(knob[0], knob[1]), knob[2])
    run = Run("min-cost", arr, np.empty(0), [(0.0, *knob)])
    starts = [w * iv for w in range(n)]
    for t in sorted({*starts, *(max(0.0, a - lead) for a in starts)} - {0.0}):
        if t >= setup.end_s:
            break
        sim.advance(t)
        _, mb, delay = plan[window(t)]
        new = (mb, delay, held(t, lead))
        if new != knob:
            knob = new
            sim.apply(_batching(mb, delay), knob[2])
            run.changes += 1
            run.knobs.append((t, *knob))
    return _finish(run, sim, setup)


def step_windows(setup: Setup) -> set[int]:
    """Windows within STEP_WINDOWS after a rate change of more than STEP_SHARE."""
    out: set[int] = set()
    n = round(setup.end_s / setup.interval_s)
    prev = setup.segments[0][2]
    for a, _b, rate in setup.segments[1:]:
        if abs(rate - prev) > STEP_SHARE * max(rate, prev, 1e-9):
            first = int(a // setup.interval_s)
            out.update(w for w in range(first, first + STEP_WINDOWS + 1) if w < n)
        prev = rate
    return out


def summarize(setup: Setup, policy: str, run: Run | None = None) -> dict[str, Any]:
    """The JSON summary of one policy on one setup (see the CLI's --json)."""
    if policy == "oracle":
        good, pct, cfgs = oracle_windows(setup)
        knobs = [(i * setup.interval_s, mb, d, setup.replicas_max) for i, (mb, d) in enumerate(cfgs)]
        changes = sum(1 for i in range(1, len(cfgs)) if cfgs[i] != cfgs[i - 1])
        codes: list[tuple[float, str, str]] = []
        bounds: dict[float, str] = {}
        # It holds every replica from the start, all of them ready.
        replica_seconds = ready_seconds = setup.replicas_max * setup.end_s
        answered, shed_share, rejected = np.full(len(good), np.nan), np.zeros(len(good)), 0.0  # not replayed
    else:
        run = run or run_policy(setup, policy)
        good, pct = windows_goodput(run, setup)
        knobs, changes, codes = run.knobs, run.changes, run.codes
        bounds = dict(run.bounds)
        replica_seconds, ready_seconds = run.replica_seconds, run.replica_seconds_ready
        answered, shed_share = windows_answered(run, setup)
        rejected = len(run.shed) / max(len(run.arrivals), 1)
    n = len(good)
    in_slo = pct <= setup.slo_ms
    steps = step_windows(setup)
    keep = [w for w in range(n) if w not in steps]
    offered = float(np.sum([setup.rate_at((w + 0.5) * setup.interval_s) for w in range(n)])) / max(n, 1)
    timeline = []
    # Knobs and decisions are in time order: one pass over each, not one per window.
    at = 0  # knobs[at - 1] is the last change before the window's end
    said = 0  # codes[said] is the first decision not before the window's end
    for w in range(n):
        t = w * setup.interval_s
        end = t + setup.interval_s
        while at < len(knobs) and knobs[at][0] <= end - 1e-9:
            at += 1
        k = knobs[at - 1] if at else knobs[0]
        mb, delay, reps = k[1], k[2], k[3]
        while said < len(codes) and codes[said][0] < end - 1e-6:
            said += 1
        decided = said < len(codes) and abs(codes[said][0] - end) < 1e-6
        code = codes[said][1] if decided else ""
        bound = bounds.get(codes[said][0], "") if decided else ""
        timeline.append(
            {
                "t_s": round(t, 3),
                "rate_rps": round(setup.rate_at(t + setup.interval_s / 2), 3),
                "p_ms": round(float(pct[w]), 3) if math.isfinite(pct[w]) else None,  # None: some never answered
                "goodput_rps": round(float(good[w]), 3),
                "max_batch": mb,
                "delay_us": delay,
                "replicas": reps,
                "decision": code,
                "bound_by": bound,  # the gate or guard the decision names ("": none, or no decision)
                "p_answered_ms": round(float(answered[w]), 3) if math.isfinite(answered[w]) else None,
                "rejected_share": round(float(shed_share[w]), 4),
            }
        )
    last_step = max(steps) - STEP_WINDOWS if steps else 0
    settle = settle_intervals(timeline, [bool(x) for x in in_slo], last_step)
    final = timeline[-1] if timeline else {"max_batch": 0, "delay_us": 0, "replicas": 0}
    return {
        "policy": policy,
        "curve": setup.curve.name,
        "slo_ms": setup.slo_ms,
        "percentile": setup.percentile,
        "goodput_rps": round(float(np.mean(good)), 3) if n else 0.0,
        "offered_rps": round(offered, 3),
        "windows": n,
        "windows_in_slo": int(in_slo.sum()),
        "windows_excluding_steps": len(keep),
        "windows_in_slo_excluding_steps": int(sum(1 for w in keep if in_slo[w])),
        "changes": changes,
        "settle_intervals": settle,
        "replica_seconds": round(replica_seconds, 3),
        "replica_seconds_ready": round(ready_seconds, 3),
        "shedding": setup.shed,
        "rejected_share": round(rejected, 4),
        "final": {"max_batch": final["max_batch"], "delay_us": final["delay_us"], "replicas": final["replicas"]},
        "timeline": timeline,
    }


def excess_by_rule(policy: dict[str, Any], least: dict[str, Any], interval_s: float) -> dict[str, float]:
    """Replica-seconds a policy's summary holds above another's (`least`: min-cost's), window by window (each
    window's replicas at its end, times the interval), put down to the gate or guard the last tick's decision
    before the window names as bound by (`bound_by`: the last to change the decision's proposal, which may have
    limited its batching rather than its count), else to the plan (`PLAN`; a fast path scale-out between ticks is
    put down to the next tick, which keeps or undoes it). Windows where it holds
    fewer add nothing: this is where the replicas above the least go, not a net difference."""
    out: dict[str, float] = {}
    rule = PLAN
    for w, v in zip(policy["timeline"], least["timeline"], strict=True):
        above = w["replicas"] - v["replicas"]
        if above > 0:
            out[rule] = out.get(rule, 0.0) + above * interval_s
        if w["decision"]:  # the decision at this window's end keeps or sets the count of the next
            rule = w.get("bound_by") or PLAN
    return out


def settle_intervals(
    timeline: Sequence[dict[str, Any]], in_slo: Sequence[bool], from_window: int, count_give_back: bool = True
) -> int:
    """Windows after the last step until the config stops changing and every later window is in the SLO.
    Without `count_give_back`, a change that only gives back replicas within the SLO does not count (a cost move
    the scale-in stabilization window delays on purpose)."""
    last = from_window
    for w in range(from_window, len(timeline)):
        now, prev = timeline[w], timeline[w - 1] if w > 0 else timeline[w]
        moved = any(now[k] != prev[k] for k in ("max_batch", "delay_us", "replicas"))
        give_back = (now["max_batch"], now["delay_us"]) == (prev["max_batch"], prev["delay_us"]) and (
            now["replicas"] < prev["replicas"]
        )
        if (moved and (count_give_back or not give_back)) or not in_slo[w]:
            last = w + 1
    return max(0, last - from_window)


def plot(setup: Setup, summaries: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """P-latency vs SLO, goodput vs offered, and the knobs over time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    replicas_ax = axes[2].twinx()  # a few replicas beside max batches of hundreds: their own scale
    for i, s in enumerate(summaries):
        tl = s["timeline"]
        xs = [r["t_s"] + setup.interval_s for r in tl]
        color = f"C{i}"  # one color per policy in every panel
        # tailtune wide and beneath, the others thin on top: where a baseline runs the same config, both show.
        mine = s["policy"] == "tailtune"
        line = {"color": color, "lw": 3.5 if mine else 1.3, "alpha": 0.55 if mine else 1.0, "zorder": 2 if mine else 3}
        p_ms = [r["p_ms"] if r["p_ms"] is not None else np.nan for r in tl]
        axes[0].plot(xs, p_ms, label=s["policy"], **line)
        axes[1].plot(xs, [r["goodput_rps"] for r in tl], label=s["policy"], **line)
        axes[2].step(xs, [r["max_batch"] for r in tl], where="pre", label=f"{s['policy']} max batch", **line)
        if s["policy"] in ("tailtune", "predictive", "min-cost"):  # the policies that scale
            reps = [r["replicas"] for r in tl]
            label = f"{s['policy']} replicas ({s.get('replica_seconds', 0):.0f} replica-s)"
            replicas_ax.step(xs, reps, where="pre", color=color, linestyle=":", label=label)
    if summaries:
        tl = summaries[0]["timeline"]
        xs = [r["t_s"] + setup.interval_s for r in tl]
        axes[1].step(xs, [r["rate_rps"] for r in tl], "k--", where="pre", label="offered")
    axes[0].axhline(setup.slo_ms, color="black", linestyle="--", label=f"SLO {setup.slo_ms:g} ms")
    axes[0].set_yscale("symlog", linthresh=max(1.0, setup.slo_ms / 10))
    axes[0].set_ylim(bottom=0)  # latencies are never negative: no mirrored half of the symlog axis
    axes[0].set_ylabel(f"P{setup.percentile:g} of arrivals (ms)")
    axes[1].set_ylabel("goodput (req/s in SLO)")
    axes[2].set_ylabel("max batch")
    replicas_ax.set_ylabel("replicas (dotted)")
    replicas_ax.set_ylim(bottom=0)
    replicas_ax.yaxis.get_major_locator().set_params(integer=True)
    if replicas_ax.lines:
        replicas_ax.legend(fontsize=7, loc="upper right")
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"{setup.curve.name}: SLO {setup.slo_ms:g} ms")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
