"""The canary rollout through the running operator, end to end, in the demo runtime.

Every part is real except the GPU: the local cluster, the process runtime running each Triton pod as a real
`tritonserver` (emulated accelerator), a real Prometheus scraping the three pods (the operator judges the canary
on its own per-pod series, `tailtune.tuner.prom.read_pod_windows`), the operator process (`tailtune operator`)
reconciling and tuning an InferenceService of 3 replicas in hot mode, and open-loop Poisson load
(`devkit.load`). Each case is an InferenceService of its own, applied at max batch 1: the tuner's first change
(to max batch 8, planned from the build's service-time curve) is the change rolled out.

- a good change goes to one pod, and after one clean window to the other two; time to promote;
- a change made worse on purpose (the harness's slow-reload fault, `devkit.faults`: every execution of the
  reloaded config takes SLOW_MS longer, so every request on it breaks the SLO) is rolled back on the canary
  after its window; the share of requests over the SLO or failed during the episode, against the same change
  applied to every pod at once; time to roll back;
- a reload Triton refuses on the canary (the refuse fault: Triton gets a KIND_GPU instance it cannot place)
  is rejected in the same tick, shown as an Event and by `tailtune explain`;
- the operator SIGKILLed in the middle of the canary's window and started again, then SIGKILLed again in the
  middle of the promotion and started again: it resumes from the `tailtune.io/rollout` record each time,
  reloads no pod twice, and the pods are split between configs for one window (plus ticks and reloads), not
  longer.

Figures are printed (`-s`). Marked e2e: TAILTUNE_SKIP_E2E=1 skips it, as the other demo-runtime test. About
5 minutes on two shared cores. Two runs here (30 req/s, SLO 300 ms, window 60 s, ticks 5 s):

- good change (max batch 1 -> 8) promoted to all 3 pods 64.0 / 64.5 s after the canary took it; 0 failed;
- bad change (+400 ms per execution) rolled back 63.5 / 63.9 s after the canary took it; over the SLO or
  failed: 623/1870 = 33.3 % and 624/1885 = 33.1 % of the requests with the canary (all on the canary pod),
  against 99.3 % and 98.7 % with the change on every pod at once (about 1856 / 1860 requests of an episode as
  long);
- refused reload: CanaryStarted and CanaryRejected in the same tick; 0 requests failed;
- operator SIGKILLed mid-window (and, in the second run, again with 2 of 3 pods promoted): pods split between
  configs 63.2 / 70.7 s; no pod reloaded twice; 0 failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from devkit.checkout import find_checkout
from devkit.demo import TRITON_COMPONENT, Demo, DemoCluster, demo_service
from devkit.faults import ReloadFault, fault_path, inject_reload_fault
from devkit.load import LoadGenerator, Phase, infer_body
from devkit.runtime import UPSTREAM_HTTP_PORT
from tailtune.api.keys import APPLIED_ANNOTATION, GRPC_PORT, ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import Batching, InferenceService
from tailtune.operator.engine import engine_cache_key, engine_info
from tailtune.operator.inforce import tuner_state
from tailtune.operator.modelconfig import model_config_json
from tailtune.operator.rollout import RolloutState
from tailtune.triton import control
from tailtune.tuner.types import InForce

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.triton,
    pytest.mark.prometheus,
    pytest.mark.skipif(os.environ.get("TAILTUNE_SKIP_E2E") == "1", reason="TAILTUNE_SKIP_E2E=1"),
]

REPO = Path(__file__).resolve().parents[2]
RATE_RPS = 30.0  # open loop, over the three pods
# The demo's device (10 ms + 2 ms * b^1.3); the SLO is wider than the demo's 150 ms because this test runs three
# pods, Prometheus, the control plane and the operator on two shared cores (a good config's P99 reached 95 ms).
SLO_MS = 300.0
SLOW_MS = 400.0  # the slow fault: every request on the bad config waits at least this, over the SLO
WINDOW_S = 60.0  # the canary's window (`rollout.rollout_window`: Triton's per-pod summary covers 60 s)
TICK_S = 5.0  # spec.tuning.intervalSeconds
# Between two changes: after a rejection the tuner's next try waits this long, so a case sees one rollout.
COOLDOWN_S = 30
START = Batching(max_batch_size=1)
ALL_AT_ONCE_S = 20.0  # how long the bad change runs on every pod in the comparison without a canary


def knobs(b: Batching) -> tuple[int, int]:
    return b.max_batch_size, b.max_queue_delay_microseconds


# --------------------------------------------------------------------------------------------- the runtime


@dataclass
class Env:
    """The demo runtime, up for the module: cluster, process runtime, Prometheus, operator; no object yet."""

    demo: Demo
    cluster: DemoCluster
    example: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # the closing note's figures

    @property
    def namespace(self) -> str:
        return self.demo.namespace


def example() -> dict[str, Any]:
    """examples/demo.yaml with 3 replicas pinned (only batching moves), the wider SLO, a short cooldown."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    spec = doc["spec"]
    spec["serving"]["replicas"] = {"min": 3, "max": 3}
    spec["serving"]["batching"] = {"maxBatchSize": START.max_batch_size, "maxQueueDelayMicroseconds": 0}
    spec["slo"]["latencyMs"] = SLO_MS
    spec["tuning"] |= {"mode": "hot", "intervalSeconds": int(TICK_S), "cooldownSeconds": COOLDOWN_S}
    return doc


@contextlib.contextmanager
def demo_env(work: Path, doc: dict[str, Any], title: str) -> Iterator[Env]:
    """The demo runtime (cluster, Prometheus, the operator) for `doc`'s services; the notes are printed after."""
    args = argparse.Namespace(
        quick=True, duration=None, low_rps=RATE_RPS, high_rps=RATE_RPS, out=work / "out", workdir=work,
        operator_command=None,
    )  # fmt: skip
    demo = Demo(args, Console(stderr=True), find_checkout(), example=doc)
    notes: list[str] = []
    try:
        with demo.stack:
            demo.prepare_workdir()
            cluster = demo.cluster = demo.up_cluster()
            demo.install(cluster)
            demo.start_components(cluster)
            yield Env(demo, cluster, doc, notes)
    finally:
        demo.verify_nothing_left()
        if notes:
            print(f"\n\n{title}:")
            print("\n".join(f"  {n}" for n in notes))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    title = "canary rollout through the operator (tests/demo/test_rollout_operator.py)"
    with demo_env(tmp_path_factory.mktemp("rollout-operator"), example(), title) as e:
        yield e


# ------------------------------------------------------------------------------------------ one service


@dataclass(frozen=True)
class Seen:
    """One look at the service: each pod's live batching (Triton's config endpoint) and the rollout record."""

    t: float
    live: dict[str, tuple[int, int] | None]
    record: RolloutState | None


@dataclass
class Service:
    """One InferenceService under load, watched every half second until the context ends."""

    env: Env
    name: str
    ips: list[str]
    load: LoadGenerator | None = None
    load_wall0: float = 0.0  # time.time() at the load's t = 0
    seen: list[Seen] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (first seen at, reason, message)
    _stop: threading.Event = field(default_factory=threading.Event)

    # ---- the object --------------------------------------------------------------------------------
    def raw(self) -> dict[str, Any]:
        path = f"/apis/tailtune.io/v1alpha1/namespaces/{self.env.namespace}/inferenceservices/{self.name}"
        return self.env.cluster.raw(path) or {}

    def isvc(self) -> InferenceService:
        return InferenceService.model_validate(self.raw())

    def annotations(self) -> dict[str, str]:
        return dict(self.raw().get("metadata", {}).get("annotations") or {})

    def live(self, ip: str) -> tuple[int, int] | None:
        """(max batch, queue delay) Triton serves with now, from its own config endpoint; None when unreadable."""
        url = f"http://{ip}:{UPSTREAM_HTTP_PORT}/v2/models/{self.name}/config"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                cfg = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None
        delay = cfg.get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0)
        return int(cfg.get("max_batch_size", 0)), int(delay)

    def pods(self) -> list[dict[str, Any]]:
        """This service's Triton pods (not its engine build's), but those being deleted."""
        selector = f"{TRITON_COMPONENT},app.kubernetes.io/instance%3D{self.name}".replace("=", "%3D")
        found = self.env.cluster.raw(f"/api/v1/namespaces/{self.env.namespace}/pods?labelSelector={selector}") or {}
        return [p for p in found.get("items", []) if not p["metadata"].get("deletionTimestamp")]

    def pod_ips(self) -> list[str]:
        return sorted(p["status"]["podIP"] for p in self.pods() if p.get("status", {}).get("podIP"))

    def loads(self) -> dict[str, int]:
        """How many times each pod's Triton loaded the model (start, then every reload), from its own log."""
        counts = {}
        for p in self.pods():
            meta = p["metadata"]
            log = self.env.demo.work / "runtime" / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
            text = (log / "container.log").read_text(errors="replace")
            counts[p["status"]["podIP"]] = text.count(f"successfully loaded '{self.name}'")
        return counts

    def ready(self) -> bool:
        pods = self.pods()
        ready = [
            p for p in pods
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]  # fmt: skip
        return len(ready) == 3

    def poll_events(self) -> None:
        found = self.env.cluster.raw(f"/api/v1/namespaces/{self.env.namespace}/events") or {}
        known = {(r, m) for _, r, m in self.events}
        for e in sorted(found.get("items", []), key=lambda e: e["metadata"].get("creationTimestamp") or ""):
            if e.get("involvedObject", {}).get("name") != self.name:
                continue
            key = (e.get("reason", ""), e.get("message", ""))
            if key not in known:
                self.events.append((time.time(), *key))
                known.add(key)

    def look(self) -> Seen:
        with ThreadPoolExecutor(3) as pool:
            live = dict(zip(self.ips, pool.map(self.live, self.ips), strict=True))
        return Seen(time.time(), live, RolloutState.from_annotations(self.annotations()))

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):  # a slow API server: the next look comes half a second later
                self.seen.append(self.look())
                self.poll_events()

    # ---- waiting -----------------------------------------------------------------------------------
    def wait_event(self, reason: str, timeout_s: float) -> tuple[float, str]:
        """(when first seen, message) of the first Event with `reason` about this object."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for t, r, m in list(self.events):
                if r == reason:
                    return t, m
            time.sleep(0.25)
        raise AssertionError(f"no {reason} Event within {timeout_s:.0f} s; saw {[r for _, r, _ in self.events]}")

    def wait_record_cleared(self, timeout_s: float = 20) -> dict[str, str]:
        """The object's annotations once the rollout record is gone (it is cleared just after the last Event)."""
        deadline = time.time() + timeout_s
        while True:
            annotations = self.annotations()
            if not annotations.get(ROLLOUT_ANNOTATION):
                return annotations
            if time.time() > deadline:
                raise AssertionError(f"the rollout record is still there: {annotations.get(ROLLOUT_ANNOTATION)}")
            time.sleep(0.25)

    def started_for(self, target: Batching) -> int:
        """How many CanaryStarted Events were for `target` (the message ends with the law's "old -> new")."""
        change = f"-> {describe(target)},"
        return sum(1 for _, r, m in self.events if r == "CanaryStarted" and change in m)

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.events]

    # ---- what the pods ran -------------------------------------------------------------------------
    def on(self, config: tuple[int, int]) -> list[tuple[float, list[str]]]:
        """(time, the pods serving `config` then) for every look."""
        return [(s.t, sorted(ip for ip, b in s.live.items() if b == config)) for s in self.seen]

    def split(self, target: tuple[int, int]) -> tuple[float, float]:
        """(first look with some pod on `target`, first look after it with every pod on it)."""
        timeline = self.on(target)
        first = next(t for t, ips in timeline if ips)
        done = next(t for t, ips in timeline if t >= first and len(ips) == len(self.ips))
        return first, done

    # ---- the load ----------------------------------------------------------------------------------
    def requests(self, since: float, until: float, ip: str | None = None) -> tuple[int, int, int]:
        """(over the SLO, failed, all) of the requests sent in [since, until) (wall clock), to one pod or all."""
        assert self.load is not None
        s = self.load.samples
        n = min(len(s.target), len(s.sent), len(s.latency_ms), len(s.ok))
        over = failed = total = 0
        for i in range(n):
            t = self.load_wall0 + s.sent[i]
            if not since <= t < until or (ip is not None and not s.target[i].startswith(f"{ip}:")):
                continue
            total += 1
            if not s.ok[i]:
                failed += 1
            elif s.latency_ms[i] > SLO_MS:
                over += 1
        return over, failed, total

    def explain(self) -> str:
        """`tailtune explain NAME -n NAMESPACE`, as a user runs it (stdout and stderr together)."""
        result = subprocess.run(
            [sys.executable, "-m", "tailtune", "explain", self.name, "-n", self.env.namespace],
            env={**os.environ, "KUBECONFIG": str(self.env.cluster.kubeconfig)},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"explain exited {result.returncode}: {result.stderr[-2000:]}"
        return result.stdout + result.stderr

    def reload_all(self, batching: Batching, fault: ReloadFault | None) -> None:
        """Reload every pod at once, as a hot apply without a canary would (the operator's config, through the
        pods' shims, so an armed fault applies)."""
        isvc = self.isvc()
        info = engine_info(isvc, engine_cache_key(isvc), None)
        config = model_config_json(isvc, batching, info)
        if fault is not None:
            for ip in self.ips:
                inject_reload_fault(self.env.demo.faults_dir, ip, fault)
        with ThreadPoolExecutor(len(self.ips)) as pool:
            list(pool.map(lambda ip: control.apply_config(f"{ip}:{GRPC_PORT}", self.name, config), self.ips))


@contextlib.contextmanager
def serve(env: Env, name: str, fault: ReloadFault | None = None) -> Iterator[Service]:
    """Apply an InferenceService `name` (the module's example), arm `fault` for every pod's next reload as
    soon as the pods have their IPs (the first change goes to whichever is the canary), wait for 3 Ready
    pods, start the load and the watcher; delete the object and disarm the faults afterwards."""
    demo, cluster = env.demo, env.cluster
    doc = demo_service(env.example, demo.model_server.url, demo.sha256, demo.prometheus_url)
    doc["metadata"]["name"] = name
    cluster.apply(doc)
    svc = Service(env, name, [])

    watcher: threading.Thread | None = None
    try:
        demo.wait(f"3 pods of {name} with IPs", 120, lambda: len(svc.pod_ips()) == 3)
        svc.ips = svc.pod_ips()
        if fault is not None:
            for ip in svc.ips:
                inject_reload_fault(demo.faults_dir, ip, fault)
        demo.wait(f"3 Ready pods of {name}", 120, svc.ready)
        targets = [f"{ip}:{UPSTREAM_HTTP_PORT}" for ip in svc.ips]
        svc.load = LoadGenerator([Phase(0, RATE_RPS)], 900, lambda: targets, name, infer_body("INPUT0", [16]))
        svc.load.start()
        svc.load_wall0 = time.time()
        watcher = threading.Thread(target=svc._watch, name=f"watch-{name}", daemon=True)
        watcher.start()
        yield svc
    finally:
        svc._stop.set()
        if watcher is not None:
            watcher.join(timeout=10)
        if svc.load is not None:
            svc.load.stop()
        with contextlib.suppress(Exception):  # the module's teardown takes the cluster down anyway
            cluster.kubectl("delete", "inferenceservice", name, "-n", env.namespace, "--wait=false")
        for ip in svc.ips:
            fault_path(demo.faults_dir, ip).unlink(missing_ok=True)  # the next service's pods may reuse the IPs


@dataclass(frozen=True)
class Started:
    """A rollout as its CanaryStarted Event tells it: the canary pod and the change (from max batch 1)."""

    canary: str
    target: Batching
    previous: Batching = START


CHANGE = re.compile(r"max batch (\d+), delay (\d+) us, \d+ replica\(s\) -> max batch (\d+), delay (\d+) us,")


def started_rollout(svc: Service) -> tuple[float, Started]:
    """Wait for the tuner's first change to start a canary; (when the test saw its Event, what it started).
    The Event, not the record: a rollout refused in its first tick has left no record by the time one looks."""
    t, message = svc.wait_event("CanaryStarted", 90)
    change = CHANGE.findall(message)
    assert message.startswith("canary ") and change, message
    old_mb, old_delay, mb, delay = change[-1]
    started = Started(
        canary=message.split(":")[0].removeprefix("canary ").strip(),
        target=Batching(max_batch_size=int(mb), max_queue_delay_microseconds=int(delay)),
    )
    assert started.canary in svc.ips, (started, svc.ips)
    assert (int(old_mb), int(old_delay)) == knobs(START), message  # from the spec's start, the first change
    assert knobs(started.target) != knobs(START), started
    return t, started


# --------------------------------------------------------------------------------------------- the cases


def test_a_reload_triton_refuses_on_the_canary_is_rejected_at_once(env: Env) -> None:
    with serve(env, "refused", ReloadFault("refuse")) as svc:
        t0, record = started_rollout(svc)
        t1, message = svc.wait_event("CanaryRejected", 30)
        assert "refused the reload" in message and "KIND_GPU" in message, message
        time.sleep(1.0)
        # Triton refused it on the canary; the canary keeps serving the old config, nothing else was touched.
        assert all(svc.live(ip) == knobs(START) for ip in svc.ips), [svc.live(ip) for ip in svc.ips]
        assert all(control.is_model_ready(f"{ip}:{GRPC_PORT}", svc.name) for ip in svc.ips)
        assert not fault_path(env.demo.faults_dir, record.canary).exists(), "the canary was never reloaded"
        others = [ip for ip in svc.ips if ip != record.canary]
        assert all(fault_path(env.demo.faults_dir, ip).exists() for ip in others), "another pod was reloaded"
        assert all(not any(b == knobs(record.target) for b in s.live.values()) for s in svc.seen)
        assert svc.loads() == dict.fromkeys(svc.ips, 1), svc.loads()  # the refused load loaded nothing
        # Recorded: the config in force unchanged, the target rejected, its rollout over. The tuner tries its
        # next best config after the cooldown, never the rejected one again.
        annotations = svc.annotations()
        later = RolloutState.from_annotations(annotations)
        assert later is None or knobs(later.target) != knobs(record.target), later
        assert knobs(json_batching(annotations[APPLIED_ANNOTATION])) == knobs(START)
        assert [knobs(r.batching) for r in tuner_state(svc.isvc()).rejected] == [knobs(record.target)]
        assert svc.started_for(record.target) == 1 and "CanaryPromoted" not in svc.reasons()
        explained = svc.explain()
        assert "CanaryRejected" in explained and "refused the reload" in explained, explained
        failed = svc.requests(0, time.time())[1]
    env.notes.append(
        f"refused reload: canary {record.canary} refused {describe(record.target)} (Triton: KIND_GPU on a CPU "
        f"server); rejected {t1 - t0:.1f} s after CanaryStarted was seen, in the same tick; {failed} requests failed"
    )
    assert failed == 0


def test_a_bad_change_is_rolled_back_on_the_canary_and_hurts_a_third_of_what_it_would_all_at_once(
    env: Env,
) -> None:
    with serve(env, "bad", ReloadFault("slow", extra_ms=SLOW_MS)) as svc:
        _, record = started_rollout(svc)
        target = knobs(record.target)
        _, message = svc.wait_event("CanaryRejected", WINDOW_S + 60)
        assert "over the SLO" in message, message
        time.sleep(1.5)  # the watcher's look after the rollback
        # Episode: from the first look with the canary on the target to the first look with it back.
        timeline = svc.on(target)
        first = next(t for t, ips in timeline if ips)
        back = next(t for t, ips in timeline if t > first and not ips)
        assert all(ips in ([], [record.canary]) for _, ips in timeline), "only the canary ever ran the bad config"
        assert back - first >= WINDOW_S - 2 * TICK_S, f"judged after {back - first:.1f} s, before its window"
        assert all(svc.live(ip) == knobs(START) for ip in svc.ips)
        annotations = svc.wait_record_cleared()
        assert knobs(json_batching(annotations[APPLIED_ANNOTATION])) == knobs(START)
        assert [knobs(r.batching) for r in tuner_state(svc.isvc()).rejected] == [target]
        assert "CanaryPromoted" not in svc.reasons()
        explained = svc.explain()
        assert "CanaryRejected" in explained and "over the SLO" in explained, explained
        assert svc.loads() == {ip: 3 if ip == record.canary else 1 for ip in svc.ips}, svc.loads()
        judged = re.search(r"P99 ([\d.]+) ms over the SLO", message)
        assert judged is not None and float(judged.group(1)) >= SLOW_MS, message  # the canary's own series
        over, failed, total = svc.requests(first, back)
        c_over, c_failed, c_total = svc.requests(first, back, record.canary)
        # Without a canary: the same change on every pod at once, for ALL_AT_ONCE_S, then put back; the operator
        # is stopped meanwhile (it would take the pods' reset metrics for no traffic and plan anew).
        env.demo.stop_operator()
        t2 = time.time()
        svc.reload_all(record.target, ReloadFault("slow", extra_ms=SLOW_MS))
        time.sleep(ALL_AT_ONCE_S)
        svc.reload_all(record.previous, None)
        time.sleep(1.5)
        after = [(t, ips) for t, ips in svc.on(target) if t >= t2]
        t3 = next(t for t, ips in after if ips)  # as above: from the first pod on the bad config to none
        t4 = next(t for t, ips in after if t > t3 and not ips)
        a_over, a_failed, a_total = svc.requests(t3, t4)
        per_pod = [sum(svc.requests(t3, t4, ip)[:2]) / max(1, svc.requests(t3, t4, ip)[2]) for ip in svc.ips]
        env.demo.start_operator()
        assert all(svc.live(ip) == knobs(START) for ip in svc.ips)
    share = (over + failed) / max(1, total)
    share_all = (a_over + a_failed) / max(1, a_total)
    env.notes.append(
        f"bad change ({describe(record.target)}, every execution +{SLOW_MS:g} ms, SLO {SLO_MS:g} ms): rolled back "
        f"{back - first:.1f} s after the canary took it (window {WINDOW_S:g} s); requests over the SLO or failed "
        f"with the canary {over + failed}/{total} = {share:.1%} (canary pod {c_over + c_failed}/{c_total}); all pods "
        f"at once {a_over + a_failed}/{a_total} = {share_all:.1%} over {t4 - t3:.0f} s (per pod "
        f"{', '.join(f'{p:.0%}' for p in per_pod)}), i.e. about "
        f"{share_all * total:.0f} of the {total} requests of an episode as long as the canary's"
    )
    assert total > 0.5 * RATE_RPS * (back - first), "the load did not run"
    assert share < share_all / 2, (share, share_all)
    assert share_all > 0.8


def test_a_good_change_goes_to_one_pod_then_after_a_clean_window_to_all(env: Env) -> None:
    with serve(env, "good") as svc:
        t0, record = started_rollout(svc)
        target = knobs(record.target)
        # Mid-window: the canary alone runs the target, and `explain` says so.
        time.sleep(10)
        assert [ip for ip in svc.ips if svc.live(ip) == target] == [record.canary]
        explained = svc.explain()
        assert f"canary pod {record.canary}" in explained, explained
        _, message = svc.wait_event("CanaryPromoted", WINDOW_S + 60)
        assert "within the SLO" in message, message
        time.sleep(1.5)
        first, done = svc.split(target)
        timeline = svc.on(target)
        assert all(ips in ([], [record.canary]) for t, ips in timeline if t < first + WINDOW_S - TICK_S)
        assert all(svc.live(ip) == target for ip in svc.ips), [svc.live(ip) for ip in svc.ips]
        assert svc.loads() == dict.fromkeys(svc.ips, 2), svc.loads()  # each pod reloaded once
        annotations = svc.wait_record_cleared()
        assert knobs(json_batching(annotations[APPLIED_ANNOTATION])) == target
        isvc = svc.isvc()
        assert not tuner_state(isvc).rejected
        env.demo.wait("status.batching", 30, lambda: svc.isvc().status.batching.max_batch_size == target[0])
        assert svc.reasons().count("CanaryStarted") == 1 and "CanaryRejected" not in svc.reasons()
        assert svc.reasons().index("CanaryStarted") < svc.reasons().index("CanaryPromoted")
        over, failed, total = svc.requests(first, done)
    env.notes.append(
        f"good change ({describe(record.target)}): canary {record.canary} on it {first - t0:+.1f} s after "
        f"CanaryStarted was seen; all 3 pods {done - first:.1f} s after the canary took it (window {WINDOW_S:g} s, "
        f"ticks every {TICK_S:g} s); {failed} failed and {over} over the SLO of {total} requests meanwhile"
    )
    assert WINDOW_S - TICK_S <= done - first <= WINDOW_S + 3 * TICK_S + 10
    assert failed == 0


def test_the_operator_killed_mid_window_and_mid_promotion_resumes_the_rollout_from_the_object(env: Env) -> None:
    with serve(env, "killed") as svc:
        _, record = started_rollout(svc)
        target = knobs(record.target)
        deadline = time.time() + 30
        while svc.live(record.canary) != target and time.time() < deadline:
            time.sleep(0.25)
        took = time.time()
        time.sleep(20)  # a third of the way into the canary's window
        assert [ip for ip in svc.ips if svc.live(ip) == target] == [record.canary]
        env.demo.stop_operator(kill=True)
        killed = time.time()
        kept = RolloutState.from_annotations(svc.annotations())
        assert kept is not None and kept.stage == "canary" and kept.since is not None, kept
        time.sleep(3)
        env.demo.start_operator()
        restarted = time.time()
        # Killed again as soon as a second pod serves the target: in the middle of the promotion.
        while len([ip for ip in svc.ips if svc.live(ip) == target]) < 2:
            assert time.time() < restarted + WINDOW_S + 60, "never promoted"
            time.sleep(0.1)
        env.demo.stop_operator(kill=True)
        killed_again = time.time()
        promoting = RolloutState.from_annotations(svc.annotations())
        on_target = len([ip for ip in svc.ips if svc.live(ip) == target])
        time.sleep(1)
        env.demo.start_operator()
        restarted_again = time.time()
        svc.wait_event("CanaryPromoted", 60)
        time.sleep(1.5)
        first, done = svc.split(target)
        timeline = svc.on(target)
        # Resumed, not restarted: one canary start, the canary on the target from its reload to the end, each pod
        # reloaded once.
        assert svc.reasons().count("CanaryStarted") == 1, svc.reasons()
        assert all(record.canary in ips for t, ips in timeline if t >= first), "the canary left the target"
        assert all(svc.live(ip) == target for ip in svc.ips)
        assert svc.loads() == dict.fromkeys(svc.ips, 2), svc.loads()
        svc.wait_record_cleared()
        assert "CanaryRejected" not in svc.reasons()
        over, failed, total = svc.requests(first, done)
    split = done - first
    stage = "none left" if promoting is None else promoting.stage
    env.notes.append(
        f"operator SIGKILLed {killed - took:.0f} s into the canary's window (record: canary), started again "
        f"{restarted - killed:.1f} s later, SIGKILLed again with {on_target} of 3 pods promoted (record: {stage}), "
        f"started again {restarted_again - killed_again:.1f} s later: resumed from the record each time, promoted, "
        f"each pod reloaded once; pods split between configs {split:.1f} s (window {WINDOW_S:g} s); {failed} failed, "
        f"{over} over the SLO of {total} requests meanwhile"
    )
    # One window, plus the ticks either side of it and the two reloads of the promotion: the restart adds none.
    assert split <= WINDOW_S + 3 * TICK_S + 10, split
    assert failed == 0


def json_batching(applied: str) -> Batching:
    """The batching of the config in force (the `tailtune.io/applied` annotation)."""
    return InForce.from_annotation(applied).batching


def describe(b: Batching) -> str:
    return f"max batch {b.max_batch_size}, delay {b.max_queue_delay_microseconds} us"
