"""A real Prometheus (Debian's package) discovering the Triton pods through the local API server.

Debian builds Prometheus without `kubernetes_sd_configs`, so discovery goes through `http_sd_configs` and
`PodDiscovery`, a small bridge that lists pods from the API server every refresh and hands Prometheus the
same target groups and `__meta_kubernetes_pod_*` labels its Kubernetes pod role would. The relabelling is
the usual one for annotated pods: pods annotated `prometheus.io/scrape` are scraped at
`<podIP>:<prometheus.io/port>` every 2 s, with `namespace` and `pod` labels (the tuner's queries select on
`namespace` and Triton's own `model`). With a Prometheus that has the Kubernetes SD, `render_config`'s
`http_sd_configs` block becomes `kubernetes_sd_configs: [{role: pod, kubeconfig_file: ...}]`, nothing else.
Prometheus and the bridge listen on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from devkit.procs import Process

APT_HINT = "apt-get install -y --no-install-recommends prometheus"


class PrometheusError(RuntimeError):
    """Prometheus is missing, did not start, or did not answer."""


def render_config(sd_url: str, scrape_interval_s: int = 2) -> str:
    """prometheus.yml for the demo. Pure."""
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "keep", "regex": "Running"},
        {
            "source_labels": ["__meta_kubernetes_pod_ip", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
            "regex": r"(.+);(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {
            "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "target_label": "inferenceservice",
        },
    ]
    # One target per declared container port comes out of discovery; after relabelling they are identical
    # and Prometheus keeps one.
    sd = {"url": sd_url, "refresh_interval": f"{scrape_interval_s}s"}
    doc = {
        "global": {"scrape_interval": f"{scrape_interval_s}s", "evaluation_interval": f"{scrape_interval_s}s"},
        "scrape_configs": [
            {
                "job_name": "triton-pods",
                "scrape_interval": f"{scrape_interval_s}s",
                "scrape_timeout": f"{scrape_interval_s}s",
                "http_sd_configs": [sd],
                "relabel_configs": relabel,
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def find_prometheus() -> str:
    """The `prometheus` binary on PATH."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError(f"prometheus not found on PATH: {APT_HINT}")
    return binary


def start_prometheus(config_text: str, workdir: Path, port: int, pid_dir: Path | None = None) -> Process:
    """Write the config and start Prometheus on 127.0.0.1:port; returns once `/-/ready` answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(config_text)
    argv = [
        find_prometheus(),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=2h",
        "--log.level=warn",
    ]
    proc = Process.start(argv, log_path=workdir / "prometheus.log", pid_dir=pid_dir, name="prometheus")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PrometheusError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    proc.stop()
    raise PrometheusError("prometheus not ready after 60 s")


def query(url: str, promql: str, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """An instant query; the result vector (empty on any error)."""
    full = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as r:
            doc = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    result = doc.get("data", {}).get("result", [])
    return result if isinstance(result, list) else []


def scalar(url: str, promql: str) -> float | None:
    """The first sample's value of an instant query, None when empty or NaN."""
    result = query(url, promql)
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if value != value else value


def active_targets(url: str) -> list[dict[str, Any]]:
    """Prometheus' active scrape targets."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=3) as r:
            doc = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    targets = doc.get("data", {}).get("activeTargets", [])
    return targets if isinstance(targets, list) else []


# ------------------------------------------------------------------------------------- pod discovery


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_target_groups(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """http_sd target groups for pods, labelled as Prometheus' Kubernetes SD (role: pod) labels them. Pure.

    One target per declared container port (`<podIP>:<port>`); pods without an IP are left out.
    """
    groups: list[dict[str, Any]] = []
    for pod in pods:
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
        ip = status.get("podIP")
        if not ip:
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        labels = {
            "__meta_kubernetes_namespace": meta.get("namespace", ""),
            "__meta_kubernetes_pod_name": meta.get("name", ""),
            "__meta_kubernetes_pod_uid": meta.get("uid", ""),
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": "true" if ready else "false",
        }
        for key, value in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
            labels[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
        for key, value in (meta.get("annotations") or {}).items():
            labels[f"__meta_kubernetes_pod_annotation_{_sanitize(key)}"] = value
            labels[f"__meta_kubernetes_pod_annotationpresent_{_sanitize(key)}"] = "true"
        for owner in meta.get("ownerReferences") or []:
            if owner.get("controller"):
                labels["__meta_kubernetes_pod_controller_kind"] = owner.get("kind", "")
                labels["__meta_kubernetes_pod_controller_name"] = owner.get("name", "")
        for container in spec.get("containers", []):
            ports = container.get("ports") or [{}]
            for port in ports:
                number = port.get("containerPort")
                target = f"{ip}:{number}" if number else ip
                group_labels = {**labels, "__meta_kubernetes_pod_container_name": container.get("name", "")}
                if number:
                    group_labels |= {
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(number),
                        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                    }
                groups.append({"targets": [target], "labels": group_labels})
    return groups


class GetServer:
    """Serves `GET <path>` on 127.0.0.1 (`port`; 0: a free one) from `respond()`, which gives (status, content type,
    body), in a daemon thread; any other path is 404. The pod discovery here and bench/scale's synthetic exporter."""

    def __init__(
        self, path: str, respond: Callable[[], tuple[int, str, bytes]], port: int = 0, name: str = "get-server"
    ) -> None:
        self.path, self.respond = path, respond
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != served.path:
                    self.send_error(404)
                    return
                code, content_type, body = served.respond()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class PodDiscovery(GetServer):
    """Serves `GET /sd` (Prometheus http_sd) on 127.0.0.1 from `list_pods()`, in a daemon thread."""

    def __init__(self, list_pods: Callable[[], list[dict[str, Any]]]) -> None:
        self.list_pods = list_pods
        super().__init__("/sd", self._targets, name="pod-discovery")

    def _targets(self) -> tuple[int, str, bytes]:
        try:
            return 200, "application/json", json.dumps(pod_target_groups(self.list_pods())).encode()
        except Exception as exc:  # Prometheus keeps the last good targets on an error
            return 500, "application/json", str(exc).encode()
