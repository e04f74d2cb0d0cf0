"""Pod discovery for Debian's Prometheus (http_sd with the Kubernetes SD's labels), and the scrape config."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, start_http_server

from devkit.ports import free_port
from devkit.prometheus import (
    PodDiscovery,
    active_targets,
    pod_target_groups,
    render_config,
    scalar,
    start_prometheus,
)


def pod(name: str, ip: str | None, *, phase: str = "Running", port: int = 8002, scrape: bool = True) -> dict[str, Any]:
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)} if scrape else {}
    return {
        "metadata": {
            "name": name, "namespace": "ml", "uid": f"uid-{name}",
            "labels": {"app.kubernetes.io/instance": "bert"}, "annotations": annotations,
            "ownerReferences": [{"kind": "ReplicaSet", "name": "bert-triton-1", "controller": True}],
        },
        "spec": {
            "nodeName": "demo-l4-0",
            "containers": [{"name": "triton", "ports": [
                {"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 8002},
            ]}],
        },
        "status": {"phase": phase, "podIP": ip, "hostIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def test_target_groups_carry_the_kubernetes_sd_labels() -> None:
    groups = pod_target_groups([pod("a", "127.0.1.2"), pod("pending", None, phase="Pending")])
    assert [g["targets"] for g in groups] == [["127.0.1.2:8000"], ["127.0.1.2:8002"]]
    labels = groups[1]["labels"]
    assert labels["__meta_kubernetes_namespace"] == "ml"
    assert labels["__meta_kubernetes_pod_name"] == "a"
    assert labels["__meta_kubernetes_pod_ip"] == "127.0.1.2"
    assert labels["__meta_kubernetes_pod_ready"] == "true"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert labels["__meta_kubernetes_pod_annotationpresent_prometheus_io_port"] == "true"
    assert labels["__meta_kubernetes_pod_label_app_kubernetes_io_instance"] == "bert"
    assert labels["__meta_kubernetes_pod_controller_kind"] == "ReplicaSet"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "metrics"
    assert labels["__meta_kubernetes_pod_container_port_number"] == "8002"


def test_the_config_scrapes_annotated_running_pods_every_two_seconds() -> None:
    doc = yaml.safe_load(render_config("http://127.0.0.1:1/sd"))
    job = doc["scrape_configs"][0]
    assert job["scrape_interval"] == "2s"
    assert job["http_sd_configs"] == [{"url": "http://127.0.0.1:1/sd", "refresh_interval": "2s"}]
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert [r["source_labels"][0] for r in keep] == [
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape",
        "__meta_kubernetes_pod_phase",
    ]
    assert {r.get("target_label") for r in job["relabel_configs"]} >= {"__address__", "namespace", "pod"}


@pytest.mark.prometheus
def test_a_real_prometheus_scrapes_annotated_pods_once_each(tmp_path: Path) -> None:
    ip = "127.0.1.250"
    registry = CollectorRegistry()
    Counter("nv_inference_request_success", "fake", ["model"], registry=registry).labels("bert").inc(5)
    port = free_port(ip)
    server, _ = start_http_server(port, addr=ip, registry=registry)
    pods = [pod("a", ip, port=port), pod("quiet", ip, scrape=False), pod("starting", ip, phase="Pending", port=port)]
    discovery = PodDiscovery(lambda: pods)
    discovery.start()
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    prom = start_prometheus(render_config(discovery.url), tmp_path, int(url.rsplit(":", 1)[1]))
    try:
        deadline = time.monotonic() + 30
        value = None
        while value is None and time.monotonic() < deadline:
            time.sleep(0.5)
            value = scalar(url, 'sum(nv_inference_request_success_total{namespace="ml",pod="a",model="bert"})')
        assert value == 5.0
        targets = active_targets(url)
        assert [t["labels"]["pod"] for t in targets] == ["a"]  # one target per pod, annotated and Running only
        assert targets[0]["labels"]["instance"] == f"{ip}:{port}"
        assert targets[0]["labels"]["inferenceservice"] == "bert"
    finally:
        prom.stop()
        discovery.stop()
        server.shutdown()
        server.server_close()
