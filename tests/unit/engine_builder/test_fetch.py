"""Fetching from a local HTTP(S) server, local paths and mounted claims; digests."""

from __future__ import annotations

import hashlib
import importlib.util
import socket
from pathlib import Path

import pytest

from tailtune.engine_builder import fetch
from tailtune.engine_builder.errors import BuildError, Failure

from .conftest import Models, TlsServer


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_http_fetch_streams_into_scratch_and_hashes(models: Models, http_url: str, tmp_path: Path) -> None:
    got = fetch.fetch(f"{http_url}/dynamic.onnx", tmp_path, pvc_root=tmp_path, timeout_s=10)
    assert got.path == tmp_path / "model.onnx"
    assert got.path.read_bytes() == models.dynamic.read_bytes()
    assert got.sha256 == _sha256(models.dynamic)
    assert got.size == models.dynamic.stat().st_size


def test_https_fetch_checks_the_certificate(
    https_server: TlsServer, models: Models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"{https_server.url}/static1.onnx"
    with pytest.raises(BuildError) as refused:
        fetch.fetch(uri, tmp_path, pvc_root=tmp_path, timeout_s=10)
    assert refused.value.failure is Failure.FETCH_FAILED
    assert "CERTIFICATE_VERIFY_FAILED" in refused.value.message
    # Trusted the way a Job trusts a private CA: through SSL_CERT_FILE.
    monkeypatch.setenv("SSL_CERT_FILE", str(https_server.ca_file))
    got = fetch.fetch(uri, tmp_path, pvc_root=tmp_path, timeout_s=10)
    assert got.sha256 == _sha256(models.static1)


def test_http_404_names_the_status(http_url: str, tmp_path: Path) -> None:
    with pytest.raises(BuildError) as err:
        fetch.fetch(f"{http_url}/missing.onnx", tmp_path, pvc_root=tmp_path, timeout_s=10)
    assert err.value.failure is Failure.FETCH_FAILED
    assert err.value.message == f"GET {http_url}/missing.onnx: HTTP 404 File not found"


def test_unreachable_host(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}/m.onnx"
    with pytest.raises(BuildError) as err:
        fetch.fetch(uri, tmp_path, pvc_root=tmp_path, timeout_s=5)
    assert err.value.failure is Failure.FETCH_FAILED
    assert err.value.message.startswith(f"cannot reach {uri}: ")


def test_credentials_and_query_never_reach_messages() -> None:
    assert fetch.redact("https://user:secret@host:8443/m.onnx?X-Amz-Signature=abc") == "https://host:8443/m.onnx"
    assert fetch.redact("/plain/path.onnx") == "/plain/path.onnx"


def test_local_path_and_file_uri_are_hashed_in_place(models: Models, tmp_path: Path) -> None:
    for uri in (str(models.dynamic), models.dynamic.as_uri()):
        got = fetch.fetch(uri, tmp_path, pvc_root=tmp_path, timeout_s=1)
        assert got.path == models.dynamic
        assert got.sha256 == _sha256(models.dynamic)
    assert list(tmp_path.iterdir()) == []


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as err:
        fetch.fetch(str(tmp_path / "nope.onnx"), tmp_path, pvc_root=tmp_path, timeout_s=1)
    assert err.value.failure is Failure.FETCH_FAILED
    assert "no such file" in err.value.message


def test_pvc_uri_reads_the_mounted_claim(models: Models, tmp_path: Path) -> None:
    mounted = tmp_path / "models-claim" / "resnet"
    mounted.mkdir(parents=True)
    (mounted / "model.onnx").write_bytes(models.dynamic.read_bytes())
    got = fetch.fetch("pvc://models-claim/resnet/model.onnx", tmp_path / "scratch", pvc_root=tmp_path, timeout_s=1)
    assert got.path == mounted / "model.onnx"
    assert got.sha256 == _sha256(models.dynamic)
    with pytest.raises(BuildError, match="is the claim mounted"):
        fetch.fetch("pvc://other-claim/model.onnx", tmp_path, pvc_root=tmp_path, timeout_s=1)


@pytest.mark.parametrize("uri", ["pvc://claim/../etc/passwd", "pvc://claim", "pvc:///model.onnx"])
def test_pvc_uri_cannot_leave_the_claim(uri: str, tmp_path: Path) -> None:
    with pytest.raises(BuildError) as err:
        fetch.resolve_pvc_path(uri, tmp_path)
    assert err.value.failure is Failure.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    ("uri", "module", "package"),
    [("s3://bucket/m.onnx", "boto3", "boto3"), ("gs://bucket/m.onnx", "google.cloud.storage", "google-cloud-storage")],
)
def test_object_storage_without_its_client_says_so(uri: str, module: str, package: str, tmp_path: Path) -> None:
    try:
        present = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        present = False
    if present:
        pytest.skip(f"{module} is installed here; this test is about images without it")
    with pytest.raises(BuildError) as err:
        fetch.fetch(uri, tmp_path, pvc_root=tmp_path, timeout_s=1)
    assert err.value.failure is Failure.FETCH_FAILED
    assert package in err.value.message


def test_unknown_scheme_is_an_argument_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as err:
        fetch.fetch("ftp://host/m.onnx", tmp_path, pvc_root=tmp_path, timeout_s=1)
    assert err.value.failure is Failure.INVALID_ARGUMENTS


def test_digest_verification(models: Models, tmp_path: Path) -> None:
    got = fetch.fetch(str(models.dynamic), tmp_path, pvc_root=tmp_path, timeout_s=1)
    fetch.verify_sha256(got, got.sha256)
    fetch.verify_sha256(got, f"sha256:{got.sha256.upper()}")
    with pytest.raises(BuildError) as err:
        fetch.verify_sha256(got, "0" * 64)
    assert err.value.failure is Failure.DIGEST_MISMATCH
    assert err.value.message == f"{models.dynamic} has sha256 {got.sha256}, expected {'0' * 64}"


@pytest.mark.parametrize("text", ["abc", "g" * 64, "sha512:" + "0" * 64])
def test_malformed_sha256_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        fetch.normalize_sha256(text)
