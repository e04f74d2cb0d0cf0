"""Benchmark of the SLO tuner on generated families of curves, traces and starts, in the simulator.

    python bench/tuner/run.py                 # the full family (>= 100 scenarios; ~1 h of CPU: use --jobs)
    python bench/tuner/run.py --quick         # 12 scenarios, shorter traces (~3 min on 2 cores)
    python bench/tuner/run.py --jobs 16       # processes
    python bench/tuner/run.py --wide          # the out-of-sample family: 50 scenarios along other axes

Every scenario is drawn from fixed seeds: a curve family (linear, power law with exponent 0.8-1.6,
TensorRT-style stepwise, saturating, the legacy curves of the first benchmark, and curves measured on the
local tritonserver through `batch_stats` when `bench/tuner/curves/*.csv` has them), a trace (steps up and
down, diurnal, bursts, flash crowds, ramps to near zero, metrics gaps, P99 noise), a start (max batch 1, 8
or the engine's max), 1-2 instances and 1-4 replicas (the static policies and the oracle run with those
replicas; tailtune starts with them and may scale within 1..that). Each runs `tailtune`, `triton-default`, `aimd`, the
start config held static, the `oracle` (per interval, the best static config of a sweep), `min-cost` (per interval
the fewest replicas and a config of the sweep that hold the SLO, each scale-out one pod start ahead) and
`static-max` (the most replicas, the start config) through `tailtune.offline.whatif`: the same engine as
`tailtune simulate`. tailtune runs with the surge fast path on in every family, as the operator runs it.

Writes bench/out/tuner/report.md (distribution per family: minimum, 10th percentile and median of
goodput/oracle and of windows in SLO; replica-seconds per family and per trace, tailtune / min-cost and the saving
against static-max, worst scenario named; the 5 worst scenarios with their decision traces) and a PNG per worst
scenario and one of the distributions, plus results.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tailtune.offline.whatif import (
    STEP_WINDOWS,
    Setup,
    excess_by_rule,
    read_curve,
    run_policy,
    settle_intervals,
    step_windows,
    summarize,
)
from tailtune.sim.curves import PiecewiseCurve

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out" / "tuner"
MEASURED = ROOT / "bench" / "tuner" / "curves"
INTERVAL = 30.0
FAMILIES = ("linear", "power", "stepwise", "saturating", "legacy", "measured")
TRACES = ("step-up", "step-down", "diurnal", "bursts", "flash-crowd", "ramp-to-zero", "gap", "noise")


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    trace: str
    setup: Setup


def _curve(family: str, rng: np.random.Generator, engine_max: int) -> PiecewiseCurve:
    sizes = sorted({1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128} & set(range(1, engine_max + 1)) | {engine_max})
    a = float(rng.uniform(3.0, 12.0))
    if family == "linear":
        # Best batch large: a big fixed cost per execution, a small cost per request.
        c = a / float(rng.uniform(20, 80))
        pts = [(b, a + c * b) for b in sizes]
        label = f"linear(a={a:.1f},c={c:.3f})"
    elif family == "power":
        p = float(rng.uniform(0.8, 1.6))
        c = a / float(rng.uniform(4, 30))
        pts = [(b, a + c * b**p) for b in sizes]
        label = f"power(a={a:.1f},c={c:.2f},p={p:.2f})"
    elif family == "stepwise":
        # Flat plateaus, one per optimization-profile range (TensorRT picks kernels per range).
        edges = sorted({int(x) for x in rng.choice([4, 8, 16, 32, 64], size=3, replace=False)})
        step_ms = a * float(rng.uniform(0.4, 1.2))
        pts = [(b, a + step_ms * sum(1 for e in edges if b > e) * (1 + b / engine_max)) for b in sizes]
        label = f"stepwise(a={a:.1f},edges={edges})"
    elif family == "saturating":
        k = float(rng.uniform(4, 32))
        top = a * float(rng.uniform(1.5, 4))
        pts = [(b, a + top * (1 - math.exp(-b / k)) + 0.02 * a * b) for b in sizes]
        label = f"saturating(a={a:.1f},k={k:.0f})"
    elif family == "knee":
        # Linear up to a knee, steeply superlinear past it (a kernel that stops fitting the device past a size).
        knee = int(rng.choice([4, 8, 16, 32]))
        c = a / float(rng.uniform(10, 40))
        pts = [(b, a + c * b + (0.0 if b <= knee else 0.05 * a * (b - knee) ** 1.5)) for b in sizes]
        label = f"knee(a={a:.1f},k={knee})"
    elif family == "legacy":
        if rng.random() < 0.5:
            pts = [(b, 2.0 + 0.4 * b**1.3) for b in sizes]
            label = "linear-power(2,0.4,1.3)"
        else:
            table = {1: 4.0, 2: 4.3, 4: 4.9, 8: 6.3, 16: 11.0, 32: 23.5, 64: 51.0, 128: 110.0}
            pts = [(b, ms) for b, ms in table.items() if b <= engine_max]
            label = "bert-base-l4"
    else:
        raise ValueError(family)
    return PiecewiseCurve(tuple((b, round(ms, 4)) for b, ms in pts), label)


def _capacity_within(curve: PiecewiseCurve, slo_ms: float) -> float:
    """Most req/s one replica serves at a batch whose two executions fit in the SLO."""
    fits = [b for b in range(1, curve.engine_max + 1) if 2 * curve.ms(b) <= 0.8 * slo_ms] or [1]
    return max(1000.0 * b / curve.ms(b) for b in fits)


def _segments(kind: str, peak: float, duration: float, rng: np.random.Generator) -> list[tuple[float, float, float]]:
    low = peak * float(rng.uniform(0.15, 0.4))
    third = round(duration / 3 / INTERVAL) * INTERVAL
    if kind in ("step-up", "gap", "noise"):
        return [(0, third, low), (third, duration, peak)]
    if kind == "step-down":
        return [(0, third, peak), (third, duration, low)]
    if kind == "diurnal":
        n = 20
        return [
            (
                i * duration / n,
                (i + 1) * duration / n,
                low + (peak - low) * (1 - math.cos(2 * math.pi * (i + 0.5) / n)) / 2,
            )
            for i in range(n)
        ]
    if kind == "bursts":
        segs, t = [], 0.0
        while t < duration:
            d = float(rng.uniform(10, 60))
            segs.append((t, min(duration, t + d), peak if len(segs) % 2 else low * 1.5))
            t += d
        return segs
    if kind == "flash-crowd":
        at = third + float(rng.uniform(0, third))
        return [(0, at, low), (at, at + 40, min(peak * 1.6, peak / 0.7)), (at + 40, duration, low)]
    if kind == "ramp-to-zero":
        n = 12
        return [(i * duration / n, (i + 1) * duration / n, peak * (1 - i / n) + 0.5) for i in range(n)]
    raise ValueError(kind)


SEED = 20261130


def _draw_curve(rng: np.random.Generator, family: str, i: int, measured: list[Path]) -> tuple[PiecewiseCurve, float]:
    """A scenario's curve (drawn, or the i-th measured one) and its SLO: 2.5-5x the time of one of its batches."""
    engine_max = int(rng.choice([32, 64, 128]))
    curve = read_curve(measured[i % len(measured)]) if family == "measured" else _curve(family, rng, engine_max)
    ref = int(rng.choice([b for b, _ in curve.points if b >= 2] or [1]))
    return curve, float(rng.uniform(2.5, 5.0)) * curve.ms(ref)


def _fleet(
    curve: PiecewiseCurve,
    segs: list[tuple[float, float, float]],
    slo: float,
    instances: int,
    replicas_max: int,
    start: int,
    seed: int,
    **extra: Any,
) -> Setup:
    """A scenario that starts at its most replicas (where the static policies stay) and the start's max batch; tailtune
    runs with the surge fast path on, as the operator does."""
    return Setup(
        curve=curve,
        segments=tuple((float(a), float(b), float(r)) for a, b, r in segs),
        slo_ms=slo,
        instances=instances,
        replicas=replicas_max,
        replicas_max=replicas_max,
        interval_s=INTERVAL,
        start_max_batch=min(start, curve.engine_max),
        seed=seed,
        fast_path=True,
        **extra,
    )


def scenarios(quick: bool, seed: int = SEED, count: int | None = None) -> list[Scenario]:
    """The family, from fixed seeds (another `seed` draws another family: an out-of-sample check)."""
    rng = np.random.default_rng(seed)
    measured = sorted(MEASURED.glob("*.csv")) if MEASURED.exists() else []
    families = [f for f in FAMILIES if f != "measured" or measured]
    out: list[Scenario] = []
    count = count or (12 if quick else 120)
    duration = 300.0 if quick else 480.0
    for i in range(count):
        family = families[i % len(families)]
        trace = TRACES[(i // len(families)) % len(TRACES)]
        curve, slo = _draw_curve(rng, family, i, measured)
        slo = round(slo, 2)
        replicas_max = int(rng.integers(1, 5))
        instances = int(rng.choice([1, 1, 2]))
        start = int(rng.choice([1, 8, curve.engine_max]))
        peak = float(rng.uniform(0.45, 0.85)) * replicas_max * _capacity_within(curve, slo)
        segs = _segments(trace, peak, duration, rng)
        setup = _fleet(
            curve,
            segs,
            slo,
            instances,
            replicas_max,
            start,
            1000 + i + (0 if seed == SEED else seed % 100_000),
            p99_noise=0.15 if trace == "noise" else 0.0,
            gap=(duration / 3 + INTERVAL, 3) if trace == "gap" else None,
        )
        name = f"{i:03d}-{family}-{trace}-r{replicas_max}-i{instances}-s{setup.start_max_batch}"
        out.append(Scenario(name, family, trace, setup))
    return out


WIDE_FAMILIES = ("linear", "power", "stepwise", "saturating", "knee")
WIDE_TRACES = ("ramp-up", "sawtooth", "walk", "step-up-2", "spike")
WIDE_SEED = 20261202


def _wide_segments(
    kind: str, peak: float, duration: float, rng: np.random.Generator
) -> list[tuple[float, float, float]]:
    low = peak * float(rng.uniform(0.05, 0.5))
    if kind == "ramp-up":
        n = 16
        return [(i * duration / n, (i + 1) * duration / n, low + (peak - low) * i / (n - 1)) for i in range(n)]
    if kind == "sawtooth":
        out, t, period, n = [], 0.0, float(rng.uniform(90, 200)), 6
        while t < duration:
            for i in range(n):
                a = t + i * period / n
                if a < duration:
                    out.append((a, min(duration, a + period / n), low + (peak - low) * i / (n - 1)))
            t += period
        return out
    if kind == "walk":
        out, t, r = [], 0.0, float(rng.uniform(low, peak))
        while t < duration:
            d = float(rng.uniform(20, 120))
            out.append((t, min(duration, t + d), r))
            t += d
            r = float(np.clip(r * math.exp(rng.normal(0, 0.35)), low, peak))
        return out
    if kind == "step-up-2":
        return [(0, duration / 4, low), (duration / 4, duration / 2, (low + peak) / 2), (duration / 2, duration, peak)]
    if kind == "spike":
        at, width = float(rng.uniform(duration / 4, duration / 2)), float(rng.uniform(5, 25))
        return [(0, at, low * 1.5), (at, at + width, peak * 1.3), (at + width, duration, low * 1.5)]
    raise ValueError(kind)


def wide_scenarios(seed: int = WIDE_SEED, count: int | None = None) -> list[Scenario]:
    """An out-of-sample family along axes the main one holds fixed: replicas at the start below the most, the
    99.9th and 95th percentiles, 15 s and 60 s intervals, P99 noise up to 25 %, loads up to 0.95 of what the most
    replicas carry, SLOs from 1.8x a batch time, a knee curve, and ramps up, sawtooths, random walks, two-step
    rises and short spikes. (The oracle runs at the most replicas: where tailtune starts below them, saving the
    replicas the load does not need, its goodput/oracle also counts what those replicas would have served in a
    spike; the defaults run at the start's replicas.)"""
    rng = np.random.default_rng(seed)
    out: list[Scenario] = []
    for i in range(count or 50):
        family = WIDE_FAMILIES[i % len(WIDE_FAMILIES)]
        trace = WIDE_TRACES[(i // len(WIDE_FAMILIES)) % len(WIDE_TRACES)]
        curve = _curve(family, rng, int(rng.choice([16, 32, 64, 128])))
        ref = int(rng.choice([b for b, _ in curve.points if b >= 2] or [1]))
        pct = float(rng.choice([95.0, 99.0, 99.0, 99.9]))
        slo = round(float(rng.uniform(1.8, 6.0)) * curve.ms(ref), 2)
        replicas_max = int(rng.integers(1, 5))
        replicas = int(rng.integers(1, replicas_max + 1))
        instances = int(rng.choice([1, 1, 2]))
        start = int(rng.choice([1, 4, 8, 16, curve.engine_max]))
        interval = float(rng.choice([15.0, 30.0, 60.0]))
        duration = interval * int(rng.integers(14, 24))
        peak = float(rng.uniform(0.3, 0.95)) * replicas_max * _capacity_within(curve, slo)
        noise = float(rng.choice([0.0, 0.0, 0.1, 0.25]))
        segs = _wide_segments(trace, peak, duration, rng)
        setup = Setup(
            curve=curve,
            segments=tuple((float(a), float(b), float(r)) for a, b, r in segs),
            slo_ms=slo,
            percentile=pct,
            instances=instances,
            replicas=replicas,
            replicas_max=replicas_max,
            interval_s=interval,
            start_max_batch=min(start, curve.engine_max),
            p99_noise=noise,
            seed=5000 + i + seed % 100_000,
            fast_path=True,
        )
        name = (
            f"{i:03d}-{family}-{trace}-r{replicas}of{replicas_max}-i{instances}-s{setup.start_max_batch}"
            f"-p{pct:g}-iv{interval:g}-n{noise:g}"
        )
        out.append(Scenario(name, family, trace, setup))
    return out


COST_FAMILIES = ("linear", "power", "stepwise", "saturating", "measured")
COST_TRACES_LONG = ("diurnal", "on-off")
COST_SEED = 20261206
# A day compressed 24x into an hour: the stabilization window (the HPA's 300 s) is 1/12 of the cycle (1/288 of a
# real day: the compression makes giving back harder, not easier), the pod start (30 s) 1/120.
COST_PERIOD_S = 3600.0
# On/off phases: each one 10-20 minutes (several stabilization windows: a phase shorter than one cannot be given
# back by a policy that waits it out, by design).
ON_OFF_PHASE_S = (600.0, 1200.0)
# A replica serves at most this many req/s within the SLO: a curve that serves more runs slower by a constant factor
# (the same shape: a larger model). The simulator's cost grows with the requests, and an hour on 8 replicas must
# run in minutes; 1,000 req/s is the order of a BERT-base on an L4 (the legacy bert-base-l4 curve: 16 in 11 ms).
COST_REPLICA_RPS_MAX = 1000.0


def _cost_segments(
    kind: str, peak: float, interval: float, rng: np.random.Generator, period_s: float = COST_PERIOD_S
) -> list[tuple[float, float, float]]:
    """One cycle of `period_s`, an interval a segment: a daily swing (trough 10-35 % of the peak) or on/off
    phases (off at 5-20 % of the peak); each interval's rate times a lognormal wiggle of 0-10 % (a measured
    trace is never smooth)."""
    n = round(period_s / interval)
    wiggle = float(rng.uniform(0.0, 0.1))
    if kind == "diurnal":
        low = peak * float(rng.uniform(0.1, 0.35))
        level = [low + (peak - low) * (1 - math.cos(2 * math.pi * (i + 0.5) / n)) / 2 for i in range(n)]
    elif kind == "on-off":
        low = peak * float(rng.uniform(0.05, 0.2))
        level, on = [], bool(rng.integers(0, 2))
        while len(level) < n:
            phase = round(float(rng.uniform(*ON_OFF_PHASE_S)) / interval)
            level += [peak if on else low] * phase
            on = not on
        level = level[:n]
    else:
        raise ValueError(kind)
    return [
        (i * interval, (i + 1) * interval, min(peak, x * float(np.exp(rng.normal(0.0, wiggle)))))
        for i, x in enumerate(level)
    ]


def cost_scenarios(seed: int = COST_SEED, count: int | None = None, period_s: float = COST_PERIOD_S) -> list[Scenario]:
    """The family the cost targets are about: an hour of a daily swing or of on/off phases on a fleet (4-8
    replicas, the peak 0.6-0.9 of what they carry within the SLO), every curve family, 1-2 instances. Each starts
    at the most replicas and the start config (where static-max stays); tailtune runs with the surge fast path,
    as the operator does by default. `period_s`: the cycle's length (a day compressed less; the same draws of
    curves and fleets only for the default, whose names carry no period)."""
    rng = np.random.default_rng(seed)
    measured = sorted(MEASURED.glob("*.csv")) if MEASURED.exists() else []
    families = [f for f in COST_FAMILIES if f != "measured" or measured]
    out: list[Scenario] = []
    for i in range(count or 8):
        family = families[i % len(families)]
        trace = COST_TRACES_LONG[i % len(COST_TRACES_LONG)]
        curve, slo = _draw_curve(rng, family, i, measured)
        slower = max(1.0, _capacity_within(curve, slo) / COST_REPLICA_RPS_MAX)
        if slower > 1.0:
            curve = PiecewiseCurve(tuple((b, round(ms * slower, 4)) for b, ms in curve.points), curve.label)
        slo = round(slo * slower, 2)
        replicas_max = int(rng.integers(4, 9))
        instances = int(rng.choice([1, 1, 2]))
        start = int(rng.choice([1, 8, curve.engine_max]))
        peak = float(rng.uniform(0.6, 0.9)) * replicas_max * _capacity_within(curve, slo)
        segs = _cost_segments(trace, peak, INTERVAL, rng, period_s)
        setup = _fleet(curve, segs, slo, instances, replicas_max, start, 9000 + i + seed % 100_000)
        name = f"{i:03d}-{family}-{trace}-r{replicas_max}-i{instances}-s{setup.start_max_batch}"
        name += f"-p{period_s:g}s" if period_s != COST_PERIOD_S else ""
        out.append(Scenario(name, family, trace, setup))
    return out


BASELINES = ("triton-default", "aimd", "oracle", "start", "min-cost", "static-max")
# The traces the cost targets are about: a daily swing and a load that comes and goes ("bursts": on/off).
COST_TRACES = ("diurnal", "bursts", "on-off")
COST_VS_MIN = 1.25  # tailtune's replica-seconds at most this times min-cost's
GOODPUT_VS_ORACLE = 0.95  # issue 38: tailtune's goodput at least this share of the per-window oracle's
NO_HARM = 0.99  # do no harm: tailtune's goodput at least a static baseline's less one point
SAVING_VS_STATIC_MAX = 0.35  # ... and at least this share fewer than static-max's


def run_one(sc: Scenario, baselines: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every policy on one scenario, summarized; tailtune's full timeline kept. `baselines`: the other policies'
    summaries of an earlier run of the same scenario, reused instead of simulated again."""
    t0 = time.perf_counter()
    res: dict[str, Any] = {"name": sc.name, "family": sc.family, "trace": sc.trace, "curve": sc.setup.curve.name}
    run = run_policy(sc.setup, "tailtune")
    res["tailtune"] = summarize(sc.setup, "tailtune", run)
    # The oracle before min-cost: both read the sweep at the most replicas, run once.
    for policy in (
        "triton-default",
        "aimd",
        "oracle",
        f"static:{sc.setup.start_max_batch}:0",
        "min-cost",
        "static-max",
    ):
        key = "start" if policy.startswith("static:") else policy
        res[key] = baselines[key] if baselines and key in baselines else summarize(sc.setup, policy)
    res["decisions"] = [(round(t), code, why) for t, code, why in run.codes if code not in ("WithinBand", "Settled")]
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


def _in_slo(w: dict[str, Any], slo_ms: float) -> bool:
    return w["p_ms"] is not None and w["p_ms"] <= slo_ms


def _settle_but_scale_in(t: dict[str, Any], steps: set[int], oracle: dict[str, Any] | None = None) -> int:
    """`settle_intervals`, not counting a change that only gives back replicas within the SLO (with `oracle`: nor
    a window where the best static config breaks the SLO too, out of any config's reach)."""
    tl = t["timeline"]
    first = max(steps) - STEP_WINDOWS if steps else 0
    slo = t["slo_ms"]
    held = [
        _in_slo(w, slo) or (oracle is not None and not _in_slo(o, slo))
        for w, o in zip(tl, (oracle or t)["timeline"], strict=True)
    ]
    return settle_intervals(tl, held, first, count_give_back=False)


def metrics(r: dict[str, Any], setup: Setup | None = None) -> dict[str, float]:
    """The figures the targets are about (those that need the windows' steps only with `setup`)."""
    t, o = r["tailtune"], r["oracle"]
    base = max(r["triton-default"]["goodput_rps"], r["aimd"]["goodput_rps"])
    windows = t["timeline"]
    steady = max(1, t["windows_excluding_steps"])
    extra: dict[str, float] = {}
    if setup is not None:
        steps = step_windows(setup)
        slo = t["slo_ms"]
        # Windows outside the steps where the clairvoyant best static config holds the SLO: the reachable ones.
        reach = [w for w in range(len(windows)) if w not in steps and _in_slo(o["timeline"][w], slo)]
        held = sum(1 for w in reach if _in_slo(windows[w], slo))
        extra = {
            "in_slo_reachable": held / len(reach) if reach else 1.0,
            **(
                {"min_cost_in_slo_reachable": _held_share(r["min-cost"]["timeline"], reach, slo)}
                if "min-cost" in r
                else {}
            ),
            "settle_but_scale_in": float(_settle_but_scale_in(t, steps)),
            "settle_reachable": float(_settle_but_scale_in(t, steps, o)),
        }
    if "min-cost" in r and "static-max" in r:  # absent from a results.json of before they ran
        extra |= {
            "cost_vs_min": _ratio(t["replica_seconds"], r["min-cost"]["replica_seconds"]),
            "saving_vs_static_max": 1.0 - _ratio(t["replica_seconds"], r["static-max"]["replica_seconds"]),
            "min_cost_saving": 1.0 - _ratio(r["min-cost"]["replica_seconds"], r["static-max"]["replica_seconds"]),
        }
    return extra | {
        "vs_oracle": _ratio(t["goodput_rps"], o["goodput_rps"]),
        "vs_default": _ratio(t["goodput_rps"], r["triton-default"]["goodput_rps"]),
        "vs_start": _ratio(t["goodput_rps"], r["start"]["goodput_rps"]),
        "vs_best_baseline": _ratio(t["goodput_rps"], base),
        "in_slo": t["windows_in_slo_excluding_steps"] / steady,
        "settle": float(t["settle_intervals"]),
        "changes_per_5": 5.0 * t["changes"] / max(1, len(windows)),
    }


def _held_share(timeline: list[dict[str, Any]], reach: list[int], slo_ms: float) -> float:
    return sum(1 for w in reach if _in_slo(timeline[w], slo_ms)) / len(reach) if reach else 1.0


def _dist(xs: list[float]) -> str:
    return f"{min(xs):.3f} / {np.percentile(xs, 10):.3f} / {np.median(xs):.3f}"


def _dist_high(xs: list[float]) -> str:
    """A ratio where high is bad, worst first: max / 90th percentile / median."""
    return f"{max(xs):.3f} / {np.percentile(xs, 90):.3f} / {np.median(xs):.3f}"


def _cost_section(m_all: list[tuple[dict[str, float], dict[str, Any]]]) -> list[str]:
    """Replica-seconds per family and per trace, worst first and named, beside goodput and the fair windows."""
    rows = [(x, r) for x, r in m_all if "cost_vs_min" in x]
    if not rows:
        return []
    lines = [
        "",
        "## Cost: replica-seconds",
        "",
        "Each replica counts from its request (it holds its device while it starts) until it is let go. min-cost: per "
        "window the fewest replicas and a config of the oracle's sweep that hold the SLO on the window entered with an "
        "empty queue, each scale-out requested one pod start (30 s) ahead, replayed in the simulator; static-max: the "
        "most replicas and the start config. Fair windows: outside steps, where the oracle holds the SLO.",
        "",
        "| group | n | tailtune / min-cost max / p90 / median | worst | saving vs static-max min / p10 / median "
        "| worst | min-cost's own saving min / median | goodput/oracle min / median "
        "| fair windows in SLO min (tailtune; min-cost) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    # (label, the field a member has the value of): the curve families, the traces, then all.
    groups = [(f, "family", f) for f in sorted({r["family"] for _, r in rows})]
    groups += [(f"trace {tr}", "trace", tr) for tr in sorted({r["trace"] for _, r in rows})]
    groups.append(("all", "", ""))
    for label, key, value in groups:
        g = [(x, r) for x, r in rows if not key or r[key] == value]
        cost = [x["cost_vs_min"] for x, _ in g]
        save = [x["saving_vs_static_max"] for x, _ in g]
        worst_cost = max(g, key=lambda xr: xr[0]["cost_vs_min"])[1]["name"]
        worst_save = min(g, key=lambda xr: xr[0]["saving_vs_static_max"])[1]["name"]
        vs_oracle = [x["vs_oracle"] for x, _ in g]
        own = [x.get("min_cost_saving", math.nan) for x, _ in g]
        fair = min(x.get("in_slo_reachable", math.nan) for x, _ in g)
        fair_min_cost = min(x.get("min_cost_in_slo_reachable", math.nan) for x, _ in g)
        lines.append(
            f"| {label} | {len(g)} | {_dist_high(cost)} | {worst_cost} | {_dist(save)} | {worst_save} "
            f"| {min(own):.3f} / {np.median(own):.3f} | {min(vs_oracle):.3f} / {np.median(vs_oracle):.3f} "
            f"| {fair:.3f}; {fair_min_cost:.3f} |"
        )
    target = [(x, r) for x, r in rows if r["trace"] in COST_TRACES]
    if target:
        cheap = [x["cost_vs_min"] <= COST_VS_MIN for x, _ in target]
        saves = [x["saving_vs_static_max"] >= SAVING_VS_STATIC_MAX for x, _ in target]
        reachable = [x["min_cost_saving"] >= SAVING_VS_STATIC_MAX for x, _ in target]
        both = sum(a and b for a, b in zip(saves, reachable, strict=True))
        fair_ok = [x.get("in_slo_reachable", 0.0) >= 0.99 for x, _ in target]
        lines += [
            "",
            f"Targets on the {' and '.join(COST_TRACES)} traces ({len(target)} scenarios):",
            "",
            f"- replica-seconds <= {COST_VS_MIN:g}x min-cost: {sum(cheap)}/{len(target)}",
            f"- >= {SAVING_VS_STATIC_MAX * 100:g} % fewer than static-max: {sum(saves)}/{len(target)} "
            f"(min-cost itself: {sum(reachable)}/{len(target)}; where it reaches it: {both}/{sum(reachable)})",
            f"- >= 99 % of the fair windows in SLO: {sum(fair_ok)}/{len(target)}",
            f"- all three: {sum(a and b and c for a, b, c in zip(cheap, saves, fair_ok, strict=True))}/{len(target)}",
        ]
    return lines


def _excess(r: dict[str, Any]) -> dict[str, float]:
    """`excess_by_rule` of tailtune over min-cost in one scenario's results, as shares of min-cost's replica-seconds."""
    tl = r["tailtune"]["timeline"]
    interval = tl[1]["t_s"] - tl[0]["t_s"] if len(tl) > 1 else INTERVAL
    least = r["min-cost"]["replica_seconds"]
    return {k: _ratio(v, least) for k, v in excess_by_rule(r["tailtune"], r["min-cost"], interval).items()}


def _excess_section(results: list[dict[str, Any]], png: Path) -> list[str]:
    """Where tailtune's replicas above min-cost's go, by the rule that set or kept its count; a stacked bar per
    scenario in `png`."""
    rows = [(r["name"], _excess(r)) for r in results if "min-cost" in r]
    if not rows:
        return []
    rules = sorted({k for _, e in rows for k in e}, key=lambda k: -sum(e.get(k, 0.0) for _, e in rows))
    lines = [
        "",
        "### Where the replicas above min-cost's go",
        "",
        "Window by window, tailtune's replicas above min-cost's times the interval, put down to the gate or guard "
        "that tailtune's last decision before the window names as bound by (the last to change its proposal: some "
        "limit the batching, not the count) or, where it names none, to `plan` (the plan's own count: the demand "
        "with its margin at the target utilisation). Shares of min-cost's replica-seconds; windows where tailtune "
        "holds fewer are not netted out, and a count is read at each window's end (min-cost asks for a window's "
        "replicas a pod start ahead, tailtune's fast path between ticks), so a scenario's shares need not add up to "
        "its ratio less one. Drawn in `excess.png`.",
        "",
        "| rule | median share | max share | scenarios where it is the largest |",
        "|---|---|---|---|",
    ]
    for k in rules:
        shares = [e.get(k, 0.0) for _, e in rows]
        largest = sum(1 for _, e in rows if max(e, key=lambda x: e[x], default="") == k)
        lines.append(f"| {k} | {np.median(shares):.3f} | {max(shares):.3f} | {largest}/{len(rows)} |")
    _excess_png(rows, rules, png)
    return [*lines, "", f"![excess]({png.name})"]


def _excess_png(rows: list[tuple[str, dict[str, float]]], rules: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 1.8))
    left = np.zeros(len(rows))
    for k in rules:
        shares = np.array([e.get(k, 0.0) for _, e in rows])
        ax.barh([n for n, _ in rows], shares, left=left, label=k)
        left += shares
    ax.axvline(COST_VS_MIN - 1.0, color="red", linestyle="--", label=f"{COST_VS_MIN:g}x min-cost")
    ax.invert_yaxis()
    ax.set_xlabel("replica-seconds above min-cost's / min-cost's")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(
    results: list[dict[str, Any]],
    out: Path,
    quick: bool,
    seed: int = SEED,
    count: int | None = None,
    wide: bool = False,
    cost: bool = False,
    period_s: float = COST_PERIOD_S,
) -> str:
    """Markdown report: targets, distribution per family, the 5 worst; PNGs beside it."""
    from tailtune.offline.whatif import plot

    drawn = _drawn(quick, seed, count, wide, cost, period_s)
    by_name = {sc.name: sc for sc in drawn}
    default_seed = WIDE_SEED if wide else COST_SEED if cost else SEED
    lines = [
        "# Tuner benchmark (simulator)",
        "",
        f"{len(results)} scenarios; `python bench/tuner/run.py{' --quick' if quick else ''}{' --wide' if wide else ''}"
        f"{' --cost' if cost else ''}{f' --period-s {period_s:g}' if period_s != COST_PERIOD_S else ''}"
        f"{f' --seed {seed}' if seed != default_seed else ''}{f' --count {count}' if count else ''}`. "
        "Goodput = requests answered within the SLO per second; ratios are tailtune / baseline in the same run."
        + (
            " The wide family: the oracle runs at the most replicas, tailtune and the static policies start below "
            "them where the scenario's name says `rNofM`."
            if wide
            else ""
        ),
        "",
        "| family | n | goodput/oracle min / p10 / median | windows in SLO (excl. steps) min / p10 / median "
        "| vs Triton default min | vs start min | vs max(default, AIMD) min | settle max "
        "| changes per 5 intervals max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fams = [*sorted({r["family"] for r in results}), "all"]
    for fam in fams:
        rs = [r for r in results if fam in ("all", r["family"])]
        m = [metrics(r) for r in rs]
        lines.append(
            f"| {fam} | {len(rs)} | {_dist([x['vs_oracle'] for x in m])} | {_dist([x['in_slo'] for x in m])} "
            f"| {min(x['vs_default'] for x in m):.3f} | {min(x['vs_start'] for x in m):.3f} "
            f"| {min(x['vs_best_baseline'] for x in m):.3f} | {max(x['settle'] for x in m):.0f} "
            f"| {max(x['changes_per_5'] for x in m):.2f} |"
        )
    m_all = [(metrics(r, by_name[r["name"]].setup if r["name"] in by_name else None), r) for r in results]
    targets = [
        ("goodput >= 95 % of the oracle", sum(1 for x, _ in m_all if x["vs_oracle"] >= GOODPUT_VS_ORACLE)),
        ("goodput >= max(default, AIMD) - 1 point", sum(1 for x, _ in m_all if x["vs_best_baseline"] >= NO_HARM)),
        ("goodput >= Triton default - 1 point", sum(1 for x, _ in m_all if x["vs_default"] >= NO_HARM)),
        ("goodput >= start config - 1 point", sum(1 for x, _ in m_all if x["vs_start"] >= NO_HARM)),
        (">= 99 % windows in SLO outside steps", sum(1 for x, _ in m_all if x["in_slo"] >= 0.99)),
        (
            "... of the windows where the oracle (the best static config, clairvoyant) holds the SLO",
            sum(1 for x, _ in m_all if x.get("in_slo_reachable", 0.0) >= 0.99),
        ),
        ("settle <= 3 intervals", sum(1 for x, _ in m_all if x["settle"] <= 3)),
        (
            "... not counting a scale-in within the SLO (held back by the 300 s stabilization window)",
            sum(1 for x, _ in m_all if x.get("settle_but_scale_in", 99.0) <= 3),
        ),
        (
            "... nor a window where the oracle breaks the SLO too",
            sum(1 for x, _ in m_all if x.get("settle_reachable", 99.0) <= 3),
        ),
        ("<= 1 change per 5 intervals", sum(1 for x, _ in m_all if x["changes_per_5"] <= 1)),
    ]
    lines += ["", "## Targets: scenarios meeting each", ""]
    lines += [f"- {name}: {n}/{len(results)}" for name, n in targets]
    lines += _cost_section(m_all)
    lines += _excess_section(results, out / "excess.png")
    worst = sorted(m_all, key=lambda xr: xr[0]["vs_oracle"])[:5]
    for stale in out.glob("worst-*.png"):  # an earlier run's worst: not this report's
        stale.unlink()
    lines += ["", "## The 5 worst scenarios (by goodput/oracle)", ""]
    for x, r in worst:
        png = out / f"worst-{r['name']}.png"
        sc = by_name.get(r["name"])
        if sc is not None:
            shown = [r[k] for k in ("tailtune", "triton-default", "aimd", "oracle", "min-cost") if k in r]
            plot(sc.setup, shown, png, title=r["name"])
        t = r["tailtune"]
        lines += [
            f"### {r['name']} ({r['curve']})",
            "",
            f"goodput/oracle {x['vs_oracle']:.3f}, vs default {x['vs_default']:.3f}, vs AIMD "
            f"{_ratio(t['goodput_rps'], r['aimd']['goodput_rps']):.3f}; windows in SLO excl. steps "
            f"{t['windows_in_slo_excluding_steps']}/{t['windows_excluding_steps']}; changes {t['changes']}; "
            f"final {t['final']}; replica-seconds / min-cost {x.get('cost_vs_min', math.nan):.3f}, saving vs "
            f"static-max {x.get('saving_vs_static_max', math.nan):.3f}. ![{r['name']}]({png.name})",
            "",
            "Decisions:",
            "",
        ]
        lines += [f"- t={d[0]} s {d[1]}: {d[2]}" for d in r["decisions"][:12]] + [""]
    _distribution_png(results, out / "distribution.png")
    lines += ["![distribution](distribution.png)", ""]
    return "\n".join(lines)


def _drawn(
    quick: bool, seed: int, count: int | None, wide: bool, cost: bool, period_s: float = COST_PERIOD_S
) -> list[Scenario]:
    """The family a run draws."""
    if wide:
        return wide_scenarios(seed, count)
    if cost:
        return cost_scenarios(seed, count, period_s)
    return scenarios(quick, seed, count)


def _distribution_png(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({r["family"] for r in results})
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, key, label, target in (
        (axes[0][0], "vs_oracle", "goodput / oracle", GOODPUT_VS_ORACLE),
        (axes[0][1], "vs_best_baseline", "goodput / max(default, AIMD)", 0.99),
        (axes[1][0], "cost_vs_min", "replica-seconds / min-cost's", COST_VS_MIN),
        (axes[1][1], "saving_vs_static_max", "1 - replica-seconds / static-max's", SAVING_VS_STATIC_MAX),
    ):
        data = [[x[key] for r in results if r["family"] == f and key in (x := metrics(r))] for f in fams]
        if not any(data):  # the cost of a results.json of before it was measured
            ax.set_axis_off()
            continue
        ax.boxplot(data, whis=(0, 100))
        ax.set_xticks(range(1, len(fams) + 1), fams)
        ax.axhline(target, color="red", linestyle="--", label="target")
        if key == "vs_best_baseline":
            ax.set_yscale("log")  # ratios from 0.9 to 20 and more: near 1 must stay readable
        ax.set_ylabel(label)
        ax.legend()
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="12 short scenarios")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"report folder (default {OUT})")
    ap.add_argument(
        "--seed", type=int, default=None, help=f"draw the family from this seed (default {SEED}; --wide: {WIDE_SEED})"
    )
    ap.add_argument(
        "--wide",
        action="store_true",
        help="the out-of-sample family (default 50 scenarios): start replicas below the most, P95/P99.9, 15 s and "
        "60 s intervals, noise, a knee curve, ramps up, sawtooths, random walks, two-step rises, spikes",
    )
    ap.add_argument(
        "--cost",
        action="store_true",
        help="the cost family (default 8 scenarios, ~1 h of CPU): an hour of a daily swing or on/off phases on 4-8 "
        "replicas, for the replica-seconds targets",
    )
    ap.add_argument(
        "--period-s",
        type=float,
        default=COST_PERIOD_S,
        help=f"with --cost: the cycle's length in seconds (default {COST_PERIOD_S:g}: a day compressed 24x; longer "
        "weighs the law's fixed time constants, the 300 s memory and the pod start among them, less)",
    )
    ap.add_argument("--count", type=int, default=None, help="scenarios to draw (default 120, 12 with --quick)")
    ap.add_argument("--only", default="", help="run only scenarios whose name matches this regular expression")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from results.json")
    ap.add_argument(
        "--baselines",
        type=Path,
        help="reuse the baselines (default, AIMD, oracle, start, min-cost, static-max) of this earlier results.json: "
        "only tailtune runs, and a baseline it lacks (valid while the simulator and the scenarios are unchanged)",
    )
    ap.add_argument(
        "--target-utilization",
        type=float,
        default=None,
        help="tailtune's spec.tuning.targetUtilization in every scenario (default the spec's); the other policies "
        "do not read it, so --baselines of a run at another target stay valid",
    )
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else WIDE_SEED if args.wide else COST_SEED if args.cost else SEED
    t0 = time.perf_counter()
    if args.report_only:
        results = json.loads((args.out / "results.json").read_text())
    else:
        drawn = _drawn(args.quick, seed, args.count, args.wide, args.cost, args.period_s)
        scs = [s for s in drawn if re.search(args.only, s.name)]
        if args.target_utilization is not None:
            u = args.target_utilization
            scs = [dataclasses.replace(s, setup=dataclasses.replace(s.setup, target_utilization=u)) for s in scs]
        args.out.mkdir(parents=True, exist_ok=True)
        results = []
        earlier = {r["name"]: r for r in json.loads(args.baselines.read_text())} if args.baselines else {}
        base = [
            {k: earlier[s.name][k] for k in BASELINES if k in earlier[s.name]} if s.name in earlier else None
            for s in scs
        ]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            # Saved as they come: a run cut short still leaves its results.
            for res in pool.map(run_one, scs, base):
                results.append(res)
                (args.out / "results.json").write_text(json.dumps(results))
    text = report(results, args.out, args.quick, seed, args.count, args.wide, args.cost, args.period_s)
    (args.out / "report.md").write_text(text)
    print(text.split("## The 5 worst")[0])
    print(f"{len(results)} scenarios in {time.perf_counter() - t0:.0f} s; report {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
