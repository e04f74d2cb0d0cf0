"""`tailtune explain NAME [-n NS]`: where the time goes for one InferenceService, and what the tuner does next.

Read-only: the object through `kube.KubeCluster.read_isvc`, the metrics through `tuner.prom`. The rendering is
pure (`render`), so it is tested without a cluster or a Prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from tailtune.api.v1alpha1 import InferenceService
from tailtune.operator.engine import build_curve
from tailtune.operator.inforce import in_force, tuner_state
from tailtune.operator.status import SLO_MET, compute_slo_condition
from tailtune.operator.tuning import LatencyRead, latency_status, parse_isvc, policy_for, read_latency
from tailtune.tuner.law import decide
from tailtune.tuner.prom import Breakdown, PrometheusReader, PrometheusUnavailable, Target
from tailtune.tuner.types import Decision, Observation


class IsvcReader(Protocol):
    """What explain needs from the API server (`kube.KubeCluster`)."""

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Facts:
    """Everything explain shows, read once."""

    isvc: InferenceService
    read: LatencyRead
    breakdown: Breakdown | None
    # Triton's own figure at the SLO percentile, when the SLO's figure comes from the user's (end-to-end) query.
    server_ms: float | None
    now: datetime


def reader_for(isvc: InferenceService, *, user_query: bool = True) -> PrometheusReader:
    """The tuner's reader for this object (or Triton's own, without the user's query)."""
    spec = isvc.spec
    return PrometheusReader.connect(
        spec.metrics.prometheus_url,
        Target(isvc.metadata.namespace, isvc.metadata.name, isvc.model_name),
        spec.slo.percentile,
        spec.slo.window_seconds,
        latency_query=spec.metrics.latency_query if user_query else None,
        timeout_seconds=spec.metrics.timeout_seconds,
    )


def gather(isvc: InferenceService, now: datetime) -> Facts:
    """Read the latest window, its breakdown and (for a user query) Triton's own figure. Blocking."""
    read = read_latency(reader_for(isvc), now)
    breakdown, server_ms = None, None
    if read.signal is not None:
        try:
            breakdown = reader_for(isvc, user_query=False).read_breakdown(now)
            if read.signal.source == "userQuery":
                server_ms = reader_for(isvc, user_query=False).read_signal(now).observation.p_latency_ms
        except PrometheusUnavailable:
            pass  # the latency itself was read: show it without the breakdown
    return Facts(isvc, read, breakdown, server_ms, now)


def next_decision(isvc: InferenceService, observation: Observation, now: datetime) -> Decision:
    """What the law would decide on this window (as if it had not judged it yet). Pure."""
    state = tuner_state(isvc).model_copy(update={"last_window_end": None})
    return decide(state, in_force(isvc), observation, policy_for(isvc, build_curve(isvc)), now)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


def render(facts: Facts) -> str:
    """One screen: the window and its percentile against the SLO, where the time goes, the config in force and
    why, the tuner's last and next decision, the service-time curve. Pure."""
    isvc, read, now = facts.isvc, facts.read, facts.now
    slo, label = isvc.spec.slo, f"P{isvc.spec.slo.percentile:g}"
    latency = latency_status(read, isvc, now)
    cond = compute_slo_condition(isvc, latency)
    out = [f"InferenceService {isvc.metadata.namespace}/{isvc.metadata.name} (model {isvc.model_name})", ""]
    out.append(f"SLO        {label} <= {slo.latency_ms:g} ms over {slo.window_seconds} s")
    if read.signal is None:
        out.append(f"latency    not read: {read.message}")
    else:
        shown = "above every histogram bucket" if latency.above_range else _ms(latency.observed_ms)
        out.append(f"latency    {label} {shown} at {latency.throughput_rps or 0:g} req/s ({latency.source})")
        out.append(f"window     {latency.window_start} .. {latency.window_end}")
        if latency.overlaps_change:
            out.append("           reaches back before the last change: settling, not judged")
    out.append(f"SLOMet     {cond.status} {cond.reason}: {cond.message}")
    if latency.message and read.signal is not None:
        out.append(f"note       {latency.message}")
    b = facts.breakdown
    if b is not None:
        out += ["", "where the time goes (mean per request, inside Triton)"]
        rows = [
            ("queue/batching wait", b.queue_ms),
            ("compute input", b.input_ms),
            ("compute infer", b.infer_ms),
            ("compute output", b.output_ms),
            ("rest of Triton's request", b.rest_ms),
        ]
        total = b.request_ms or sum(v for _, v in rows if v) or 1.0
        for name, v in rows:
            bar = "#" * round(30 * (v or 0) / total) if total > 0 else ""
            out.append(f"  {name:<26}{_ms(v):>12}  {bar}")
        out.append(f"  {'Triton request (total)':<26}{_ms(b.request_ms):>12}")
    if facts.server_ms is not None and latency.observed_ms is not None:
        outside = latency.observed_ms - facts.server_ms
        out.append(
            f"  end-to-end {label} {latency.observed_ms:.2f} ms (your query) vs Triton's {facts.server_ms:.2f} ms: "
            f"{outside:.2f} ms outside Triton (network, client, pre/post-processing)"
        )
    force = in_force(isvc)
    bt = force.batching
    out += [
        "",
        f"in force   max batch {bt.max_batch_size}, preferred {list(bt.preferred_batch_sizes)}, "
        f"delay {bt.max_queue_delay_microseconds} us, {force.replicas} replica(s)",
        f"           since {force.changed_at.isoformat() if force.changed_at else 'the spec'}: "
        f"{force.reason or 'the spec starting point'}",
    ]
    state = tuner_state(isvc)
    out.append(
        f"last       {state.last_reason_code or '-'} (bad windows {state.bad_windows}, good {state.good_windows})"
    )
    if read.signal is not None:
        d = next_decision(isvc, read.signal.observation, now)
        verb = "change" if d.changed else "hold"
        out.append(f"next       {verb} {d.reason_code}: {d.reason}")
        if d.infeasible:
            out.append(
                f"           infeasible: demand {d.demand_rps or 0:.0f} req/s vs capacity {d.capacity_rps or 0:.0f}"
            )
    points = isvc.status.service_time.points
    if points:
        out += ["", "service time t(b) (ms per batch)"]
        for p in sorted(points, key=lambda p: (p.batch, p.source)):
            mark = "  <- max batch in force" if p.batch == bt.max_batch_size else ""
            out.append(f"  b={p.batch:<5}{p.ms:>9.2f} ms  {p.source} ({p.samples} runs){mark}")
    old = next((c for c in isvc.status.conditions if c.type == SLO_MET), None)
    if old is not None and (old.status, old.reason) != (cond.status, cond.reason):
        out.append(f"\n(status still says SLOMet {old.status} {old.reason}; the operator updates it on its next tick)")
    return "\n".join(out)


async def explain(cluster: IsvcReader, namespace: str, name: str, now: datetime) -> tuple[int, str]:
    """(exit code, text): 1 when the object cannot be read or parsed, 3 when Prometheus is unreachable."""
    raw = await cluster.read_isvc(namespace, name)
    if raw is None:
        return 1, f"InferenceService {namespace}/{name} not found"
    isvc = parse_isvc(raw)
    if isvc is None:
        return 1, f"InferenceService {namespace}/{name} does not parse as tailtune.io/v1alpha1"
    facts = await asyncio.to_thread(gather, isvc, now)
    text = render(facts)
    return (3 if facts.read.signal is None else 0), text


def main(argv: list[str]) -> int:
    """`tailtune explain NAME [-n NAMESPACE]`."""
    parser = argparse.ArgumentParser(prog="tailtune explain", description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("-n", "--namespace", default="default")
    args = parser.parse_args(argv)
    from tailtune.operator.kube import ApiException, KubeCluster, load_config

    try:
        cluster = KubeCluster(load_config())
        code, text = asyncio.run(explain(cluster, args.namespace, args.name, datetime.now(UTC)))
    except ApiException as exc:
        print(f"tailtune explain: API server: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    except Exception as exc:  # no kubeconfig, API server unreachable
        print(
            f"tailtune explain: cannot read {args.namespace}/{args.name}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 1
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code
