"""`tailtune simulate --generative`: a tuning policy for a generative service on a trace of requests.

    tailtune simulate --generative --ttft-ms 2000 --tpot-ms 100 (--trace REQUESTS.csv | --shape SHAPE --seed S)
      [--gpu l4|h100] [--policy tailtune|planner|static:N] [--replicas N] [--replicas-max N] [--interval-s S]
      [--percentile P] [--json] [--plot FILE.png]

REQUESTS.csv: header `t_s,prompt_tokens,output_tokens`, one request a row, in arrival order. --shape draws a seeded
trace instead: step, diurnal, bursts or long-prompt (`family_trace`). The fleet is `tailtune.sim.llm.LlmFleet`
(the emulated engine's model: Llama-3-8B FP16 roofline, inflight batching, the KV budget); each interval the policy
reads one window of the engine's metrics and sets the replicas (and, for tailtune, the serving levers).

Policies: tailtune (`tuner.generative.decide_generative`); planner, a throughput-profile planner in the style of
NVIDIA Dynamo's (replicas = predicted output tokens/s / the per-replica output tokens/s profiled at the TPOT
target, every 180 s, the last interval's demand as the prediction); static:N. The report gives TTFT and TPOT
percentiles per window (of the requests that arrived in it), goodput (requests within both targets) and
replica-seconds. Exit 0 on success, 2 on bad input (the message names the flag or the file and line).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from tailtune.api.v1alpha1 import MAX_REPLICAS
from tailtune.sim.llm import (
    ROOFLINES,
    EngineConfig,
    FleetWindow,
    LlmFleet,
    LlmRequest,
    RequestRecord,
    TokenLengths,
    percentile,
    poisson_requests,
)
from tailtune.tuner.generative import (
    GenDecision,
    GenEngineModel,
    GenInForce,
    GenLevers,
    GenObservation,
    GenPolicy,
    GenState,
    decide_generative,
)

# Dynamo's planner adjusts every `adjustment_interval` seconds, 180 by default (Dynamo planner docs:
# https://docs.nvidia.com/dynamo/v-0-9-0/design-docs/planner-design.md, "Scaling Algorithm").
PLANNER_INTERVAL_SECONDS = 180.0
# Requests a trace may hold: the simulator keeps a record of each (about 200 B): past this, gigabytes.
MAX_TRACE_REQUESTS = 2_000_000
SHAPES = ("step", "diurnal", "bursts", "long-prompt")


class InputError(ValueError):
    """Bad input; the message names the flag or the file and line, and the fix."""


def engine_config(levers: GenLevers, base: EngineConfig) -> EngineConfig:
    """The engine config the levers render (Triton's tensorrt_llm model config over the build's limits)."""
    return replace(
        base,
        policy=levers.batch_scheduler_policy,
        chunked_prefill=levers.enable_chunked_context,
        kv_cache_free_gpu_mem_fraction=levers.kv_cache_free_gpu_mem_fraction,
        max_queue_size=levers.max_queue_size,
    )


def observation(w: FleetWindow, policy: GenPolicy) -> GenObservation:
    """The window as the operator reads it from the engine's histograms and gauges."""
    span = max(w.end - w.start, 1e-9)
    ttft = percentile(w.ttft_s, policy.ttft_percentile)
    tpot = percentile(w.tpot_s, policy.tpot_percentile)
    p50t, p50o = percentile(w.ttft_s, 50), percentile(w.tpot_s, 50)
    return GenObservation(
        window_start=w.start,
        window_end=w.end,
        ttft_ms=None if ttft is None else 1000 * ttft,
        tpot_ms=None if tpot is None else 1000 * tpot,
        ttft_p50_ms=None if p50t is None else 1000 * p50t,
        tpot_p50_ms=None if p50o is None else 1000 * p50o,
        request_rate=w.arrivals / span,
        prompt_tokens_per_s=w.prompt_tokens / span,
        # Output tokens per request: the tokens that came out over the first tokens (requests started) in the window
        # would undercount long answers; the rate of output tokens per arrival is what the demand asks in steady state.
        output_tokens_per_s=w.output_tokens / span,
        running=w.running_mean,
        waiting=float(w.waiting),
        kv_use=w.kv_use,
        replicas_ready=w.replicas_ready,
        requests=len(w.ttft_s),
    )


# A controller: each interval, the window and the time -> (replicas, levers) to have in force.
Controller = Callable[[FleetWindow, float], tuple[int, GenLevers]]


class TailtuneController:
    """decide_generative, with its state and what is in force carried between windows."""

    def __init__(self, policy: GenPolicy, replicas: int, levers: GenLevers) -> None:
        self.policy = policy
        self.state = GenState()
        self.in_force = GenInForce(replicas, levers)
        self.decisions: list[GenDecision] = []

    def __call__(self, w: FleetWindow, now: float) -> tuple[int, GenLevers]:
        d = decide_generative(self.state, self.in_force, observation(w, self.policy), self.policy, now)
        self.decisions.append(d)
        self.state = d.state
        self.in_force = self.in_force.after(d, now)
        return self.in_force.replicas, self.in_force.levers


def profile_replica_tokens_per_s(
    base: EngineConfig, lengths: TokenLengths, tpot_target_s: float, tpot_percentile: float, seed: int = 0
) -> float:
    """What Dynamo's profiler measures for a decode worker: the most output tokens/s one replica gives with its TPOT
    percentile within the target, here by steady Poisson loads on one simulated replica (rates doubled, then
    bisected, 300 s each)."""

    def run(rate: float) -> tuple[float, bool]:
        duration = 300.0
        fleet = LlmFleet(base, 1, start_seconds=0.0)
        fleet.offer(poisson_requests(lambda _t: rate, duration, lengths, seed))
        fleet.run_until(duration)
        w = fleet.window()
        tpot = percentile(w.tpot_s, tpot_percentile)
        return w.output_tokens / duration, tpot is not None and tpot <= tpot_target_s

    best, rate = 0.0, 0.25
    lo = hi = None
    for _ in range(8):  # double until the target breaks or the throughput stops growing
        tok, ok = run(rate)
        if not ok:
            hi = rate
            break
        if tok <= best * 1.02:
            return max(best, tok)
        best, lo, rate = max(best, tok), rate, rate * 2
    if lo is not None and hi is not None:
        for _ in range(4):
            mid = (lo + hi) / 2
            tok, ok = run(mid)
            if ok:
                best, lo = max(best, tok), mid
            else:
                hi = mid
    return best


class PlannerController:
    """Throughput-profile planner in the style of Dynamo's: every PLANNER_INTERVAL_SECONDS, replicas = the
    predicted output tokens/s / the per-replica output tokens/s profiled at the TPOT target, rounded up, within the
    bounds. The prediction is the last adjustment interval's demand (Dynamo's constant predictor on its request
    count and mean output length: here the output tokens the interval's arrivals ask for), not what came out (a
    saturated replica's output would hide the demand). It does not read the queue."""

    def __init__(
        self, per_replica_tokens_s: float, replicas: int, replicas_min: int, replicas_max: int, levers: GenLevers
    ) -> None:
        self.per_replica = per_replica_tokens_s
        self.replicas = replicas
        self.bounds = (replicas_min, replicas_max)
        self.levers = levers
        self.tokens = 0
        self.since = 0.0

    def __call__(self, w: FleetWindow, now: float) -> tuple[int, GenLevers]:
        self.tokens += w.asked_output_tokens
        if now - self.since >= PLANNER_INTERVAL_SECONDS - 1e-6:
            predicted = self.tokens / (now - self.since)
            want = math.ceil(predicted / self.per_replica) if self.per_replica > 0 else self.bounds[1]
            self.replicas = max(self.bounds[0], min(self.bounds[1], want))
            self.tokens, self.since = 0, now
        return self.replicas, self.levers


@dataclass(frozen=True)
class WindowRow:
    """One window of a run: its requests' (by arrival) TTFT and TPOT percentiles, goodput share, replicas."""

    start: float
    requests: int
    ttft_ms: float | None
    tpot_ms: float | None
    within: int
    replicas: int


@dataclass(frozen=True)
class RunResult:
    """A policy's run over a trace."""

    policy: str
    records: tuple[RequestRecord, ...]
    windows: tuple[WindowRow, ...]
    replica_seconds: float
    ttft_target_ms: float
    tpot_target_ms: float
    lever_changes: int = 0
    reasons: tuple[str, ...] = ()

    @property
    def goodput(self) -> float:
        """Share of the trace's requests finished within both targets."""
        ok = sum(r.within(self.ttft_target_ms / 1000, self.tpot_target_ms / 1000) for r in self.records)
        return ok / len(self.records) if self.records else 1.0

    def trace_percentiles(self, p: float) -> tuple[float, float]:
        """TTFT and TPOT (ms) at percentile p over the whole trace, an unanswered request counting as infinite."""
        ttft = [math.inf if r.ttft_s is None else r.ttft_s for r in self.records]
        tpot = [math.inf if r.tpot_s is None else r.tpot_s for r in self.records]
        a, b = percentile(ttft, p), percentile(tpot, p)
        return (1000 * (a if a is not None else 0.0), 1000 * (b if b is not None else 0.0))

    @property
    def windows_within(self) -> int:
        """Windows with requests whose TTFT and TPOT percentiles are within the targets."""
        return sum(
            1
            for w in self.windows
            if w.requests
            and w.ttft_ms is not None
            and w.tpot_ms is not None
            and w.ttft_ms <= self.ttft_target_ms
            and w.tpot_ms <= self.tpot_target_ms
        )

    def summary(self) -> dict[str, Any]:
        """The JSON report."""
        return {
            "policy": self.policy,
            "requests": len(self.records),
            "goodput": self.goodput,
            "windows": sum(1 for w in self.windows if w.requests),
            "windows_within_both": self.windows_within,
            "replica_seconds": self.replica_seconds,
            "lever_changes": self.lever_changes,
            "per_window": [
                {
                    "t_s": w.start,
                    "requests": w.requests,
                    "ttft_ms": w.ttft_ms,
                    "tpot_ms": w.tpot_ms,
                    "within": w.within,
                    "replicas": w.replicas,
                }
                for w in self.windows
            ],
        }


def run(
    requests: Sequence[LlmRequest],
    controller: Controller | None,
    base: EngineConfig,
    replicas: int,
    levers: GenLevers,
    interval_s: float,
    ttft_target_ms: float,
    tpot_target_ms: float,
    percentile_p: float = 99.0,
    name: str = "",
) -> RunResult:
    """Play `requests` on a fleet; every `interval_s` the controller (None: static) reads the window and sets the
    replicas and levers. The run lasts until the last request finished (or one interval past the last arrival
    for what never can)."""
    fleet = LlmFleet(engine_config(levers, base), replicas)
    fleet.offer(requests)
    end = (requests[-1].arrival if requests else 0.0) + interval_s
    counts: list[int] = []
    t = 0.0
    changes = 0
    while t < end or (fleet.records and any(r.finished_at is None and not r.refused for r in fleet.records)):
        t += interval_s
        fleet.run_until(t)
        counts.append(len(fleet.live()))
        w = fleet.window()
        if controller is not None:
            n, lv = controller(w, t)
            if lv != levers:
                changes += 1
                levers = lv
                fleet.set_config(engine_config(lv, base))
            fleet.set_replicas(n)
        if t > end + 3600:  # what is still queued an hour past the trace never finishes within any target
            break
    records = tuple(fleet.records)
    rows = []
    for i, n in enumerate(counts):
        a, b = i * interval_s, (i + 1) * interval_s
        rs = [r for r in records if a <= r.request.arrival < b]
        ttft = [math.inf if r.ttft_s is None else r.ttft_s for r in rs]
        tpot = [math.inf if r.tpot_s is None else r.tpot_s for r in rs]
        pt, po = percentile(ttft, percentile_p), percentile(tpot, percentile_p)
        rows.append(
            WindowRow(
                a,
                len(rs),
                None if pt is None else 1000 * pt,
                None if po is None else 1000 * po,
                sum(r.within(ttft_target_ms / 1000, tpot_target_ms / 1000) for r in rs),
                n,
            )
        )
        if a > end:
            break
    reasons = tuple(d.describe() for d in controller.decisions) if isinstance(controller, TailtuneController) else ()
    return RunResult(
        name, records, tuple(rows), fleet.replica_seconds(fleet.now), ttft_target_ms, tpot_target_ms, changes, reasons
    )


# Traces.


def family_trace(
    shape: str, seed: int, duration_s: float, base_rate: float, lengths: TokenLengths | None = None
) -> list[LlmRequest]:
    """A seeded trace of `shape` around `base_rate` req/s: step (x2-3 at a third of the way), diurnal (a
    sinusoid between 0.5 and 2-3x over the trace), bursts (2-4 bursts of 60-180 s at 2-3x) or long-prompt (prompts
    3-5x longer for 300-600 s at the same rate)."""
    rng = random.Random(seed)
    lengths = lengths or TokenLengths()
    if shape == "step":
        k, at = rng.uniform(2, 3), duration_s * rng.uniform(0.25, 0.4)
        return poisson_requests(lambda t: base_rate * (k if t >= at else 1), duration_s, lengths, seed)
    if shape == "diurnal":
        top = rng.uniform(2, 3)
        phase = rng.uniform(0, 2 * math.pi)
        return poisson_requests(
            lambda t: base_rate * (0.5 + (top - 0.5) * (1 + math.sin(2 * math.pi * t / duration_s + phase)) / 2),
            duration_s,
            lengths,
            seed,
        )
    if shape == "bursts":
        bursts = [
            (rng.uniform(0.1, 0.85) * duration_s, rng.uniform(60, 180), rng.uniform(2, 3))
            for _ in range(rng.randint(2, 4))
        ]
        return poisson_requests(
            lambda t: base_rate * max([k for s, d, k in bursts if s <= t < s + d], default=1.0),
            duration_s,
            lengths,
            seed,
        )
    if shape == "long-prompt":
        k, at, span = rng.uniform(3, 5), duration_s * rng.uniform(0.2, 0.5), rng.uniform(300, 600)
        return poisson_requests(
            lambda _t: base_rate, duration_s, lengths, seed, prompt_factor=lambda t: k if at <= t < at + span else 1.0
        )
    raise InputError(f"--shape {shape!r}: use one of {', '.join(SHAPES)}")


def read_requests(path: Path) -> list[LlmRequest]:
    """REQUESTS.csv: `t_s,prompt_tokens,output_tokens`, arrival order; InputError names the line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from exc
    if not lines or [h.strip() for h in lines[0].split(",")] != ["t_s", "prompt_tokens", "output_tokens"]:
        raise InputError(f"{path}:1: the header must be t_s,prompt_tokens,output_tokens")
    out: list[LlmRequest] = []
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            t, p, o = line.split(",")
            req = LlmRequest(float(t), int(p), int(o))
        except ValueError as exc:
            raise InputError(f"{path}:{i}: {line!r}: want seconds,tokens,tokens (e.g. 0.5,512,128)") from exc
        if not (math.isfinite(req.arrival) and req.arrival >= 0 and req.prompt_tokens >= 1 and req.output_tokens >= 1):
            raise InputError(f"{path}:{i}: t_s must be >= 0 and the token counts >= 1")
        if out and req.arrival < out[-1].arrival:
            raise InputError(f"{path}:{i}: t_s {req.arrival:g} is before the row above: sort by arrival")
        out.append(req)
        if len(out) > MAX_TRACE_REQUESTS:
            raise InputError(f"{path}: more than {MAX_TRACE_REQUESTS} requests: split the trace")
    if not out:
        raise InputError(f"{path}: no requests")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailtune simulate --generative", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ttft-ms", type=float, required=True, help="TTFT target, ms")
    p.add_argument("--tpot-ms", type=float, required=True, help="TPOT target, ms")
    p.add_argument("--percentile", type=float, default=99.0, help="percentile of both targets (default 99)")
    p.add_argument("--trace", type=Path, default=None, help="REQUESTS.csv (t_s,prompt_tokens,output_tokens)")
    p.add_argument("--shape", default=None, help=f"a seeded trace instead: {'|'.join(SHAPES)}")
    p.add_argument("--rate", type=float, default=2.0, help="--shape's base rate, req/s (default 2)")
    p.add_argument("--duration-s", type=float, default=1800.0, help="--shape's length (default 1800)")
    p.add_argument("--seed", type=int, default=0, help="--shape's seed (default 0)")
    p.add_argument("--gpu", default="l4", help=f"roofline: {'|'.join(ROOFLINES)} (default l4)")
    p.add_argument("--policy", default="tailtune", help="tailtune|planner|static:N (default tailtune)")
    p.add_argument("--replicas", type=int, default=1, help="replicas at the start (default 1)")
    p.add_argument("--replicas-max", type=int, default=16, help="most replicas (default 16)")
    p.add_argument("--interval-s", type=float, default=30.0, help="tuning interval and window, s (default 30)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of the run")
    return p


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run one policy on a trace and print its summary (or JSON); 2 on bad input."""
    stream = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        result = _run_cli(args)
    except InputError as exc:
        print(f"tailtune simulate --generative: {exc}", file=sys.stderr)
        return 2
    if args.plot is not None:
        try:
            plot_runs([result], args.plot)
        except OSError as exc:
            print(f"tailtune simulate --generative: --plot {args.plot}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    s = result.summary()
    if args.json:
        print(json.dumps(s), file=stream)
        return 0
    p_ttft, p_tpot = result.trace_percentiles(args.percentile)
    print(
        f"{s['policy']}: goodput {100 * s['goodput']:.1f} % of {s['requests']} requests within TTFT {args.ttft_ms:g} "
        f"ms and TPOT {args.tpot_ms:g} ms; P{args.percentile:g} TTFT {p_ttft:.0f} ms, TPOT {p_tpot:.1f} ms; "
        f"{s['windows_within_both']}/{s['windows']} windows within both; {s['replica_seconds']:.0f} replica-seconds; "
        f"{s['lever_changes']} lever changes",
        file=stream,
    )
    return 0


def _run_cli(args: argparse.Namespace) -> RunResult:
    checks = [
        (0 < args.ttft_ms < math.inf, "--ttft-ms must be > 0 and finite"),
        (0 < args.tpot_ms < math.inf, "--tpot-ms must be > 0 and finite"),
        (50 <= args.percentile < 100, "--percentile must be in [50, 100) (as spec.slo.ttft.percentile)"),
        ((args.trace is None) != (args.shape is None), "give one of --trace REQUESTS.csv or --shape SHAPE"),
        (args.gpu in ROOFLINES, f"--gpu {args.gpu!r}: use one of {', '.join(ROOFLINES)}"),
        (
            1 <= args.replicas <= args.replicas_max <= MAX_REPLICAS,
            f"--replicas and --replicas-max: 1 <= replicas <= replicas-max <= {MAX_REPLICAS}",
        ),
        (0 < args.interval_s < math.inf, "--interval-s must be > 0 and finite"),
        (0 < args.rate < math.inf and 0 < args.duration_s <= 7 * 86400, "--rate > 0 and --duration-s in (0, 1 week]"),
    ]
    for ok, message in checks:
        if not ok:
            raise InputError(message)
    if args.plot is not None and (args.plot.suffix.lower() != ".png" or not args.plot.parent.is_dir()):
        raise InputError(f"--plot {args.plot}: name a .png file in a folder that exists")
    if args.rate * args.duration_s > MAX_TRACE_REQUESTS:
        raise InputError(f"--rate x --duration-s asks for over {MAX_TRACE_REQUESTS} requests: shorten it")
    reqs = (
        read_requests(args.trace)
        if args.trace is not None
        else family_trace(args.shape, args.seed, args.duration_s, args.rate)
    )
    base = EngineConfig(roofline=ROOFLINES[args.gpu])
    policy = GenPolicy(
        ttft_target_ms=args.ttft_ms,
        tpot_target_ms=args.tpot_ms,
        engine=GenEngineModel.from_engine(base),
        ttft_percentile=args.percentile,
        tpot_percentile=args.percentile,
        interval_seconds=args.interval_s,
        replicas_min=1,
        replicas_max=args.replicas_max,
    )
    return run_policy(args.policy, reqs, base, policy, args.replicas)


def run_policy(
    name: str,
    reqs: Sequence[LlmRequest],
    base: EngineConfig,
    policy: GenPolicy,
    replicas: int,
    lengths: TokenLengths | None = None,
    planner_profile: float | None = None,
) -> RunResult:
    """One named policy (tailtune, planner, static:N) on `reqs`; the planner profiles one replica on `lengths`
    (default: the trace's own mean lengths, lognormal as `TokenLengths`) unless given its profile."""
    levers = GenLevers()
    controller: Controller | None
    if name == "tailtune":
        controller = TailtuneController(policy, replicas, levers)
    elif name == "planner":
        if planner_profile is None:
            if lengths is None:
                n = max(1, len(reqs))
                lengths = replace(
                    TokenLengths(),
                    prompt_median=sum(r.prompt_tokens for r in reqs) / n,
                    output_median=sum(r.output_tokens for r in reqs) / n,
                )
            planner_profile = profile_replica_tokens_per_s(
                base, lengths, policy.tpot_target_ms / 1000, policy.tpot_percentile
            )
        controller = PlannerController(planner_profile, replicas, policy.replicas_min, policy.replicas_max, levers)
    elif name.startswith("static:"):
        try:
            replicas = int(name.split(":", 1)[1])
        except ValueError as exc:
            raise InputError(f"--policy {name!r}: use static:N, e.g. static:4") from exc
        if not 1 <= replicas <= MAX_REPLICAS:
            raise InputError(f"--policy {name!r}: N must be 1..{MAX_REPLICAS}")
        controller = None
    else:
        raise InputError(f"--policy {name!r}: use tailtune, planner or static:N")
    return run(
        reqs,
        controller,
        base,
        replicas,
        levers,
        policy.interval_seconds,
        policy.ttft_target_ms,
        policy.tpot_target_ms,
        policy.ttft_percentile,
        name,
    )


def plot_runs(runs: Sequence[RunResult], path: Path, title: str = "") -> None:
    """TTFT and TPOT per window against the targets, and the replicas, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for r in runs:
        ts = [w.start / 60 for w in r.windows]
        axes[0].plot(ts, [min(w.ttft_ms or 0, 20 * r.ttft_target_ms) for w in r.windows], label=r.policy)
        axes[1].plot(ts, [min(w.tpot_ms or 0, 20 * r.tpot_target_ms) for w in r.windows], label=r.policy)
        axes[2].step(ts, [w.replicas for w in r.windows], where="post", label=r.policy)
    if runs:
        axes[0].axhline(runs[0].ttft_target_ms, color="k", ls="--", lw=0.8)
        axes[1].axhline(runs[0].tpot_target_ms, color="k", ls="--", lw=0.8)
    axes[0].set_ylabel("P99 TTFT ms")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("P99 TPOT ms")
    axes[2].set_ylabel("replicas")
    axes[2].set_xlabel("minutes")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
