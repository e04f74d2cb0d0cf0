"""The only module that talks to Prometheus: builds the tuner's queries and reads one `Observation`.

The queries of one read are listed by figure (`plan_read`) and their answers read into a `Signal` by one function
(`assemble_signal`), whichever reader sent them: `PrometheusReader`, one object's own queries, or
`tuner.fleet.FleetReader`, the same figures written once for many objects (a `Form` with the labels that tell them
apart) and split among them.

Latency, by default from Triton's own metrics:

- a request-duration histogram (`nv_inference_request_duration_us_bucket`) when the server exposes one:
  buckets add up across pods, so `histogram_quantile` over their sum is exact. Triton 2.51's
  `--metrics-config histogram_latencies=true` only adds a first-response histogram for decoupled models,
  so on current Triton this path is for servers or exporters that add one;
- otherwise the summary `nv_inference_request_summary_us{quantile=...}` (`summary_latencies=true`).
  Summary quantiles cannot be averaged across pods, so the conservative aggregate is the max over pods;
  they cover a fixed sliding 60 s, so the observation's span is at least 60 s and the law waits that long
  after a change.

The user's PromQL (`spec.metrics.latencyQuery`, in seconds) replaces both when given. Rate, queue and
compute time per request, mean batch and the pending-queue growth come from Triton's counters.
Missing series give None, never zero.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from tailtune.tuner.types import SUMMARY_WINDOW_SECONDS, TAIL_SHARE, Observation, judged_window_seconds

DEFAULT_SELECTOR = 'namespace="{namespace}",model="{model}"'


class PromClient(Protocol):
    """An instant-query client: the result vector of one PromQL at one time (raises `PrometheusUnavailable`)."""

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]: ...


ErrorKind = Literal["dns", "refused", "timeout", "http", "invalid"]
Source = Literal["tritonSummary", "histogram", "userQuery"]
DEFAULT_TIMEOUT_SECONDS = 3.0
# How far ahead of the read the newest sample is looked for: Prometheus' default lookback (`--query.lookback-delta`,
# 5 min), so the query ahead sees every sample stamped after the read's time up to that far (with a shorter lookback,
# only the far end of that span).
CLOCK_PROBE_SECONDS = 300.0
# Past this length a query goes in a form POST, which Prometheus' API takes alike: a fleet's query names every object,
# and a URL that long may be refused by what sits in front of Prometheus (nginx reads request lines of 8 KB at most).
MAX_GET_QUERY_CHARS = 2000
# Triton's default summary quantiles (`--metrics-config summary_quantiles=...` changes them).
TRITON_SUMMARY_QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")


class PrometheusUnavailable(Exception):
    """Prometheus could not answer: which URL, and why (DNS, refused, timeout, HTTP status, invalid reply)."""

    def __init__(self, url: str, kind: ErrorKind, detail: str) -> None:
        super().__init__(f"{url}: {kind}: {detail}")
        self.url, self.kind, self.detail = url, kind, detail


class HttpPromClient:
    """Prometheus' HTTP API with a timeout on every call; failures classified as `PrometheusUnavailable`."""

    def __init__(self, url: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        import requests

        self.url = url.rstrip("/")
        self.timeout = timeout_seconds
        self._session = requests.Session()

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        """The result vector of an instant query."""
        import requests

        params = {"query": promql, "time": f"{at.timestamp():.3f}", "timeout": f"{self.timeout:g}s"}
        url = f"{self.url}/api/v1/query"
        try:
            if len(promql) > MAX_GET_QUERY_CHARS:
                response = self._session.post(url, data=params, timeout=self.timeout)
            else:
                response = self._session.get(url, params=params, timeout=self.timeout)
        except requests.Timeout as exc:
            raise PrometheusUnavailable(self.url, "timeout", f"no answer within {self.timeout:g} s") from exc
        except requests.ConnectionError as exc:
            raise PrometheusUnavailable(self.url, _connection_kind(exc), _root(exc)) from exc
        except requests.RequestException as exc:
            raise PrometheusUnavailable(self.url, "invalid", _root(exc)) from exc
        if response.status_code != 200:
            raise PrometheusUnavailable(
                self.url, "http", f"HTTP {response.status_code} {response.reason}: {response.text[:200]}"
            )
        try:
            body = response.json()
            result: list[dict[str, Any]] = body["data"]["result"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PrometheusUnavailable(self.url, "invalid", f"not a Prometheus answer: {response.text[:200]}") from exc
        return result


def _root(exc: BaseException) -> str:
    """The innermost cause's message (requests wraps urllib3 wraps socket)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    args = getattr(exc, "args", ())
    return str(args[-1] if args else exc) or type(exc).__name__


def _connection_kind(exc: BaseException) -> ErrorKind:
    text = repr(exc)
    if "NameResolution" in text or "Name or service not known" in text or "getaddrinfo" in text:
        return "dns"
    if "ConnectTimeout" in text or "timed out" in text:
        return "timeout"
    if "Connection refused" in text or "ConnectionRefused" in text:
        return "refused"
    chain: BaseException | None = exc
    while chain is not None:
        if isinstance(chain, socket.gaierror):
            return "dns"
        if isinstance(chain, ConnectionRefusedError):
            return "refused"
        chain = chain.__cause__ or chain.__context__
    return "refused"


@dataclass(frozen=True)
class Target:
    """Whose metrics: the InferenceService's namespace and name, and the model name inside Triton."""

    namespace: str
    name: str
    model: str


@dataclass(frozen=True)
class Queries:
    """The PromQL the reader runs; latency in ms, rates in 1/s."""

    latency_ms: str
    span_seconds: float
    request_rate: str
    queue_ms: str
    compute_ms: str
    avg_batch: str
    queue_growth_rps: str
    ready_replicas: str
    source: Source = "tritonSummary"
    # Completions plus queue growth over the window's last TAIL_SHARE (`Observation.tail_demand_rps`).
    tail_demand_rps: str = ""
    # The most requests pending on one pod now (`Observation.pending_max`).
    pending_max: str = ""
    # Unix time of the newest sample behind the latency figure: the window's end advances only with new data (read at
    # the read's time, and ahead of it: samples stamped in the future say a clock is off).
    newest_sample: str = ""


@dataclass(frozen=True)
class Breakdown:
    """Where a request's time goes inside Triton, mean ms per request over the window (None: no series)."""

    queue_ms: float | None
    input_ms: float | None
    infer_ms: float | None
    output_ms: float | None
    request_ms: float | None

    @property
    def rest_ms(self) -> float | None:
        """Request time Triton spent outside the queue and the compute steps (its own request path)."""
        parts = (self.queue_ms, self.input_ms, self.infer_ms, self.output_ms)
        if self.request_ms is None or any(p is None for p in parts):
            return None
        return max(0.0, self.request_ms - sum(p for p in parts if p is not None))


@dataclass(frozen=True)
class Signal:
    """One read of the latency signal: the law's observation, and what status says about it."""

    observation: Observation
    source: Source
    # How many series the latency query returned; more than one is ambiguous and never silently reduced.
    series: int = 1
    ambiguous: str = ""
    # The quantile lies above every histogram bucket (+Inf): over any SLO, not missing.
    above_range: bool = False
    latency_query: str = ""
    # Where the time goes inside Triton over the same window (None: not read).
    breakdown: Breakdown | None = None
    # Triton's own figure at the SLO percentile when the SLO's comes from the user's (end-to-end) query.
    server_ms: float | None = None


def fill(template: str, target: Target, window_seconds: float, percentile: float | None = None) -> str:
    """Substitute {namespace} {name} {model} {window} (and {quantile} {percentile} when given) and nothing else
    (PromQL has braces of its own)."""
    values = {
        "namespace": target.namespace,
        "name": target.name,
        "model": target.model,
        "window": f"{round(window_seconds)}s",
    }
    if percentile is not None:
        values |= {"quantile": f"{percentile / 100:g}", "percentile": f"{percentile:g}"}
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def fill_user_query(template: str, target: Target, window_seconds: float, percentile: float | None = None) -> str:
    """A user's `latencyQuery`: placeholders filled, then the doubled braces the spec asks for (`{{` for a
    literal `{`, as in Python's format strings) turned back into PromQL's single ones."""
    return fill(template, target, window_seconds, percentile).replace("{{", "{").replace("}}", "}")


def quantile_label(percentile: float) -> str:
    """Triton's quantile label for a percentile: 99 -> '0.99', 99.9 -> '0.999'."""
    return f"{percentile / 100:g}"


@dataclass(frozen=True)
class Form:
    """Whose series a query reads: one object's filled selector, or a fleet's selector with the labels that tell its
    objects apart (`by`, e.g. namespace and model), by which every aggregation then keeps one series per object."""

    selector: str
    by: tuple[str, ...] = ()

    def agg(self, op: str, expr: str, *labels: str) -> str:
        """`op` over `expr`, by the form's labels and these: `sum(x)` for one object, `sum by (namespace, model) (x)`
        for a fleet."""
        by = (*self.by, *labels)
        return f"{op} by ({', '.join(by)}) ({expr})" if by else f"{op}({expr})"


def own_form(target: Target, window_seconds: float, selector: str = DEFAULT_SELECTOR) -> Form:
    """The form of one object's own queries: its selector filled."""
    return Form(fill(selector, target, window_seconds))


def build_queries(
    target: Target,
    percentile: float,
    window_seconds: float,
    *,
    latency_query: str | None = None,
    histogram: bool = False,
    selector: str = DEFAULT_SELECTOR,
    form: Form | None = None,
) -> Queries:
    """The queries for one InferenceService (`form`: written for a fleet instead; a user's query stays its own)."""
    f = form or own_form(target, window_seconds, selector)
    sel = f.selector
    w = f"{round(window_seconds)}s"

    def rate(metric: str) -> str:
        return f.agg("sum", f"rate({metric}{{{sel}}}[{w}])")

    q = percentile / 100
    source: Source
    if latency_query is not None:
        latency = f"({fill_user_query(latency_query, target, window_seconds, percentile)}) * 1000"
        span = window_seconds
        source, newest = "userQuery", f.agg("max", f"timestamp(nv_inference_request_success{{{sel}}})")
    elif histogram:
        buckets = f.agg("sum", f"rate(nv_inference_request_duration_us_bucket{{{sel}}}[{w}])", "le")
        latency = f"histogram_quantile({q:g}, {buckets}) / 1000"
        span = window_seconds
        source, newest = "histogram", f.agg("max", f"timestamp(nv_inference_request_duration_us_bucket{{{sel}}})")
    else:
        summary = f'nv_inference_request_summary_us{{{sel},quantile="{quantile_label(percentile)}"}}'
        extra = window_seconds - SUMMARY_WINDOW_SECONDS
        # The summary already covers the last 60 s; a longer SLO window adds the max over the rest.
        over = summary if extra < 1 else f"max_over_time({summary}[{round(extra)}s])"
        latency = f"{f.agg('max', over)} / 1000"
        span = judged_window_seconds(window_seconds)
        source, newest = "tritonSummary", f.agg("max", f"timestamp({summary})")
    success = rate("nv_inference_request_success")
    # Over the window's tail: no figure where it holds fewer than two scrapes (Prometheus' rate then returns none,
    # and the law waits a window more on a rising demand).
    t = f"{max(1, round(TAIL_SHARE * window_seconds))}s"
    tail_done = f.agg("sum", f"rate(nv_inference_request_success{{{sel}}}[{t}])")
    tail = f"{tail_done} + {f.agg('sum', f'deriv(nv_inference_pending_request_count{{{sel}}}[{t}])')}"
    compute = " + ".join(rate(f"nv_inference_compute_{part}_duration_us") for part in ("input", "infer", "output"))
    return Queries(
        latency_ms=latency,
        span_seconds=span,
        request_rate=success,
        queue_ms=f"{rate('nv_inference_queue_duration_us')} / {success} / 1000",
        compute_ms=f"({compute}) / {success} / 1000",
        avg_batch=f"{rate('nv_inference_count')} / {rate('nv_inference_exec_count')}",
        queue_growth_rps=f.agg("sum", f"deriv(nv_inference_pending_request_count{{{sel}}}[{w}])"),
        ready_replicas=f.agg("count", f.agg("count", f"nv_inference_request_success{{{sel}}}", "instance")),
        tail_demand_rps=tail,
        pending_max=f.agg("max", f.agg("sum", f"nv_inference_pending_request_count{{{sel}}}", "instance")),
        source=source,
        newest_sample=newest,
    )


def breakdown_queries(
    target: Target, window_seconds: float, selector: str = DEFAULT_SELECTOR, *, form: Form | None = None
) -> dict[str, str]:
    """Mean ms per request of each step of Triton's request path over the window (its cumulative counters)."""
    f = form or own_form(target, window_seconds, selector)
    w = f"{round(window_seconds)}s"
    success = f.agg("sum", f"rate(nv_inference_request_success{{{f.selector}}}[{w}])")

    def per_request(metric: str) -> str:
        return f"{f.agg('sum', f'rate({metric}{{{f.selector}}}[{w}])')} / {success} / 1000"

    return {
        "queue_ms": per_request("nv_inference_queue_duration_us"),
        "input_ms": per_request("nv_inference_compute_input_duration_us"),
        "infer_ms": per_request("nv_inference_compute_infer_duration_us"),
        "output_ms": per_request("nv_inference_compute_output_duration_us"),
        "request_ms": per_request("nv_inference_request_duration_us"),
    }


def histogram_query(form: Form) -> str:
    """How many latency-histogram series the object (or each object of a fleet) exposes: its latency comes from
    them when there are any."""
    return form.agg("count", f"nv_inference_request_duration_us_bucket{{{form.selector}}}")


@dataclass(frozen=True)
class ReadSpec:
    """What one InferenceService's read asks of Prometheus: whose metrics, at which percentiles, over which window."""

    target: Target
    percentile: float
    window_seconds: float
    latency_query: str | None = None
    selector: str = DEFAULT_SELECTOR
    # Further targets' percentiles, read over the same window into `Observation.other_percentiles`.
    other_percentiles: tuple[float, ...] = ()
    breakdown: bool = False


@dataclass(frozen=True)
class Query:
    """One instant query of a read: its PromQL, whether it runs ahead of the read's time (the clock probe), and
    whether it is the object's own (a user's query: never written for a fleet)."""

    promql: str
    ahead: bool = False
    own: bool = False

    def time(self, at: datetime) -> datetime:
        """When the query is evaluated for a read at `at`."""
        return at + timedelta(seconds=CLOCK_PROBE_SECONDS) if self.ahead else at


# The figures of a read's breakdown, by `Breakdown` field.
BREAKDOWN_PREFIX = "breakdown."


def _percentile_queries(spec: ReadSpec, percentile: float | None, histogram: bool, form: Form, triton: bool) -> Queries:
    """The queries at the SLO's percentile (None) or another; `triton`: Triton's own figure even when the user gave a
    query. The user's query serves another percentile only when it has a placeholder for it."""
    user = None if triton else spec.latency_query
    if user is not None and percentile is not None and "{quantile}" not in user and "{percentile}" not in user:
        user = None  # the user's query is for the SLO's percentile only: other ones come from Triton's metrics
    return build_queries(
        spec.target,
        spec.percentile if percentile is None else percentile,
        spec.window_seconds,
        latency_query=user,
        histogram=user is None and histogram,
        form=form,
    )


def plan_read(spec: ReadSpec, histogram: bool, form: Form) -> dict[str, Query]:
    """Every query of one object's read, by figure, written in `form` (its own, or its fleet's), once it is known
    whether Triton exposes a latency histogram. The one list both readers send; `assemble_signal` reads the answers."""
    q = _percentile_queries(spec, None, histogram, form, triton=False)
    figures = {
        "latency": Query(q.latency_ms, own=q.source == "userQuery"),
        "newest": Query(q.newest_sample),
        "newest_ahead": Query(q.newest_sample, ahead=True),
        "ready_replicas": Query(q.ready_replicas),
        "request_rate": Query(q.request_rate),
        "queue_ms": Query(q.queue_ms),
        "compute_ms": Query(q.compute_ms),
        "avg_batch": Query(q.avg_batch),
        "queue_growth_rps": Query(q.queue_growth_rps),
        "tail_demand_rps": Query(q.tail_demand_rps),
        "pending_max": Query(q.pending_max),
    }
    for percentile in spec.other_percentiles:
        other = _percentile_queries(spec, percentile, histogram, form, triton=False)
        figures[f"P{percentile:g}"] = Query(other.latency_ms, own=other.source == "userQuery")
    if q.source == "userQuery":
        figures["server_ms"] = Query(_percentile_queries(spec, None, histogram, form, triton=True).latency_ms)
    if spec.breakdown:
        parts = breakdown_queries(spec.target, spec.window_seconds, form=form)
        figures |= {BREAKDOWN_PREFIX + k: Query(v) for k, v in parts.items()}
    return figures


Series = list[dict[str, Any]]


def assemble_signal(spec: ReadSpec, histogram: bool, results: Mapping[str, Series], at: datetime) -> Signal:
    """One read's signal from the answers to `plan_read`'s figures (result vectors, by figure): the observation,
    whose window ends at the newest sample behind the latency figure (so two reads without a new scrape are the same
    window; ahead of `at` when a clock is off), and what status says about it. Pure: both readers end here."""
    q = _percentile_queries(spec, None, histogram, own_form(spec.target, spec.window_seconds, spec.selector), False)
    series = results["latency"]
    latency, above, ambiguous = _latency(series)
    newest = _value(results["newest"])
    # Samples stamped after `at` are invisible at `at`: a query ahead shows them. The window ends at the newest
    # sample as stamped, never clamped to the read's time: `tuner.judge` tells a scrape during the read from a
    # clock that is off (ClockSkew).
    ahead = _value(results["newest_ahead"])
    if ahead is not None and ahead > at.timestamp():
        newest = ahead
    window_end = datetime.fromtimestamp(newest, tz=at.tzinfo) if newest is not None else at
    replicas = _value(results["ready_replicas"])
    requests = _value(results["request_rate"])
    others: list[tuple[float, float | None]] = []
    for percentile in spec.other_percentiles:
        value, _, why = _latency(results[f"P{percentile:g}"])
        others.append((percentile, value))
        ambiguous = ambiguous or (f"P{percentile:g}: {why}" if why else "")
    server_ms = _latency(results["server_ms"])[0] if q.source == "userQuery" else None
    observation = Observation(
        window_end=window_end,
        span_seconds=q.span_seconds,
        p_latency_ms=latency,
        request_rate=requests,
        queue_ms=_value(results["queue_ms"]),
        compute_ms=_value(results["compute_ms"]),
        avg_batch=_value(results["avg_batch"]),
        queue_growth_rps=_value(results["queue_growth_rps"]),
        tail_demand_rps=_value(results["tail_demand_rps"]),
        pending_max=_value(results["pending_max"]),
        ready_replicas=round(replicas) if replicas is not None else None,
        sample_count=round(requests * q.span_seconds) if requests is not None else None,
        other_percentiles=tuple(others),
    )
    breakdown = None
    if spec.breakdown:
        parts = {k[len(BREAKDOWN_PREFIX) :]: _value(v) for k, v in results.items() if k.startswith(BREAKDOWN_PREFIX)}
        breakdown = Breakdown(**parts)
    return Signal(
        observation=observation,
        source=q.source,
        series=len(series),
        ambiguous=ambiguous,
        above_range=above,
        latency_query=q.latency_ms,
        breakdown=breakdown,
        server_ms=server_ms,
    )


def has_histogram(series: Series) -> bool:
    """Whether the answer to `histogram_query` counts any histogram series."""
    return (_value(series) or 0) > 0


def _value(series: Series) -> float | None:
    """The value of a one-series answer (None: no series, or not a finite number)."""
    if not series:
        return None
    value = float(series[0]["value"][1])
    return value if math.isfinite(value) else None


class PrometheusReader:
    """Reads the window ending at a given time for one InferenceService (the loop's ObservationReader).

    Every call has a timeout (the client's); the first failure ends the read with `PrometheusUnavailable`, so a
    hanging Prometheus costs one timeout per tick, not one per query. `tuner.fleet.FleetReader` reads many objects
    with the same queries written for the fleet.
    """

    def __init__(
        self,
        client: PromClient,
        target: Target,
        percentile: float,
        window_seconds: float,
        *,
        latency_query: str | None = None,
        selector: str = DEFAULT_SELECTOR,
        other_percentiles: tuple[float, ...] = (),
        breakdown: bool = False,
    ) -> None:
        self._client = client
        self.spec = ReadSpec(
            target, percentile, window_seconds, latency_query=latency_query, selector=selector,
            other_percentiles=other_percentiles, breakdown=breakdown,
        )  # fmt: skip

    @classmethod
    def connect(
        cls,
        url: str,
        target: Target,
        percentile: float,
        window_seconds: float,
        *,
        latency_query: str | None = None,
        selector: str = DEFAULT_SELECTOR,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        other_percentiles: tuple[float, ...] = (),
        breakdown: bool = False,
    ) -> PrometheusReader:
        """A reader over Prometheus' HTTP API at this URL."""
        client = HttpPromClient(url, timeout_seconds)
        return cls(
            client, target, percentile, window_seconds, latency_query=latency_query, selector=selector,
            other_percentiles=other_percentiles, breakdown=breakdown,
        )  # fmt: skip

    @classmethod
    def for_spec(cls, client: PromClient, spec: ReadSpec) -> PrometheusReader:
        """A reader of this object's read over this client."""
        return cls(
            client, spec.target, spec.percentile, spec.window_seconds, latency_query=spec.latency_query,
            selector=spec.selector, other_percentiles=spec.other_percentiles, breakdown=spec.breakdown,
        )  # fmt: skip

    def _form(self) -> Form:
        return own_form(self.spec.target, self.spec.window_seconds, self.spec.selector)

    def read(self, window_end: datetime) -> Observation:
        """One observation (the loop's reader); raises `PrometheusUnavailable`."""
        return self.read_signal(window_end).observation

    def read_signal(self, at: datetime) -> Signal:
        """One read at `at` (`assemble_signal` says what it holds): whether a latency histogram exists, then every
        figure of `plan_read`, one query each."""
        form = self._form()
        histogram = has_histogram(self._client.query(histogram_query(form), at))
        figures = plan_read(self.spec, histogram, form)
        results = {name: self._client.query(f.promql, f.time(at)) for name, f in figures.items()}
        return assemble_signal(self.spec, histogram, results, at)

    def read_breakdown(self, at: datetime) -> Breakdown:
        """Where the time goes inside Triton over the window ending at `at`."""
        parts = breakdown_queries(self.spec.target, self.spec.window_seconds, form=self._form())
        return Breakdown(**{k: _value(self._client.query(v, at)) for k, v in parts.items()})


def _latency(series: list[dict[str, Any]]) -> tuple[float | None, bool, str]:
    """(ms, above every bucket, why ambiguous) from the latency query's result vector.

    Several series are ambiguous: which one is the service's latency is not ours to guess. NaN (no requests in
    the window) is no data; +Inf (the quantile lies in the +Inf bucket) is over any SLO.
    """
    if len(series) > 1:
        labels = sorted({k for s in series for k in s.get("metric", {})})
        varying = [k for k in labels if len({s.get("metric", {}).get(k) for s in series}) > 1]
        shown = ", ".join(varying or labels) or "no labels"
        why = f"the latency query returned {len(series)} series (differing in: {shown}); aggregate it to one"
        return None, False, why
    if not series:
        return None, False, ""
    value = float(series[0]["value"][1])
    if math.isinf(value) and value > 0:
        return math.inf, True, ""
    return (value if math.isfinite(value) else None), False, ""


@dataclass(frozen=True)
class PodWindow:
    """One Triton pod's own window (the canary's judge): latency, successes and failures, GPU memory.

    Every field is None when its series is missing."""

    p_ms: float | None = None
    success_rps: float | None = None
    failure_rps: float | None = None
    gpu_used_bytes: float | None = None
    gpu_total_bytes: float | None = None

    @property
    def error_rate(self) -> float | None:
        """Failed share of the requests in the window."""
        if self.success_rps is None:
            return None
        total = self.success_rps + (self.failure_rps or 0.0)
        return (self.failure_rps or 0.0) / total if total > 0 else 0.0


def pod_queries(
    target: Target,
    percentile: float,
    window_seconds: float,
    *,
    histogram: bool = False,
    selector: str = DEFAULT_SELECTOR,
) -> dict[str, str]:
    """Per-pod PromQL (one series per scrape `instance`), keyed by `PodWindow` field."""
    sel = fill(selector, target, window_seconds)
    w = f"{round(window_seconds)}s"
    if histogram:
        buckets = f"sum by (instance, le) (rate(nv_inference_request_duration_us_bucket{{{sel}}}[{w}]))"
        latency = f"histogram_quantile({percentile / 100:g}, {buckets}) / 1000"
    else:
        # Triton's summary already covers the last 60 s of this pod alone.
        summary = f'nv_inference_request_summary_us{{{sel},quantile="{quantile_label(percentile)}"}}'
        latency = f"max by (instance) ({summary}) / 1000"
    # GPU metrics carry no model label: the namespace selects them.
    gpu = fill('namespace="{namespace}"', target, window_seconds)
    return {
        "p_ms": latency,
        "success_rps": f"sum by (instance) (rate(nv_inference_request_success{{{sel}}}[{w}]))",
        "failure_rps": f"sum by (instance) (rate(nv_inference_request_failure{{{sel}}}[{w}]))",
        "gpu_used_bytes": f"max by (instance) (nv_gpu_memory_used_bytes{{{gpu}}})",
        "gpu_total_bytes": f"max by (instance) (nv_gpu_memory_total_bytes{{{gpu}}})",
    }


def read_pod_windows(
    query: Callable[[str, datetime], list[dict[str, Any]]],
    target: Target,
    percentile: float,
    window_seconds: float,
    at: datetime,
    *,
    histogram: bool = False,
    selector: str = DEFAULT_SELECTOR,
) -> dict[str, PodWindow]:
    """Each pod's own window ending at `at`, keyed by pod IP (the host of the scrape `instance`).

    `query(promql, at)` runs one instant query and returns its result vector. Read only."""
    queries = pod_queries(target, percentile, window_seconds, histogram=histogram, selector=selector)
    fields = _by_pod(query, queries, at)
    return {
        ip: PodWindow(**{k: v if math.isfinite(v) else None for k, v in values.items()})
        for ip, values in fields.items()
    }


def _by_pod(
    query: Callable[[str, datetime], list[dict[str, Any]]], queries: Mapping[str, str], at: datetime
) -> dict[str, dict[str, float]]:
    """The answers of per-pod queries (one series per scrape `instance`), keyed by pod IP (the instance's host) and
    then by the query's name; values as Prometheus gave them (NaN and +Inf included)."""
    fields: dict[str, dict[str, float]] = {}
    for name, promql in queries.items():
        for series in query(promql, at):
            instance = str(series.get("metric", {}).get("instance", ""))
            if not instance:
                continue
            ip = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
            fields.setdefault(ip, {})[name] = float(series["value"][1])
    return fields


# ------------------------------------------------------------------------------------------- generative services
#
# A generative model (decoupled, inflight batching) is judged by its token latencies, from histograms summed over
# pods, whose quantile over the window is exact to a bucket:
# - TTFT: `nv_inference_first_response_histogram_ms`, Triton's own first-response histogram (2.52 on, with
#   `--metrics-config histogram_latencies=true`; the local emulated engine exports it under the same name and unit);
# - TPOT: `tailtune_llm_time_per_output_token_ms`, one observation per request, (last - first token) / (tokens - 1),
#   the figure a streaming client computes. No Triton backend exports it (tensorrtllm_backend#657): on a real
#   cluster an exporter beside the backend has to (README), else TPOT reads "no data".
# The engine's load comes from TensorRT-LLM's gauges by their real names and labels.
TTFT_HISTOGRAM_MS = "nv_inference_first_response_histogram_ms"
TPOT_HISTOGRAM_MS = "tailtune_llm_time_per_output_token_ms"
OUTPUT_TOKENS_COUNTER = "tailtune_llm_output_tokens_total"
# Prompt tokens taken (the prefill work offered; the emulated engine exports it, a real cluster needs an exporter).
PROMPT_TOKENS_COUNTER = "tailtune_llm_prompt_tokens_total"
TRTLLM_REQUEST_GAUGE = "nv_trt_llm_request_metrics"
TRTLLM_KV_CACHE_GAUGE = "nv_trt_llm_kv_cache_block_metrics"


@dataclass(frozen=True)
class GenerativeSignal:
    """One read of a generative service over its window; None where a series is missing, never zero.

    `ttft_ms`/`tpot_ms` are at the spec's percentiles; `above_range_*` says the quantile lies above every bucket.
    Running/waiting sequences are the window's means summed over pods; KV-cache use the fullest pod's, now."""

    window_end: datetime
    span_seconds: float
    ttft_ms: float | None
    tpot_ms: float | None
    request_rate: float | None
    tokens_per_second: float | None
    running: float | None
    waiting: float | None
    kv_used_fraction: float | None
    ready_replicas: int | None
    prompt_tokens_per_second: float | None = None
    above_range_ttft: bool = False
    above_range_tpot: bool = False


def token_quantile(histogram: str, percentile: float, selector: str, window: str, *by: str) -> str:
    """`histogram_quantile` at `percentile` over the increase of a token-latency histogram's buckets in `window`,
    summed over pods (`by`: kept apart by these labels too, e.g. `instance` for one figure per pod)."""
    labels = ", ".join((*by, "le"))
    buckets = f"increase({histogram}_bucket{{{selector}}}[{window}])"
    return f"histogram_quantile({percentile / 100:g}, sum by ({labels}) ({buckets}))"


def generative_queries(
    target: Target, ttft_percentile: float, tpot_percentile: float, window_seconds: float,
    selector: str = DEFAULT_SELECTOR,
) -> dict[str, str]:  # fmt: skip
    """One generative service's PromQL over the window, keyed by `GenerativeSignal` field."""
    sel = fill(selector, target, window_seconds)
    w = f"{round(window_seconds)}s"

    def quantile(histogram: str, percentile: float) -> str:
        return token_quantile(histogram, percentile, sel, w)

    def gauge(name: str, label: str, value: str) -> str:
        return f'{name}{{{sel},{label}="{value}"}}'

    used = gauge(TRTLLM_KV_CACHE_GAUGE, "kv_cache_block_type", "used")
    total = gauge(TRTLLM_KV_CACHE_GAUGE, "kv_cache_block_type", "max")
    return {
        "ttft_ms": quantile(TTFT_HISTOGRAM_MS, ttft_percentile),
        "tpot_ms": quantile(TPOT_HISTOGRAM_MS, tpot_percentile),
        "request_rate": f"sum(rate({TTFT_HISTOGRAM_MS}_count{{{sel}}}[{w}]))",
        "tokens_per_second": f"sum(rate({OUTPUT_TOKENS_COUNTER}{{{sel}}}[{w}]))",
        "prompt_tokens_per_second": f"sum(rate({PROMPT_TOKENS_COUNTER}{{{sel}}}[{w}]))",
        "running": f"sum(avg_over_time({gauge(TRTLLM_REQUEST_GAUGE, 'request_type', 'active')}[{w}]))",
        "waiting": f"sum(avg_over_time({gauge(TRTLLM_REQUEST_GAUGE, 'request_type', 'waiting')}[{w}]))",
        "kv_used_fraction": f"max(sum by (instance) ({used}) / sum by (instance) ({total}))",
        "ready_replicas": f"count(sum by (instance) ({total}))",
    }


def read_generative(
    query: Callable[[str, datetime], list[dict[str, Any]]],
    target: Target,
    ttft_percentile: float,
    tpot_percentile: float,
    window_seconds: float,
    at: datetime,
    selector: str = DEFAULT_SELECTOR,
) -> GenerativeSignal:
    """The window ending at `at` (`query(promql, at)` runs one instant query; raises `PrometheusUnavailable`)."""
    values: dict[str, float | None] = {}
    above: dict[str, bool] = {}
    for name, promql in generative_queries(target, ttft_percentile, tpot_percentile, window_seconds, selector).items():
        series = query(promql, at)
        raw = float(series[0]["value"][1]) if series else None
        above[name] = raw is not None and math.isinf(raw) and raw > 0
        values[name] = raw if raw is not None and math.isfinite(raw) else None
    replicas = values.pop("ready_replicas")
    return GenerativeSignal(
        window_end=at,
        span_seconds=window_seconds,
        ready_replicas=None if replicas is None else round(replicas),
        above_range_ttft=above["ttft_ms"],
        above_range_tpot=above["tpot_ms"],
        **values,
    )


@dataclass(frozen=True)
class PodTokenWindow:
    """One pod's own TTFT and TPOT over a window (a generative canary's judge), at the spec's percentiles by
    `histogram_quantile` over that pod's buckets alone, and the requests behind each (its histogram's count over the
    window). None where a series is missing; `above_range_*`: the quantile lies above every bucket (+Inf)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    ttft_requests: float | None = None
    tpot_requests: float | None = None
    above_range_ttft: bool = False
    above_range_tpot: bool = False


def pod_generative_queries(
    target: Target, ttft_percentile: float, tpot_percentile: float, window_seconds: float,
    selector: str = DEFAULT_SELECTOR,
) -> dict[str, str]:  # fmt: skip
    """Per-pod PromQL of a generative service (one series per scrape `instance`), keyed by `PodTokenWindow` field: the
    service's own TTFT/TPOT queries (`generative_queries`) kept apart by instance."""
    sel = fill(selector, target, window_seconds)
    w = f"{round(window_seconds)}s"
    return {
        "ttft_ms": token_quantile(TTFT_HISTOGRAM_MS, ttft_percentile, sel, w, "instance"),
        "tpot_ms": token_quantile(TPOT_HISTOGRAM_MS, tpot_percentile, sel, w, "instance"),
        "ttft_requests": f"sum by (instance) (increase({TTFT_HISTOGRAM_MS}_count{{{sel}}}[{w}]))",
        "tpot_requests": f"sum by (instance) (increase({TPOT_HISTOGRAM_MS}_count{{{sel}}}[{w}]))",
    }


def read_pod_generative(
    query: Callable[[str, datetime], list[dict[str, Any]]],
    target: Target,
    ttft_percentile: float,
    tpot_percentile: float,
    window_seconds: float,
    at: datetime,
    selector: str = DEFAULT_SELECTOR,
) -> dict[str, PodTokenWindow]:
    """Each pod's own TTFT/TPOT window ending at `at`, keyed by pod IP (the host of the scrape `instance`), as
    `read_pod_windows` reads a request model's. Raises `PrometheusUnavailable`. Read only."""
    queries = pod_generative_queries(target, ttft_percentile, tpot_percentile, window_seconds, selector)
    out: dict[str, PodTokenWindow] = {}
    for ip, raw in _by_pod(query, queries, at).items():
        above = {k: math.isinf(v) and v > 0 for k, v in raw.items()}
        values = {k: v if math.isfinite(v) else None for k, v in raw.items()}
        out[ip] = PodTokenWindow(
            **values, above_range_ttft=above.get("ttft_ms", False), above_range_tpot=above.get("tpot_ms", False)
        )
    return out
