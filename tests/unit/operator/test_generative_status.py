"""A generative service's status from one Prometheus window (tailtune.operator.generative): status.generative, the
SLOMet verdict on TTFT and TPOT, and what reconcile keeps of the tick's writing."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tailtune.api import InferenceService
from tailtune.api.v1alpha1 import Condition, GenerativeStatus, InferenceServiceStatus
from tailtune.operator import generative
from tailtune.operator.generative import carry_into, generative_status, observation, slo_condition
from tailtune.tuner.prom import GenerativeSignal, PrometheusUnavailable
from tests.unit.factories import make_isvc

NOW = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)


def _isvc() -> InferenceService:
    return (
        make_isvc("llm")
        .set("spec.model.kind", "generative")
        .set("spec.slo.ttft", {"targetMs": 500, "percentile": 99})
        .set("spec.slo.tpot", {"targetMs": 30, "percentile": 90})
        .obj()
    )


def _sig(
    ttft: float | None = 400.0, tpot: float | None = 25.0, rate: float | None = 3.0, **kw: object
) -> GenerativeSignal:
    values: dict[str, object] = dict(
        window_end=NOW, span_seconds=60.0, ttft_ms=ttft, tpot_ms=tpot, request_rate=rate, tokens_per_second=120.04,
        running=7.6, waiting=1.2, kv_used_fraction=0.4321, ready_replicas=2,
    )  # fmt: skip
    values.update(kw)
    return GenerativeSignal(**values)  # type: ignore[arg-type]


def test_status_shows_each_token_latency_against_its_target_and_the_engines_load() -> None:
    g = generative_status(_isvc(), _sig(ttft=612.34))
    assert g.ttft is not None and g.tpot is not None
    assert (g.ttft.percentile, g.ttft.target_ms, g.ttft.observed_ms, g.ttft.met) == (99, 500, 612.3, False)
    assert (g.tpot.percentile, g.tpot.target_ms, g.tpot.observed_ms, g.tpot.met) == (90, 30, 25.0, True)
    assert (g.ttft_summary, g.tpot_summary) == ("P99 612.3/500 MISSED", "P90 25/30 ok")
    assert (g.tokens_per_second, g.running_sequences, g.waiting_sequences, g.kv_cache_used_percent) == (
        120.0, 8, 1, 43.2,
    )  # fmt: skip


def test_slo_met_names_the_target_missed_and_holds_judgement_without_data() -> None:
    isvc = _isvc()
    ok = slo_condition(isvc, _sig())
    assert (ok.status, ok.reason) == ("True", "WithinSLO") and "TTFT P99 400/500 ok" in ok.message
    tpot = slo_condition(isvc, _sig(tpot=31.0))
    assert (tpot.status, tpot.reason) == ("False", "SLOViolated") and tpot.message.startswith("TPOT over target")
    above = slo_condition(isvc, _sig(ttft=None, above_range_ttft=True))
    assert above.status == "False" and above.message.startswith("TTFT over target")  # above every bucket: missed
    assert slo_condition(isvc, _sig(rate=0.0)).reason == "NoTraffic"
    assert slo_condition(isvc, _sig(tpot=None)).reason == "NoLatencyData"
    down = slo_condition(isvc, None, "http://p:9090: connection refused")
    assert (down.status, down.reason) == ("Unknown", "PrometheusUnavailable") and "refused" in down.message


def test_reconcile_keeps_the_ticks_slo_met_and_figures() -> None:
    """Reconcile computes SLOMet from status.latency, which a generative service never has: it must keep the tick's
    verdict and status.generative (caught: each reconcile reset them to NoLatencyData and empty)."""
    tick_slo = Condition(type="SLOMet", status="False", reason="SLOViolated", message="TPOT over target")
    gen = generative_status(_isvc(), _sig())
    raw = _isvc().model_dump(by_alias=True, mode="json")
    raw["status"] = {"conditions": [tick_slo.model_dump(by_alias=True)], "generative": gen.model_dump(by_alias=True)}
    isvc = InferenceService.model_validate(raw)
    computed = InferenceServiceStatus(
        conditions=[Condition(type="SLOMet", status="Unknown", reason="NoLatencyData", message="no P99 latency data"),
                    Condition(type="Ready", status="True", reason="AllComponentsReady", message="")],
    )  # fmt: skip
    kept = carry_into(isvc, computed)
    assert [c.reason for c in kept.conditions] == ["SLOViolated", "AllComponentsReady"]
    assert kept.generative == gen != GenerativeStatus()
    first = carry_into(_isvc(), computed)  # before any tick: not judged, and says why
    assert first.conditions[0].message == "no TTFT/TPOT read from Prometheus yet"


def test_the_tuners_window_takes_the_read() -> None:
    obs = observation(_sig(ttft=None, above_range_ttft=True), ready=2)
    assert obs.ttft_ms == float("inf") and obs.tpot_ms == 25.0
    assert (obs.window_end - obs.window_start, obs.requests, obs.replicas_ready) == (60.0, 180, 2)


def test_explain_speaks_ttft_and_tpot(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tailtune explain` of a generative service: the token latencies against their targets, the engine's load and
    the tuner's next step; exit 3 naming the cause when Prometheus cannot be read (caught: explain showed the
    request latency, which a generative service has none of)."""
    isvc = _isvc()
    monkeypatch.setattr(generative, "read_window", lambda _isvc, _now: _sig(tpot=31.0))
    code, text = generative.explain_generative(isvc, NOW)
    assert code == 0
    assert "TTFT       P99 400/500 ok ms" in text and "TPOT       P90 31/30 MISSED ms" in text
    assert "SLOMet     False (SLOViolated)" in text and "\nnext       " in text
    doc = json.loads(generative.explain_generative(isvc, NOW, as_json=True)[1])
    assert doc["generative"]["tpot"]["met"] is False and doc["next"]["replicas"] >= 1

    def down(_isvc: InferenceService, _now: datetime) -> GenerativeSignal:
        raise PrometheusUnavailable("http://p:9090", "refused", "connection refused")

    monkeypatch.setattr(generative, "read_window", down)
    code, text = generative.explain_generative(isvc, NOW)
    assert code == 3 and "TTFT/TPOT  not read" in text and "PrometheusUnavailable" in text


def test_explain_shows_the_serving_settings_in_force_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generative, "read_window", lambda _isvc, _now: _sig())
    code, text = generative.explain_generative(_isvc(), NOW)
    assert code == 0
    assert "serving    guaranteed_no_evict, KV share 0.9, no chunked prefill, queue unbounded (spec.serving.llm" in text
    doc = json.loads(generative.explain_generative(_isvc(), NOW, as_json=True)[1])
    assert doc["servingInForce"]["kvCacheFreeGpuMemFraction"] == 0.9 and doc["rollout"] is None
