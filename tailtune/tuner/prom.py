"""The only module that talks to Prometheus: builds the tuner's queries and reads one `Observation`.

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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from tailtune.tuner.types import SUMMARY_WINDOW_SECONDS, TAIL_SHARE, Observation

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
        try:
            response = self._session.get(f"{self.url}/api/v1/query", params=params, timeout=self.timeout)
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


def build_queries(
    target: Target,
    percentile: float,
    window_seconds: float,
    *,
    latency_query: str | None = None,
    histogram: bool = False,
    selector: str = DEFAULT_SELECTOR,
) -> Queries:
    """The queries for one InferenceService."""
    sel = fill(selector, target, window_seconds)
    w = f"{round(window_seconds)}s"

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{{{sel}}}[{w}]))"

    q = percentile / 100
    source: Source
    if latency_query is not None:
        latency = f"({fill_user_query(latency_query, target, window_seconds, percentile)}) * 1000"
        span = window_seconds
        source, newest = "userQuery", f"max(timestamp(nv_inference_request_success{{{sel}}}))"
    elif histogram:
        buckets = f"sum by (le) (rate(nv_inference_request_duration_us_bucket{{{sel}}}[{w}]))"
        latency = f"histogram_quantile({q:g}, {buckets}) / 1000"
        span = window_seconds
        source, newest = "histogram", f"max(timestamp(nv_inference_request_duration_us_bucket{{{sel}}}))"
    else:
        summary = f'nv_inference_request_summary_us{{{sel},quantile="{quantile_label(percentile)}"}}'
        extra = window_seconds - SUMMARY_WINDOW_SECONDS
        # The summary already covers the last 60 s; a longer SLO window adds the max over the rest.
        latency = f"max({summary}) / 1000" if extra < 1 else f"max(max_over_time({summary}[{round(extra)}s])) / 1000"
        span = max(window_seconds, SUMMARY_WINDOW_SECONDS)
        source, newest = "tritonSummary", f"max(timestamp({summary}))"
    success = rate("nv_inference_request_success")
    # Over the window's tail: no figure where it holds fewer than two scrapes (Prometheus' rate then returns none,
    # and the law waits a window more on a rising demand).
    t = f"{max(1, round(TAIL_SHARE * window_seconds))}s"
    tail_done = f"sum(rate(nv_inference_request_success{{{sel}}}[{t}]))"
    tail = f"{tail_done} + sum(deriv(nv_inference_pending_request_count{{{sel}}}[{t}]))"
    compute = " + ".join(rate(f"nv_inference_compute_{part}_duration_us") for part in ("input", "infer", "output"))
    return Queries(
        latency_ms=latency,
        span_seconds=span,
        request_rate=success,
        queue_ms=f"{rate('nv_inference_queue_duration_us')} / {success} / 1000",
        compute_ms=f"({compute}) / {success} / 1000",
        avg_batch=f"{rate('nv_inference_count')} / {rate('nv_inference_exec_count')}",
        queue_growth_rps=f"sum(deriv(nv_inference_pending_request_count{{{sel}}}[{w}]))",
        ready_replicas=f"count(count by (instance) (nv_inference_request_success{{{sel}}}))",
        tail_demand_rps=tail,
        pending_max=f"max(sum by (instance) (nv_inference_pending_request_count{{{sel}}}))",
        source=source,
        newest_sample=newest,
    )


def breakdown_queries(target: Target, window_seconds: float, selector: str = DEFAULT_SELECTOR) -> dict[str, str]:
    """Mean ms per request of each step of Triton's request path over the window (its cumulative counters)."""
    sel = fill(selector, target, window_seconds)
    w = f"{round(window_seconds)}s"
    success = f"sum(rate(nv_inference_request_success{{{sel}}}[{w}]))"

    def per_request(metric: str) -> str:
        return f"sum(rate({metric}{{{sel}}}[{w}])) / {success} / 1000"

    return {
        "queue_ms": per_request("nv_inference_queue_duration_us"),
        "input_ms": per_request("nv_inference_compute_input_duration_us"),
        "infer_ms": per_request("nv_inference_compute_infer_duration_us"),
        "output_ms": per_request("nv_inference_compute_output_duration_us"),
        "request_ms": per_request("nv_inference_request_duration_us"),
    }


class PrometheusReader:
    """Reads the window ending at a given time for one InferenceService (the loop's ObservationReader).

    Every call has a timeout (the client's); the first failure ends the read with `PrometheusUnavailable`, so a
    hanging Prometheus costs one timeout per tick, not one per query.
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
        self._target = target
        self._percentile = percentile
        self._window = window_seconds
        self._latency_query = latency_query
        self._selector = selector
        # Further targets' percentiles, read over the same window into `Observation.other_percentiles`.
        self._others = other_percentiles
        self._breakdown = breakdown

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

    def _histogram(self, at: datetime) -> bool:
        sel = fill(self._selector, self._target, self._window)
        return (self._scalar(f"count(nv_inference_request_duration_us_bucket{{{sel}}})", at) or 0) > 0

    def queries(
        self, at: datetime, percentile: float | None = None, *, triton: bool = False, histogram: bool | None = None
    ) -> Queries:
        """The queries for the window ending at `at` (checks whether a latency histogram exists, unless told), at
        the SLO's percentile or another; `triton`: Triton's own figure even when the user gave a query."""
        user = None if triton else self._latency_query
        if user is not None and percentile is not None and "{quantile}" not in user and "{percentile}" not in user:
            user = None  # the user's query is for the SLO's percentile only: other ones come from Triton's metrics
        if user is None and histogram is None:
            histogram = self._histogram(at)
        return build_queries(
            self._target,
            self._percentile if percentile is None else percentile,
            self._window,
            latency_query=user,
            histogram=user is None and bool(histogram),
            selector=self._selector,
        )

    def read(self, window_end: datetime) -> Observation:
        """One observation (the loop's reader); raises `PrometheusUnavailable`."""
        return self.read_signal(window_end).observation

    def read_signal(self, at: datetime) -> Signal:
        """One read at `at`: the observation, whose window ends at the newest sample behind the latency figure
        (so two reads without a new scrape are the same window; ahead of `at` when a clock is off), and what status
        says about it."""
        q = self.queries(at)
        series = self._client.query(q.latency_ms, at)
        latency, above, ambiguous = _latency(series)
        newest = self._scalar(q.newest_sample, at)
        # Samples stamped after `at` are invisible at `at`: a query ahead shows them. The window ends at the newest
        # sample as stamped, never clamped to the read's time: `tuner.judge` tells a scrape during the read from a
        # clock that is off (ClockSkew).
        ahead = self._scalar(q.newest_sample, at + timedelta(seconds=CLOCK_PROBE_SECONDS))
        if ahead is not None and ahead > at.timestamp():
            newest = ahead
        window_end = datetime.fromtimestamp(newest, tz=at.tzinfo) if newest is not None else at
        replicas = self._scalar(q.ready_replicas, at)
        requests = self._scalar(q.request_rate, at)
        # Whether Triton's figures come from a histogram: asked once per read, not once per percentile.
        histogram = self._histogram(at) if q.source == "userQuery" else q.source == "histogram"
        others: list[tuple[float, float | None]] = []
        for percentile in self._others:
            query = self.queries(at, percentile, histogram=histogram).latency_ms
            value, _, why = _latency(self._client.query(query, at))
            others.append((percentile, value))
            ambiguous = ambiguous or (f"P{percentile:g}: {why}" if why else "")
        server_ms = None
        if q.source == "userQuery":
            query = self.queries(at, triton=True, histogram=histogram).latency_ms
            server_ms, _, _ = _latency(self._client.query(query, at))
        observation = Observation(
            window_end=window_end,
            span_seconds=q.span_seconds,
            p_latency_ms=latency,
            request_rate=requests,
            queue_ms=self._scalar(q.queue_ms, at),
            compute_ms=self._scalar(q.compute_ms, at),
            avg_batch=self._scalar(q.avg_batch, at),
            queue_growth_rps=self._scalar(q.queue_growth_rps, at),
            tail_demand_rps=self._scalar(q.tail_demand_rps, at),
            pending_max=self._scalar(q.pending_max, at),
            ready_replicas=round(replicas) if replicas is not None else None,
            sample_count=round(requests * q.span_seconds) if requests is not None else None,
            other_percentiles=tuple(others),
        )
        return Signal(
            observation=observation,
            source=q.source,
            series=len(series),
            ambiguous=ambiguous,
            above_range=above,
            latency_query=q.latency_ms,
            breakdown=self.read_breakdown(at) if self._breakdown else None,
            server_ms=server_ms,
        )

    def read_breakdown(self, at: datetime) -> Breakdown:
        """Where the time goes inside Triton over the window ending at `at`."""
        values = {
            k: self._scalar(v, at) for k, v in breakdown_queries(self._target, self._window, self._selector).items()
        }
        return Breakdown(**values)

    def _scalar(self, query: str, at: datetime) -> float | None:
        result = self._client.query(query, at)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return value if math.isfinite(value) else None


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
    fields: dict[str, dict[str, float | None]] = {}
    for name, promql in pod_queries(target, percentile, window_seconds, histogram=histogram, selector=selector).items():
        for series in query(promql, at):
            instance = str(series.get("metric", {}).get("instance", ""))
            if not instance:
                continue
            ip = instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance
            value = float(series["value"][1])
            fields.setdefault(ip, {})[name] = value if math.isfinite(value) else None
    return {ip: PodWindow(**values) for ip, values in fields.items()}
