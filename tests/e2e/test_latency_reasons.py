"""Every reason of the SLOMet condition, as the user sees it on the object, with the operator against the local
cluster (kwok GPU nodes make the Triton pods Ready) and `spec.metrics.prometheusUrl` pointing at an
unresolvable name, a refused port, or a fake Prometheus on 127.0.0.1 (a tiny http.server in this module).

All InferenceServices are created at once (one per case, in one namespace, one engine build per GPU product)
with a 5 s tuning interval, so the cases wait side by side: one hanging Prometheus must not hold up the others' status.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tailtune.api.keys import APPLIED_ANNOTATION
from tailtune.api.v1alpha1 import Batching
from tailtune.tuner.types import InForce
from tests.e2e.test_operator import OperatorProcess, condition, engine_store, example

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

# The custom latencyQuery every fake case uses: the fake recognises it by this metric name. No label matcher:
# spec checks want literal braces doubled, but the reader substitutes placeholders with str.replace and would
# send the doubled braces on to Prometheus (reported; the case's URL path tells the fake which case it is).
FAKE_METRIC = "tt_fake_latency_seconds"
LATENCY_QUERY = FAKE_METRIC
HANG_SECONDS = 8.0
TIMEOUT_SECONDS = 1.0  # the hanging case's
# Every other case's: a fake that answers at once, so only a machine busy with the rest of the suite could make it
# late; a timeout there would be a real PrometheusUnavailable between the verdicts the tests wait for.
ANSWER_TIMEOUT_SECONDS = 10.0


def _vector(*samples: tuple[dict[str, str], str]) -> list[dict[str, Any]]:
    now = time.time()
    return [{"metric": labels, "value": [now, value]} for labels, value in samples]


# Per case (the first path segment of the URL): the latency query's answer and the request rate's (None: no
# series), or a behaviour ("hang", "http503").
FAKE_ANSWERS: dict[str, tuple[list[tuple[dict[str, str], str]], str | None] | str] = {
    "hang": "hang",
    "http503": "http503",
    "several": ([({"pod": "triton-a"}, "0.010"), ({"pod": "triton-b"}, "0.100")], "20"),
    "nan-idle": ([({}, "NaN")], "0"),
    "nan-busy": ([({}, "NaN")], "20"),
    "nodata": ([], None),
    "inf": ([({}, "+Inf")], "20"),
    "over": ([({}, "0.050")], "20"),
    "under": ([({}, "0.010")], "20"),
    "settling": ([({}, "0.050")], "20"),
}


# The request rate as one object's read asks it, or as the fleet's read of the ticks due together (each case has a
# URL of its own: one object a read).
REQUEST_RATE = (
    "sum(rate(nv_inference_request_success{",
    "sum by (namespace, model) (rate(nv_inference_request_success{",
)


def _fleet_labels(query: str) -> dict[str, str]:
    """The labels a fleet's grouped answer carries for its object (its values in the query's regex matchers); none
    for one object's own query."""
    if not query.startswith("sum by (namespace, model)"):
        return {}
    matchers = re.findall(r'(namespace|model)=~"((?:[^"\\]|\\.)*)"', query)
    return {label: re.sub(r"\\\\(.)", r"\1", value) for label, value in matchers}  # regex escapes undone


class FakePrometheus(ThreadingHTTPServer):
    daemon_threads = True
    queries: list[tuple[str, str]]


class _Handler(BaseHTTPRequestHandler):
    server: FakePrometheus

    def log_message(self, *_: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any] | str) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if code == 200 else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (timeout)
            self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        case, _, rest = url.path.strip("/").partition("/")
        query = parse_qs(url.query).get("query", [""])[0]
        self.server.queries.append((case, query))
        answer = FAKE_ANSWERS.get(case)
        if rest != "api/v1/query" or answer is None:
            self._send(404, "not found")
            return
        if answer == "hang":
            time.sleep(HANG_SECONDS)
            self._send(200, {"status": "success", "data": {"resultType": "vector", "result": []}})
            return
        if answer == "http503":
            self._send(503, "overloaded")
            return
        assert not isinstance(answer, str)
        latency, rate = answer
        result: list[dict[str, Any]] = []
        if FAKE_METRIC in query:  # the reader sends `(query) * 1000`: answer what Prometheus would, in ms
            scale = 1000.0 if query.replace(" ", "").endswith("*1000") else 1.0
            result = _vector(*((labels, str(float(v) * scale)) for labels, v in latency))
        elif query.startswith(REQUEST_RATE) and "/" not in query and rate is not None:
            result = _vector((_fleet_labels(query), rate))
        self._send(200, {"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture(scope="module")
def fake_prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus(("127.0.0.1", 0), _Handler)
    server.queries = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


H100_CASES = ("dns", "refused", "hang", "http503")
DNS_URL = "http://tt-no-such-prometheus.invalid:9090"


def _urls(fake: FakePrometheus) -> dict[str, str]:
    host, port = fake.server_address[:2]
    urls = {case: f"http://{host!s}:{port}/{case}" for case in FAKE_ANSWERS}
    return {"dns": DNS_URL, "refused": f"http://127.0.0.1:{_closed_port()}", **urls}


@pytest.fixture(scope="module")
def served(
    cluster: Cluster, crd_installed: list[str], fake_prometheus: FakePrometheus,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, str], OperatorProcess]]:  # fmt: skip
    """The operator, and one InferenceService per case in one fresh namespace; yields (namespace, URLs, op)."""
    namespace = f"latency-reasons-{int(time.time()) % 100000}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for("ServiceAccount default", lambda: cluster.get("serviceaccount", "default", namespace), 30)
    engine_store(cluster, namespace)
    op = OperatorProcess(cluster, tmp_path_factory.mktemp("operator") / "operator.log")
    op.start()
    urls = _urls(fake_prometheus)
    docs = []
    for case, url in urls.items():
        doc = example(case)
        doc["spec"]["tuning"] |= {"intervalSeconds": 5, "mode": "rolling"}
        timeout = TIMEOUT_SECONDS if case == "hang" else ANSWER_TIMEOUT_SECONDS
        doc["spec"]["metrics"] = {"prometheusUrl": url, "timeoutSeconds": timeout}
        if case in FAKE_ANSWERS:
            doc["spec"]["metrics"]["latencyQuery"] = LATENCY_QUERY
        if case in H100_CASES:  # the two L4 nodes hold 8 GPUs: the rest goes to the H100 node (its own build)
            doc["spec"]["serving"]["gpu"]["product"] = "NVIDIA-H100-80GB-HBM3"
        if case == "settling":  # the config in force changed just now: every window reaches back before it
            spec = doc["spec"]["serving"]
            just_now = InForce(
                batching=Batching.model_validate(spec["batching"]), replicas=1, changed_at=datetime.now(UTC),
                reason="e2e: a change just now",
            )  # fmt: skip
            doc["metadata"]["annotations"] = {APPLIED_ANNOTATION: just_now.to_annotation()}
        docs.append(doc)
    cluster.apply(*docs, namespace=namespace)
    try:
        yield namespace, urls, op
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def slo_now(
    cluster: Cluster, namespace: str, name: str, status: str, reason: str, seen: list[Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the condition, status.latency) when SLOMet has this status and reason now, else None; `seen` gets what was
    read."""
    tis = cluster.get("tis", name, namespace)
    c = condition(tis, "SLOMet")
    if seen is not None:
        seen[:] = [c, (tis or {}).get("status", {}).get("latency")]
    latency = (tis or {}).get("status", {}).get("latency") or {}
    # A verdict on a figure is told with the figure: a later tick's problem may already be in status.latency
    # while reconcile has yet to write its condition (two writes, the tuner's then reconcile's).
    consistent = reason not in JUDGED_VERDICTS or not latency.get("problem")
    if c and c["status"] == status and c["reason"] == reason and consistent:
        return c, latency
    return None


def wait_slo(
    cluster: Cluster, served: tuple[str, dict[str, str], OperatorProcess], name: str, status: str, reason: str,
    timeout_s: float = 28,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Waits until SLOMet has this status and reason; returns (the condition, status.latency)."""
    namespace, _, op = served
    seen: list[Any] = []

    def check() -> tuple[dict[str, Any], dict[str, Any]] | None:
        return slo_now(cluster, namespace, name, status, reason, seen)

    try:
        return cluster.wait_for(f"SLOMet={status} {reason} on {namespace}/{name}", check, timeout_s)
    except BaseException:
        print(f"last seen: SLOMet {seen[:1]}\nstatus.latency {seen[1:]}\noperator log:\n{op.log_tail(40)}")
        raise


Served = tuple[str, dict[str, str], OperatorProcess]
JUDGED_VERDICTS = frozenset({"WithinSLO", "SLOViolated", "Settling"})


@pytest.mark.parametrize(
    ("case", "kind"),
    [("dns", "dns"), ("refused", "refused"), ("hang", "timeout"), ("http503", "http")],
)
def test_prometheus_unavailable_names_the_url_and_the_error(
    cluster: Cluster, served: Served, case: str, kind: str
) -> None:
    url = served[1][case]
    c, latency = wait_slo(cluster, served, case, "Unknown", "PrometheusUnavailable")
    assert f"Prometheus at {url} unavailable ({kind})" in c["message"], c["message"]
    assert c["message"].startswith("P99 not judged"), c["message"]
    assert latency["problem"] == "PrometheusUnavailable"
    assert url in latency["message"] and f"({kind})" in latency["message"]
    assert latency.get("observedMs") is None
    if case == "hang":
        assert f"no answer within {TIMEOUT_SECONDS:g} s" in c["message"]
    if case == "http503":
        assert "HTTP 503" in c["message"]


def test_several_series_are_ambiguous_not_the_first_taken(cluster: Cluster, served: Served) -> None:
    c, latency = wait_slo(cluster, served, "several", "Unknown", "QueryAmbiguous")
    assert "returned 2 series (differing in: pod)" in c["message"], c["message"]
    assert FAKE_METRIC in c["message"]  # the query that was run
    assert latency["problem"] == "QueryAmbiguous"
    assert latency.get("observedMs") is None  # neither 10 ms nor 100 ms
    assert latency["source"] == "userQuery"


def test_nan_without_requests_is_no_traffic(cluster: Cluster, served: Served) -> None:
    c, latency = wait_slo(cluster, served, "nan-idle", "Unknown", "NoTraffic")
    assert "no requests in the window" in c["message"], c["message"]
    assert latency["problem"] == "NoTraffic"
    assert latency["throughputRps"] == 0


@pytest.mark.parametrize("case", ["nan-busy", "nodata"])
def test_nan_or_nothing_under_traffic_is_no_latency_data(cluster: Cluster, served: Served, case: str) -> None:
    wait_slo(cluster, served, case, "Unknown", "NoLatencyData")
    namespace = served[0]

    def ticked() -> dict[str, Any] | None:  # reconcile says "no data yet" before the tuner's first tick writes
        latency: dict[str, Any] = (cluster.get("tis", case, namespace) or {}).get("status", {}).get("latency", {})
        return latency if latency.get("problem") else None

    latency = cluster.wait_for(f"the tuner's first window of {case}", ticked, 28)
    c = condition(cluster.get("tis", case, namespace), "SLOMet")
    assert c is not None
    assert c["message"].startswith("no P99 latency data from Prometheus yet"), c["message"]
    assert latency["problem"] == "NoLatencyData"
    assert latency["source"] == "userQuery"
    assert latency.get("observedMs") is None


def test_inf_is_over_the_slo_not_missing(cluster: Cluster, served: Served) -> None:
    c, latency = wait_slo(cluster, served, "inf", "False", "SLOViolated")
    assert c["message"].startswith("P99 above every histogram bucket vs SLO 30 ms"), c["message"]
    assert latency["aboveRange"] is True
    assert latency.get("observedMs") is None
    assert not latency.get("problem")


def _window_s(latency: dict[str, Any]) -> float:
    start, end = (datetime.fromisoformat(latency[k].replace("Z", "+00:00")) for k in ("windowStart", "windowEnd"))
    return (end - start).total_seconds()


def test_over_the_slo_is_violated(cluster: Cluster, served: Served) -> None:
    c, latency = wait_slo(cluster, served, "over", "False", "SLOViolated")
    assert c["message"].startswith("P99 50.0 ms vs SLO 30 ms over "), c["message"]
    assert latency["observedMs"] == 50.0 and latency["source"] == "userQuery"
    assert _window_s(latency) == 60 and latency["overlapsChange"] is False
    assert latency["windowStart"] in c["message"] and latency["windowEnd"] in c["message"]


def test_under_the_slo_is_within(cluster: Cluster, served: Served) -> None:
    c, latency = wait_slo(cluster, served, "under", "True", "WithinSLO")
    assert c["message"].startswith("P99 10.0 ms vs SLO 30 ms over "), c["message"]
    assert latency["observedMs"] == 10.0 and latency["cleanMs"] == 10.0
    assert latency["source"] == "userQuery" and _window_s(latency) == 60
    assert not latency.get("problem")


def test_a_window_from_before_the_last_change_is_settling_never_false(cluster: Cluster, served: Served) -> None:
    c, latency = wait_slo(cluster, served, "settling", "Unknown", "Settling")
    assert "P99 50.0 ms vs SLO 30 ms" in c["message"], c["message"]
    assert "reaches back before the last change" in c["message"]
    assert latency["overlapsChange"] is True and latency.get("cleanMs") is None


AT_REST = [("under", "True", "WithinSLO"), ("nodata", "Unknown", "NoLatencyData")]
# The settling tick after the first verdict may still write (the good-window count reaching its relax point).
AT_REST_TICKS = 4
AT_REST_TICKS_TIMEOUT_S = 40


@dataclass
class AtRest:
    """What test_at_rest_a_tick_writes_nothing checks, seen for its cases over the same ticks: the objects tick side
    by side (5 s apart each), so one watch of `AT_REST_TICKS` ticks, then `AT_REST_TICKS` more, serves every case
    whose verdict holds when it starts, instead of one such watch per case after the other. Per case: its
    resourceVersion after the first ticks, the object after the next ones, or why it was not seen."""

    cluster: Cluster
    served: Served
    fake: FakePrometheus
    seen: dict[str, tuple[str, dict[str, Any], str] | str] = field(default_factory=dict)

    def queries(self, case: str) -> int:
        return sum(1 for c, q in list(self.fake.queries) if c == case and FAKE_METRIC in q)

    def _ticks(self, cases: list[str], ticks_from: dict[str, int], what: str) -> list[str]:
        """Waits until each case has sent `AT_REST_TICKS` ticks' queries past its count in `ticks_from` (40 s at
        most, for all of them together, as for one); those that did not are told why in `seen`, the rest returned."""
        deadline = time.monotonic() + AT_REST_TICKS_TIMEOUT_S
        while True:
            late = [c for c in cases if self.queries(c) < ticks_from[c] + AT_REST_TICKS]
            if not late or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        waited = f"timed out after {AT_REST_TICKS_TIMEOUT_S} s waiting for {AT_REST_TICKS} {what} of"
        for case in late:
            self.seen[case] = f"{waited} {case}"
        return [c for c in cases if c not in late]

    def watch(self, case: str) -> tuple[str, dict[str, Any], str] | str:
        """For `case`, whose verdict the caller has seen: (resourceVersion after `AT_REST_TICKS` ticks, the object
        after as many more, the operator's log then), or a timeout's words. Cases not yet watched whose verdict
        holds now are watched along."""
        if case not in self.seen:
            namespace, _, op = self.served
            cases = [case] + [
                c
                for c, status, reason in AT_REST
                if c != case and c not in self.seen and slo_now(self.cluster, namespace, c, status, reason)
            ]
            start = {c: self.queries(c) for c in cases}
            cases = self._ticks(cases, start, "ticks")
            versions = {c: self.cluster.get("tis", c, namespace)["metadata"]["resourceVersion"] for c in cases}
            more = {c: self.queries(c) for c in cases}
            for c in self._ticks(cases, more, "more ticks"):
                self.seen[c] = (versions[c], self.cluster.get("tis", c, namespace), op.log_tail(20))
        return self.seen[case]


@pytest.fixture(scope="module")
def at_rest(cluster: Cluster, served: Served, fake_prometheus: FakePrometheus) -> AtRest:
    return AtRest(cluster, served, fake_prometheus)


@pytest.mark.parametrize(("case", "status", "reason"), AT_REST)
def test_at_rest_a_tick_writes_nothing(
    cluster: Cluster, served: Served, at_rest: AtRest, case: str, status: str, reason: str
) -> None:
    """A steady signal (the same P99 and rate each window, only the window moving) and a steadily missing one: once
    SLOMet says so, the object's resourceVersion stays put while the tuner ticks on (each tick is seen as the
    queries it sends the fake Prometheus). Before: every 5 s tick rewrote status.latency's window times and the
    tuner-state annotation's good-window count (244 resourceVersions in 21 minutes on one object)."""
    wait_slo(cluster, served, case, status, reason)
    seen = at_rest.watch(case)  # AT_REST_TICKS ticks, then AT_REST_TICKS more (with the other cases, see AtRest)
    if isinstance(seen, str):
        pytest.fail(seen)
    version, tis, log = seen
    assert tis["metadata"]["resourceVersion"] == version, (
        f"{case}: written at rest: {tis['status'].get('latency')}\n{tis['metadata'].get('annotations')}\n" + log
    )
