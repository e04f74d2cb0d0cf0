"""The demo's figures and report: summary numbers (pure), a PNG, and JSON + markdown files."""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devkit.load import WindowStats, window_stats

ROLLING_S = 5.0


@dataclass(frozen=True)
class Tick:
    """What the demo saw once a second: the knobs live in Triton, the InferenceService, Prometheus, the load."""

    t: float  # seconds since the load started
    offered_rps: float
    phase: str = ""
    max_batch: int | None = None  # live in the ready pods' Triton (the first pod's)
    delay_us: int | None = None
    replicas_desired: int | None = None
    replicas_ready: int | None = None
    status_p99_ms: float | None = None
    prom_p99_ms: float | None = None
    prom_rps: float | None = None
    tuner: str = ""  # the tuner's last reason code (holds included)
    decision: str = ""  # the reason of the tuner's last change
    # status.latency.breakdown: where Triton's time goes, mean ms per request over the tuner's window.
    queue_ms: float | None = None  # queue and batching wait
    compute_ms: float | None = None  # compute input + infer + output
    rest_ms: float | None = None  # Triton's request time outside the queue and the compute steps


@dataclass(frozen=True)
class Decision:
    """A tuner change: when (load clock), the config it asked for, and the law's reason."""

    t: float
    config: str
    reason: str


@dataclass(frozen=True)
class Window:
    """Client-side figures of one stretch of the run."""

    label: str
    start_s: float
    end_s: float
    throughput_rps: float
    p99_ms: float | None
    p50_ms: float | None
    failed: int
    sent: int

    @classmethod
    def of(cls, label: str, stats: WindowStats) -> Window:
        p99 = None if stats.p99_ms is None or math.isinf(stats.p99_ms) else round(stats.p99_ms, 2)
        p50 = None if stats.p50_ms is None else round(stats.p50_ms, 2)
        return cls(
            label, stats.start_s, stats.end_s, round(stats.throughput_rps, 1), p99, p50, stats.failed, stats.sent
        )


@dataclass(frozen=True)
class Summary:
    """The demo's numbers and its own check."""

    slo_ms: float
    step_at_s: float
    low_rps: float
    high_rps: float
    time_to_first_ready_s: float | None
    settle_s: float | None
    before: Window
    untuned_high: Window | None
    after: Window
    passed: bool
    verdict: str
    timings_s: dict[str, float] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    final_config: str = ""
    # Seconds from the command to the load's start: t = 0 of every time in the report (x-axis, windows,
    # decisions); `timings_s` and `time_to_first_ready_s` count from the command and are shown on both clocks.
    load_start_s: float = 0.0
    # Server-measured P99 (Triton's summary through Prometheus, its own 60 s window) per stretch label: the
    # median of the ticks in the stretch; beside the client's P99, the difference is the time outside Triton.
    server_p99_ms: dict[str, float | None] = field(default_factory=dict)
    # Where the server's time goes per stretch label: queue, compute and the rest (status.latency.breakdown,
    # median of the ticks in the stretch).
    breakdown_ms: dict[str, Breakdown] = field(default_factory=dict)


def _stretches(s: Summary) -> list[Window]:
    """The report's stretches in order: before the step, high load before the tuner's first change (if any),
    after it."""
    return [w for w in (s.before, s.untuned_high, s.after) if w is not None]


@dataclass(frozen=True)
class Breakdown:
    """Mean ms per request inside Triton over a stretch: queue and batching wait, compute, the rest."""

    queue_ms: float | None
    compute_ms: float | None
    rest_ms: float | None

    @property
    def queue_share(self) -> float | None:
        """The queue's share of the three parts (None unless all are known and add up to more than 0)."""
        parts = (self.queue_ms, self.compute_ms, self.rest_ms)
        if any(p is None for p in parts):
            return None
        total = sum(p for p in parts if p is not None)
        return None if total <= 0 or self.queue_ms is None else self.queue_ms / total


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return round(ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2, 2)


def server_p99(ticks: Sequence[Tick], start_s: float, end_s: float) -> float | None:
    """Median of Prometheus' P99 (Triton's own, 60 s summary) over the ticks in [start_s, end_s]. Pure."""
    return _median([k.prom_p99_ms for k in ticks if start_s <= k.t <= end_s and k.prom_p99_ms is not None])


def server_breakdown(ticks: Sequence[Tick], start_s: float, end_s: float) -> Breakdown:
    """Each part of status.latency.breakdown, the median over the ticks in [start_s, end_s] that have it. Pure."""
    inside = [k for k in ticks if start_s <= k.t <= end_s]

    def part(attr: str) -> float | None:
        return _median([v for k in inside if (v := getattr(k, attr)) is not None])

    return Breakdown(part("queue_ms"), part("compute_ms"), part("rest_ms"))


def rolling_p99(
    sent: Sequence[float], latency_ms: Sequence[float], ok: Sequence[bool], end_s: float, step_s: float = 1.0
) -> list[tuple[float, float | None]]:
    """(t, P99 of the requests sent in [t - 5 s, t)) every `step_s`; failed requests count as infinite."""
    order = sorted(range(len(sent)), key=sent.__getitem__)
    s = [sent[i] for i in order]
    lat = [latency_ms[i] for i in order]
    good = [ok[i] for i in order]
    out = []
    t = ROLLING_S
    while t <= end_s + 1e-9:
        lo, hi = bisect.bisect_left(s, t - ROLLING_S), bisect.bisect_left(s, t)
        out.append((t, window_stats(s[lo:hi], lat[lo:hi], good[lo:hi], t - ROLLING_S, t).p99_ms))
        t += step_s
    return out


def settle_time(rolling: Sequence[tuple[float, float | None]], step_at: float, slo_ms: float) -> float | None:
    """Seconds from the step until the rolling P99 stays under the SLO to the end; None if it never does."""
    settled_at = None
    for t, p99 in rolling:
        if t - ROLLING_S < step_at:
            continue  # windows that reach before the step say nothing about the step
        if p99 is None or p99 > slo_ms:
            settled_at = None
        elif settled_at is None:
            settled_at = t - ROLLING_S
    return None if settled_at is None else max(0.0, settled_at - step_at)


def describe_config(tick: Tick) -> str:
    """`max batch 8, delay 0 us, 2 replicas`."""
    return f"max batch {tick.max_batch}, delay {tick.delay_us} us, {tick.replicas_desired} replicas"


def summarize(
    samples: tuple[Sequence[float], Sequence[float], Sequence[bool]],
    ticks: Sequence[Tick],
    decisions: Sequence[Decision],
    *,
    slo_ms: float,
    step_at: float,
    low_rps: float,
    high_rps: float,
    end_s: float,
    time_to_first_ready_s: float | None,
    timings_s: dict[str, float],
    load_start_s: float = 0.0,
) -> Summary:
    """The summary of a run. Pure.

    Times are on the load clock (t = 0 when the load started, `load_start_s` after the command).
    before: the last 20 s of low load (initial config); untuned_high: high load before the tuner's first
    change after the step, the like-for-like "before tuning" of `after`; after: the final stretch (the last
    quarter of the high-load phase, >= 15 s).
    The check: the final stretch meets the SLO (client-side P99), loses < 1% of requests, and settled.
    """
    sent, lat, ok = samples
    before = Window.of(
        f"initial config, {low_rps:g} req/s offered", window_stats(sent, lat, ok, max(0.0, step_at - 20), step_at)
    )
    first_change = next((d.t for d in decisions if d.t > step_at), None)
    untuned = None
    if first_change is None or first_change - step_at >= 3:
        stop = end_s if first_change is None else first_change
        untuned = Window.of(
            f"before tuning: initial config, {high_rps:g} req/s offered", window_stats(sent, lat, ok, step_at, stop)
        )
    final_len = max(15.0, (end_s - step_at) / 4)
    after = Window.of(
        f"after tuning, {high_rps:g} req/s offered", window_stats(sent, lat, ok, end_s - final_len, end_s)
    )
    settle = settle_time(rolling_p99(sent, lat, ok, end_s), step_at, slo_ms)
    lost = after.failed / after.sent if after.sent else 1.0
    problems = []
    if after.p99_ms is None or after.p99_ms > slo_ms:
        problems.append(f"P99 {after.p99_ms} ms over the SLO {slo_ms:g} ms at the end")
    if lost >= 0.01:
        problems.append(f"{lost:.1%} of requests failed at the end")
    if settle is None:
        problems.append("never settled under the SLO after the step")
    passed = not problems
    verdict = (
        f"PASS: P99 {after.p99_ms} ms <= SLO {slo_ms:g} ms at {after.throughput_rps} req/s after the step"
        if passed
        else "FAIL: " + "; ".join(problems)
    )
    return Summary(
        slo_ms=slo_ms,
        step_at_s=step_at,
        low_rps=low_rps,
        high_rps=high_rps,
        time_to_first_ready_s=None if time_to_first_ready_s is None else round(time_to_first_ready_s, 1),
        settle_s=None if settle is None else round(settle, 1),
        before=before,
        untuned_high=untuned,
        after=after,
        passed=passed,
        verdict=verdict,
        timings_s={k: round(v, 1) for k, v in timings_s.items()},
        decisions=list(decisions),
        final_config=describe_config(ticks[-1]) if ticks else "",
        load_start_s=round(load_start_s, 1),
        server_p99_ms={
            w.label: server_p99(ticks, w.start_s, w.end_s) for w in (before, untuned, after) if w is not None
        },
        breakdown_ms={
            w.label: server_breakdown(ticks, w.start_s, w.end_s) for w in (before, untuned, after) if w is not None
        },
    )


def _fmt(v: float | None, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:g} {unit}".rstrip()


def before_after(s: Summary) -> str:
    """Throughput and P99 before and after tuning at the same offered load (the high one)."""
    after = f"{s.after.throughput_rps:g} req/s at P99 {_p99(s.after)}"
    u = s.untuned_high
    if u is None:
        return (
            f"At {s.high_rps:g} req/s offered: the tuner changed the config within 3 s of the step, so there is no "
            f"untuned stretch at that load; after tuning it served {after}."
        )
    return (
        f"At {s.high_rps:g} req/s offered: before tuning (initial config, t = {u.start_s:.0f}-{u.end_s:.0f} s) "
        f"served {u.throughput_rps:g} req/s at P99 {_p99(u)}; after tuning served {after}."
    )


def _p99(w: Window) -> str:
    if w.p99_ms is None:
        return "unbounded (requests failed)" if w.sent else "n/a"
    return f"{w.p99_ms:g} ms"


def markdown(summary: Summary) -> str:
    """The summary as markdown."""
    s = summary
    lines = [
        "# tailtune demo",
        "",
        f"**{s.verdict}**",
        "",
        "Everything real except the GPU: local control plane, the operator, one real `tritonserver` per pod "
        "(model: the EMULATED accelerator), a real Prometheus, real open-loop load; latencies are client-side.",
        "",
        f"Times are seconds since the load started (t = 0, {s.load_start_s:g} s after the command), as in the PNG.",
        "",
        f"- SLO: P99 <= {s.slo_ms:g} ms; load {s.low_rps:g} -> {s.high_rps:g} req/s at t = {s.step_at_s:g} s",
        f"- time from command to first Ready pod: {_fmt(s.time_to_first_ready_s, 's')}"
        + ("" if s.time_to_first_ready_s is None else f" (t = {s.time_to_first_ready_s - s.load_start_s:.1f} s)"),
        f"- time to settle after the load step (client P99 over 5 s stays under the SLO): {_fmt(s.settle_s, 's')}",
        f"- final config: {s.final_config}",
        "",
        "| stretch | from t (s) | to t (s) | throughput (req/s) | P50 (ms) | P99 (ms) | failed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for w in _stretches(s):
        p99 = "unbounded (failures)" if w.p99_ms is None and w.sent else _fmt(w.p99_ms)
        lines.append(
            f"| {w.label} | {w.start_s:.0f} | {w.end_s:.0f} | {w.throughput_rps:g} | {_fmt(w.p50_ms)} "
            f"| {p99} | {w.failed}/{w.sent} |"
        )
    lines += ["", *client_vs_server(s)]
    lines += ["", *where_the_time_goes(s)]
    lines += ["", "## Tuner decisions", ""]
    lines += [f"- t = {d.t:.0f} s: {d.config} — {d.reason}" for d in s.decisions] or ["- none"]
    lines += ["", before_after(s)]
    lines += ["", "## Timings", ""]
    lines += [f"- {k}: t = {v - s.load_start_s:.1f} s ({v:g} s after the command)" for k, v in s.timings_s.items()]
    return "\n".join(lines) + "\n"


def client_vs_server(s: Summary) -> list[str]:
    """Client-measured P99 (the load generator's) against server-measured (Triton's, through Prometheus) per
    stretch: what lies between them is outside Triton (network, client, HTTP handling in front of the model)."""
    lines = [
        "## Client-measured vs server-measured",
        "",
        "Server: Triton's own P99 (its 60 s summary through Prometheus, median over the stretch); client: the load "
        "generator's. Their difference is the time outside Triton (network, client, HTTP handling) only as far "
        "as the windows agree: the server's reaches 60 s back, into the stretch before, so a small or negative "
        "difference is the windows, not the network. `status.latency.breakdown` and `tailtune explain` split "
        "the server's time into queue, compute and the rest.",
        "",
        "| stretch | client P99 (ms) | server P99 (ms) | client - server (ms) |",
        "| --- | --- | --- | --- |",
    ]
    for w in _stretches(s):
        server = s.server_p99_ms.get(w.label)
        outside = None if server is None or w.p99_ms is None else round(w.p99_ms - server, 2)
        lines.append(f"| {w.label} | {_fmt(w.p99_ms)} | {_fmt(server)} | {_fmt(outside)} |")
    return lines


def where_the_time_goes(s: Summary) -> list[str]:
    """Where the server's time goes per stretch (status.latency.breakdown): the queue and batching wait against
    the compute, so a P99 that grew under load reads as queueing (more replicas, a shorter delay) or as
    compute (bigger batches run slower)."""
    lines = [
        "## Where the server's time goes",
        "",
        "Mean ms per request inside Triton over the tuner's window (`status.latency.breakdown`, median over the "
        "stretch): queue and batching wait, compute (input copy + inference + output copy), and the rest of "
        "Triton's request time. Means, not P99s: they say where the time goes, not how long the tail is.",
        "",
        "| stretch | queue (ms) | compute (ms) | rest (ms) | queue share |",
        "| --- | --- | --- | --- | --- |",
    ]
    for w in _stretches(s):
        b = s.breakdown_ms.get(w.label) or Breakdown(None, None, None)
        share = "n/a" if b.queue_share is None else f"{b.queue_share:.0%}"
        lines.append(f"| {w.label} | {_fmt(b.queue_ms)} | {_fmt(b.compute_ms)} | {_fmt(b.rest_ms)} | {share} |")
    return lines


def write_report(
    out: Path,
    summary: Summary,
    ticks: Sequence[Tick],
    samples: tuple[Sequence[float], Sequence[float], Sequence[bool]],
) -> list[Path]:
    """report.png, summary.json, summary.md and timeline.json under `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = asdict(summary)
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    (out / "timeline.json").write_text(json.dumps([asdict(t) for t in ticks]) + "\n")
    png = out / "report.png"
    plot(png, summary, ticks, samples)
    return [png, out / "summary.json", out / "summary.md", out / "timeline.json"]


def plot(
    path: Path,
    summary: Summary,
    ticks: Sequence[Tick],
    samples: tuple[Sequence[float], Sequence[float], Sequence[bool]],
) -> None:
    """Five panels on the load clock: P99 vs SLO, throughput, max batch, queue delay, replicas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    sent, lat, ok = samples
    end = ticks[-1].t if ticks else (sent[-1] if sent else 1.0)
    rolling = rolling_p99(sent, lat, ok, end)
    fig, axes = plt.subplots(5, 1, figsize=(11, 13), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.2, 1.2, 1.2]})
    ax_lat, ax_rps, ax_batch, ax_delay, ax_rep = axes
    fig.suptitle(f"tailtune demo (emulated GPU): {summary.verdict}", fontsize=10)

    # Latency, log scale, ticks at 1-2-5 labelled in plain milliseconds.
    cap = 10_000.0  # failures count as infinite; drawn at the top of the axis
    ax_lat.plot([t for t, _ in rolling], [min(p if p is not None else cap, cap) for _, p in rolling],
                label="P99, client, 5 s window (failures at 10 s)", color="tab:blue")  # fmt: skip
    prom = [(k.t, k.prom_p99_ms) for k in ticks if k.prom_p99_ms is not None]
    if prom:
        ax_lat.plot(*zip(*prom, strict=True), label="P99, Triton summary via Prometheus (60 s)", color="tab:purple",
                    alpha=0.7)  # fmt: skip
    ax_lat.axhline(summary.slo_ms, color="tab:red", linestyle="--", label=f"SLO {summary.slo_ms:g} ms")
    ax_lat.set_yscale("log")
    ax_lat.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax_lat.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax_lat.yaxis.set_minor_formatter(NullFormatter())
    ax_lat.set_ylabel("latency (ms, log)")

    # Throughput.
    bins: dict[int, int] = {}
    for s, good in zip(sent, ok, strict=False):
        if good:
            bins[int(s)] = bins.get(int(s), 0) + 1
    xs = sorted(bins)[:-1]  # the last second is partial
    ax_rps.plot(xs, [bins[x] for x in xs], label="served (client, 1 s)", color="tab:green", linewidth=0.8)
    ax_rps.plot([k.t for k in ticks], [k.offered_rps for k in ticks], label="offered", color="black", linestyle=":")
    rps = [(k.t, k.prom_rps) for k in ticks if k.prom_rps is not None]
    if rps:
        ax_rps.plot(*zip(*rps, strict=True), label="Prometheus rate", color="tab:purple", alpha=0.7)
    ax_rps.set_ylabel("req/s")
    ax_rps.set_ylim(bottom=0)

    def steps(attr: str) -> tuple[list[float], list[float]]:
        pts = [(k.t, float(getattr(k, attr))) for k in ticks if getattr(k, attr) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    def floor_above_axis(ax: Any, values: Sequence[float], least: float) -> None:
        # A little room under 0, so a line at 0 is drawn above the axis instead of on it.
        top = max([least, *values]) * 1.2
        ax.set_ylim(-0.08 * top, top)

    t_batch, batch = steps("max_batch")
    ax_batch.step(t_batch, batch, where="post", label="max batch size (live in Triton)", color="tab:orange",
                  linewidth=2)  # fmt: skip
    ax_batch.set_ylabel("max batch")
    floor_above_axis(ax_batch, batch, 1.0)
    ax_batch.yaxis.set_major_locator(MaxNLocator(integer=True))

    t_delay, delay = steps("delay_us")
    delay_ms = [d / 1000 for d in delay]
    ax_delay.step(t_delay, delay_ms, where="post", label="max queue delay (live in Triton)", color="tab:brown",
                  linewidth=2)  # fmt: skip
    ax_delay.set_ylabel("queue delay (ms)")
    floor_above_axis(ax_delay, delay_ms, 1.0)

    t_want, want = steps("replicas_desired")
    t_ready, ready = steps("replicas_ready")
    ax_rep.step(t_ready, ready, where="post", label="replicas ready (serving)", color="tab:cyan", linewidth=1.5)
    ax_rep.step(t_want, want, where="post", label="replicas desired (status)", color="tab:gray", linestyle="--",
                linewidth=1.5, zorder=3)  # fmt: skip
    ax_rep.set_ylabel("replicas")
    floor_above_axis(ax_rep, [*want, *ready], 1.0)
    ax_rep.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_rep.set_xlabel(f"seconds since the load started (t = 0 is {summary.load_start_s:g} s after the command)")
    ax_rep.set_xlim(0, end)

    step_label = f"load step {summary.low_rps:g} -> {summary.high_rps:g} req/s"
    for ax in axes:
        ax.axvline(summary.step_at_s, color="black", alpha=0.5, label=step_label)
        for i, d in enumerate(summary.decisions):
            ax.axvline(d.t, color="tab:olive", alpha=0.6, linestyle="-.",
                       label="tuner change" if i == 0 else None)  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8, framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
