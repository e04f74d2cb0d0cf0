"""A real tritonserver for the session (explicit model control, no model loaded) and helpers to drive it."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from devkit.triton.local import LocalTriton, TritonNotFound, find_triton, start_tritonserver
from devkit.triton.repository import ModelKind, write_model_repository
from tailtune.triton import control
from tailtune.triton.config import ModelConfigInput


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    try:
        find_triton()
    except TritonNotFound as e:
        pytest.skip(str(e))
    repo = tmp_path_factory.mktemp("model-repository")
    server = start_tritonserver(repo, log_path=repo.parent / "tritonserver.log", exit_timeout_secs=2)
    yield server
    server.stop()


@dataclass
class Deployer:
    """Writes models into the session server's repository and unloads them after the test."""

    server: LocalTriton
    repo: Path
    loaded: list[str] = field(default_factory=list)

    def write(self, kind: ModelKind, inp: ModelConfigInput, **params: str | int | float) -> ModelConfigInput:
        return write_model_repository(self.repo, kind, inp.name, inp, **params)

    def load(self, name: str, config_json: str | None = None) -> None:
        self.loaded.append(name)
        control.load_model(self.server.grpc_url, name, config_json)

    def deploy(self, kind: ModelKind, inp: ModelConfigInput, **params: str | int | float) -> ModelConfigInput:
        written = self.write(kind, inp, **params)
        self.load(inp.name)
        return written


@pytest.fixture
def deployer(triton: LocalTriton) -> Iterator[Deployer]:
    d = Deployer(triton, triton.model_repository)
    yield d
    for name in d.loaded:
        with contextlib.suppress(Exception):  # a model that never loaded
            control.unload_model(triton.grpc_url, name)


def infer(
    server: LocalTriton,
    model: str,
    x: npt.NDArray[np.float32],
    conn: http.client.HTTPConnection | None = None,
) -> Any:
    """One KServe v2 JSON inference of FP32 `x` (batch first) on INPUT0; returns OUTPUT0 as an array."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    )
    c = conn or http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    c.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    doc = json.loads(resp.read())
    if conn is None:
        c.close()
    if resp.status != 200:
        raise RuntimeError(f"inference failed ({resp.status}): {doc}")
    out = doc["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


@dataclass
class Load:
    """Closed-loop clients, each sending batch-1 requests back to back; counts answers and failures."""

    server: LocalTriton
    model: str
    dim: int
    clients: int
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (sent at, seconds)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self) -> None:
        conn = http.client.HTTPConnection(self.server.host, self.server.http_port, timeout=30)
        x = np.ones((1, self.dim), dtype=np.float32)
        while not self._stop.is_set():
            sent = time.time()
            try:
                infer(self.server, self.model, x, conn)
                with self._lock:
                    self.ok += 1
                    self.latencies.append((sent, time.time() - sent))
            except Exception as e:
                with self._lock:
                    self.failed += 1
                    self.errors.append(str(e))
                conn.close()
                conn = http.client.HTTPConnection(self.server.host, self.server.http_port, timeout=30)
        conn.close()

    def __enter__(self) -> Load:
        for _ in range(self.clients):
            t = threading.Thread(target=self._client, daemon=True)
            t.start()
            self._threads.append(t)
        time.sleep(0.3)  # let every client have a request in flight
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def http_ready(server: LocalTriton, model: str) -> bool:
    """`GET /v2/models/<model>/ready`, what a Kubernetes readiness probe asks."""
    c = http.client.HTTPConnection(server.host, server.http_port, timeout=5)
    try:
        c.request("GET", f"/v2/models/{model}/ready")
        return c.getresponse().status == 200
    finally:
        c.close()


def read_counter(path: Path) -> list[tuple[int, float, float, int]]:
    """The lines a local model appended per execution: (batch, start, end, pid)."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(b), float(s), float(e), int(p)) for b, s, e, p in rows]
