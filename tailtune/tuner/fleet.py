"""One Prometheus read for many InferenceServices: each figure once for the fleet, split among its objects.

Each object's read is the same list of figures (`prom.plan_read`) with another namespace and model in the selector.
For the objects read together from one Prometheus, each figure is written once with the selector factored out: the
matchers on a placeholder (`namespace="{namespace}"`) become regexes of the values the objects give them, and every
aggregation keeps the labels that tell the objects apart (`sum by (namespace, model) (...)`, `histogram_quantile`
over `by (namespace, model, le)`). The answer is split by those labels' values into each object's own answer, which
`prom.assemble_signal` reads exactly as it reads the per-object reader's: one source of truth for the `Signal`.

A user's `latencyQuery` is the object's own PromQL and stays one query per object; so does every object whose
selector cannot be factored (a placeholder inside a longer value).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tailtune.tuner.prom import (
    Form,
    PromClient,
    PrometheusReader,
    Query,
    ReadSpec,
    Series,
    Signal,
    assemble_signal,
    fill,
    has_histogram,
    histogram_query,
    plan_read,
)

# One label matcher of a selector template: label, operator, double-quoted value.
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*')
_PLACEHOLDER = re.compile(r"\{(namespace|name|model)\}")


@dataclass(frozen=True)
class FleetSelector:
    """A selector template factored for a fleet: the labels whose value is an object's (in the template's order), and
    the matchers every object shares."""

    by: tuple[str, ...]
    # label -> the placeholder that gives its value, e.g. {"namespace": "{namespace}", "model": "{model}"}
    placeholders: tuple[tuple[str, str], ...]
    shared: tuple[str, ...]

    def key(self, spec: ReadSpec) -> tuple[str, ...]:
        """The object's values of the labels that tell the fleet's objects apart (its group in a grouped answer)."""
        return tuple(fill(p, spec.target, spec.window_seconds) for _, p in self.placeholders)

    def form(self, specs: Sequence[ReadSpec]) -> Form:
        """The fleet's form: each object label matched against the values these objects give it."""
        keys = {self.key(s) for s in specs}
        matchers = [
            f'{label}=~"{_promql_string(_alternatives({k[i] for k in keys}))}"' for i, label in enumerate(self.by)
        ]
        return Form(",".join([*matchers, *self.shared]), self.by)


def fleet_selector(template: str) -> FleetSelector | None:
    """The template factored (each matcher either `label="{placeholder}"` or free of placeholders), or None when it
    cannot be (a placeholder inside a longer value, a label matched twice on placeholders)."""
    by: list[str] = []
    placeholders: list[tuple[str, str]] = []
    shared: list[str] = []
    for part in _split_matchers(template):
        m = _MATCHER.fullmatch(part)
        if m is None:
            return None
        label, op, value = m.groups()
        if _PLACEHOLDER.search(value) is None:
            shared.append(part.strip())
        elif op == "=" and _PLACEHOLDER.fullmatch(value) and label not in by:
            by.append(label)
            placeholders.append((label, value))
        else:
            return None
    return FleetSelector(tuple(by), tuple(placeholders), tuple(shared)) if by else None


def _split_matchers(template: str) -> list[str]:
    """The template's matchers: split at the commas outside quoted values."""
    parts, current, quoted, escaped = [], "", False, False
    for ch in template:
        if ch == "," and not quoted:
            parts.append(current)
            current = ""
            continue
        current += ch
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
    return [p for p in (*parts, current) if p.strip()]


def _alternatives(values: set[str]) -> str:
    """An RE2 regex (Prometheus anchors it) matching exactly these values."""
    return "|".join(re.escape(v) for v in sorted(values))


def _promql_string(value: str) -> str:
    """A value inside a double-quoted PromQL string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def split(series: Series, by: tuple[str, ...]) -> dict[tuple[str, ...], Series]:
    """A grouped answer split by the values of `by`: each object's own answer (at most one series each, as its own
    query's aggregation gives)."""
    out: dict[tuple[str, ...], Series] = {}
    for s in series:
        labels = s.get("metric", {})
        out.setdefault(tuple(str(labels.get(label, "")) for label in by), []).append(s)
    return out


class FleetReader:
    """Reads the window ending at one time for many InferenceServices from one Prometheus (one client).

    The objects whose selector template factors the same way are read together: one query for whether each exposes
    a latency histogram, then one query per distinct figure (the SLO percentile's latency, the newest sample and its
    clock probe, rates, queue, compute, batch, replicas, each further percentile, the breakdown), whatever their
    number. Objects of other percentiles or windows add only the figures that differ. A failure of a shared query
    ends the read for every object (a hanging Prometheus costs one timeout per read, not one per object); a user's
    own query that fails ends that object's read alone.
    """

    def __init__(self, client: PromClient) -> None:
        self._client = client

    def read(self, specs: Sequence[ReadSpec], at: datetime) -> list[Signal | Exception]:
        """Each object's signal, or the exception its read ended with, in the order of `specs`."""
        out: dict[int, Signal | Exception] = {}
        groups: dict[str, list[int]] = {}
        for i, spec in enumerate(specs):
            groups.setdefault(spec.selector, []).append(i)
        try:
            for template, members in groups.items():
                selector = fleet_selector(template)
                if selector is None:
                    out |= {i: _read_one(PrometheusReader.for_spec(self._client, specs[i]), at) for i in members}
                else:
                    out |= zip(members, self._read_group(selector, [specs[i] for i in members], at), strict=True)
        except Exception as exc:  # a shared query failed: the read ends for all
            return [exc] * len(specs)
        return [out[i] for i in range(len(specs))]

    def _read_group(self, selector: FleetSelector, specs: list[ReadSpec], at: datetime) -> list[Signal | Exception]:
        form = selector.form(specs)
        keys = [selector.key(s) for s in specs]
        histograms = split(self._client.query(histogram_query(form), at), selector.by)
        flags = [has_histogram(histograms.get(k, [])) for k in keys]
        plans = [plan_read(s, h, form) for s, h in zip(specs, flags, strict=True)]
        shared: dict[Query, dict[tuple[str, ...], Series]] = {}
        for plan in plans:
            for query in plan.values():
                if not query.own and query not in shared:
                    shared[query] = split(self._client.query(query.promql, query.time(at)), selector.by)
        out: list[Signal | Exception] = []
        for spec, histogram, plan, key in zip(specs, flags, plans, keys, strict=True):
            try:
                results = {
                    name: self._client.query(q.promql, q.time(at)) if q.own else shared[q].get(key, [])
                    for name, q in plan.items()
                }
                out.append(assemble_signal(spec, histogram, results, at))
            except Exception as exc:  # the object's own query: its read alone ends
                out.append(exc)
        return out


def _read_one(reader: PrometheusReader, at: datetime) -> Signal | Exception:
    try:
        return reader.read_signal(at)
    except Exception as exc:  # the object's own read: it alone ends
        return exc
