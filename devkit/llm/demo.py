"""`tailtune demo --generative`: a generative InferenceService on the local cluster, every part real except the GPU
and the model (the EMULATED inflight-batching LLM inside the real tritonserver, devkit.llm).

    python -m devkit.demo --generative [--quick] [--out DIR] [--workdir DIR]

As the request demo (devkit.demo, whose cluster, runtime, Prometheus and operator it starts), with
examples/demo-generative.yaml: waits for the first Ready pod (behind its warmup), streams requests over gRPC with
the streaming client (devkit.llm.load) in four phases:

1. low: `low_rps` requests/s of `low_prompt`-token prompts;
2. the step: `high_rps` of `high_prompt`-token prompts (more requests, and longer prompts: both TTFT and TPOT rise);
3. quiet: nothing, long enough that the operator's window (spec.slo.windowSeconds) holds no earlier request;
4. probe: the high load again for `probe_s`, then quiet until the window that covers exactly the probe's requests
   has been read by the operator: its status.generative is compared with the client's percentiles of the same
   requests (issue 39: within 5 %).

The live table shows TTFT/TPOT (client, status) against the targets, tokens/s, running and waiting sequences, KV
use and the replicas; report.png, summary.json and summary.md go under --out. Exit 0 when the client's P99
TTFT and TPOT after the step (the high phase's last window) are within the targets and the status agrees with the
client within 5 % on the probe.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from devkit.checkout import Checkout
from devkit.demo import Demo, DemoCluster, DemoError, _condition, log
from devkit.llm.load import Lengths, StreamingLoad, StreamRecord
from devkit.load import Phase, percentile, rate_at
from devkit.runtime import UPSTREAM_GRPC_PORT
from tailtune.api.keys import APPLIED_ANNOTATION

# Issue 39's bar: the server's percentiles within 5 % of the client's on the same requests.
AGREEMENT = 0.05
# Output lengths: log-normal around 24 tokens (spread 0.3), 4 to 64: short answers keep a run short on two cores.
OUTPUT = Lengths(median=24, sigma=0.3, low=4, high=64)
PROMPT_SIGMA = 0.3
PROMPT_MAX = 2048
# After the probe's last token: Prometheus' scrape (1 s) and the operator's read before its window is whole.
SCRAPED_AFTER_S = 2.0
# Client percentiles shown live: requests whose first token (TTFT) or last token (TPOT) came in the last 10 s.
LIVE_WINDOW_S = 10.0


@dataclass(frozen=True)
class GenPlan:
    """The load's phases on the load clock (seconds)."""

    low_rps: float
    high_rps: float
    low_prompt: int
    high_prompt: int
    step_at_s: float
    high_end_s: float
    probe_at_s: float
    probe_end_s: float
    end_s: float

    @classmethod
    def build(cls, args: argparse.Namespace, window_s: float, interval_s: float) -> GenPlan:
        """Low for a quarter of the run, high for the rest; then the quiet gap and the probe, sized by the
        operator's window and tick interval."""
        duration = args.duration or (85.0 if args.quick else 180.0)
        step = round(duration / 4)
        probe_s = 10.0
        # The quiet gap: the window read after the probe must start after the high phase's last token (a request
        # sent at its end finishes a few seconds later).
        last_token_s = 5.0
        quiet = max(0.0, window_s - probe_s - SCRAPED_AFTER_S - last_token_s) + last_token_s
        probe_at = duration + quiet
        probe_end = probe_at + probe_s
        # Ends when a tick has read the whole probe (its last token + scrape) and before the window moves past it.
        end = probe_at + window_s - 1.0
        if end - (probe_end + last_token_s + SCRAPED_AFTER_S) < interval_s:
            raise DemoError(
                f"spec.slo.windowSeconds {window_s:g} is too short for the probe: it must hold {probe_s:g} s of probe, "
                f"its drain and one tick interval ({interval_s:g} s)"
            )
        return cls(args.low_rps, args.high_rps, args.low_prompt, args.high_prompt, step, duration, probe_at, probe_end,
                   end)  # fmt: skip

    def phases(self) -> list[Phase]:
        return [Phase(0, self.low_rps), Phase(self.step_at_s, self.high_rps), Phase(self.high_end_s, 0.0),
                Phase(self.probe_at_s, self.high_rps), Phase(self.probe_end_s, 0.0)]  # fmt: skip

    def prompt(self, t: float) -> Lengths:
        median = self.low_prompt if t < self.step_at_s else self.high_prompt
        return Lengths(median=median, sigma=PROMPT_SIGMA, low=16, high=PROMPT_MAX)


@dataclass
class GenTick:
    """One second of the live view (load clock)."""

    t: float
    offered_rps: float
    prompt_median: int
    replicas_ready: int
    replicas_desired: int | None
    ttft_status_ms: float | None
    tpot_status_ms: float | None
    ttft_client_ms: float | None
    tpot_client_ms: float | None
    tokens_per_second: float | None
    running: int | None
    waiting: int | None
    kv_percent: float | None
    slo: str
    change: str


@dataclass
class Window:
    """Client P99s over a set of requests, against the targets."""

    start_s: float
    end_s: float
    requests: int
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    within: bool


@dataclass
class GenSummary:
    """What the run showed; `passed` when every check held."""

    ttft_target_ms: float
    tpot_target_ms: float
    plan: dict[str, float]
    time_to_first_ready_s: float | None
    requests: int
    failed: int
    tokens: int
    before: Window
    high_all: Window
    after: Window
    probe: Window
    probe_status_ttft_ms: float | None
    probe_status_tpot_ms: float | None
    ttft_error: float | None
    tpot_error: float | None
    replicas_max: int
    decisions: list[str] = field(default_factory=list)
    passed: bool = False
    verdict: str = ""


def _p99(values: Sequence[float]) -> float | None:
    return percentile(list(values), 99.0)


def client_window(records: Sequence[StreamRecord], t0: float, start: float, end: float, targets: tuple[float, float],
                  ) -> Window:  # fmt: skip
    """The client's P99 TTFT and TPOT of the requests sent in [start, end) on the load clock (t0: its origin)."""
    chosen = [r for r in records if start <= r.sent - t0 < end and r.done and r.token_times]
    ttft = _p99([r.ttft_ms for r in chosen if r.ttft_ms is not None])
    tpot = _p99([r.tpot_ms for r in chosen if r.tpot_ms is not None])
    within = ttft is not None and tpot is not None and ttft <= targets[0] and tpot <= targets[1]
    return Window(start, end, len(chosen), ttft, tpot, within)


def _error(server: float | None, client: float | None) -> float | None:
    return None if server is None or not client else (server - client) / client


class GenerativeDemo(Demo):
    """The request demo's machinery with a generative service, the streaming client and TTFT/TPOT views."""

    def __init__(self, args: argparse.Namespace, console: Console, checkout: Checkout) -> None:
        example_path = checkout.examples / "demo-generative.yaml"
        example = yaml.safe_load(example_path.read_text())
        args.low_rps = args.low_rps if args.low_rps is not None else 1.5
        args.high_rps = args.high_rps if args.high_rps is not None else 4.0
        super().__init__(args, console, checkout, example)
        self.example_path = example_path
        slo = example["spec"]["slo"]
        self.ttft_ms = float(slo["ttft"]["targetMs"])
        self.tpot_ms = float(slo["tpot"]["targetMs"])
        self.window_s = float(slo["windowSeconds"])
        interval = float(example["spec"]["tuning"]["intervalSeconds"])
        self.gplan = GenPlan.build(args, self.window_s, interval)

    def apply_example(self, cluster: DemoCluster) -> None:
        doc: dict[str, Any] = json.loads(json.dumps(self.example))
        doc["spec"]["metrics"]["prometheusUrl"] = self.prometheus_url
        cluster.apply(doc)
        self.mark(f"applied {self.example_path.relative_to(self.checkout.root)} ({self.namespace}/{self.name})")

        def first_ready() -> bool:
            status = self.isvc(cluster).get("status", {})
            engine = _condition(status, "EngineReady")
            if engine and engine["status"] == "True" and "engine built (emulated)" not in self.timings:
                self.mark("engine built (emulated)")
            if engine and engine.get("reason") == "EngineBuildFailed":
                raise DemoError(f"engine build failed: {engine.get('message')}")
            ready = _condition(status, "Ready")
            if ready and ready.get("reason") in ("InvalidSpec", "InvalidModelConfig", "ChildRejected"):
                raise DemoError(f"{ready['reason']}: {ready.get('message')}")
            return bool(self.ready_pod_ips(cluster))

        self.wait("the first Ready Triton pod (behind its warmup)", 240.0, first_ready)
        self.mark("first Ready pod")
        self.first_ready_s = self.timings["first Ready pod"]

    def targets_now(self) -> list[str]:
        assert self.cluster is not None
        return [f"{ip}:{UPSTREAM_GRPC_PORT}" for ip in self.ready_pod_ips(self.cluster)]

    def gdrive(self, cluster: DemoCluster) -> tuple[list[GenTick], StreamingLoad, dict[str, Any], list[str]]:
        plan = self.gplan
        targets = self.targets_now()
        load = StreamingLoad(lambda: targets, self.model, plan.phases(), plan.probe_end_s, plan.prompt, OUTPUT,
                             seed=39, streams=2, drain_timeout_s=60.0)  # fmt: skip
        log(self.console, f"load: {plan.low_rps:g} req/s of {plan.low_prompt}-token prompts, stepping to "
            f"{plan.high_rps:g} req/s of {plan.high_prompt}-token prompts at {plan.step_at_s:g} s until "
            f"{plan.high_end_s:g} s; probe {plan.probe_at_s:g}-{plan.probe_end_s:g} s; targets P99 TTFT "
            f"{self.ttft_ms:g} ms, TPOT {self.tpot_ms:g} ms")  # fmt: skip
        runner = threading.Thread(target=load.run, name="streaming-load", daemon=True)
        runner.start()
        while load.started_at is None:
            time.sleep(0.05)
        t0 = load.started_at
        self.load_start_s = t0 - self.t0
        ticks: list[GenTick] = []
        decisions: list[str] = []
        last_change = ""
        probe_status: dict[str, Any] = {}
        live = Live(console=self.console, refresh_per_second=2, transient=False) if self.console.is_terminal else None
        with live if live is not None else contextlib.nullcontext():
            while True:
                time.sleep(1.0)
                t = time.monotonic() - t0
                targets[:] = self.targets_now()
                isvc = self.isvc(cluster)
                tick = self.gtick(isvc, load.snapshot(), t0, t, len(targets))
                if tick.change and tick.change != last_change:
                    last_change = tick.change
                    decisions.append(f"t={t:.0f} s: {tick.change}")
                ticks.append(tick)
                if t < plan.end_s:
                    probe_status = dict(isvc.get("status", {}).get("generative") or {})
                if live is not None:
                    live.update(self.gtable(tick))
                elif int(t) % 10 == 0:
                    self.console.print(_plain(tick, self.ttft_ms, self.tpot_ms), markup=False, highlight=False)
                if t >= plan.end_s and not runner.is_alive():
                    break
                if t > plan.end_s + 90:
                    raise DemoError("the streaming client did not finish 90 s after the run's end")
        return ticks, load, probe_status, decisions

    def gtick(self, isvc: dict[str, Any], records: list[StreamRecord], t0: float, t: float, ready: int) -> GenTick:
        status = isvc.get("status", {})
        gen = status.get("generative") or {}
        slo = _condition(status, "SLOMet") or {}
        now = t0 + t
        recent_first = [r.ttft_ms for r in records if r.ttft_ms is not None and now - r.token_times[0] <= LIVE_WINDOW_S]
        recent_done = [r.tpot_ms for r in records if r.done and r.tpot_ms is not None
                       and now - r.token_times[-1] <= LIVE_WINDOW_S]  # fmt: skip
        applied = (isvc.get("metadata", {}).get("annotations") or {}).get(APPLIED_ANNOTATION)
        try:
            change = str(json.loads(applied).get("reason") or "") if applied else ""
        except ValueError:
            change = ""
        return GenTick(
            t=round(t, 1),
            offered_rps=rate_at(self.gplan.phases(), t),
            prompt_median=self.gplan.prompt(t).median,
            replicas_ready=ready,
            replicas_desired=status.get("replicas", {}).get("desired"),
            ttft_status_ms=(gen.get("ttft") or {}).get("observedMs"),
            tpot_status_ms=(gen.get("tpot") or {}).get("observedMs"),
            ttft_client_ms=_p99(recent_first),
            tpot_client_ms=_p99(recent_done),
            tokens_per_second=gen.get("tokensPerSecond"),
            running=gen.get("runningSequences"),
            waiting=gen.get("waitingSequences"),
            kv_percent=gen.get("kvCacheUsedPercent"),
            slo=f"{slo.get('status', '?')} {slo.get('reason', '')}".strip(),
            change=change,
        )

    def gtable(self, tick: GenTick) -> Table:
        table = Table(title=f"tailtune demo --generative: {self.namespace}/{self.name}, t = {tick.t:.0f} s of "
                      f"{self.gplan.end_s:g} s", width=100)  # fmt: skip
        table.add_column("what", width=24, no_wrap=True)
        table.add_column("value", width=70, no_wrap=True, overflow="ellipsis")

        def vs(client: float | None, status: float | None, target: float) -> str:
            ok = client is not None and client <= target
            c = "n/a" if client is None else f"{client:.0f} ms"
            return f"[{'green' if ok else 'red'}]{c}[/] client 10 s / {_ms(status)} status / {target:g} ms target"

        table.add_row("offered", f"{tick.offered_rps:g} req/s, prompts ~{tick.prompt_median} tokens")
        table.add_row("P99 TTFT", vs(tick.ttft_client_ms, tick.ttft_status_ms, self.ttft_ms))
        table.add_row("P99 TPOT", vs(tick.tpot_client_ms, tick.tpot_status_ms, self.tpot_ms))
        table.add_row("tokens/s", _num(tick.tokens_per_second))
        table.add_row("running / waiting / KV", f"{tick.running} / {tick.waiting} / {_num(tick.kv_percent)} %")
        table.add_row("replicas ready/desired", f"{tick.replicas_ready}/{tick.replicas_desired}")
        table.add_row("SLOMet", tick.slo)
        table.add_row("last change", tick.change or "-")
        return table

    def run(self) -> int:
        summary: GenSummary | None = None
        with self.stack:
            self.prepare_workdir()
            cluster = self.cluster = self.up_cluster()
            self.install(cluster)
            self.start_components(cluster)
            self.apply_example(cluster)
            ticks, load, probe_status, decisions = self.gdrive(cluster)
            assert load.started_at is not None
            summary = self.summarize(load.snapshot(), load.started_at, ticks, probe_status, decisions)
            log(self.console, "tearing down")
        self.verify_nothing_left()
        if summary is None:
            return 1
        files = write_report(self.out, summary, ticks, load.snapshot(), load.started_at or 0.0)
        self.print_gsummary(summary, files)
        return 0 if summary.passed else 1

    def summarize(self, records: list[StreamRecord], t0: float, ticks: list[GenTick], probe_status: dict[str, Any],
                  decisions: list[str]) -> GenSummary:  # fmt: skip
        p = self.gplan
        targets = (self.ttft_ms, self.tpot_ms)
        before = client_window(records, t0, 0.0, p.step_at_s, targets)
        high_all = client_window(records, t0, p.step_at_s, p.high_end_s, targets)
        after = client_window(records, t0, max(p.step_at_s, p.high_end_s - self.window_s), p.high_end_s, targets)
        probe = client_window(records, t0, p.probe_at_s, p.probe_end_s, targets)
        s_ttft = (probe_status.get("ttft") or {}).get("observedMs")
        s_tpot = (probe_status.get("tpot") or {}).get("observedMs")
        e_ttft, e_tpot = _error(s_ttft, probe.ttft_p99_ms), _error(s_tpot, probe.tpot_p99_ms)
        failed = sum(1 for r in records if not r.done)
        tokens = sum(len(r.token_times) for r in records)
        agree = e_ttft is not None and e_tpot is not None and max(abs(e_ttft), abs(e_tpot)) <= AGREEMENT
        # The probe measures agreement; the targets are judged after the step (a tuner may give replicas back in the
        # quiet gap before it, and the probe is then a step of its own).
        checks = {
            "every request streamed to its end": failed == 0 and tokens > 0,
            "P99 TTFT/TPOT within targets after the step": after.within,
            f"status within {AGREEMENT:.0%} of the client on the probe": agree,
        }
        missed = [k for k, ok in checks.items() if not ok]
        return GenSummary(
            ttft_target_ms=self.ttft_ms, tpot_target_ms=self.tpot_ms, plan=asdict(p),
            time_to_first_ready_s=self.first_ready_s, requests=len(records), failed=failed, tokens=tokens,
            before=before, high_all=high_all, after=after, probe=probe,
            probe_status_ttft_ms=s_ttft, probe_status_tpot_ms=s_tpot, ttft_error=e_ttft, tpot_error=e_tpot,
            replicas_max=max((k.replicas_ready for k in ticks), default=0), decisions=decisions,
            passed=not missed, verdict="PASS" if not missed else "FAIL: " + "; ".join(missed),
        )  # fmt: skip

    def print_gsummary(self, s: GenSummary, files: list[Path]) -> None:
        c = self.console

        def w(label: str, win: Window) -> None:
            c.print(f"{label}: {win.requests} requests, P99 TTFT {_ms(win.ttft_p99_ms)}, TPOT {_ms(win.tpot_p99_ms)} "
                    f"(targets {s.ttft_target_ms:g} / {s.tpot_target_ms:g} ms)")  # fmt: skip

        c.print()
        c.print(f"time from command to first Ready pod (behind warmup): {_num(s.time_to_first_ready_s)} s")
        c.print(f"requests {s.requests}, unfinished {s.failed}, tokens streamed {s.tokens}")
        w("before the step", s.before)
        w("the whole high phase", s.high_all)
        w("after the step (its last window)", s.after)
        w("probe", s.probe)
        c.print(f"status vs client on the probe: TTFT {_ms(s.probe_status_ttft_ms)} ({_pct(s.ttft_error)}), "
                f"TPOT {_ms(s.probe_status_tpot_ms)} ({_pct(s.tpot_error)})")  # fmt: skip
        c.print(f"replicas at most {s.replicas_max}; changes: {'; '.join(s.decisions) or 'none'}")
        c.print(f"report: {', '.join(str(f) for f in files)}")
        c.print(f"[bold {'green' if s.passed else 'red'}]{s.verdict}[/]")


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1%}"


def _plain(tick: GenTick, ttft: float, tpot: float) -> str:
    return (f"t={tick.t:.0f} s: {tick.offered_rps:g} req/s ~{tick.prompt_median} tokens; P99 TTFT client "
            f"{_ms(tick.ttft_client_ms)} status {_ms(tick.ttft_status_ms)} / {ttft:g}; TPOT client "
            f"{_ms(tick.tpot_client_ms)} status {_ms(tick.tpot_status_ms)} / {tpot:g}; replicas "
            f"{tick.replicas_ready}/{tick.replicas_desired}; {tick.slo}")  # fmt: skip


def write_report(out: Path, s: GenSummary, ticks: Sequence[GenTick], records: Sequence[StreamRecord], t0: float
                 ) -> list[Path]:  # fmt: skip
    """summary.json, summary.md, timeline.json and report.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(asdict(s), indent=2) + "\n")
    (out / "timeline.json").write_text(json.dumps([asdict(t) for t in ticks]) + "\n")
    rows = [("before the step", s.before), ("high phase", s.high_all), ("after the step", s.after), ("probe", s.probe)]
    md = ["# tailtune demo --generative", "", f"**{s.verdict}**", "",
          "| window | requests | P99 TTFT ms | P99 TPOT ms |", "|---|---|---|---|"]  # fmt: skip
    md += [f"| {n} ({w.start_s:g}-{w.end_s:g} s) | {w.requests} | {_ms(w.ttft_p99_ms)} | {_ms(w.tpot_p99_ms)} |"
           for n, w in rows]  # fmt: skip
    md += ["", f"targets: P99 TTFT {s.ttft_target_ms:g} ms, P99 TPOT {s.tpot_target_ms:g} ms; status on the probe: "
           f"TTFT {_ms(s.probe_status_ttft_ms)} ({_pct(s.ttft_error)}), TPOT {_ms(s.probe_status_tpot_ms)} "
           f"({_pct(s.tpot_error)}); replicas at most {s.replicas_max}"]  # fmt: skip
    (out / "summary.md").write_text("\n".join(md) + "\n")
    png = out / "report.png"
    plot(png, s, ticks, records, t0)
    return [png, out / "summary.json", out / "summary.md", out / "timeline.json"]


def plot(path: Path, s: GenSummary, ticks: Sequence[GenTick], records: Sequence[StreamRecord], t0: float) -> None:
    """Four panels on the load clock: TTFT and TPOT (client P99 per 5 s, status) vs targets, load, replicas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True, gridspec_kw={"height_ratios": [3, 3, 1.5, 1.2]})
    ax_ttft, ax_tpot, ax_load, ax_rep = axes
    fig.suptitle(f"tailtune demo --generative (emulated LLM): {s.verdict}", fontsize=10)
    bins: dict[int, list[StreamRecord]] = {}
    for r in records:
        if r.done and r.token_times:
            bins.setdefault(int((r.sent - t0) // 5) * 5, []).append(r)
    xs = sorted(bins)
    for ax, attr, status_attr, target, label in (
        (ax_ttft, "ttft_ms", "ttft_status_ms", s.ttft_target_ms, "TTFT"),
        (ax_tpot, "tpot_ms", "tpot_status_ms", s.tpot_target_ms, "TPOT"),
    ):
        pts = [(x + 2.5, _p99([getattr(r, attr) for r in bins[x] if getattr(r, attr) is not None])) for x in xs]
        ax.plot([x for x, v in pts if v is not None], [v for _, v in pts if v is not None], "o-", markersize=3,
                label=f"P99 {label}, client, requests sent per 5 s", color="tab:blue")  # fmt: skip
        st = [(k.t, getattr(k, status_attr)) for k in ticks if getattr(k, status_attr) is not None]
        if st:
            ax.plot(*zip(*st, strict=True), label=f"P99 {label} in status.generative (operator's window)",
                    color="tab:purple", alpha=0.8)  # fmt: skip
        ax.axhline(target, color="tab:red", linestyle="--", label=f"target {target:g} ms")
        ax.set_ylabel(f"{label} (ms)")
        ax.set_ylim(bottom=0)
    ax_load.plot([k.t for k in ticks], [k.offered_rps for k in ticks], color="black", label="offered req/s")
    ax_prompt = ax_load.twinx()
    ax_prompt.plot([k.t for k in ticks], [k.prompt_median for k in ticks], color="tab:orange", linestyle=":",
                   label="prompt median (tokens)")  # fmt: skip
    ax_prompt.set_ylabel("prompt tokens")
    ax_prompt.legend(loc="upper right", fontsize=8)
    ax_load.set_ylabel("req/s")
    ax_rep.step([k.t for k in ticks], [k.replicas_ready for k in ticks], where="post", label="replicas ready")
    want = [(k.t, k.replicas_desired) for k in ticks if k.replicas_desired is not None]
    if want:
        ax_rep.step(*zip(*want, strict=True), where="post", linestyle="--", color="tab:gray", label="desired")
    ax_rep.set_ylabel("replicas")
    ax_rep.set_xlabel("seconds since the load started")
    p = s.plan
    for ax in axes:
        ax.axvline(p["step_at_s"], color="black", alpha=0.5)
        ax.axvspan(p["probe_at_s"], p["probe_end_s"], color="tab:green", alpha=0.08)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8, framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The generative run's own options (beside the request demo's)."""
    p.add_argument("--low-prompt", type=int, default=256, help="--generative: prompt tokens before the step")
    p.add_argument("--high-prompt", type=int, default=1024, help="--generative: prompt tokens after the step")
