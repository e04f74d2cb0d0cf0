"""Model control of one Triton instance over gRPC (`tritonclient.grpc`): load with a config override,
readiness, live config. Synchronous and thread-safe; the operator calls it from a worker thread.

gRPC, not HTTP, on purpose: Triton's HTTP frontend handles `POST /v2/repository/models/M/load` on its
event loop, so every HTTP request to that server, inference included, waits for the whole load (seen on
2.51: each hot apply over HTTP stalled all HTTP inference for ~1.5 s; over gRPC, HTTP inference went on
with a 62 ms worst case). Every function takes the gRPC endpoint, `host:port` (Triton's default port is
`tailtune.api.keys.GRPC_PORT`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tailtune.api.v1alpha1 import Batching
from tailtune.triton.config import ModelConfig, batching_equivalent, batching_from_config


class ApplyError(RuntimeError):
    """Triton refused a config, or the live config does not show it; Triton keeps the old model serving."""


@dataclass(frozen=True)
class ApplyResult:
    """A config that Triton applied: how long it took and the batching Triton now reports."""

    seconds: float
    live_batching: Batching


def _target(url: str) -> str:
    if url.startswith(("http://", "https://")):
        # Loud on purpose: a load over HTTP would stall the pod's HTTP traffic (see the module docstring).
        raise ValueError(f"model control goes over gRPC: pass Triton's gRPC endpoint host:port, not {url!r}")
    return url.removeprefix("grpc://").rstrip("/")


@contextmanager
def _client(url: str) -> Iterator[Any]:
    client = grpcclient.InferenceServerClient(_target(url))
    try:
        yield client
    finally:
        client.close()


def _message(e: InferenceServerException) -> str:
    return str(e.message()) if e.message() else str(e)


def server_live(url: str, timeout: float = 2.0) -> bool:
    """Triton's liveness; False when the server does not answer."""
    try:
        with _client(url) as c:
            return bool(c.is_server_live(client_timeout=timeout))
    except InferenceServerException:
        return False


def is_model_ready(url: str, model: str, timeout: float = 2.0) -> bool:
    """Model readiness: True only once the model loaded and finished its warmup."""
    try:
        with _client(url) as c:
            return bool(c.is_model_ready(model, client_timeout=timeout))
    except InferenceServerException:
        return False


def get_model_config(url: str, model: str, timeout: float = 5.0) -> ModelConfig:
    """The live `ModelConfig` Triton serves `model` with."""
    with _client(url) as c:
        return c.get_model_config(model, client_timeout=timeout).config


def get_model_config_json(url: str, model: str, timeout: float = 5.0) -> dict[str, Any]:
    """The live config as a dict with Triton's field names (as `GET /v2/models/<model>/config` gives it)."""
    cfg = get_model_config(url, model, timeout)
    return dict(json_format.MessageToDict(cfg, preserving_proto_field_name=True))


def load_model(url: str, model: str, config_json: str | None = None, timeout: float = 300.0) -> None:
    """Load (or reload) `model`, with the whole config replaced by `config_json` if given.

    Blocks until Triton has loaded (and warmed up) the model or refused it; raises `ApplyError` then.
    """
    try:
        with _client(url) as c:
            c.load_model(model, config=config_json, client_timeout=timeout)
    except InferenceServerException as e:
        raise ApplyError(f"Triton refused to load {model!r}: {_message(e)}") from e


def unload_model(url: str, model: str, timeout: float = 30.0) -> None:
    """Unload `model`."""
    with _client(url) as c:
        c.unload_model(model, client_timeout=timeout)


def apply_config(url: str, model: str, config_json: str, timeout: float = 300.0) -> ApplyResult:
    """Hot-apply `config_json` (see `config.render_json`) to `model` on one Triton and confirm it.

    Loads with the config override, waits for the model to be ready, reads back the live config and
    checks that its batching is the one sent (`batching_equivalent`). When Triton refuses, the previous
    model keeps serving and `ApplyError` carries Triton's message.
    """
    try:
        wanted = batching_from_config(json.loads(config_json))
    except (ValueError, json_format.ParseError) as e:  # refuse before calling Triton
        raise ApplyError(f"not a Triton model config: {e}") from e
    start = time.monotonic()
    load_model(url, model, config_json, timeout)
    while not is_model_ready(url, model):
        if time.monotonic() - start > timeout:
            raise ApplyError(f"{model!r} loaded but not ready after {timeout:.0f} s")
        time.sleep(0.05)
    seconds = time.monotonic() - start
    try:
        live = batching_from_config(get_model_config_json(url, model, timeout))
    except InferenceServerException as e:
        raise ApplyError(f"cannot read back the config of {model!r}: {_message(e)}") from e
    if not batching_equivalent(live, wanted):
        raise ApplyError(f"{model!r} live batching {live.model_dump()} differs from the applied {wanted.model_dump()}")
    return ApplyResult(seconds=seconds, live_batching=live)
