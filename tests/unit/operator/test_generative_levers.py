"""The generative tuner's lever changes applied (tailtune.operator.generative): a reload of the tensorrt_llm settings
through the canary in hot mode (one pod, judged over a window, then the rest, or rolled back), at once with a pod roll
in rolling mode; in force on the object (rendered into the ConfigMap by reconcile), counted by the reload budget, told
by an Event and in status."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tailtune.api import InferenceService
from tailtune.api.keys import APPLIED_ANNOTATION, CONFIG_HASH_ANNOTATION, ROLLOUT_ANNOTATION
from tailtune.api.v1alpha1 import Batching, Condition, GenerativeStatus, LlmServing
from tailtune.operator import generative
from tailtune.operator.generative import gen_in_force, generative_status, serving_status
from tailtune.operator.inforce import in_force, llm_in_force
from tailtune.operator.reconcile import desired_state, rollout_status
from tailtune.tuner import prom
from tailtune.tuner.generative import (
    LEVERS_CHANGED,
    RELOADS_PER_HOUR,
    GenDecision,
    GenLevers,
    GenPolicy,
    GenState,
    levers_of,
    reloads_left,
    serving_with,
)
from tailtune.tuner.types import InForce
from tests.unit.operator.test_generative_status import _sig
from tests.unit.operator.test_trtllm_serving import _by_kind, _succeeded, llm

NOW = datetime(2026, 12, 6, 0, 0, tzinfo=UTC)
PODS = ("10.0.0.1", "10.0.0.2")
# The spec's levers (test_trtllm_serving.SERVING) with the most KV share the tuner gives.
MORE_KV = GenLevers(
    kv_cache_free_gpu_mem_fraction=0.95,
    max_queue_size=64,
    enable_chunked_context=True,
    batch_scheduler_policy="max_utilization",
)


class FakeCluster:
    """The API server's side of a tick: annotations patched onto a raw object, Events kept."""

    def __init__(self, isvc: InferenceService) -> None:
        self.raw = isvc.model_dump(by_alias=True, mode="json", exclude_none=True)
        self.events: list[tuple[str, str, str]] = []

    def isvc(self) -> InferenceService:
        return InferenceService.model_validate(self.raw)

    async def patch_annotations(self, meta: Any, annotations: dict[str, str]) -> None:
        kept = self.raw["metadata"].setdefault("annotations", {})
        for k, v in annotations.items():
            if v:
                kept[k] = v
            else:
                kept.pop(k, None)

    async def patch_generative(self, meta: Any, g: GenerativeStatus, conditions: list[Condition] | None) -> None:
        return None

    async def emit_event(self, meta: Any, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def ready_pod_ips(self, isvc: InferenceService) -> tuple[str, ...]:
        return PODS


# A pod's own window on the spec's settings and on any other (test_trtllm_spec's targets: P99 TTFT 500, TPOT 30 ms):
# (TTFT ms, TPOT ms, requests).
WITHIN = (300.0, 20.0, 200)


class FakeTriton:
    """Each pod's live tensorrt_llm settings; a reload sets them, or fails where told to. Each pod's own TTFT/TPOT
    window (`generative.read_pod_tokens`) is that of the settings it runs (`figures`, else WITHIN)."""

    def __init__(self, live: LlmServing, refuse: set[str] | None = None) -> None:
        self.live = dict.fromkeys(PODS, live)
        self.refuse = refuse or set()
        self.no_room = False  # the GPU memory gauges say a second copy of the engine fits (or say nothing)
        self.reloads: list[tuple[str, LlmServing]] = []
        self.figures: dict[LlmServing, tuple[float, float, int]] = {}
        self.reads = 0

    def tokens(self, isvc: InferenceService, window: float, now: datetime) -> dict[str, prom.PodTokenWindow]:
        self.reads += 1
        out = {}
        for ip, settings in self.live.items():
            ttft, tpot, n = self.figures.get(settings, WITHIN)
            out[ip] = prom.PodTokenWindow(ttft, tpot, float(n), float(n))
        return out

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def reload(isvc: InferenceService, ip: str, settings: LlmServing) -> str:
            self.reloads.append((ip, settings))
            if ip in self.refuse:
                return "Triton refused to load 'llm': out of memory"
            self.live[ip] = settings
            return ""

        monkeypatch.setattr(generative, "reload_llm_pod", reload)
        monkeypatch.setattr(generative, "no_room_to_reload", lambda isvc, now: self.no_room)
        monkeypatch.setattr(generative, "read_pod_tokens", self.tokens)

        def observe(ips: tuple[str, ...], model: str, tokens: Any = None) -> dict[str, Any]:
            return {
                ip: generative.pod_observation(True, None, None, 0.0, llm=self.live[ip], tokens=(tokens or {}).get(ip))
                for ip in ips
            }

        monkeypatch.setattr(generative, "observe_llm_pods", observe)


def _isvc(mode: str = "hot") -> InferenceService:
    return llm(spec__tuning__mode=mode, spec__serving__replicas={"min": 2, "max": 2})


def _decision(levers: GenLevers, replicas: int = 2) -> GenDecision:
    return GenDecision(replicas, levers, LEVERS_CHANGED, "TTFT binds: the most KV", changed=True)


def _apply(cluster: FakeCluster, decision: GenDecision, at: datetime) -> bool:
    return asyncio.run(generative._apply(cluster, cluster.isvc(), decision, at))  # type: ignore[arg-type]


def test_a_lever_change_reloads_a_canary_then_the_rest_and_goes_in_force(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Hot mode: the canary alone is reloaded with the new settings, the record and the reload spent go on the object
    first; after its window the other pod follows and the settings go in force, rendered into the ConfigMap without a
    pod roll; an Event at the start and at the end; status says what is in force and why (caught: lever changes were
    logged, never applied)."""
    isvc = _isvc()
    spec_settings = isvc.spec.llm_serving()
    wanted = LlmServing(**{**spec_settings.model_dump(), "kv_cache_free_gpu_mem_fraction": 0.95})
    levers = levers_of(wanted)
    triton = FakeTriton(spec_settings)
    triton.install(monkeypatch)
    cluster = FakeCluster(isvc)
    before = desired_state(isvc, _succeeded(isvc, tmp_path))

    assert _apply(cluster, _decision(levers), NOW)
    assert triton.reloads == [(PODS[0], wanted)]  # the canary only
    started = cluster.isvc()
    record = json.loads(started.metadata.annotations[ROLLOUT_ANNOTATION])
    assert record["stage"] == "canary" and record["canary"] == PODS[0]
    assert LlmServing.model_validate(record["llm_target"]) == wanted
    assert rollout_status(started).llm == wanted  # status.rollout shows what the canary runs
    kept = in_force(started)
    assert kept.llm is None and kept.llm_reloads == (NOW,) and kept.changed_at == NOW  # spent, not in force yet
    assert [e[1] for e in cluster.events] == ["CanaryStarted"]

    assert _apply(cluster, _decision(levers), NOW + timedelta(seconds=30)) is False  # within its window: waits
    assert len(triton.reloads) == 1

    assert _apply(cluster, _decision(levers), NOW + timedelta(seconds=61))
    assert triton.reloads[1:] == [(PODS[1], wanted)]
    done = cluster.isvc()
    assert ROLLOUT_ANNOTATION not in done.metadata.annotations
    assert llm_in_force(done) == wanted and in_force(done).llm_reloads == (NOW,)
    assert [e[1] for e in cluster.events] == ["CanaryStarted", "CanaryPromoted"]
    shown = serving_status(done)
    assert shown["serving"] == wanted and "promoted" in shown["serving_reason"]
    assert "KV share 0.95" in shown["serving_reason"]

    after = desired_state(done, _succeeded(done, tmp_path))
    a, b = _by_kind(before.objects), _by_kind(after.objects)
    assert '"0.85"' in a["ConfigMap"]["data"]["config.pbtxt"].split("kv_cache_free_gpu_mem_fraction")[1][:60]
    assert '"0.95"' in b["ConfigMap"]["data"]["config.pbtxt"].split("kv_cache_free_gpu_mem_fraction")[1][:60]
    template = "spec", "template", "metadata", "annotations"

    def pod_hash(d: dict[str, Any]) -> str:
        for k in template:
            d = d[k]
        return str(d[CONFIG_HASH_ANNOTATION])

    assert pod_hash(a["Deployment"]) == pod_hash(b["Deployment"])  # reloaded in place: no pod roll on top


def test_a_canary_that_refuses_the_reload_is_rejected_and_the_settings_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused reload ends the rollout at once: nothing in force changes but the cooldown and the budget, a Warning
    Event and status.generative.servingReason say why."""
    isvc = _isvc()
    triton = FakeTriton(isvc.spec.llm_serving(), refuse={PODS[0]})
    triton.install(monkeypatch)
    cluster = FakeCluster(isvc)
    assert _apply(cluster, _decision(MORE_KV), NOW)
    done = cluster.isvc()
    assert ROLLOUT_ANNOTATION not in done.metadata.annotations
    assert llm_in_force(done) == isvc.spec.llm_serving()
    assert in_force(done).llm_reloads == (NOW,) and in_force(done).changed_at == NOW
    kind, reason, message = cluster.events[-1]
    assert (kind, reason) == ("Warning", "CanaryRejected") and "out of memory" in message
    assert (
        "stays" in serving_status(done)["serving_reason"] and "out of memory" in serving_status(done)["serving_reason"]
    )
    assert triton.live[PODS[1]] == isvc.spec.llm_serving()  # never touched


def test_rolling_mode_puts_the_settings_in_force_at_once_and_rolls_the_pods(tmp_path: Path) -> None:
    isvc = _isvc("rolling")
    cluster = FakeCluster(isvc)
    assert _apply(cluster, _decision(MORE_KV), NOW)
    done = cluster.isvc()
    assert levers_of(llm_in_force(done)) == MORE_KV and ROLLOUT_ANNOTATION not in done.metadata.annotations
    assert cluster.events[-1][1] == LEVERS_CHANGED
    one = _by_kind(desired_state(isvc, _succeeded(isvc, tmp_path)).objects)["Deployment"]
    two = _by_kind(desired_state(done, _succeeded(done, tmp_path)).objects)["Deployment"]
    hash_of = lambda d: d["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]  # noqa: E731
    assert hash_of(one) != hash_of(two)


def test_the_reload_budget_counts_the_reloads_kept_on_the_object() -> None:
    """The law's reload budget reads the reloads the config in force keeps (a restart does not refill it)."""
    isvc = _isvc()
    spent = InForce(
        batching=isvc.spec.serving.batching, replicas=2, llm_reloads=(NOW - timedelta(minutes=70), NOW), changed_at=NOW
    )
    raw = isvc.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["metadata"]["annotations"] = {APPLIED_ANNOTATION: spent.to_annotation()}
    seen = gen_in_force(InferenceService.model_validate(raw))
    assert seen.reloads == (spent.llm_reloads[0].timestamp(), NOW.timestamp())
    policy = GenPolicy.from_spec(isvc.spec)
    assert reloads_left(seen, policy, NOW.timestamp()) == RELOADS_PER_HOUR - 1  # the one 70 min ago is out


def test_only_the_levers_are_the_tuners_the_rest_of_serving_llm_stays_the_specs() -> None:
    isvc = _isvc()
    tuned = InForce(batching=isvc.spec.serving.batching, replicas=2, llm=LlmServing(max_queue_delay_microseconds=7))
    raw = isvc.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["metadata"]["annotations"] = {APPLIED_ANNOTATION: tuned.to_annotation()}
    settings = llm_in_force(InferenceService.model_validate(raw))
    assert settings.max_queue_delay_microseconds == isvc.spec.llm_serving().max_queue_delay_microseconds == 100
    assert levers_of(settings) == levers_of(LlmServing())


def test_a_batching_services_config_in_force_is_written_as_before() -> None:
    """The generative fields stay out of the annotation where unset (a batching service's is unchanged)."""
    doc = json.loads(InForce(batching=Batching(max_batch_size=8), replicas=1).to_annotation())
    assert set(doc) == {"batching", "replicas", "changedAt", "reason", "rolled"}
    back = InForce.from_annotation(InForce(batching=Batching(), replicas=1, llm=LlmServing()).to_annotation())
    assert back.llm == LlmServing()


def test_status_generative_shows_the_settings_in_force() -> None:
    isvc = _isvc()
    g = generative_status(isvc, _sig())
    assert g.serving == isvc.spec.llm_serving() and g.serving_reason == generative.SPEC_SERVING_REASON


def test_a_rollout_in_flight_is_not_left_split_while_prometheus_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a per-pod read the canary is not promoted blind: it waits, an Event says why (once), and two windows
    after its reload it is rolled back unjudged by the tick, which runs without a window of its own too; the settings
    are not remembered as rejected (caught: the canary was promoted on its reload and readiness alone)."""
    from collections import defaultdict

    from tailtune.operator.generative import generative_tick
    from tailtune.tuner.prom import PrometheusUnavailable

    isvc = _isvc()
    triton = FakeTriton(isvc.spec.llm_serving())
    triton.install(monkeypatch)
    monkeypatch.setattr(generative, "read_pod_tokens", lambda isvc, window, now: {})  # Prometheus down
    cluster = FakeCluster(isvc)
    t0 = datetime.now(UTC) - timedelta(seconds=130)  # the tick below runs at the wall clock's now
    assert _apply(cluster, _decision(MORE_KV), t0)
    assert _apply(cluster, _decision(MORE_KV), t0 + timedelta(seconds=61)) is False
    assert cluster.events[-1][:2] == ("Normal", "CanaryWaiting") and "no TTFT read" in cluster.events[-1][2]
    _apply(cluster, _decision(MORE_KV), t0 + timedelta(seconds=70))
    assert [e[1] for e in cluster.events].count("CanaryWaiting") == 1  # told once
    cluster.raw["status"] = {
        "replicas": {"desired": 2, "ready": 2},
        "generative": {"ttft": {"targetMs": 500, "percentile": 99}},
    }

    def down(isvc: InferenceService, now: datetime) -> Any:
        raise PrometheusUnavailable("http://p:9090", "refused", "connection refused")

    monkeypatch.setattr(generative, "read_window", down)

    class State:
        locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        ticking: set[tuple[str, str]] = set()

        def __init__(self) -> None:
            self.cluster = cluster

        async def current(self, namespace: str, name: str) -> dict[str, Any]:
            return cluster.raw

    async def reconciled(fresh: dict[str, Any]) -> None:
        return None

    tick = generative_tick(State(), "default", "llm", InferenceService.model_validate, reconciled)  # type: ignore[arg-type]
    asyncio.run(tick)
    kind, reason, message = cluster.events[-1]
    assert (kind, reason) == ("Warning", "CanaryRejected") and "not judged within two windows" in message
    done = cluster.isvc()
    assert ROLLOUT_ANNOTATION not in done.metadata.annotations and llm_in_force(done) == isvc.spec.llm_serving()
    assert set(triton.live.values()) == {isvc.spec.llm_serving()}  # the canary rolled back
    assert generative._memory.get(done.metadata.uid, GenState()).rejected == ()  # not judged: not known bad


def _wanted(isvc: InferenceService, levers: GenLevers) -> LlmServing:
    return serving_with(levers, isvc.spec.llm_serving())


def test_a_canary_over_its_ttft_target_is_rejected_naming_the_figure_and_not_proposed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two pods at the replica bound, over the TTFT target: the law's lever change goes to the canary, whose own P99
    TTFT over its window is over the target too and no better than the other pod's: rejected and rolled back, a
    Warning CanaryRejected naming the figure, the settings in force unchanged; the law's next proposal at the same
    demand is another change (caught: the canary was promoted on readiness, and the law proposed it again)."""
    isvc = llm(
        spec__tuning__mode="hot",
        spec__tuning__cooldownSeconds=30,
        spec__serving__replicas={"min": 2, "max": 2},
        spec__serving__llm__enableChunkedContext=False,
    )
    generative.forget(isvc.metadata.uid)
    spec_settings = isvc.spec.llm_serving()
    over = _sig(ttft=900.0, tpot=20.0, rate=4.0, ready_replicas=2, prompt_tokens_per_second=4 * 800.0)
    first = generative.decide(isvc, over, NOW)
    assert first.reason_code == LEVERS_CHANGED, first.describe()
    tried = _wanted(isvc, first.levers)
    triton = FakeTriton(spec_settings)
    triton.figures = {spec_settings: (900.0, 20.0, 200), tried: (950.0, 20.0, 200)}
    triton.install(monkeypatch)
    cluster = FakeCluster(isvc)
    assert _apply(cluster, first, NOW)
    assert _apply(cluster, first, NOW + timedelta(seconds=61))
    kind, reason, message = cluster.events[-1]
    assert (kind, reason) == ("Warning", "CanaryRejected")
    assert "TTFT P99 950.0 ms over the target 500 ms" in message, message
    assert "not proposed again at 4.00 req/s of 800-token prompts for 60 min" in message, message
    done = cluster.isvc()
    assert llm_in_force(done) == spec_settings and ROLLOUT_ANNOTATION not in done.metadata.annotations
    assert triton.live == dict.fromkeys(PODS, spec_settings) and triton.reloads[-1] == (PODS[0], spec_settings)
    assert "stays" in serving_status(done)["serving_reason"] and "950.0" in serving_status(done)["serving_reason"]
    later = NOW + timedelta(seconds=120)  # past the cooldown, within the reload budget
    again = generative.decide(done, _sig(**{**over.__dict__, "window_end": later}), later)
    assert again.reason_code == LEVERS_CHANGED and again.levers != first.levers, again.describe()
    generative.forget(isvc.metadata.uid)


def test_a_canary_worse_than_the_other_pods_past_the_noise_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within both targets, the canary's P99 TPOT 28 ms against the other pod's 20 ms on 200 requests each is past
    the noise those samples allow (bound 27.1 ms): rejected, the message names TPOT and the bound."""
    isvc = _isvc()
    triton = FakeTriton(isvc.spec.llm_serving())
    triton.figures = {_wanted(isvc, MORE_KV): (300.0, 28.0, 200)}
    triton.install(monkeypatch)
    cluster = FakeCluster(isvc)
    assert _apply(cluster, _decision(MORE_KV), NOW)
    assert _apply(cluster, _decision(MORE_KV), NOW + timedelta(seconds=61))
    kind, reason, message = cluster.events[-1]
    assert (kind, reason) == ("Warning", "CanaryRejected") and "TPOT P99 28.0 ms worse than" in message, message
    assert "bound 27.1 ms" in message and llm_in_force(cluster.isvc()) == isvc.spec.llm_serving()


def test_a_canary_with_too_few_requests_waits_says_so_and_is_promoted_once_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five requests in the canary's window: it waits past its window and an Event says why; once its window holds
    enough (within two windows) it is judged on them and promoted, the message naming its figures."""
    isvc = _isvc()
    wanted = _wanted(isvc, MORE_KV)
    triton = FakeTriton(isvc.spec.llm_serving())
    triton.figures = {wanted: (300.0, 20.0, 5)}
    triton.install(monkeypatch)
    cluster = FakeCluster(isvc)
    assert _apply(cluster, _decision(MORE_KV), NOW)
    assert _apply(cluster, _decision(MORE_KV), NOW + timedelta(seconds=61)) is False
    kind, reason, message = cluster.events[-1]
    assert (kind, reason) == ("Normal", "CanaryWaiting")
    assert "5 requests with a TTFT in the canary's window, 20 needed" in message, message
    assert llm_in_force(cluster.isvc()) == isvc.spec.llm_serving()
    triton.figures = {wanted: (300.0, 20.0, 60)}
    assert _apply(cluster, _decision(MORE_KV), NOW + timedelta(seconds=90))
    kind, reason, message = cluster.events[-1]
    assert (kind, reason) == ("Normal", "CanaryPromoted") and "TTFT P99 300.0 ms <= 500 ms" in message, message
    assert llm_in_force(cluster.isvc()) == wanted


def test_without_room_for_a_second_engine_copy_the_pods_roll_onto_the_new_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a GPU whose memory gauges say a second copy of the engine does not fit (TensorRT-LLM's KV cache took its
    share of what the engine left), no pod is reloaded in place: the settings go in force at once and the pods roll,
    each starting on them (the batching tuner's fallback, same Event reason)."""
    isvc = _isvc()
    triton = FakeTriton(isvc.spec.llm_serving())
    triton.no_room = True
    triton.install(monkeypatch)
    cluster = FakeCluster(isvc)
    assert _apply(cluster, _decision(MORE_KV), NOW)
    done = cluster.isvc()
    assert triton.reloads == [] and ROLLOUT_ANNOTATION not in done.metadata.annotations
    assert levers_of(llm_in_force(done)) == MORE_KV and in_force(done).rolled
    assert cluster.events[-1][1] == generative.HOT_RELOAD_NO_ROOM
    one = _by_kind(desired_state(isvc, _succeeded(isvc, tmp_path)).objects)["Deployment"]
    two = _by_kind(desired_state(done, _succeeded(done, tmp_path)).objects)["Deployment"]
    hash_of = lambda d: d["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]  # noqa: E731
    assert hash_of(one) != hash_of(two)
    triton.no_room = False  # gauges missing later: the pods roll again, no in-place reload on that GPU
    fewer_kv = LlmServing(**{**llm_in_force(done).model_dump(), "kv_cache_free_gpu_mem_fraction": 0.8})
    assert _apply(cluster, _decision(levers_of(fewer_kv)), NOW + timedelta(minutes=5))
    assert triton.reloads == [] and llm_in_force(cluster.isvc()) == fewer_kv
    assert cluster.events[-1][1] == generative.HOT_RELOAD_NO_ROOM


def test_no_room_to_reload_reads_the_gpu_memory_gauges_and_treats_unknown_as_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An L4 (24 GB) whose Llama-3-8B engine (16 GB) and KV cache use 22 GB has no room for a second copy; pods
    without GPU gauges (the emulated engine) or an unreadable Prometheus leave it to the canary's reload."""

    raw = _isvc().model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["status"] = {"engine": {"engineBytes": 16_000_000_000}}
    isvc = InferenceService.model_validate(raw)
    full = {PODS[0]: prom.PodWindow(gpu_used_bytes=22e9, gpu_total_bytes=24e9)}
    monkeypatch.setattr(prom, "read_pod_windows", lambda *a, **k: full)
    assert generative.no_room_to_reload(isvc, NOW)
    monkeypatch.setattr(prom, "read_pod_windows", lambda *a, **k: {PODS[0]: prom.PodWindow()})
    assert not generative.no_room_to_reload(isvc, NOW)

    def down(*a: Any, **k: Any) -> Any:
        raise prom.PrometheusUnavailable("http://p:9090", "refused", "connection refused")

    monkeypatch.setattr(prom, "read_pod_windows", down)
    assert not generative.no_room_to_reload(isvc, NOW)
