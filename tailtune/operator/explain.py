"""`tailtune explain NAME [-n NS] [--json]`: where the time goes for one InferenceService, and what the tuner
does next.

Read-only: the object and its Events through `kube.KubeCluster` (`read_isvc`, `list_events`), the metrics through
`tuner.prom`. The rendering is pure (`render`, `to_json`), so it is tested without a cluster or a Prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from tailtune.api.v1alpha1 import InferenceService
from tailtune.operator.engine import build_curve
from tailtune.operator.generative import explain_generative, is_generative
from tailtune.operator.inforce import in_force, policy_for, tuner_state
from tailtune.operator.rollout import RolloutState
from tailtune.operator.status import SLO_MET, compute_slo_condition
from tailtune.operator.tuning import (
    LatencyRead,
    judge_read,
    judged_hold,
    latency_status,
    parse_isvc,
    read_latency,
)
from tailtune.tuner.law import CANDIDATE_CALIBRATION, best_plan, decide, demand_margin
from tailtune.tuner.prom import TRITON_SUMMARY_QUANTILES, Breakdown, PrometheusReader, Target
from tailtune.tuner.servicetime import Curve, merged
from tailtune.tuner.types import Decision, Observation

# Triton's default summary quantiles as percentiles: read too, to say which lower percentile the SLO would meet.
_SUMMARY_PERCENTILES = tuple(float(q) * 100 for q in TRITON_SUMMARY_QUANTILES)
# The replicas asked about when the bounds cannot carry the demand.
_REPLICAS_ASKED = 1000


class IsvcReader(Protocol):
    """What explain needs from the API server (`kube.KubeCluster`): reads only."""

    async def read_isvc(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def list_events(self, namespace: str, name: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Facts:
    """Everything explain shows, read once."""

    isvc: InferenceService
    read: LatencyRead
    breakdown: Breakdown | None
    # Triton's own figure at the SLO percentile, when the SLO's figure comes from the user's (end-to-end) query.
    server_ms: float | None
    now: datetime
    # The object's Events, oldest first (empty when they could not be read: `events_error` says why).
    events: tuple[dict[str, Any], ...] = ()
    events_error: str = ""


def reader_for(isvc: InferenceService, *, user_query: bool = True) -> PrometheusReader:
    """The tuner's reader for this object, also reading Triton's summary quantiles (or Triton's own, without
    the user's query)."""
    spec = isvc.spec
    targets = {p for p, _ in spec.slo.other_targets()}
    others = tuple(sorted((targets | set(_SUMMARY_PERCENTILES)) - {spec.slo.percentile}))
    return PrometheusReader.connect(
        spec.metrics.prometheus_url,
        Target(isvc.metadata.namespace, isvc.metadata.name, isvc.model_name),
        spec.slo.percentile,
        spec.slo.window_seconds,
        latency_query=spec.metrics.latency_query if user_query else None,
        timeout_seconds=spec.metrics.timeout_seconds,
        other_percentiles=others,
        breakdown=True,
    )


def gather(isvc: InferenceService, now: datetime) -> Facts:
    """Read the latest window with the other percentiles, its breakdown and (for a user query) Triton's own
    figure. Blocking."""
    read = read_latency(reader_for(isvc), now)
    breakdown, server_ms = None, None
    if read.signal is not None:
        breakdown, server_ms = read.signal.breakdown, read.signal.server_ms
    return Facts(isvc, read, breakdown, server_ms, now)


def next_decision(
    isvc: InferenceService, observation: Observation, now: datetime, read: LatencyRead | None = None
) -> Decision:
    """What the tuner would decide on this window (as if it had not judged it yet): the hold on a read the judge
    refused (`judge_read`: its problem), else the law's decision. Pure."""
    state = tuner_state(isvc).model_copy(update={"last_window_end": None})
    if read is not None and read.signal is not None and read.problem:
        return judged_hold(state, in_force(isvc), observation, read)
    return decide(state, in_force(isvc), observation, policy_for(isvc, build_curve(isvc)), now)


@dataclass(frozen=True)
class WouldTake:
    """What it would take to meet the SLO: replicas at the demand, or the percentiles it is met at now."""

    replicas: int | None  # None: see `why`
    demand_rps: float | None
    lower_percentiles: tuple[float, ...]  # observed percentiles within the SLO's latency, highest first
    why: str = ""  # why no replica count is named


def would_take(isvc: InferenceService, observation: Observation, decision: Decision) -> WouldTake:
    """The replicas the tuner's planner needs for the demand at the best batching (bounds lifted), and the
    lower percentiles the SLO's latency holds at now. Pure."""
    policy = policy_for(isvc, build_curve(isvc))
    state = tuner_state(isvc)
    demand = decision.demand_rps
    if demand is None and observation.request_rate is not None:
        demand = observation.request_rate + max(0.0, observation.queue_growth_rps or 0.0)
    curve = Curve(merged(policy.build_curve, state.live))
    replicas, why = None, ""
    if demand is None or demand <= 0:
        why = "no demand measured"
    elif not curve:
        why = "no service-time curve of the engine in force yet (status.serviceTime)"
    else:
        lifted = policy.model_copy(update={"replicas_max": max(policy.replicas_max, _REPLICAS_ASKED)})
        # The law's share of the calibration for configs other than the one in force.
        mild = min(CANDIDATE_CALIBRATION[1], max(CANDIDATE_CALIBRATION[0], state.calibration))
        plan = best_plan(curve, demand * demand_margin(decision.state, policy), lifted, mild)
        replicas = plan.replicas if plan.feasible else None
        why = "" if plan.feasible else f"no replica count up to {_REPLICAS_ASKED} carries it"
    slo_ms = isvc.spec.slo.latency_ms
    lower = tuple(
        sorted(
            (p for p, ms in observation.other_percentiles if ms is not None and ms <= slo_ms and p < policy.percentile),
            reverse=True,
        )
    )
    return WouldTake(replicas, demand, lower, why)


def _ms(v: float | None) -> str:
    return "-" if v is None or math.isinf(v) else f"{v:.2f} ms"


def render(facts: Facts) -> str:
    """One screen: the targets against the window's percentiles, where the time goes, the config in force and
    why, the tuner's last and next decision, what it would take when the SLO is missed, a rollout in flight,
    the recent Events, the service-time curve. Pure."""
    isvc, now = facts.isvc, facts.now
    read = judge_read(facts.read, isvc, now=now)
    slo, label = isvc.spec.slo, f"P{isvc.spec.slo.percentile:g}"
    latency = latency_status(read, isvc, now)
    cond = compute_slo_condition(isvc, latency)
    out = [f"InferenceService {isvc.metadata.namespace}/{isvc.metadata.name} (model {isvc.model_name})", ""]
    targets = ", ".join(f"P{p:g} <= {ms:g} ms" for p, ms in slo.all_targets())
    out.append(f"SLO        {targets} over {slo.window_seconds} s")
    if read.signal is None:
        out.append(f"latency    not read: {read.message}")
    elif read.problem:
        out.append(f"latency    not judged ({read.problem}): {read.message}")
        out.append(f"window     {latency.window_start} .. {latency.window_end}")
    else:
        shown = "above every histogram bucket" if latency.above_range else _ms(latency.observed_ms)
        out.append(f"latency    {label} {shown} at {latency.throughput_rps or 0:g} req/s ({latency.source})")
        for t in latency.targets[1:]:
            verdict = "no data" if t.met is None else ("met" if t.met else "MISSED")
            out.append(f"           P{t.percentile:g} {_ms(t.observed_ms)} vs {t.target_ms:g} ms: {verdict}")
        out.append(f"window     {latency.window_start} .. {latency.window_end}")
        if latency.overlaps_change:
            out.append("           reaches back before the last change: settling, not judged")
    out.append(f"SLOMet     {cond.status} {cond.reason}: {cond.message}")
    if latency.message and read.signal is not None and not read.problem:
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
            out.append(f"  {name:<26}{_ms(v):>12}  {bar}".rstrip())
        out.append(f"  {'Triton request (total)':<26}{_ms(b.request_ms):>12}")
        mean_batch = read.signal.observation.avg_batch if read.signal is not None else None
        if mean_batch is not None:
            out.append(f"  {'mean batch executed':<26}{mean_batch:>9.2f}")
    batches = isvc.status.latency.breakdown.batches if isvc.status.latency.breakdown else []
    if batches:
        shown_batches = ", ".join(f"{c.batch} x{c.count}" for c in batches)
        out.append(f"  batch sizes (operator's last tick): {shown_batches}")
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
        d = next_decision(isvc, read.signal.observation, now, read)
        verb = "change" if d.changed else "hold"
        out.append(f"next       {verb} {d.reason_code}: {d.reason}")
        out.append(f"bound by   {d.bound_by or 'the plan as made (no gate or guard)'}")
        if d.infeasible:
            out.append(
                f"           infeasible: demand {d.demand_rps or 0:.0f} req/s vs capacity {d.capacity_rps or 0:.0f}"
            )
        if cond.status == "False" or d.infeasible:
            out += _would_take_lines(isvc, would_take(isvc, read.signal.observation, d))
    rollout = RolloutState.from_annotations(isvc.metadata.annotations)
    if rollout is not None:
        out += ["", *_rollout_lines(rollout)]
    if facts.events or facts.events_error:
        out += ["", "recent events"]
        out += [f"  (not readable: {facts.events_error})"] if facts.events_error else []
        for e in facts.events[-8:]:
            count = f" (x{e['count']})" if e.get("count", 1) > 1 else ""
            out.append(f"  {e.get('lastTimestamp') or '-'}  {e['type']:<7} {e['reason']}{count}: {e['message']}")
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


def _would_take_lines(isvc: InferenceService, w: WouldTake) -> list[str]:
    label, bounds = f"P{isvc.spec.slo.percentile:g}", isvc.spec.serving.replicas
    out = []
    if w.replicas is not None and w.demand_rps is not None:
        out.append(
            f"would take {w.replicas} replica(s) to carry {w.demand_rps:.0f} req/s steadily with the tuner's margin "
            f"(spec.serving.replicas.max {bounds.max}); draining a backlog takes more for a while"
        )
    elif w.demand_rps and w.why.startswith("no replica count"):
        out.append(
            f"would take a faster GPU (spec.serving.gpu.product) or a looser SLO: {w.why} "
            f"({w.demand_rps:.0f} req/s within {isvc.spec.slo.latency_ms:g} ms)"
        )
    else:
        out.append(f"would take: replicas not sized ({w.why})")
    if w.lower_percentiles:
        out.append(
            f"           or a lower percentile: {isvc.spec.slo.latency_ms:g} ms holds now at "
            + ", ".join(f"P{p:g}" for p in w.lower_percentiles)
            + f" (not at {label})"
        )
    return out


def _rollout_lines(r: RolloutState) -> list[str]:
    t, prev = r.target, r.previous
    since = r.since.isoformat() if r.since else "its reload pending"
    return [
        f"rollout    {r.stage}: canary pod {r.canary}, started {r.started.isoformat()}, on the target since {since}",
        f"           max batch {prev.max_batch_size} -> {t.max_batch_size}, delay {prev.max_queue_delay_microseconds} "
        f"-> {t.max_queue_delay_microseconds} us: {r.reason}",
        *([f"           verdict: {r.verdict}"] if r.verdict else []),
    ]


def to_json(facts: Facts) -> dict[str, Any]:
    """Everything `render` shows, as one JSON-ready object (`--json`). Pure."""
    isvc, now = facts.isvc, facts.now
    read = judge_read(facts.read, isvc, now=now)
    latency = latency_status(read, isvc, now)
    cond = compute_slo_condition(isvc, latency)
    force, state = in_force(isvc), tuner_state(isvc)
    out: dict[str, Any] = {
        "namespace": isvc.metadata.namespace,
        "name": isvc.metadata.name,
        "model": isvc.model_name,
        "slo": isvc.spec.slo.model_dump(by_alias=True, mode="json"),
        "latency": latency.model_dump(by_alias=True, mode="json", exclude_none=True),
        "sloMet": cond.model_dump(by_alias=True, mode="json", exclude_none=True),
        "otherPercentiles": (
            {f"{p:g}": ms for p, ms in read.signal.observation.other_percentiles} if read.signal is not None else {}
        ),
        "inForce": force.model_dump(by_alias=True, mode="json"),
        "last": {"reasonCode": state.last_reason_code, "badWindows": state.bad_windows,
                 "goodWindows": state.good_windows},
        "serviceTime": isvc.status.service_time.model_dump(by_alias=True, mode="json", exclude_none=True),
        "events": list(facts.events[-20:]),
    }  # fmt: skip
    if facts.events_error:
        out["eventsError"] = facts.events_error
    recorded = isvc.status.latency.breakdown
    if recorded is not None and recorded.batches:
        # explain reads no batch statistics (Triton's gRPC): the operator's last tick recorded them.
        out["latency"].setdefault("breakdown", {})["batches"] = [
            c.model_dump(by_alias=True, exclude_none=True) for c in recorded.batches
        ]
    if read.signal is not None:
        d = next_decision(isvc, read.signal.observation, now, read)
        out["next"] = {
            "action": d.action, "reasonCode": d.reason_code, "reason": d.reason, "boundBy": d.bound_by,
            "infeasible": d.infeasible,
            "demandRps": d.demand_rps, "capacityRps": d.capacity_rps,
            "batching": d.batching.model_dump(by_alias=True, mode="json"), "replicas": d.replicas,
        }  # fmt: skip
        if cond.status == "False" or d.infeasible:
            w = would_take(isvc, read.signal.observation, d)
            out["wouldTake"] = {
                "replicas": w.replicas, "demandRps": w.demand_rps, "lowerPercentiles": list(w.lower_percentiles),
                "why": w.why,
            }  # fmt: skip
    rollout = RolloutState.from_annotations(isvc.metadata.annotations)
    if rollout is not None:
        out["rollout"] = rollout.model_dump(mode="json")
    return out


async def explain(
    cluster: IsvcReader, namespace: str, name: str, now: datetime, *, as_json: bool = False
) -> tuple[int, str]:
    """(exit code, text): 1 when the object cannot be read or parsed, 3 when Prometheus is unreachable."""
    raw = await cluster.read_isvc(namespace, name)
    if raw is None:
        return 1, f"InferenceService {namespace}/{name} not found"
    isvc = parse_isvc(raw)
    if isvc is None:
        return 1, f"InferenceService {namespace}/{name} does not parse as tailtune.io/v1alpha1"
    if is_generative(isvc):  # TTFT/TPOT, not the request latency (tailtune.operator.generative)
        return await asyncio.to_thread(explain_generative, isvc, now, as_json=as_json)
    facts = await asyncio.to_thread(gather, isvc, now)
    try:
        events: tuple[dict[str, Any], ...] = tuple(await cluster.list_events(namespace, name))
        facts = replace(facts, events=events)
    except Exception as exc:  # a user without events list: explain the rest
        facts = replace(facts, events_error=f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}")
    text = json.dumps(to_json(facts), indent=2) if as_json else render(facts)
    return (3 if facts.read.signal is None else 0), text


def main(argv: list[str]) -> int:
    """`tailtune explain NAME [-n NAMESPACE] [--json]`."""
    parser = argparse.ArgumentParser(prog="tailtune explain", description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    args = parser.parse_args(argv)
    from tailtune.operator.kube import ApiException, KubeCluster, load_config

    try:
        cluster = KubeCluster(load_config())
        code, text = asyncio.run(explain(cluster, args.namespace, args.name, datetime.now(UTC), as_json=args.json))
    except ApiException as exc:
        print(f"tailtune explain: API server: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    except Exception as exc:  # no kubeconfig, API server unreachable
        print(
            f"tailtune explain: cannot read {args.namespace}/{args.name}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 1
    print(text, file=sys.stdout if code == 0 or args.json else sys.stderr)
    return code
