"""`tailtune plan`: the config the tuner would start from for a service-time curve and a load.

It feeds the curve to the law's own planner (`best_plan`) as if every batch size had been measured, then
simulates Poisson arrivals at that load to predict the P99 and throughput, next to Triton's default. When no
config within --replicas-max carries the load it says how many replicas would and exits 1; when no config at
all can meet the SLO (one request alone takes longer, or queueing behind one does) it says so and exits 2.
A bad flag exits 2 too, with one line on stderr that names it and the range it takes.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TextIO

import numpy as np

from tailtune.api.v1alpha1 import (
    DEFAULT_TARGET_UTILIZATION,
    MAX_BATCH_SIZE,
    MAX_INSTANCES_PER_GPU,
    MAX_REPLICAS,
    MAX_TARGET_UTILIZATION,
    MIN_TARGET_UTILIZATION,
    Batching,
    IntRange,
    Replicas,
    Slo,
    Tuning,
)
from tailtune.sim import MAX_REQUESTS, SimCluster, linear_power, named_curve, poisson
from tailtune.sim.curves import CURVES, ServiceCurve
from tailtune.tuner.law import best_plan
from tailtune.tuner.model import predict
from tailtune.tuner.servicetime import Curve, CurvePoint
from tailtune.tuner.types import Policy

WARMUP_S = 10.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailtune plan", description=__doc__)
    p.add_argument("--curve", choices=CURVES, help="a named service-time curve (else t(b) = a + c*b^p)")
    p.add_argument("--a-ms", type=float, default=2.0, help="fixed time per batch, ms (default 2)")
    p.add_argument("--c-ms", type=float, default=0.4, help="time per request, ms (default 0.4)")
    p.add_argument("--p", type=float, default=1.3, help="exponent on the batch size (default 1.3)")
    p.add_argument("--rate", type=float, required=True, help="offered load, requests/s")
    p.add_argument("--slo-ms", type=float, required=True, help="latency objective, ms")
    p.add_argument("--percentile", type=float, default=99.0, help="percentile of the objective (default 99)")
    p.add_argument("--headroom", type=float, default=0.8, help="aim at this share of the SLO (default 0.8)")
    p.add_argument(
        "--target-utilization",
        type=float,
        default=DEFAULT_TARGET_UTILIZATION,
        help=f"share of a replica's capacity it is planned to carry (default {DEFAULT_TARGET_UTILIZATION:g})",
    )
    p.add_argument("--engine-max-batch", type=int, default=64, help="the engine's max batch (default 64)")
    p.add_argument("--replicas-max", type=int, default=1, help="most replicas (default 1)")
    p.add_argument("--instances", type=int, default=1, help="model instances per GPU (default 1)")
    p.add_argument("--seconds", type=float, default=120.0, help="simulated seconds (default 120)")
    p.add_argument("--seed", type=int, default=0, help="arrival seed (default 0)")
    return p


def _bad_flag(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags, naming the flag and the range it takes (the spec's, where it has one)."""
    finite = math.isfinite
    checks = [
        (finite(args.rate) and args.rate > 0, "--rate must be > 0 and finite (requests/s)"),
        (
            finite(args.slo_ms) and 0 < args.slo_ms <= 600_000,
            "--slo-ms must be in (0, 600000] (as the spec's slo.latencyMs)",
        ),
        (50 <= args.percentile <= 99.99, "--percentile must be in [50, 99.99] (as the spec's slo.percentile)"),
        (0 < args.headroom < 1, "--headroom must be in (0, 1) (as the spec's tuning.headroom)"),
        (
            MIN_TARGET_UTILIZATION <= args.target_utilization <= MAX_TARGET_UTILIZATION,
            f"--target-utilization must be in [{MIN_TARGET_UTILIZATION:g}, {MAX_TARGET_UTILIZATION:g}] (as the spec's "
            "tuning.targetUtilization)",
        ),
        (finite(args.a_ms) and args.a_ms >= 0, "--a-ms must be >= 0 and finite"),
        (finite(args.c_ms) and args.c_ms >= 0, "--c-ms must be >= 0 and finite"),
        (args.a_ms + args.c_ms > 0, "--a-ms and --c-ms cannot both be 0: a batch takes some time"),
        (finite(args.p) and args.p >= 0, "--p must be >= 0 and finite (a batch never takes less than a smaller one)"),
        (
            1 <= args.engine_max_batch <= MAX_BATCH_SIZE,
            f"--engine-max-batch must be 1..{MAX_BATCH_SIZE} (as the spec's serving.batching.maxBatchSize)",
        ),
        (
            1 <= args.replicas_max <= MAX_REPLICAS,
            f"--replicas-max must be 1..{MAX_REPLICAS} (as the spec's replicas.max)",
        ),
        (
            1 <= args.instances <= MAX_INSTANCES_PER_GPU,
            f"--instances must be 1..{MAX_INSTANCES_PER_GPU} (as the spec's serving.instancesPerGpu)",
        ),
        (finite(args.seconds) and args.seconds > 0, "--seconds must be > 0 and finite"),
        (args.seed >= 0, "--seed must be >= 0"),
    ]
    bad = next((message for ok, message in checks if not ok), None)
    requests = (args.seconds + WARMUP_S) * args.rate
    if bad is None and requests > MAX_REQUESTS:
        bad = (
            f"--seconds {args.seconds:g} at --rate {args.rate:g} is {requests:.3g} requests with the warm-up, over "
            f"the simulator's {MAX_REQUESTS:.0e}: lower --seconds"
        )
    try:
        top_ms = args.a_ms + args.c_ms * float(args.engine_max_batch) ** args.p
    except OverflowError:
        top_ms = math.inf
    if bad is None and not args.curve and not math.isfinite(top_ms):
        bad = f"--c-ms and --p: a batch of {args.engine_max_batch} takes longer than a float holds; lower them"
    return bad


def _predict(
    curve: ServiceCurve, batching: Batching, replicas: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """(P99 ms, served req/s, share within the SLO) of a config at the load, after a warm-up."""
    trace = poisson(args.rate, args.seconds + WARMUP_S, args.seed)
    cluster = SimCluster(
        curve,
        trace.arrivals,
        batching,
        replicas,
        instances=args.instances,
        engine_max_batch=args.engine_max_batch,
        seed=args.seed,
    )
    cluster.advance(trace.duration_s)
    arr, lat = cluster.outcomes()
    lat = lat[arr >= WARMUP_S]
    served = float(np.sum(np.isfinite(lat))) / args.seconds
    p = float(np.percentile(lat, args.percentile, method="higher")) * 1000 if len(lat) else float("nan")
    within = float(np.mean(lat <= args.slo_ms / 1000)) if len(lat) else 0.0
    return p, served, within


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Print the starting config and its predicted latency and throughput; 0 on success, 1 when more replicas
    than --replicas-max are needed, 2 when no config can meet the SLO."""
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    bad = _bad_flag(args)
    if bad is not None:
        print(f"tailtune plan: {bad}", file=sys.stderr)
        return 2
    curve = named_curve(args.curve) if args.curve else linear_power(args.a_ms, args.c_ms, args.p)
    top = args.engine_max_batch
    policy = Policy.from_spec(
        Slo(latency_ms=args.slo_ms, percentile=args.percentile),
        Tuning(
            max_batch_size=IntRange(min=1, max=top),
            headroom=args.headroom,
            target_utilization=args.target_utilization,
        ),
        Replicas(min=1, max=args.replicas_max),
        top,
        instances=args.instances,
    )
    points = tuple(CurvePoint(batch=b, ms=curve.ms(b), source="build") for b in range(1, top + 1))
    model_curve = Curve(points)
    plan = best_plan(model_curve, args.rate * policy.demand_margin, policy)
    c = plan.candidate
    pname = f"P{args.percentile:g}"
    print(f"tailtune plan: {curve.name} at {args.rate:g} req/s, SLO {pname} <= {args.slo_ms:g} ms", file=stream)
    single = curve.ms(1)
    if single > args.slo_ms:
        print(
            f"infeasible SLO: no config can meet {pname} <= {args.slo_ms:g} ms: one request alone takes "
            f"{single:.1f} ms on this curve, whatever the batching and the replicas. "
            f"Raise --slo-ms to at least {2 * single / policy.headroom:.1f}.",
            file=stream,
        )
        return 2
    if 2 * single > args.slo_ms:
        print(
            f"infeasible SLO: no batching config keeps {pname} under {args.slo_ms:g} ms: one request alone takes "
            f"{single:.1f} ms and a request that arrives while another is in flight waits for it. "
            f"Raise --slo-ms to at least {2 * single / policy.headroom:.1f}.",
            file=stream,
        )
        return 2
    if not plan.feasible:
        # The same planner without the replica bound says how many replicas the load takes.
        unbounded = best_plan(
            model_curve, args.rate * policy.demand_margin, policy.model_copy(update={"replicas_max": 10_000})
        )
        u = unbounded.candidate
        if unbounded.feasible:
            more = (
                f"more replicas would do: {unbounded.replicas} replicas of max batch {u.max_batch} (delay "
                f"{u.delay_us} us) carry {u.carries():.0f} req/s each within {pname} {policy.aim_ms:g} ms. "
                f"Raise --replicas-max to {unbounded.replicas}."
            )
        else:
            more = "no number of replicas carries it within the aim: a faster device or a looser SLO."
        print(
            f"infeasible within --replicas-max {args.replicas_max}: {args.rate:g} req/s (x{policy.demand_margin:.2f} "
            f"margin) is more than {args.replicas_max} replica(s) carry within {pname} {policy.aim_ms:g} ms "
            f"(the most capable config, max batch {c.max_batch}, serves at most {c.capacity_rps:.0f} req/s per "
            f"replica); {more}",
            file=stream,
        )
        return 1
    batching = Batching(max_batch_size=c.max_batch, max_queue_delay_microseconds=c.delay_us)
    print(
        f"start config: max_batch_size {c.max_batch}, max_queue_delay_microseconds {c.delay_us}, "
        f"replicas {plan.replicas}",
        file=stream,
    )
    model_p = predict(
        model_curve.ms, c.max_batch, c.delay_us, args.instances, args.rate / plan.replicas, args.percentile
    )
    print(
        f"  batches of {c.max_batch} take {curve.ms(c.max_batch):.1f} ms; {c.capacity_rps:.0f} req/s per replica at "
        f"full batches; {c.carries():.0f} req/s per replica within {pname} {policy.aim_ms:g} ms (the aim); the "
        f"queueing model predicts {pname} {model_p.p_ms:.1f} ms at this load",
        file=stream,
    )
    print(f"predicted ({args.seconds:g} s of Poisson arrivals, seed {args.seed}):", file=stream)
    print(f"  {'config':<28} {pname + ' ms':>10} {'served req/s':>13} {'within SLO':>11}", file=stream)
    rows = [
        (f"tailtune start (batch {c.max_batch})", batching, plan.replicas),
        (f"triton default (batch {top})", Batching(max_batch_size=top), plan.replicas),
    ]
    for label, b, r in rows:
        p, served, within = _predict(curve, b, r, args)
        print(f"  {label:<28} {p:>10.1f} {served:>13.0f} {within:>11.1%}", file=stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
