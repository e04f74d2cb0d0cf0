"""A Triton pod killed during a hot reload, end to end, in the demo runtime (issue 13's fault suite).

The same stack as `test_rollout_operator.py` (local cluster, process runtime running each Triton pod as a
real `tritonserver` on the emulated accelerator, real Prometheus, the operator in hot mode with the canary
rollout, open-loop load): an InferenceService of 3 replicas at max batch 1; the tuner's first change goes to
the canary. The canary's reload is held in flight (the harness's `hold` reload fault, `devkit.faults`: the load
stays pending for HOLD_S, the pod serving its old config meanwhile, and fails as soon as the pod's
`tritonserver` goes away), and while it is, the canary pod is force-deleted, as a user or an eviction would
(`kubectl delete pod --grace-period=0 --force`). The load follows the Ready pods, as a Service's endpoints do.

What the user must see: the rollout ends (rejected: the canary never took the change, so there is nothing to
promote) with its record cleared in bounded time, a CanaryRejected Event and `tailtune explain` saying so;
the Deployment's replacement pod starts from the ConfigMap (the config in force), every pod on that one config,
each loaded once; the InferenceService Ready with `status.batching` the config in force; failed requests only
on the killed pod, at most a few seconds of its share of the load. Printed (`-s`): time to the rollout's end,
time to recover (3 Ready pods on one config, no rollout), failed requests.

About 50 s on two shared cores. Three runs here (30 req/s, SLO 300 ms, ticks 5 s; the canary's reload of max
batch 1 -> 8 held 30 s, the pod force-deleted 0.1 / 0.0 / 1.0 s into it): the runtime, like a kubelet, still
stops a force-deleted pod gracefully (SIGTERM), and Triton's shutdown waits out its 10 s exit timeout, so the held
reload failed ("tritonserver went away during the model load") and the rollout ended CanaryRejected 11.0 / 10.6 /
11.1 s after the kill, its record cleared 11.0 / 10.6 / 11.3 s after it; 3 Ready pods on max batch 1 (the
replacement from the ConfigMap) 11.0 / 10.6 / 11.3 s after it; 0 of 727 / 718 / 736 requests failed (the load left
the pod as it left the endpoints, and Triton drained what it had). The tuner records the target as rejected (a
pod lost mid-reload counts as a failed reload).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.demo import demo_service
from devkit.faults import ReloadFault, fault_path, inject_reload_fault
from devkit.load import LoadGenerator, Phase, infer_body
from devkit.runtime import UPSTREAM_HTTP_PORT
from tailtune.api.keys import APPLIED_ANNOTATION, ROLLOUT_ANNOTATION
from tailtune.operator.inforce import tuner_state
from tailtune.operator.rollout import RolloutState
from tests.demo.test_rollout_operator import (
    RATE_RPS,
    START,
    TICK_S,
    Env,
    Service,
    demo_env,
    describe,
    example,
    json_batching,
    knobs,
    started_rollout,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.triton,
    pytest.mark.prometheus,
    pytest.mark.skipif(os.environ.get("TAILTUNE_SKIP_E2E") == "1", reason="TAILTUNE_SKIP_E2E=1"),
]

HOLD_S = 30.0  # the canary's reload stays in flight this long unless its tritonserver goes away first
# After the rejection the tuner's next change waits this long: the test sees one rollout, and the pods stay on
# the config in force while it checks them.
COOLDOWN_S = 600
ROLLOUT_END_S = 45.0  # the record cleared within this of the kill: a tick, the failed reload, a tick
RECOVER_S = 120.0  # 3 Ready pods on one config within this of the kill (a new tritonserver loads and warms up)
# Failed requests: only the killed pod's, at most this many seconds of its share of the load (in flight when it
# died, and sent before the endpoints dropped it).
FAILED_SHARE_S = 10.0


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    doc = example()
    doc["spec"]["tuning"]["cooldownSeconds"] = COOLDOWN_S
    title = "reload faults through the operator (tests/demo/test_reload_faults.py)"
    with demo_env(tmp_path_factory.mktemp("reload-faults"), doc, title) as e:
        yield e


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@contextlib.contextmanager
def serve_following_endpoints(env: Env, name: str, fault: ReloadFault) -> Iterator[Service]:
    """As `test_rollout_operator.serve`, but the load goes to the Ready pods of the moment (a Service's
    endpoints: a deleted pod drops out, its replacement joins when Ready), refreshed every 0.25 s."""
    demo, cluster = env.demo, env.cluster
    doc = demo_service(env.example, demo.model_server.url, demo.sha256, demo.prometheus_url)
    doc["metadata"]["name"] = name
    cluster.apply(doc)
    svc = Service(env, name, [])
    endpoints: list[str] = []
    armed: set[str] = set()
    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(0.25):
            with contextlib.suppress(Exception):
                ready = sorted(p["status"]["podIP"] for p in svc.pods() if is_ready(p) and p["status"].get("podIP"))
                endpoints[:] = [f"{ip}:{UPSTREAM_HTTP_PORT}" for ip in ready]

    threads: list[threading.Thread] = []
    try:
        demo.wait(f"3 pods of {name} with IPs", 120, lambda: len(svc.pod_ips()) == 3)
        svc.ips = svc.pod_ips()
        for ip in svc.ips:
            inject_reload_fault(demo.faults_dir, ip, fault)
            armed.add(ip)
        demo.wait(f"3 Ready pods of {name}", 120, svc.ready)
        threads.append(threading.Thread(target=follow, name=f"endpoints-{name}", daemon=True))
        threads[-1].start()
        demo.wait("the load's endpoints", 10, lambda: len(endpoints) == 3)
        svc.load = LoadGenerator([Phase(0, RATE_RPS)], 900, lambda: list(endpoints), name, infer_body("INPUT0", [16]))
        svc.load.start()
        svc.load_wall0 = time.time()
        threads.append(threading.Thread(target=svc._watch, name=f"watch-{name}", daemon=True))
        threads[-1].start()
        yield svc
    finally:
        stop.set()
        svc._stop.set()
        for t in threads:
            t.join(timeout=10)
        if svc.load is not None:
            svc.load.stop()
        with contextlib.suppress(Exception):  # the module's teardown takes the cluster down anyway
            cluster.kubectl("delete", "inferenceservice", name, "-n", env.namespace, "--wait=false")
        for ip in armed | set(svc.ips):
            fault_path(demo.faults_dir, ip).unlink(missing_ok=True)  # the next service's pods may reuse the IPs


def config_map_batching(svc: Service, pod: dict[str, Any]) -> tuple[int, int]:
    """(max batch, queue delay) of the config.pbtxt in the ConfigMap the pod mounts."""
    names = [v["configMap"]["name"] for v in pod["spec"].get("volumes", []) if "configMap" in v]
    assert len(names) == 1, names
    cm = svc.env.cluster.raw(f"/api/v1/namespaces/{svc.env.namespace}/configmaps/{names[0]}") or {}
    text = cm.get("data", {}).get("config.pbtxt", "")
    mb = re.search(r"max_batch_size:\s*(\d+)", text)
    delay = re.search(r"max_queue_delay_microseconds:\s*(\d+)", text)
    assert mb is not None, text
    return int(mb.group(1)), int(delay.group(1)) if delay else 0


def wait_for(what: str, timeout_s: float, check: Any, every_s: float = 0.25) -> float:
    """time.time() when `check()` first held; AssertionError after `timeout_s`."""
    deadline = time.time() + timeout_s
    while not check():
        if time.time() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(every_s)
    return time.time()


def test_the_canary_pod_killed_during_its_hot_reload_ends_the_rollout_and_the_service_recovers(env: Env) -> None:
    demo = env.demo
    with serve_following_endpoints(env, "podkill", ReloadFault("hold", hold_ms=HOLD_S * 1e3)) as svc:
        _, record = started_rollout(svc)
        target = knobs(record.target)
        canary = record.canary
        # The canary's reload reached its pod (the shim took the fault) and is held there: in flight.
        t_taken = wait_for(
            "the canary's reload reaches its pod", 30, lambda: not fault_path(demo.faults_dir, canary).exists()
        )
        for ip in svc.ips:  # only the canary's reload is held; a later reload of another pod is not
            fault_path(demo.faults_dir, ip).unlink(missing_ok=True)
        time.sleep(1.0)  # well inside the hold
        in_flight = RolloutState.from_annotations(svc.annotations())
        assert in_flight is not None and in_flight.stage == "canary" and in_flight.since is None, in_flight
        assert svc.live(canary) == knobs(START), "the canary took the change before the kill"
        (pod,) = [p for p in svc.pods() if p["status"].get("podIP") == canary]
        killed_uid = pod["metadata"]["uid"]
        stayed = set(svc.ips) - {canary}
        t_kill = time.time()  # the deletion issued (the API removes the pod before kubectl returns)
        env.cluster.kubectl(
            "delete", "pod", pod["metadata"]["name"], "-n", env.namespace, "--grace-period=0", "--force"
        )
        reload_s = t_kill - t_taken

        # The rollout ends, its record cleared.
        t_end, message = svc.wait_event("CanaryRejected", ROLLOUT_END_S)
        assert canary in message, message
        svc.wait_record_cleared(timeout_s=max(1.0, t_kill + ROLLOUT_END_S - time.time()))
        t_cleared = time.time()

        # Recovered: 3 Ready pods, the canary's replacement among them, all on one config, no rollout.
        def recovered() -> bool:
            if not svc.ready():
                return False
            ips = svc.pod_ips()
            live = {svc.live(ip) for ip in ips}
            return canary not in ips and len(live) == 1 and None not in live

        t_recovered = wait_for("3 Ready pods on one config", max(1.0, t_kill + RECOVER_S - time.time()), recovered)
        pods = svc.pods()
        assert killed_uid not in {p["metadata"]["uid"] for p in pods}
        svc.ips = sorted(p["status"]["podIP"] for p in pods)
        assert stayed < set(svc.ips), (stayed, svc.ips)
        (replacement,) = [p for p in pods if p["status"]["podIP"] not in stayed]
        new_ip = replacement["status"]["podIP"]

        # The config in force is the one before the change; every pod serves it, the replacement from the
        # ConfigMap, and no pod was reloaded (each loaded its model once, at start).
        annotations = svc.annotations()
        assert not annotations.get(ROLLOUT_ANNOTATION), annotations.get(ROLLOUT_ANNOTATION)
        in_force = knobs(json_batching(annotations[APPLIED_ANNOTATION]))
        assert in_force == knobs(START), (in_force, "the change was never judged on a canary")
        assert {ip: svc.live(ip) for ip in svc.ips} == dict.fromkeys(svc.ips, in_force)
        assert config_map_batching(svc, replacement) == in_force
        assert svc.loads() == dict.fromkeys(svc.ips, 1), svc.loads()
        assert all(target not in s.live.values() for s in svc.seen), "a pod served the change"

        # What the user sees: one rollout, rejected; the object Ready, its status on the config in force.
        assert svc.reasons().count("CanaryStarted") == 1, svc.reasons()
        assert "CanaryPromoted" not in svc.reasons(), svc.reasons()
        explained = svc.explain()
        assert "CanaryRejected" in explained and canary in explained, explained

        def consistent() -> bool:
            isvc = svc.isvc()
            ready = [c for c in isvc.status.conditions if c.type == "Ready"]
            b = isvc.status.batching
            return (
                bool(ready) and ready[0].status == "True"
                and (b.max_batch_size, b.max_queue_delay_microseconds or 0) == in_force
                and isvc.status.replicas.ready == 3
            )  # fmt: skip

        wait_for("Ready, status.batching the config in force, 3 ready replicas", 60, consistent, every_s=1.0)
        rejected = [knobs(r.batching) for r in tuner_state(svc.isvc()).rejected]
        # Still one config a while later: no other rollout, no pod reloaded again.
        time.sleep(2 * TICK_S)
        assert {svc.live(ip) for ip in svc.ips} == {in_force}
        assert svc.reasons().count("CanaryStarted") == 1, svc.reasons()

        # Failed requests: none before the kill, after it only on the killed pod, bounded by its share.
        now = time.time()
        assert svc.requests(0, t_kill - 1)[1] == 0, "requests failed before the kill"
        _, failed, total = svc.requests(t_kill - 1, now)
        _, failed_canary, sent_canary = svc.requests(t_kill - 1, now, canary)
        dropped = last_sent_to(svc, canary)
        out_s = (dropped - t_kill) if dropped is not None else 0.0
    env.notes.append(
        f"canary {canary} force-deleted {reload_s:.1f} s into its reload of {describe(record.target)} (held "
        f"{HOLD_S:g} s): rollout ended rejected ({message!r}), record cleared {t_cleared - t_kill:.1f} s after the "
        f"kill (Event {t_end - t_kill:.1f} s); replacement {new_ip} from the ConfigMap ({describe(START)}); "
        f"recovered (3 Ready pods on one config) {t_recovered - t_kill:.1f} s after the kill; last request sent to "
        f"the killed pod {out_s:+.1f} s from the kill; {failed} of {total} requests failed since the kill, "
        f"{failed_canary} of them on the killed pod ({sent_canary} sent to it); tuner's rejected configs {rejected}"
    )
    assert failed == failed_canary, "requests failed on a pod that was not killed"
    assert failed <= RATE_RPS / 3 * FAILED_SHARE_S, (failed, "more than its share of the load failed")
    assert t_end - t_kill < HOLD_S, "the reload waited out its hold: the kill did not end it"


def last_sent_to(svc: Service, ip: str) -> float | None:
    """Wall time of the last request the load sent to `ip`."""
    assert svc.load is not None
    s = svc.load.samples
    n = min(len(s.target), len(s.sent))
    times = [svc.load_wall0 + s.sent[i] for i in range(n) if s.target[i].startswith(f"{ip}:")]
    return max(times) if times else None
