"""The fleet reader: one query per figure for many objects, split among them; failures; what stays per object.

That it gives each object the per-object reader's `Signal` on real series is checked against a real Prometheus
(`tests/prometheus/test_fleet_reader.py`); here the answers are canned.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from tailtune.tuner.fleet import FleetReader, fleet_selector, split
from tailtune.tuner.prom import PrometheusReader, PrometheusUnavailable, ReadSpec, Target

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def vec(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [NOW.timestamp(), str(value)]}


class GroupedProm:
    """A fake Prometheus for a fleet: answers each query with one series per object it names, labelled with the
    object's namespace and model (as `by (namespace, model)` does), its value from `value(metric, model)`, or one
    unlabelled series for a query that names one object. Counts the calls."""

    def __init__(self, models: dict[tuple[str, str], float], histogram: set[str] = frozenset(), fail: str = "") -> None:
        self.models = models
        self.histogram = histogram
        self.fail = fail
        self.calls: list[str] = []
        self.asked: list[tuple[str, datetime]] = []

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        self.calls.append(promql)
        self.asked.append((promql, at))
        if self.fail and self.fail in promql:
            raise PrometheusUnavailable("http://prom:9090", "http", "HTTP 400 Bad Request: bad_data")
        grouped = "by (namespace, model" in promql
        out = []
        for (ns, model), value in self.models.items():
            if not _selects(promql, ns, model):
                continue
            if promql.startswith(
                ("count(nv_inference_request_duration", "count by (namespace, model) (nv_inference_request_duration")
            ):
                if model not in self.histogram:
                    continue
                value = 4
            if "timestamp(" in promql:
                value = NOW.timestamp() - 3
            out.append(vec(value, namespace=ns, model=model) if grouped else vec(value))
        return out


def _selects(promql: str, ns: str, model: str) -> bool:
    """Whether the query's selectors take this object's series (equality or the fleet's regex)."""
    for label, value in (("namespace", ns), ("model", model)):
        eq = re.search(rf'{label}="([^"]*)"', promql)
        rx = re.search(rf'{label}=~"([^"]*)"', promql)
        if eq is not None and eq.group(1) != value:
            return False
        if rx is not None and not re.fullmatch(rx.group(1).replace("\\\\", "\\"), value):
            return False
    return True


def spec(ns: str, model: str, **kw: Any) -> ReadSpec:
    return ReadSpec(Target(ns, model, model), kw.pop("percentile", 99), kw.pop("window", 60), **kw)


# A fleet's objects cycle through these shapes: P99 and P95, one window of 90 s, further targets, the breakdown.
SHAPES: tuple[dict[str, Any], ...] = (
    {},
    {"breakdown": True},
    {"percentile": 95, "other_percentiles": (50,)},
    {"window": 90, "breakdown": True},
)


def fleet(n: int) -> list[ReadSpec]:
    return [spec(f"ns{i % 3}", f"m{i}", **SHAPES[i % len(SHAPES)]) for i in range(n)]


def prom_for(specs: list[ReadSpec], **kw: Any) -> GroupedProm:
    """Every object served (its index + 10 in every figure); every other four expose a latency histogram."""
    models = {(s.target.namespace, s.target.model): float(10 + i) for i, s in enumerate(specs)}
    return GroupedProm(models, histogram={s.target.model for i, s in enumerate(specs) if i % 8 < 4}, **kw)


def test_the_queries_of_a_read_do_not_grow_with_the_objects_read() -> None:
    few, many = fleet(8), fleet(80)  # the same mix of shapes and sources
    counts = []
    for specs in (few, many):
        prom = prom_for(specs)
        FleetReader(prom).read(specs, NOW)
        counts.append(len(prom.calls))
    assert counts[0] == counts[1]
    # Each object alone sends every figure itself: 80 objects, ten times the queries of 8.
    alone = prom_for(many)
    for s in many:
        PrometheusReader.for_spec(alone, s).read_signal(NOW)
    assert len(alone.calls) > 10 * counts[1]


def test_each_object_gets_its_own_figures_from_the_grouped_answer() -> None:
    specs = fleet(12)
    prom = prom_for(specs)
    signals = FleetReader(prom).read(specs, NOW)
    for i, (s, signal) in enumerate(zip(specs, signals, strict=True)):
        assert not isinstance(signal, Exception)
        obs = signal.observation
        assert obs.request_rate == 10 + i and obs.ready_replicas == 10 + i
        assert obs.window_end.timestamp() == NOW.timestamp() - 3
        assert signal.source == ("histogram" if s.target.model in prom.histogram else "tritonSummary")
        # Status names the object's own query, the one a user can paste.
        assert f'model="{s.target.model}"' in signal.latency_query and "by (namespace" not in signal.latency_query
        alone = PrometheusReader.for_spec(prom_for(specs), s).read_signal(NOW)
        assert signal == alone


def test_a_model_in_no_answer_reads_as_missing_not_as_another_objects_figures() -> None:
    specs = [spec("ml", "served"), spec("ml", "gone")]
    prom = GroupedProm({("ml", "served"): 7.0})
    served, gone = FleetReader(prom).read(specs, NOW)
    assert not isinstance(served, Exception) and served.observation.request_rate == 7
    assert not isinstance(gone, Exception)
    assert gone.observation.request_rate is None and gone.observation.p_latency_ms is None and gone.series == 0


def test_a_users_latency_query_stays_one_query_per_object_and_the_rest_is_shared() -> None:
    user = 'max(gw_seconds{{svc="{name}"}})'
    specs = [spec("ml", f"m{i}", latency_query=user) for i in range(5)] + [spec("ml", f"t{i}") for i in range(5)]
    prom = GroupedProm({(s.target.namespace, s.target.model): 1.0 for s in specs})
    signals = FleetReader(prom).read(specs, NOW)
    for i in range(5):
        assert sum(c == f'(max(gw_seconds{{svc="m{i}"}})) * 1000' for c in prom.calls) == 1
    assert all(not isinstance(s, Exception) for s in signals)
    assert [s.source for s in signals if not isinstance(s, Exception)] == ["userQuery"] * 5 + ["tritonSummary"] * 5
    success = "sum by (namespace, model) (rate(nv_inference_request_success"
    assert len([c for c in prom.calls if c.startswith(success) and c.endswith("[60s]))")]) == 1  # one for all ten
    assert len(set(prom.asked)) == len(prom.asked)  # nothing asked twice at one time


def test_a_failed_shared_query_ends_the_read_for_every_object_at_its_first_call() -> None:
    specs = fleet(10)
    prom = prom_for(specs, fail="nv_inference")
    outcomes = FleetReader(prom).read(specs, NOW)
    assert len(prom.calls) == 1  # a hanging Prometheus costs one timeout per read, not one per object
    assert all(isinstance(o, PrometheusUnavailable) for o in outcomes)


def test_a_users_query_that_fails_ends_only_that_objects_read() -> None:
    specs = [spec("ml", "bad", latency_query="rate(oops["), spec("ml", "good")]
    prom = prom_for(specs, fail="oops")
    bad, good = FleetReader(prom).read(specs, NOW)
    assert isinstance(bad, PrometheusUnavailable) and "bad_data" in str(bad)
    assert not isinstance(good, Exception) and good.observation.request_rate == 11


def test_the_fleet_selector_matches_exactly_the_objects_values() -> None:
    selector = fleet_selector('job="triton",namespace="{namespace}",model="{model}"')
    assert selector is not None and selector.by == ("namespace", "model") and selector.shared == ('job="triton"',)
    form = selector.form([spec("ml", "resnet-50.v2"), spec("prod", "bert"), spec("ml", "bert")])
    assert form.selector == r'namespace=~"ml|prod",model=~"bert|resnet\\-50\\.v2",job="triton"'
    assert form.by == ("namespace", "model")
    # A placeholder inside a longer value cannot be factored: such objects are read one by one.
    assert fleet_selector('namespace="{namespace}",pod=~"{name}-.*"') is None
    assert fleet_selector('namespace="ml"') is None


def test_objects_whose_selector_cannot_be_factored_are_read_one_by_one() -> None:
    odd = ReadSpec(Target("ml", "a", "a"), 99, 60, selector='namespace="{namespace}",model=~"{model}|{model}-canary"')
    specs = [odd, spec("ml", "b")]
    prom = GroupedProm({("ml", "a"): 3.0, ("ml", "b"): 4.0})
    a, b = FleetReader(prom).read(specs, NOW)
    assert not isinstance(a, Exception) and not isinstance(b, Exception)
    assert b.observation.request_rate == 4
    assert any('model=~"a|a-canary"' in c for c in prom.calls)


def test_split_groups_series_by_the_labels_values() -> None:
    answer = [vec(1, namespace="a", model="x"), vec(2, namespace="b", model="x"), vec(3, namespace="a")]
    parts = split(answer, ("namespace", "model"))
    assert parts[("a", "x")] == [answer[0]] and parts[("b", "x")] == [answer[1]] and parts[("a", "")] == [answer[2]]


@pytest.mark.parametrize("n", [1, 10, 100])
def test_queries_per_read_one_object_at_a_time_and_as_a_fleet(n: int) -> None:
    specs = [spec(f"ns{i % 7}", f"m{i}", breakdown=True) for i in range(n)]
    alone, together = GroupedProm({}), GroupedProm({})
    for s in specs:
        PrometheusReader.for_spec(alone, s).read_signal(NOW)
    FleetReader(together).read(specs, NOW)
    assert len(alone.calls) == 17 * n  # histogram?, latency, newest (+ ahead), 8 figures, 5 of the breakdown
    assert len(together.calls) == 16  # the breakdown's queue time is the signal's: asked once
