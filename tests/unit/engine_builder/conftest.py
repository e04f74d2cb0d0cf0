"""A local HTTP(S) server over small ONNX models, and a runner for the builder CLI."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

from .onnx_models import (
    custom_op_model,
    dangling_input_model,
    identity_model,
    multi_input_model,
    relu_model,
    unknown_op_model,
)


@dataclass(frozen=True)
class Models:
    root: Path
    dynamic: Path
    static1: Path
    static4: Path
    multi: Path
    complex64: Path
    string: Path
    custom_op: Path
    unknown_op: Path
    dangling: Path
    garbage: Path


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("models")

    def save(name: str, model: onnx.ModelProto) -> Path:
        path = root / name
        onnx.save(model, str(path))
        return path

    garbage = root / "garbage.onnx"
    garbage.write_bytes(b"\x00\xffthis is not protobuf\xff" * 20)
    return Models(
        root=root,
        dynamic=save("dynamic.onnx", relu_model("batch")),
        static1=save("static1.onnx", relu_model(1)),
        static4=save("static4.onnx", relu_model(4)),
        multi=save("multi.onnx", multi_input_model()),
        complex64=save("complex64.onnx", identity_model(TensorProto.COMPLEX64, "z")),
        string=save("string.onnx", identity_model(TensorProto.STRING, "s")),
        custom_op=save("custom_op.onnx", custom_op_model()),
        unknown_op=save("unknown_op.onnx", unknown_op_model()),
        dangling=save("dangling.onnx", dangling_input_model()),
        garbage=garbage,
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(directory: Path, wrap: object = None) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    scheme = "http"
    if wrap is not None:
        server.socket = wrap(server.socket)  # type: ignore[operator]
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="session")
def http_url(models: Models) -> Iterator[str]:
    """Base URL of a plain HTTP server over the models folder."""
    yield from _serve(models.root)


@dataclass(frozen=True)
class TlsServer:
    url: str
    ca_file: Path


@pytest.fixture(scope="session")
def https_server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """An HTTPS server with a self-signed certificate for 127.0.0.1 (made with openssl)."""
    import ssl

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    tls = tmp_path_factory.mktemp("tls")
    cert, key = tls / "cert.pem", tls / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for url in _serve(models.root, wrap=lambda sock: context.wrap_socket(sock, server_side=True)):
        yield TlsServer(url=url, ca_file=cert)


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str
    termination_log: str


@dataclass
class Cli:
    """Runs `python -m tailtune.engine_builder` as the Job would, in a subprocess."""

    tmp: Path
    bin_dir: Path
    extra_env: dict[str, str]

    def fake_nvidia_smi(self, line: str) -> None:
        """Put an nvidia-smi on PATH that reports one GPU (`NAME, CAPABILITY`)."""
        script = self.bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\necho '{line}'\n")
        script.chmod(0o755)

    def run(self, *args: str) -> CliResult:
        log = self.tmp / "termination-log"
        log.unlink(missing_ok=True)
        env = {
            "PATH": str(self.bin_dir),  # nvidia-smi only if a test put one there
            "HOME": str(self.tmp),
            "PYTHONPATH": os.pathsep.join(sys.path),
            "TMPDIR": str(self.tmp),
            **self.extra_env,
        }
        done = subprocess.run(
            [sys.executable, "-m", "tailtune.engine_builder", *args, "--termination-log", str(log)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        text = log.read_text() if log.exists() else ""
        return CliResult(code=done.returncode, stdout=done.stdout, stderr=done.stderr, termination_log=text)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return Cli(tmp=tmp_path, bin_dir=bin_dir, extra_env={})
