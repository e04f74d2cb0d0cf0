"""The emulation shim relays HTTP/1.1 and gRPC to the real server and rewrites only model-load config overrides."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from devkit.faults import ReloadFault, fault_path, inject_reload_fault
from devkit.ports import free_port
from devkit.shim import Shim

PARAMS = {"model_kind": "emulated_gpu", "base_ms": "8"}
GPU_CONFIG = {
    "name": "m",
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "instance_group": [{"kind": "KIND_GPU", "count": 1}],
    "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": "100"},
}


class Upstream:
    """A stand-in for tritonserver's HTTP endpoint that records what reaches it."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                upstream.bodies[self.path] = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._reply(b'{"ok": true}')

            def do_GET(self) -> None:
                if self.path == "/chunked":
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for part in (b"hello ", b"world"):
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self._reply(b"ready" if self.path.endswith("/ready") else b"")

            def _reply(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class GrpcUpstream:
    """A stand-in for tritonserver's gRPC endpoint: ServerLive, and RepositoryModelLoad that records."""

    def __init__(self) -> None:
        self.loads: list[service_pb2.RepositoryModelLoadRequest] = []

        def live(request: Any, context: Any) -> Any:
            return service_pb2.ServerLiveResponse(live=True)

        def load(request: Any, context: Any) -> Any:
            self.loads.append(request)
            if request.model_name == "missing":
                context.abort(grpc.StatusCode.NOT_FOUND, "no model 'missing'")
            return service_pb2.RepositoryModelLoadResponse()

        def handler(fn: Any, req: Any, resp: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
            )

        service = grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {
                "ServerLive": handler(live, service_pb2.ServerLiveRequest, service_pb2.ServerLiveResponse),
                "RepositoryModelLoad": handler(
                    load, service_pb2.RepositoryModelLoadRequest, service_pb2.RepositoryModelLoadResponse
                ),
            },
        )
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2), handlers=[service])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


@pytest.fixture
def shimmed() -> Iterator[tuple[Upstream, int]]:
    upstream = Upstream()
    shim = Shim()
    port = free_port()
    grpc_upstream = GrpcUpstream()
    shim.serve("127.0.0.1", http=(port, upstream.port), grpc_ports=(free_port(), grpc_upstream.port), parameters=PARAMS)
    yield upstream, port
    shim.shutdown()
    grpc_upstream.server.stop(None)
    upstream.server.shutdown()
    upstream.server.server_close()


@pytest.fixture
def grpc_shimmed() -> Iterator[tuple[GrpcUpstream, str]]:
    upstream = GrpcUpstream()
    shim = Shim()
    port = free_port()
    shim.serve("127.0.0.1", http=(free_port(), free_port()), grpc_ports=(port, upstream.port), parameters=PARAMS)
    yield upstream, f"127.0.0.1:{port}"
    shim.shutdown()
    upstream.server.stop(None)


def test_a_grpc_load_with_a_gpu_config_reaches_triton_emulated(grpc_shimmed: tuple[GrpcUpstream, str]) -> None:
    upstream, url = grpc_shimmed
    client = grpcclient.InferenceServerClient(url)
    assert client.is_server_live()
    client.load_model("m", config=json.dumps(GPU_CONFIG))
    sent = json.loads(upstream.loads[-1].parameters["config"].string_param)
    assert sent["backend"] == "python"
    assert sent["instance_group"][0]["kind"] == "KIND_CPU"
    assert sent["parameters"]["model_kind"] == {"string_value": "emulated_gpu"}
    assert sent["dynamic_batching"]["preferred_batch_size"] == [8]
    client.load_model("plain")  # no override: passes as it came
    assert "config" not in upstream.loads[-1].parameters
    with pytest.raises(InferenceServerException, match="no model 'missing'"):  # upstream errors come back
        client.load_model("missing")
    client.close()


def test_a_grpc_config_the_emulator_cannot_take_is_refused(grpc_shimmed: tuple[GrpcUpstream, str]) -> None:
    upstream, url = grpc_shimmed
    bad = {**GPU_CONFIG, "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["2"]}]}
    client = grpcclient.InferenceServerClient(url)
    with pytest.raises(InferenceServerException, match="emulated accelerator"):
        client.load_model("m", config=json.dumps(bad))
    assert not upstream.loads
    client.close()


def test_a_load_with_a_gpu_config_reaches_triton_emulated(shimmed: tuple[Upstream, int]) -> None:
    upstream, port = shimmed
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    body = json.dumps({"parameters": {"config": json.dumps(GPU_CONFIG)}})
    conn.request("POST", "/v2/repository/models/m/load", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b'{"ok": true}')
    sent = json.loads(json.loads(upstream.bodies["/v2/repository/models/m/load"])["parameters"]["config"])
    assert sent["backend"] == "python"
    assert sent["instance_group"][0]["kind"] == "KIND_CPU"
    assert sent["parameters"]["base_ms"] == {"string_value": "8"}
    assert sent["dynamic_batching"]["preferred_batch_size"] == [8]
    # Same keep-alive connection: everything else passes byte for byte.
    conn.request("POST", "/v2/models/m/infer", body=b'{"inputs": []}')
    assert conn.getresponse().read() == b'{"ok": true}'
    assert upstream.bodies["/v2/models/m/infer"] == b'{"inputs": []}'
    conn.request("GET", "/v2/models/m/ready")
    assert conn.getresponse().read() == b"ready"
    conn.request("GET", "/chunked")
    assert conn.getresponse().read() == b"hello world"
    conn.close()


def test_a_config_the_emulator_cannot_take_is_refused_before_triton(shimmed: tuple[Upstream, int]) -> None:
    upstream, port = shimmed
    bad = {**GPU_CONFIG, "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["2"]}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/v2/repository/models/m/load", body=json.dumps({"parameters": {"config": json.dumps(bad)}}))
    response = conn.getresponse()
    assert response.status == 400
    assert "emulated accelerator" in json.loads(response.read())["error"]
    assert not upstream.bodies


def test_no_upstream_means_a_closed_connection(shimmed: tuple[Upstream, int]) -> None:
    upstream, port = shimmed
    upstream.server.shutdown()
    upstream.server.server_close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/v2/models/m/ready")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        conn.getresponse()


def test_a_reload_fault_armed_for_a_pod_is_applied_to_its_next_load_only(tmp_path: Path) -> None:
    upstream = GrpcUpstream()
    shim = Shim(tmp_path / "faults")
    port = free_port()
    shim.serve("127.0.0.1", http=(free_port(), free_port()), grpc_ports=(port, upstream.port), parameters=PARAMS)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:

        def sent() -> dict[str, Any]:
            config: dict[str, Any] = json.loads(upstream.loads[-1].parameters["config"].string_param)
            return config

        inject_reload_fault(tmp_path / "faults", "127.0.0.2", ReloadFault("refuse"))  # another pod's
        client.load_model("m", config=json.dumps(GPU_CONFIG))
        assert sent()["instance_group"][0]["kind"] == "KIND_CPU" and "extra_ms" not in sent()["parameters"]
        inject_reload_fault(tmp_path / "faults", "127.0.0.1", ReloadFault("slow", extra_ms=250))
        client.load_model("m", config=json.dumps(GPU_CONFIG))
        assert sent()["parameters"]["extra_ms"] == {"string_value": "250"}
        assert sent()["instance_group"][0]["kind"] == "KIND_CPU"
        client.load_model("m", config=json.dumps(GPU_CONFIG))  # taken once: the next reload is healthy
        assert "extra_ms" not in sent()["parameters"]
        inject_reload_fault(tmp_path / "faults", "127.0.0.1", ReloadFault("refuse"))
        client.load_model("m", config=json.dumps(GPU_CONFIG))
        assert sent()["instance_group"][0]["kind"] == "KIND_GPU"  # what a CPU-only Triton refuses
        assert sent()["backend"] == "python"  # emulated all the same: Triton refuses the instance, nothing else
        assert fault_path(tmp_path / "faults", "127.0.0.2").exists()
    finally:
        client.close()
        shim.shutdown()
        upstream.server.stop(None)


def test_a_reload_fault_that_does_not_parse_refuses_the_load(tmp_path: Path) -> None:
    upstream = GrpcUpstream()
    shim = Shim(tmp_path)
    port = free_port()
    shim.serve("127.0.0.1", http=(free_port(), free_port()), grpc_ports=(port, upstream.port), parameters=PARAMS)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        fault_path(tmp_path, "127.0.0.1").write_text('{"kind": "slow"}')  # no extra_ms
        with pytest.raises(InferenceServerException, match=r"reload fault for 127\.0\.0\.1"):
            client.load_model("m", config=json.dumps(GPU_CONFIG))
        assert not upstream.loads
        with pytest.raises(ValueError, match="unknown reload fault"):
            ReloadFault.from_json('{"kind": "crash"}')
    finally:
        client.close()
        shim.shutdown()
        upstream.server.stop(None)
