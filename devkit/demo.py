"""`tailtune demo`: the whole loop on one machine, every part real except the GPU.

    python -m devkit.demo [--quick | --duration S] [--low-rps R] [--high-rps R] [--out DIR] [--generative]

With --generative, a generative service (examples/demo-generative.yaml) on the EMULATED LLM: devkit.llm.demo.

Runs from a tailtune checkout (devkit.checkout). Brings up the local cluster (devkit.cluster), installs the
CRD, an engine-store PV/PVC, starts the process runtime (devkit.runtime: real tritonserver per pod, EMULATED
accelerator), a real Prometheus, and the operator; applies examples/demo.yaml (the model file is served from
127.0.0.1); waits for the first Ready pod; sends open-loop Poisson load that steps from --low-rps to
--high-rps; shows a live table; writes report.png, summary.json/.md and timeline.json under --out (default
out/demo/); tears everything down on exit or Ctrl-C. Exit 0 when the client-side P99 is under the SLO after
the step.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from devkit.checkout import Checkout, CheckoutNotFound, find_checkout
from devkit.cluster import LocalCluster
from devkit.kubeclient import ApiError, KubeClient
from devkit.load import Buckets, LoadGenerator, Phase, infer_body, rate_at
from devkit.procs import Process, kill_recorded, recorded_alive
from devkit.prometheus import PodDiscovery, render_config, scalar, start_prometheus
from devkit.report import Decision, Summary, Tick, summarize, write_report
from devkit.runtime import FAULTS_DIR, UPSTREAM_HTTP_PORT
from devkit.triton.onnx_models import build_mlp
from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.keys import TUNER_STATE_ANNOTATION as STATE_ANNOTATION
from tailtune.tuner.types import InForce

MODEL_PATH = "/models/mlp-16x64x16.onnx"
TRITON_COMPONENT = "app.kubernetes.io/component=triton"
READY_TIMEOUT_S = 240.0


class DemoError(RuntimeError):
    """The demo cannot go on; the message says where and why."""


@dataclass(frozen=True)
class Plan:
    """The load: `low_rps` until `step_at_s`, then `high_rps` until `duration_s`."""

    low_rps: float
    high_rps: float
    step_at_s: float
    duration_s: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        duration = args.duration or (120.0 if args.quick else 240.0)
        step = max(20.0, round(duration / 4))
        if duration < step + 45:
            raise DemoError(f"--duration {duration:g} s is too short: the step comes at {step:g} s")
        return cls(args.low_rps, args.high_rps, step, duration)


def log(console: Console, message: str) -> None:
    console.print(f"[bold cyan]demo[/] {message}", highlight=False)


def free_port(preferred: int) -> int:
    """`preferred` when it is free on 127.0.0.1, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise DemoError("no free port on 127.0.0.1")


# -------------------------------------------------------------------------------------------- manifests


def engine_store_manifests(namespace: str, claim: str, host_dir: Path) -> list[dict[str, Any]]:
    """A hostPath PV bound to the engine-store claim (the runtime maps it to `host_dir`). Pure."""
    pv_name = f"{namespace}-{claim}"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(host_dir)},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
    ]


def demo_service(example: dict[str, Any], model_url: str, sha256: str, prometheus_url: str) -> dict[str, Any]:
    """examples/demo.yaml with the model URI, its digest and the Prometheus URL this run uses. Pure."""
    doc: dict[str, Any] = json.loads(json.dumps(example))
    doc["spec"]["model"]["uri"] = model_url
    doc["spec"]["model"]["sha256"] = sha256
    doc["spec"].setdefault("metrics", {})["prometheusUrl"] = prometheus_url
    return doc


# ------------------------------------------------------------------------------------------- services


class ModelServer:
    """Serves one file over HTTP on 127.0.0.1 (the model URI of the InferenceService)."""

    def __init__(self, path: str, data: bytes, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                found = self.path == path
                body = data if found else b"not found\n"
                self.send_response(200 if found else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="model-server", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class DemoCluster:
    """The local cluster this run brought up, with kubectl and the harness's API client bound to it."""

    kubeconfig: Path
    bin_dir: Path
    kube: KubeClient = field(repr=False)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))

    def raw(self, path: str) -> dict[str, Any] | None:
        """GET an API path as JSON; None on 404."""
        try:
            return self.kube.raw(path)
        except ApiError as exc:
            raise DemoError(f"GET {path}: HTTP {exc.status}") from exc


# ---------------------------------------------------------------------------------------------- the demo


class Demo:
    """One run; `run()` returns the exit code. Every start registers its stop on `self.stack`."""

    def __init__(
        self, args: argparse.Namespace, console: Console, checkout: Checkout, example: dict[str, Any] | None = None
    ) -> None:
        """`example`: the InferenceService to apply instead of examples/demo.yaml (the tests' variants)."""
        self.args = args
        self.checkout = checkout
        self.example_path = checkout.examples / "demo.yaml"
        self.console = console
        self.plan = Plan.from_args(args)
        self.t0 = time.monotonic()
        self.work: Path = args.workdir.resolve()
        self.out: Path = args.out.resolve()
        self.pid_dir = self.work / "pids"
        self.runtime_pids = self.work / "runtime" / "pids"
        self.timings: dict[str, float] = {}
        self.stack = contextlib.ExitStack()
        self.example: dict[str, Any] = example or yaml.safe_load(self.example_path.read_text())
        self.namespace: str = self.example["metadata"].get("namespace", "default")
        self.name: str = self.example["metadata"]["name"]
        self.model: str = self.example["spec"]["model"].get("name") or self.name
        self.slo_ms = float(self.example["spec"]["slo"]["latencyMs"])
        self.cluster: DemoCluster | None = None
        self.prometheus_url = ""
        self.targets: list[str] = []
        self.first_ready_s: float | None = None
        self.load_start_s = 0.0  # command clock -> load clock, the report's one origin
        self.procs: list[Process] = []
        self.operator: Process | None = None
        self.operator_env: dict[str, str] = {}

    # ---- steps ---------------------------------------------------------------------------------------
    def mark(self, what: str) -> None:
        self.timings[what] = time.monotonic() - self.t0
        log(self.console, f"{what} at +{self.timings[what]:.1f} s")

    def prepare_workdir(self) -> None:
        for pid_dir in (self.pid_dir, self.runtime_pids):
            stale = kill_recorded(pid_dir)
            if stale:
                log(self.console, f"ended {len(stale)} processes left by an earlier run: {stale}")
        for sub in ("runtime", "prometheus", "engines", "logs"):
            shutil.rmtree(self.work / sub, ignore_errors=True)
        for sub in ("pids", "logs", "engines"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)

    def cluster_command(self, command: str) -> int:
        """`python -m devkit.cluster COMMAND` on this run's state dir, logging to logs/cluster.log."""
        env = {
            **os.environ,
            "TAILTUNE_CLUSTER_DIR": str(self.work / "cluster"),
            "TAILTUNE_CHECKOUT": str(self.checkout.root),
        }
        with (self.work / "logs" / "cluster.log").open("ab") as out:
            argv = [sys.executable, "-m", "devkit.cluster", command]
            return subprocess.run(argv, env=env, cwd=self.checkout.root, stdout=out, stderr=out, check=False).returncode

    def up_cluster(self) -> DemoCluster:
        self.stack.callback(self.down_cluster)  # also after a half-finished `up`
        if self.cluster_command("up") != 0:
            raise DemoError(f"python -m devkit.cluster up failed; see {self.work / 'logs' / 'cluster.log'}")
        local = LocalCluster.load(self.work / "cluster" / "cluster.json")
        cluster = DemoCluster(Path(local.kubeconfig), Path(local.bin_dir), KubeClient.from_kubeconfig(local.kubeconfig))
        self.mark("cluster up")
        return cluster

    def down_cluster(self) -> None:
        self.cluster_command("down")

    def install(self, cluster: DemoCluster) -> None:
        crds = sorted(self.checkout.crds.glob("*.yaml"))
        cluster.kubectl("apply", "--server-side", "--force-conflicts", *(f"--filename={f}" for f in crds))

        def established() -> bool:
            crds = cluster.raw("/apis/apiextensions.k8s.io/v1/customresourcedefinitions") or {}
            return bool(crds.get("items")) and all(
                (_condition(crd.get("status") or {}, "Established") or {}).get("status") == "True"
                for crd in crds["items"]
            )

        self.wait("the CRDs Established", 60, established)
        claim = self.example["spec"].get("engine", {}).get("store", {}).get("pvc", "tailtune-engines")
        cluster.apply(*engine_store_manifests(self.namespace, claim, self.work / "engines"))
        self.wait("the namespace's default ServiceAccount", 60, lambda: cluster.raw(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default") is not None)  # fmt: skip
        self.mark("CRD, namespace and engine store installed")

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Process:
        log_path = self.work / "logs" / f"{name}.log"
        proc = Process.start(argv, log_path=log_path, env=env, cwd=self.checkout.root, pid_dir=self.pid_dir, name=name)
        self.procs.append(proc)
        self.stack.callback(self.stop_process, proc)
        return proc

    def stop_process(self, proc: Process) -> None:
        code = proc.stop(grace_s=20.0)
        log(self.console, f"stopped {proc.name} (exit {code})")

    def start_components(self, cluster: DemoCluster) -> None:
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONUNBUFFERED": "1"}
        # The model file, served from 127.0.0.1 as the model URI.
        data = build_mlp(16, 64, 16, 0)
        self.model_server = ModelServer(MODEL_PATH, data, free_port(18080))
        self.stack.callback(self.model_server.stop)
        self.sha256 = hashlib.sha256(data).hexdigest()
        # The runtime: our nodes, real processes.
        runtime_argv = [
            sys.executable, "-m", "devkit.runtime", "--kubeconfig", str(cluster.kubeconfig),
            "--workdir", str(self.work / "runtime"),
        ]  # fmt: skip
        runtime = self.start("runtime", runtime_argv, env)
        # Prometheus, discovering pods through the API server.
        discovery = PodDiscovery(lambda: cluster.kube.list_namespaced_pods(self.namespace))
        discovery.start()
        self.stack.callback(discovery.stop)
        port = free_port(19090)
        prom = start_prometheus(render_config(discovery.url), self.work / "prometheus", port, self.pid_dir)
        self.procs.append(prom)
        self.stack.callback(self.stop_process, prom)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        self.operator_env = env
        self.start_operator()
        self.wait("the runtime's nodes Ready", 60, lambda: self.nodes_ready(cluster, runtime))
        self.mark("runtime, Prometheus and operator started")

    def start_operator(self) -> Process:
        """Start the operator (again, after `stop_operator`); its log goes on in logs/operator.log."""
        operator = shlex.split(self.args.operator_command) if self.args.operator_command else [
            sys.executable, "-m", "devkit.operator", "--namespace", self.namespace,
        ]  # fmt: skip
        self.operator = self.start("operator", operator, self.operator_env)
        return self.operator

    def stop_operator(self, *, kill: bool = False) -> int:
        """Stop the operator (SIGTERM, or SIGKILL with `kill`: a crash, nothing it holds in memory survives);
        `start_operator` starts a new one. Returns its exit code."""
        if self.operator is None:
            raise DemoError("no operator running")
        proc, self.operator = self.operator, None
        self.procs.remove(proc)
        return proc.kill() if kill else proc.stop(grace_s=20.0)

    @property
    def faults_dir(self) -> Path:
        """Where a test arms reload faults for the runtime's pods (`devkit.faults`)."""
        return self.work / "runtime" / FAULTS_DIR

    def nodes_ready(self, cluster: DemoCluster, runtime: Process) -> bool:
        if runtime.poll() is not None:
            raise DemoError(f"the runtime exited:\n{self.tail('runtime')}")
        nodes = cluster.raw("/api/v1/nodes?labelSelector=dev.tailtune.io/local-runtime%3Dtrue") or {}
        items = nodes.get("items", [])
        return bool(items) and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            and not n["spec"].get("taints")
            for n in items
        )

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.work / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait(self, what: str, timeout_s: float, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            for proc in self.procs:
                if proc.poll() is not None:
                    raise DemoError(
                        f"{proc.name} exited with {proc.poll()} while waiting for {what}:\n{self.tail(proc.name)}"
                    )
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.5)

    def isvc(self, cluster: DemoCluster) -> dict[str, Any]:
        path = f"/apis/tailtune.io/v1alpha1/namespaces/{self.namespace}/inferenceservices/{self.name}"
        return cluster.raw(path) or {}

    def ready_pod_ips(self, cluster: DemoCluster) -> list[str]:
        pods = cluster.raw(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={TRITON_COMPONENT}") or {}
        ips = []
        for pod in pods.get("items", []):
            status = pod.get("status", {})
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
            if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
                ips.append(status["podIP"])
        return sorted(ips)

    def apply_example(self, cluster: DemoCluster) -> None:
        doc = demo_service(self.example, self.model_server.url, self.sha256, self.prometheus_url)
        cluster.apply(doc)
        self.mark(f"applied {self.example_path.relative_to(self.checkout.root)} ({self.namespace}/{self.name})")

        def first_ready() -> bool:
            status = self.isvc(cluster).get("status", {})
            engine = _condition(status, "EngineReady")
            if engine and engine["status"] == "True" and "engine built" not in self.timings:
                self.mark("engine built")
            if engine and engine.get("reason") == "EngineBuildFailed":
                raise DemoError(f"engine build failed: {engine.get('message')}")
            return bool(self.ready_pod_ips(cluster))

        self.wait("the first Ready Triton pod", READY_TIMEOUT_S, first_ready)
        self.mark("first Ready pod")
        self.first_ready_s = self.timings["first Ready pod"]

    # ---- load and live view ------------------------------------------------------------------------
    def drive(self, cluster: DemoCluster) -> tuple[list[Tick], list[Decision], LoadGenerator]:
        plan = self.plan
        spec_input = self.example["spec"]["model"]["inputs"][0]
        load = LoadGenerator(
            [Phase(0, plan.low_rps), Phase(plan.step_at_s, plan.high_rps)],
            plan.duration_s,
            lambda: self.targets,
            self.model,
            infer_body(spec_input["name"], spec_input["dims"]),
        )
        ips = self.ready_pod_ips(cluster)
        self.targets = [f"{ip}:{UPSTREAM_HTTP_PORT}" for ip in ips]
        buckets = Buckets()
        ticks: list[Tick] = []
        decisions: list[Decision] = []
        log(self.console, f"load: {plan.low_rps:g} req/s, stepping to {plan.high_rps:g} req/s at "
            f"{plan.step_at_s:g} s, for {plan.duration_s:g} s (SLO P99 {self.slo_ms:g} ms)")  # fmt: skip
        load.start()
        self.stack.callback(load.stop)
        wall_start = time.time()
        self.load_start_s = time.monotonic() - self.t0
        last_change = self.last_change(self.isvc(cluster))
        prom_p99: float | None = None
        prom_rps: float | None = None
        live = Live(console=self.console, refresh_per_second=2, transient=False) if self.console.is_terminal else None
        with live if live is not None else contextlib.nullcontext():
            while not load.done():
                time.sleep(1.0)
                t = load.elapsed()
                ips = self.ready_pod_ips(cluster)
                self.targets = [f"{ip}:{UPSTREAM_HTTP_PORT}" for ip in ips]
                if int(t) % 2 == 0:
                    sel = f'namespace="{self.namespace}",model="{self.model}"'
                    summary_p99 = f'max(nv_inference_request_summary_us{{{sel},quantile="0.99"}}) / 1000'
                    prom_p99 = scalar(self.prometheus_url, summary_p99)
                    prom_rps = scalar(self.prometheus_url, f"sum(rate(nv_inference_request_success{{{sel}}}[10s]))")
                isvc = self.isvc(cluster)
                tick = self.tick(isvc, ips, t, prom_p99, prom_rps)
                change = self.last_change(isvc)
                if change is not None and change != last_change:
                    last_change = change
                    at = max(0.0, round(change[0] - wall_start, 1))
                    # The reason code says which step this is (a canary started, promoted, rolled back, or a
                    # scale): a promotion repeats the reason of the change it promotes.
                    said = f"{tick.tuner}: {tick.decision}" if tick.tuner else tick.decision
                    decisions.append(Decision(at, change[1], said))
                ticks.append(tick)
                buckets.update(load.samples)
                now = int(t)
                client = buckets.stats(max(0, now - 5), now)
                if live is not None:
                    live.update(self.table(tick, client.p99_ms, buckets.completed(now - 5, now) / 5, t))
                elif now % 10 == 0:
                    self.console.print(
                        _plain_line(tick, client.p99_ms, buckets.completed(now - 5, now) / 5, self.slo_ms),
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
        return ticks, decisions, load

    @staticmethod
    def last_change(isvc: dict[str, Any]) -> tuple[float, str] | None:
        """(UNIX time, config) of the tuner's last change, from the config in force it records on the object."""
        raw = (isvc.get("metadata", {}).get("annotations") or {}).get(APPLIED_ANNOTATION)
        try:
            config = InForce.from_annotation(raw) if raw else None
        except ValueError:
            return None
        if config is None or config.changed_at is None:
            return None
        b = config.batching
        return (
            config.changed_at.timestamp(),
            f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us, {config.replicas} replicas",
        )

    def live_knobs(self, ips: list[str]) -> tuple[int | None, int | None]:
        """max_batch_size and the queue delay Triton serves with now (the first ready pod)."""
        for ip in ips:
            url = f"http://{ip}:{UPSTREAM_HTTP_PORT}/v2/models/{self.model}/config"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    cfg = json.loads(response.read())
            except (urllib.error.URLError, OSError, ValueError):
                continue
            delay = cfg.get("dynamic_batching", {}).get("max_queue_delay_microseconds")
            return cfg.get("max_batch_size"), None if delay is None else int(delay)
        return None, None

    def tick(
        self, isvc: dict[str, Any], ips: list[str], t: float, prom_p99: float | None, prom_rps: float | None
    ) -> Tick:
        status = isvc.get("status", {})
        annotations = isvc.get("metadata", {}).get("annotations") or {}
        try:
            tuner = json.loads(annotations.get(STATE_ANNOTATION) or "{}").get("last_reason_code", "")
            applied = json.loads(annotations.get(APPLIED_ANNOTATION) or "{}")
        except ValueError:
            tuner, applied = "", {}
        ready = _condition(status, "Ready") or {}
        slo = _condition(status, "SLOMet") or {}
        max_batch, delay = self.live_knobs(ips)
        breakdown = status.get("latency", {}).get("breakdown") or {}
        steps = [breakdown.get(k) for k in ("computeInputMs", "computeInferMs", "computeOutputMs")]
        compute = round(sum(float(v) for v in steps if v is not None), 3) if None not in steps else None
        return Tick(
            t=round(t, 2),
            offered_rps=rate_at([Phase(0, self.plan.low_rps), Phase(self.plan.step_at_s, self.plan.high_rps)], t),
            phase=f"{ready.get('reason', '?')}; SLOMet={slo.get('status', '?')}",
            max_batch=max_batch,
            delay_us=delay,
            replicas_desired=status.get("replicas", {}).get("desired"),
            replicas_ready=len(ips),
            status_p99_ms=status.get("latency", {}).get("observedMs"),
            prom_p99_ms=prom_p99,
            prom_rps=prom_rps,
            tuner=str(tuner or ""),
            decision=str(applied.get("reason") or ""),
            queue_ms=breakdown.get("queueMs"),
            compute_ms=compute,
            rest_ms=breakdown.get("restMs"),
        )

    def table(self, tick: Tick, client_p99: float | None, client_rps: float, t: float) -> Table:
        return live_table(
            tick, client_p99, client_rps, t=t, duration_s=self.plan.duration_s, name=f"{self.namespace}/{self.name}",
            slo_ms=self.slo_ms,
        )  # fmt: skip

    # ---- run ---------------------------------------------------------------------------------------
    def run(self) -> int:
        summary: Summary | None = None
        code = 1
        with self.stack:
            self.prepare_workdir()
            cluster = self.cluster = self.up_cluster()
            self.install(cluster)
            self.start_components(cluster)
            self.apply_example(cluster)
            ticks, decisions, load = self.drive(cluster)
            samples = load.samples.snapshot()
            summary = summarize(
                samples, ticks, decisions,
                slo_ms=self.slo_ms, step_at=self.plan.step_at_s, low_rps=self.plan.low_rps,
                high_rps=self.plan.high_rps, end_s=self.plan.duration_s,
                time_to_first_ready_s=self.first_ready_s, timings_s=self.timings,
                load_start_s=load.started_at - self.t0 if load.started_at is not None else self.load_start_s,
            )  # fmt: skip
            log(self.console, "tearing down")
        self.verify_nothing_left()
        if summary is not None:
            files = write_report(self.out, summary, ticks, samples)
            self.print_summary(summary, files)
            code = 0 if summary.passed else 1
        return code

    def verify_nothing_left(self) -> None:
        left = recorded_alive(self.pid_dir) + recorded_alive(self.runtime_pids)
        if left:
            log(self.console, f"[red]processes still running after teardown: {left}; ending them[/]")
            kill_recorded(self.pid_dir)
            kill_recorded(self.runtime_pids)
        else:
            log(self.console, "teardown complete: no process left")

    def print_summary(self, s: Summary, files: list[Path]) -> None:
        c = self.console
        c.print()
        c.print(f"times below are on the load clock: t = 0 is the load's start, {s.load_start_s:g} s after the command")
        ready = s.time_to_first_ready_s
        c.print(f"time from command to first Ready pod: {_num(ready)} s"
                + ("" if ready is None else f" (t = {ready - s.load_start_s:.0f} s)"))  # fmt: skip
        c.print(f"time to settle after the load step:   {_num(s.settle_s)} s (step at t = {s.step_at_s:g} s)")
        c.print(f"at {s.low_rps:g} req/s offered, initial config: served {s.before.throughput_rps:g} req/s at P99 "
                f"{_ms(s.before.p99_ms)}")  # fmt: skip
        u = s.untuned_high
        if u is None:
            c.print(f"throughput before tuning: n/a at {s.high_rps:g} req/s offered (the tuner changed the config "
                    "within 3 s of the step)")  # fmt: skip
        else:
            p99 = _ms(u.p99_ms) if u.p99_ms is not None else "unbounded (requests failed)"
            c.print(f"throughput before tuning: {u.throughput_rps:g} req/s at P99 {p99} ({s.high_rps:g} req/s "
                    f"offered, initial config, t = {u.start_s:.0f}-{u.end_s:.0f} s)")  # fmt: skip
        c.print(f"throughput after tuning:  {s.after.throughput_rps:g} req/s at P99 {_ms(s.after.p99_ms)} "
                f"({s.high_rps:g} req/s offered, t = {s.after.start_s:.0f}-{s.after.end_s:.0f} s; SLO "
                f"{s.slo_ms:g} ms; {s.final_config})")  # fmt: skip
        c.print(f"report: {', '.join(str(f) for f in files)}")
        c.print(f"[bold {'green' if s.passed else 'red'}]{s.verdict}[/]")


TABLE_WIDTH = 80
# A number and its unit stay on one line when a value wraps.
_NUMBER_UNIT = re.compile(r"(\d[\d.,]*) (ms|us|s|req/s|%|replicas?)\b")


def _wrap(text: str, width: int) -> str:
    """`text` wrapped at `width` without breaking a number from its unit."""
    glued = _NUMBER_UNIT.sub(lambda m: f"{m.group(1)}\x00{m.group(2)}", text)
    lines = textwrap.wrap(glued, width, break_long_words=True, break_on_hyphens=False) or [""]
    return "\n".join(lines).replace("\x00", " ")


def live_table(
    tick: Tick, client_p99: float | None, client_rps: float, *, t: float, duration_s: float, name: str, slo_ms: float
) -> Table:
    """The live view, at most TABLE_WIDTH columns wide; times on the load clock, as in the report. Pure."""
    label_w = 22
    value_w = TABLE_WIDTH - label_w - 7  # borders and padding: "│ label │ value │"
    table = Table(title=_wrap(f"tailtune demo: {name}, t = {t:.0f} s of {duration_s:g} s of load", TABLE_WIDTH),
                  show_header=True, header_style="bold", width=TABLE_WIDTH)  # fmt: skip
    table.add_column("what", width=label_w, no_wrap=True)
    table.add_column("value", width=value_w, no_wrap=True, overflow="ellipsis")
    ok = client_p99 is not None and client_p99 <= slo_ms
    p99 = "n/a" if client_p99 is None else f"{client_p99:.1f} ms"
    rows = [
        ("phase", escape(_wrap(tick.phase, value_w))),
        ("P99 client 5 s / SLO", f"[{'green' if ok else 'red'}]{p99}[/] / {slo_ms:g} ms"),
        ("P99 Prometheus 60 s", _ms(tick.prom_p99_ms)),
        ("P99 in status", _ms(tick.status_p99_ms)),
        ("max batch / delay", f"{tick.max_batch} / {tick.delay_us} us (live in Triton)"),
        ("replicas ready/desired", f"{tick.replicas_ready}/{tick.replicas_desired}"),
        ("req/s offered/served", f"{tick.offered_rps:g} / {client_rps:.0f} (Prometheus {_num(tick.prom_rps)})"),
        ("tuner's last verdict", escape(_wrap(tick.tuner or "-", value_w))),
        ("last change", escape(_wrap(tick.decision or "-", value_w))),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            found: dict[str, Any] = c
            return found
    return None


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def _plain_line(tick: Tick, client_p99: float | None, client_rps: float, slo_ms: float) -> str:
    """The live view without a terminal: wrapped at TABLE_WIDTH, numbers kept with their units."""
    line = (
        f"t={tick.t:.0f} s: offered {tick.offered_rps:g} req/s, served {client_rps:.0f} req/s; P99 client "
        f"{_ms(client_p99)} (Prometheus {_ms(tick.prom_p99_ms)}) vs SLO {slo_ms:g} ms; batch {tick.max_batch}, "
        f"delay {tick.delay_us} us, replicas {tick.replicas_ready}/{tick.replicas_desired}; tuner {tick.tuner or '-'}; "
        f"{tick.phase}"
    )
    first, *rest = _wrap(line, TABLE_WIDTH).splitlines()
    more = _wrap(" ".join(rest), TABLE_WIDTH - 2).splitlines() if rest else []
    return "\n".join([first, *(f"  {m}" for m in more)])


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the demo like Ctrl-C does: through the teardown."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def parser(checkout: Checkout) -> argparse.ArgumentParser:
    from devkit.llm.demo import add_arguments as add_generative_arguments  # it builds on this module's Demo

    p = argparse.ArgumentParser(
        prog="tailtune demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a shortened run (120 s of load)")
    p.add_argument("--duration", type=float, help="seconds of load (default 240, --quick 120); the step is at 1/4")
    p.add_argument("--low-rps", type=float, help="load before the step (req/s; default 30, --generative 1.5)")
    p.add_argument("--high-rps", type=float, help="load after the step (req/s; default 100, --generative 4)")
    p.add_argument(
        "--generative",
        action="store_true",
        help="a generative service instead (examples/demo-generative.yaml, the EMULATED LLM; devkit.llm.demo)",
    )
    add_generative_arguments(p)
    p.add_argument("--out", type=Path, default=checkout.root / "out" / "demo", help="report folder")
    p.add_argument("--workdir", type=Path, default=checkout.cache / "demo", help="cluster state, logs, engines")
    p.add_argument(
        "--operator-command", help="command that runs the operator (default: `tailtune operator` with INFO logs)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when its check passed, 1 when not, 2 when it cannot start, 130 when interrupted."""
    try:
        checkout = find_checkout()
    except CheckoutNotFound as exc:
        print(f"tailtune demo: {exc}", file=sys.stderr)
        return 2
    args = parser(checkout).parse_args(argv)
    from devkit.llm.demo import GenerativeDemo  # it builds on this module's Demo

    console = Console()
    try:
        if args.generative:
            demo: Demo = GenerativeDemo(args, console, checkout)
        else:
            args.low_rps = 30.0 if args.low_rps is None else args.low_rps
            args.high_rps = 100.0 if args.high_rps is None else args.high_rps
            demo = Demo(args, console, checkout)
    except DemoError as exc:
        console.print(f"[red]demo: {exc}[/]")
        return 2
    try:
        with _signals_interrupt():
            return demo.run()
    except KeyboardInterrupt:
        console.print("[yellow]demo interrupted; everything was torn down[/]")
        demo.verify_nothing_left()
        return 130
    except (DemoError, sys.modules["devkit.demo"].DemoError) as exc:  # run as __main__, two module objects
        console.print(f"[red]demo failed: {exc}[/]")
        console.print(f"logs: {demo.work / 'logs'}")
        demo.verify_nothing_left()
        return 1
    except Exception:
        console.print_exception()
        console.print(f"[red]demo failed (a bug); logs: {demo.work / 'logs'}[/]")
        demo.verify_nothing_left()
        return 1


if __name__ == "__main__":
    sys.exit(main())
