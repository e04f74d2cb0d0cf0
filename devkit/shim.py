"""The emulated device's shim in front of each local Triton pod's HTTP and gRPC ports.

Clients reach a pod at `<podIP>:8000` (HTTP) and `<podIP>:8001` (gRPC) as in a cluster; the shim relays
every request to the real `tritonserver` (same IP, ports 18000/18001) unchanged, except a model load with a
config override (`POST /v2/repository/models/<m>/load`, gRPC `RepositoryModelLoad`: the tuner's hot
reload, written for a GPU backend), which gets the same emulation rewrite as the pod's repository
(`devkit.emulation`). Metrics (8002) are Triton's own port.

With a faults folder, a reload fault armed for the pod (`devkit.faults`) is taken by its next model load and
applied to that load's config: Triton refuses it, or it serves slower than it should, or the load is held
(in flight, the old config serving) and fails as soon as the pod's `tritonserver` goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type stubs

from devkit.emulation import EmulationError, emulate_grpc_load, emulate_load_body
from devkit.faults import ReloadFault, take_reload_fault

log = logging.getLogger(__name__)

_LOAD_PATH = re.compile(r"^/v2/repository/models/[^/?]+/load(\?.*)?$")
_HEAD_LIMIT = 64 * 1024
_HOLD_POLL_S = 0.2


class _BadRequest(Exception):
    pass


@dataclass
class _Head:
    """A parsed request or response head; `lines` keeps the original header lines."""

    first: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None

    def encode(self) -> bytes:
        lines = [self.first, *(f"{k}: {v}" for k, v in self.headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def set(self, name: str, value: str) -> None:
        lname = name.lower()
        self.headers = [(k, v) for k, v in self.headers if k.lower() != lname]
        self.headers.append((name, value))

    def wants_close(self) -> bool:
        conn = (self.get("Connection") or "").lower()
        return "close" in conn or (self.first.endswith("HTTP/1.0") and "keep-alive" not in conn)


async def _read_head(reader: asyncio.StreamReader) -> _Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None  # the peer closed between requests
        raise _BadRequest("connection closed inside a message head") from None
    except asyncio.LimitOverrunError:
        raise _BadRequest("message head too large") from None
    lines = raw.decode("latin-1").split("\r\n")
    head = _Head(lines[0])
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(f"bad header line {line!r}")
        head.headers.append((name.strip(), value.strip()))
    return head


async def _relay_body(head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, eof: bool) -> None:
    """Copy the body that `head` announces (content-length, chunked, or until EOF when `eof`)."""
    if (head.get("Transfer-Encoding") or "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            writer.write(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    line = await reader.readuntil(b"\r\n")
                    writer.write(line)
                    if line == b"\r\n":
                        return
            writer.write(await reader.readexactly(size + 2))
    length = head.get("Content-Length")
    if length is not None:
        writer.write(await reader.readexactly(int(length)))
    elif eof:
        writer.write(await reader.read())


def _error_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class _Connection:
    """One client connection and the upstream connection it uses."""

    def __init__(self, upstream: tuple[str, int], parameters: Mapping[str, str], faults: Path | None = None) -> None:
        self.upstream = upstream
        self.parameters = parameters
        self.faults = faults
        self.up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (_BadRequest, ValueError) as exc:
            writer.write(_error_response(400, "Bad Request", str(exc)))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # a peer went away: nothing to answer
        finally:
            if self.up is not None:
                self.up[1].close()
            with contextlib.suppress(OSError):
                writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Relay one request and its response; False when the connection is done."""
        head = await _read_head(reader)
        if head is None:
            return False
        parts = head.first.split(" ")
        if len(parts) != 3:
            raise _BadRequest(f"bad request line {head.first!r}")
        method, target, _ = parts
        if (head.get("Transfer-Encoding") or "").lower() == "chunked" and method == "POST" and _LOAD_PATH.match(target):
            writer.write(_error_response(411, "Length Required", "send model loads with a Content-Length"))
            return False
        if self.up is None:
            self.up = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
        up_reader, up_writer = self.up
        if method == "POST" and _LOAD_PATH.match(target):
            body = await reader.readexactly(int(head.get("Content-Length") or 0))
            try:
                fault = _fault(self.faults, self.upstream[0])
                body = emulate_load_body(body, self.parameters, fault)
            except EmulationError as exc:
                writer.write(_error_response(400, "Bad Request", f"emulated accelerator: {exc}"))
                return not head.wants_close()
            if not await asyncio.to_thread(_hold, fault, self.upstream):
                writer.write(_error_response(503, "Service Unavailable", _GONE))
                return False
            head.set("Content-Length", str(len(body)))
            up_writer.write(head.encode() + body)
        else:
            up_writer.write(head.encode())
            await _relay_body(head, reader, up_writer, eof=False)
        await up_writer.drain()
        response = await _read_head(up_reader)
        if response is None:
            raise ConnectionError("tritonserver closed the connection")
        writer.write(response.encode())
        no_body = method == "HEAD" or response.first.split(" ")[1] in ("204", "304")
        if not no_body:
            await _relay_body(response, up_reader, writer, eof=True)
        await writer.drain()
        return not (head.wants_close() or response.wants_close())


_GRPC_LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
_GRPC_STREAMING = {"/inference.GRPCInferenceService/ModelStreamInfer"}
_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.so_reuseport", 0),  # a port another server holds must fail, not be shared
]


class _GrpcRelay:
    """A generic RPC handler (grpc checks for `service` only): relays every method as raw bytes upstream,
    rewriting model loads on the way."""

    def __init__(self, upstream: str, parameters: Mapping[str, str], faults: Path | None = None) -> None:
        self.channel = grpc.insecure_channel(upstream, options=_GRPC_OPTIONS)
        self.parameters = parameters
        self.faults = faults
        self.host, port = upstream.rsplit(":", 1)
        self.upstream = (self.host, int(port))
        self.gone = threading.Event()  # set when the shim stops serving the pod: a held load ends

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method
        if method in _GRPC_STREAMING:
            return grpc.stream_stream_rpc_method_handler(lambda it, ctx: self._stream(method, it, ctx))
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self._unary(method, req, ctx))

    @staticmethod
    def _metadata(context: grpc.ServicerContext) -> list[tuple[str, Any]]:
        return [
            (k, v) for k, v in context.invocation_metadata() if not k.startswith((":", "grpc-")) and k != "user-agent"
        ]

    def _unary(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        if method == _GRPC_LOAD:
            fault = None
            try:
                fault = _fault(self.faults, self.host)
                request = emulate_grpc_load(request, self.parameters, fault)
            except EmulationError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"emulated accelerator: {exc}")
            if not _hold(fault, self.upstream, self.gone):
                context.abort(grpc.StatusCode.UNAVAILABLE, _GONE)
        try:
            remaining = context.time_remaining()  # huge, not None, when the caller set no deadline
            timeout = remaining if remaining is not None and remaining < 86400 else None
            response: bytes = self.channel.unary_unary(method)(
                request, metadata=self._metadata(context), timeout=timeout
            )
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")
        return response

    def _stream(self, method: str, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            yield from self.channel.stream_stream(method)(requests, metadata=self._metadata(context))
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")

    def close(self) -> None:
        self.channel.close()


@dataclass
class _Listeners:
    http: asyncio.Server
    grpc_server: grpc.Server
    relay: _GrpcRelay


def _fault(faults: Path | None, host: str) -> ReloadFault | None:
    """The reload fault armed for `host`, taken now; one that does not parse refuses the load."""
    try:
        return take_reload_fault(faults, host)
    except (ValueError, OSError) as exc:
        raise EmulationError(f"reload fault for {host}: {exc}") from None


_GONE = "tritonserver went away during the model load"


def _hold(fault: ReloadFault | None, upstream: tuple[str, int], gone: threading.Event | None = None) -> bool:
    """Hold a load that took a `hold` fault for the fault's time (blocking); False as soon as the pod's
    `tritonserver` stops listening or `gone` is set: the load then fails, as one does when its server dies."""
    if fault is None or fault.kind != "hold":
        return True
    deadline = time.monotonic() + fault.hold_ms / 1e3
    while (left := deadline - time.monotonic()) > 0:
        if gone is not None and gone.is_set():
            return False
        try:
            with socket.create_connection(upstream, timeout=1.0):
                pass
        except OSError:
            return False
        time.sleep(min(_HOLD_POLL_S, left))
    return True


class Shim:
    """One asyncio loop (HTTP) in a daemon thread, plus a small gRPC server per pod IP. Reload faults are read
    from `faults` (a folder, `devkit.faults`) when given."""

    def __init__(self, faults: Path | None = None) -> None:
        self.faults = faults
        self._loop = asyncio.new_event_loop()
        self._pods: dict[str, _Listeners] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, name="shim", daemon=True)
        self._thread.start()

    def serve(
        self,
        host: str,
        *,
        http: tuple[int, int],
        grpc_ports: tuple[int, int],
        parameters: Mapping[str, str],
    ) -> None:
        """Listen on host:http[0] and host:grpc_ports[0], relaying to the same host's [1] ports.

        Raises OSError when a port is taken.
        """
        params = dict(parameters)
        http_port, http_upstream = http

        async def start() -> asyncio.Server:
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await _Connection((host, http_upstream), params, self.faults).serve(reader, writer)

            return await asyncio.start_server(handle, host, http_port, limit=_HEAD_LIMIT, reuse_address=True)

        http_server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=10)
        relay = _GrpcRelay(f"{host}:{grpc_ports[1]}", params, self.faults)
        server = grpc.server(ThreadPoolExecutor(max_workers=4), handlers=[relay], options=_GRPC_OPTIONS)
        if server.add_insecure_port(f"{host}:{grpc_ports[0]}") == 0:
            self._close_http(http_server)
            relay.close()
            raise OSError(f"cannot listen on {host}:{grpc_ports[0]}")
        server.start()
        self._pods[host] = _Listeners(http_server, server, relay)

    def _close_http(self, server: asyncio.Server) -> None:
        async def stop() -> None:
            server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)

    def close(self, host: str) -> None:
        """Stop listening on host (open HTTP connections end with their peers)."""
        pod = self._pods.pop(host, None)
        if pod is None:
            return
        pod.relay.gone.set()  # a held load fails now, not after its hold
        self._close_http(pod.http)
        pod.grpc_server.stop(grace=1).wait(5)
        pod.relay.close()

    def shutdown(self) -> None:
        """Close every listener and stop the loop."""
        for host in list(self._pods):
            with contextlib.suppress(Exception):
                self.close(host)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
