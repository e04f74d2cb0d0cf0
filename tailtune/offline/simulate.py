"""`tailtune simulate`: what a tuning policy would do on your measured curve and recorded trace.

`tailtune simulate --generative ...`: the same for a generative service (TTFT/TPOT), see
`tailtune.offline.generative`.

    tailtune simulate --curve CURVE.csv --trace TRACE.csv --slo-ms 30 [--percentile 99]
      [--policy tailtune|predictive|triton-default|static:MAXBATCH:DELAY_US|aimd|oracle|min-cost|static-max]
      [--start-max-batch N]
      [--instances N] [--replicas-max N] [--interval-s S] [--p99-noise FRACTION] [--gap START_S:WINDOWS]
      [--seed S] [--duration-s S] [--shed] [--fast-path] [--json] [--plot FILE.png]

CURVE.csv: header `batch,ms`, measured points (linear between them; a stepwise curve is given as points);
its largest batch is the engine's max. TRACE.csv: header `t_s,rate_rps`, a piecewise-constant Poisson rate;
the last row's time ends the trace. Exit 0 on success, 2 on bad input (the message names the file and line).
`--json` reports `replica_seconds` (what the replicas cost over the trace, each from its request until let go) and
`replica_seconds_ready` (from each one's readiness).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TextIO

from tailtune.api.v1alpha1 import (
    DEFAULT_TARGET_UTILIZATION,
    MAX_INSTANCES_PER_GPU,
    MAX_REPLICAS,
    MAX_TARGET_UTILIZATION,
    MIN_TARGET_UTILIZATION,
)
from tailtune.offline.whatif import InputError, Setup, plot, read_curve, read_trace, summarize
from tailtune.sim import MAX_REQUESTS

# Each window runs the tuner's decision (tens of ms): past this many (a week of 30 s windows) a run takes hours.
MAX_WINDOWS = 20_000
# min-cost runs the oracle's sweep at every count up to --replicas-max: past this many it takes that many times the
# oracle's time (hours on a day's trace).
MIN_COST_MAX_REPLICAS = 16


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailtune simulate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--curve", type=Path, required=True, help="CURVE.csv (batch,ms)")
    p.add_argument("--trace", type=Path, required=True, help="TRACE.csv (t_s,rate_rps)")
    p.add_argument("--slo-ms", type=float, required=True, help="latency objective, ms")
    p.add_argument("--percentile", type=float, default=99.0, help="percentile of the objective (default 99)")
    p.add_argument(
        "--policy",
        default="tailtune",
        help="tailtune|predictive (tailtune with spec.tuning.forecast on)|triton-default|static:MB:DELAY_US|aimd|"
        "oracle|min-cost|static-max",
    )
    p.add_argument("--start-max-batch", type=int, default=1, help="max batch at the start (default 1)")
    p.add_argument("--instances", type=int, default=1, help="model instances per GPU (default 1)")
    p.add_argument("--replicas", type=int, default=1, help="replicas at the start and of static policies")
    p.add_argument("--replicas-max", type=int, default=None, help="most replicas (default: --replicas)")
    p.add_argument("--interval-s", type=float, default=30.0, help="tuning interval and window, s (default 30)")
    p.add_argument("--p99-noise", type=float, default=0.0, help="observed percentile x uniform 1±F (default 0)")
    p.add_argument("--gap", default=None, help="START_S:WINDOWS of hidden observations")
    p.add_argument("--seed", type=int, default=0, help="arrival seed (default 0)")
    p.add_argument("--duration-s", type=float, default=None, help="stop earlier than the trace")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of the run")
    p.add_argument(
        "--shed",
        action="store_true",
        help="load shedding (spec.serving.shedding): reject a request whose queue wait passes the SLO minus t(max "
        "batch in force); the JSON's rejected_share counts them (never answered, so never in goodput)",
    )
    p.add_argument(
        "--target-utilization",
        type=float,
        default=DEFAULT_TARGET_UTILIZATION,
        help=f"share of a replica's capacity the tuner plans it to carry (spec.tuning.targetUtilization, default "
        f"{DEFAULT_TARGET_UTILIZATION:g}; tailtune policy only)",
    )
    p.add_argument(
        "--fast-path",
        action="store_true",
        help="the surge fast path between ticks (as the operator runs it): every 2 s, the pods' queues over the last "
        "6 s; a queue that outgrows the SLO asks for replicas at once (tailtune policy only)",
    )
    return p


def _setup(args: argparse.Namespace) -> Setup:
    checks = [
        (0 < args.slo_ms < math.inf, "--slo-ms must be > 0 and finite"),
        (0 < args.percentile < 100, "--percentile must be in (0, 100)"),
        (
            1 <= args.instances <= MAX_INSTANCES_PER_GPU,
            f"--instances must be 1..{MAX_INSTANCES_PER_GPU} (as the spec's serving.instancesPerGpu)",
        ),
        (1 <= args.replicas <= MAX_REPLICAS, f"--replicas must be 1..{MAX_REPLICAS} (as the spec's replicas.max)"),
        (
            args.replicas_max is None or args.replicas_max <= MAX_REPLICAS,
            f"--replicas-max must be <= {MAX_REPLICAS} (as the spec's replicas.max)",
        ),
        (0 < args.interval_s < math.inf, "--interval-s must be > 0 and finite"),
        (0 <= args.p99_noise < 1, "--p99-noise must be in [0, 1)"),
        (args.start_max_batch >= 1, "--start-max-batch must be >= 1"),
        (args.seed >= 0, "--seed must be >= 0"),
        (
            MIN_TARGET_UTILIZATION <= args.target_utilization <= MAX_TARGET_UTILIZATION,
            f"--target-utilization must be in [{MIN_TARGET_UTILIZATION:g}, {MAX_TARGET_UTILIZATION:g}] (as the spec's "
            "tuning.targetUtilization)",
        ),
        (args.duration_s is None or 0 < args.duration_s < math.inf, "--duration-s must be > 0 and finite"),
        (
            args.policy != "min-cost" or (args.replicas_max or args.replicas) <= MIN_COST_MAX_REPLICAS,
            f"--policy min-cost sweeps every replica count: --replicas-max must be <= {MIN_COST_MAX_REPLICAS} "
            "(the oracle runs at any count)",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise InputError(message)
    if args.plot is not None and (args.plot.suffix.lower() != ".png" or not args.plot.parent.is_dir()):
        raise InputError(f"--plot {args.plot}: name a .png file in a folder that exists")
    gap = None
    if args.gap:
        try:
            start, windows = args.gap.split(":")
            gap = (float(start), int(windows))
        except ValueError as exc:
            raise InputError(f"--gap {args.gap!r}: use START_S:WINDOWS, e.g. 300:3") from exc
        if not (math.isfinite(gap[0]) and gap[0] >= 0 and gap[1] >= 1):
            raise InputError(f"--gap {args.gap!r}: START_S must be >= 0 and WINDOWS >= 1, e.g. 300:3")
    curve = read_curve(args.curve)
    replicas_max = args.replicas_max if args.replicas_max is not None else args.replicas
    if replicas_max < args.replicas:
        raise InputError(f"--replicas-max {replicas_max} is below --replicas {args.replicas}")
    setup = Setup(
        curve=curve,
        segments=read_trace(args.trace),
        slo_ms=args.slo_ms,
        percentile=args.percentile,
        instances=args.instances,
        replicas=args.replicas,
        replicas_max=replicas_max,
        interval_s=args.interval_s,
        start_max_batch=min(args.start_max_batch, curve.engine_max),
        p99_noise=args.p99_noise,
        gap=gap,
        seed=args.seed,
        duration_s=args.duration_s,
        shed=args.shed,
        fast_path=args.fast_path,
        target_utilization=args.target_utilization,
    )
    end = setup.end_s
    expected = sum(rate * (min(b, end) - a) for a, b, rate in setup.segments if a < end)
    windows = end / setup.interval_s
    if windows > MAX_WINDOWS:
        raise InputError(
            f"{args.trace}: {end:g} s of trace at --interval-s {setup.interval_s:g} is {windows:.3g} windows, over the "
            f"simulator's {MAX_WINDOWS}: shorten it (--duration-s) or lengthen --interval-s"
        )
    if expected > MAX_REQUESTS:
        raise InputError(
            f"{args.trace}: the trace asks for {expected:.3g} requests, over the simulator's {MAX_REQUESTS:.0e}: "
            "shorten it (--duration-s) or scale rate_rps down (and the replicas with it)"
        )
    return setup


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run one policy and print its summary (or JSON); 2 on bad input."""
    stream = out or sys.stdout
    if argv is not None and "--generative" in argv:
        from tailtune.offline.generative import main as generative_main

        return generative_main([a for a in argv if a != "--generative"], stream)
    args = _parser().parse_args(argv)
    try:
        setup = _setup(args)
        summary = summarize(setup, args.policy)
    except InputError as exc:
        print(f"tailtune simulate: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            plot(setup, [summary], args.plot)
        except OSError as exc:
            print(f"tailtune simulate: --plot {args.plot}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(summary), file=stream)
        return 0
    s = summary
    print(
        f"{s['policy']} on {s['curve']}: goodput {s['goodput_rps']:.1f} of {s['offered_rps']:.1f} req/s offered; "
        f"{s['windows_in_slo']}/{s['windows']} windows in SLO ({s['windows_in_slo_excluding_steps']}/"
        f"{s['windows_excluding_steps']} outside steps); {s['changes']} changes; settled in "
        f"{s['settle_intervals']} intervals; {s['replica_seconds']:.0f} replica-seconds; "
        + (f"{100 * s['rejected_share']:.2f} % rejected by shedding; " if s["shedding"] else "")
        + f"final {s['final']}",
        file=stream,
    )
    return 0
