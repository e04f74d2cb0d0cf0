"""Fetch a model (or calibration cache) from its URI into the Job's scratch space, hashing as it goes.

Schemes: `https://`, `http://` (urllib, streamed), `s3://bucket/key` (boto3, standard AWS
credential env), `gs://bucket/object` (google-cloud-storage, application default credentials),
`pvc://claim/path` (the claim mounted at `<pvc_root>/<claim>`), `file://` and plain local paths.
Local files are hashed in place, not copied.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import BinaryIO

from tailtune.engine_builder.errors import BuildError, Failure

DEFAULT_PVC_ROOT = Path("/mnt/models")
_CHUNK = 1 << 20
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Fetched:
    """A fetched file: where it lies now and the sha256 of its bytes."""

    uri: str
    path: Path
    sha256: str
    size: int


def fetch(uri: str, scratch: Path, *, pvc_root: Path, timeout_s: float, name: str = "model.onnx") -> Fetched:
    """Bring `uri` to a local path (`scratch/name` for remote URIs) and hash it."""
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return _fetch_http(uri, scratch / name, timeout_s)
    if scheme == "s3":
        return _fetch_s3(uri, parsed, scratch / name)
    if scheme == "gs":
        return _fetch_gs(uri, parsed, scratch / name)
    if scheme == "pvc":
        return _hash_local(uri, resolve_pvc_path(uri, pvc_root))
    if scheme == "file":
        return _hash_local(uri, Path(urllib.parse.unquote(parsed.path)))
    if scheme == "":
        return _hash_local(uri, Path(uri))
    raise BuildError(
        Failure.INVALID_ARGUMENTS,
        f"unsupported URI scheme {scheme!r} in {redact(uri)} (use https, http, s3, gs, pvc, file or a path)",
    )


def verify_sha256(fetched: Fetched, expected: str) -> None:
    """Raise DIGEST_MISMATCH unless the fetched bytes hash to `expected` (hex, `sha256:` allowed)."""
    want = normalize_sha256(expected)
    if fetched.sha256 != want:
        raise BuildError(
            Failure.DIGEST_MISMATCH,
            f"{redact(fetched.uri)} has sha256 {fetched.sha256}, expected {want}",
        )


def normalize_sha256(text: str) -> str:
    """Lower-case hex of a sha256 given as `HEX` or `sha256:HEX`; ValueError otherwise."""
    hex_digest = text.strip().lower().removeprefix("sha256:")
    if not _SHA256_HEX.fullmatch(hex_digest):
        raise ValueError(f"not a sha256 (64 hex chars): {text!r}")
    return hex_digest


def resolve_pvc_path(uri: str, pvc_root: Path) -> Path:
    """`pvc://claim/a/b.onnx` -> `<pvc_root>/claim/a/b.onnx`, refusing paths that climb out."""
    parsed = urllib.parse.urlsplit(uri)
    claim = parsed.netloc
    rel = PurePosixPath(urllib.parse.unquote(parsed.path).lstrip("/"))
    if not claim or not rel.parts or ".." in rel.parts or "/" in claim:
        raise BuildError(Failure.INVALID_ARGUMENTS, f"{uri}: expected pvc://<claim>/<path inside the claim>")
    return pvc_root / claim / rel


def redact(uri: str) -> str:
    """The URI without credentials or query (pre-signed URLs carry their signature there)."""
    parsed = urllib.parse.urlsplit(uri)
    if not parsed.scheme:
        return uri
    host = parsed.hostname or ""
    if parsed.port is not None:
        host = f"{host}:{parsed.port}"
    return urllib.parse.urlunsplit((parsed.scheme, host, parsed.path, "", ""))


def _hash_local(uri: str, path: Path) -> Fetched:
    try:
        with path.open("rb") as src:
            sha256, size = _copy_hashing(src, None)
    except FileNotFoundError:
        hint = " (is the claim mounted?)" if uri.startswith("pvc://") else ""
        raise BuildError(Failure.FETCH_FAILED, f"{uri}: no such file {path}{hint}") from None
    except IsADirectoryError:
        raise BuildError(Failure.FETCH_FAILED, f"{uri}: {path} is a directory, not a model file") from None
    except OSError as exc:
        raise BuildError(Failure.FETCH_FAILED, f"{uri}: cannot read {path}: {exc.strerror or exc}") from None
    return Fetched(uri=uri, path=path, sha256=sha256, size=size)


def _fetch_http(uri: str, dest: Path, timeout_s: float) -> Fetched:
    shown = redact(uri)
    out = _open_scratch(uri, dest)
    request = urllib.request.Request(uri, headers={"User-Agent": "tailtune-engine-builder"})
    with out:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                sha256, size = _copy_hashing(response, out)
        except urllib.error.HTTPError as exc:
            raise BuildError(Failure.FETCH_FAILED, f"GET {shown}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise BuildError(Failure.FETCH_FAILED, f"cannot reach {shown}: {exc.reason}") from None
        except TimeoutError:
            raise BuildError(Failure.FETCH_FAILED, f"GET {shown}: no data within {timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise BuildError(Failure.FETCH_FAILED, f"GET {shown}: {type(exc).__name__}: {exc}") from None
    return Fetched(uri=uri, path=dest, sha256=sha256, size=size)


def _fetch_s3(uri: str, parsed: urllib.parse.SplitResult, dest: Path) -> Fetched:
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not key:
        raise BuildError(Failure.INVALID_ARGUMENTS, f"{uri}: expected s3://<bucket>/<key>")
    boto3 = _import_client("boto3", "s3://", "boto3")
    # Credentials and endpoint come from the standard AWS env (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...).
    _download(uri, dest, lambda: boto3.client("s3").download_file(bucket, key, str(dest)))
    return _hash_local(uri, dest)


def _fetch_gs(uri: str, parsed: urllib.parse.SplitResult, dest: Path) -> Fetched:
    bucket, name = parsed.netloc, parsed.path.lstrip("/")
    if not bucket or not name:
        raise BuildError(Failure.INVALID_ARGUMENTS, f"{uri}: expected gs://<bucket>/<object>")
    storage = _import_client("google.cloud.storage", "gs://", "google-cloud-storage")
    _download(uri, dest, lambda: storage.Client().bucket(bucket).blob(name).download_to_filename(str(dest)))
    return _hash_local(uri, dest)


def _import_client(module: str, scheme: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BuildError(
            Failure.FETCH_FAILED, f"{scheme} URIs need the {package} package, which this image lacks"
        ) from None


def _download(uri: str, dest: Path, call: Callable[[], object]) -> None:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        call()
    except Exception as exc:  # the client libraries raise their own hierarchies; all mean "not fetched"
        raise BuildError(Failure.FETCH_FAILED, f"{uri}: {type(exc).__name__}: {exc}") from None


def _open_scratch(uri: str, dest: Path) -> BinaryIO:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest.open("wb")
    except OSError as exc:
        raise BuildError(Failure.FETCH_FAILED, f"{redact(uri)}: cannot write {dest}: {exc.strerror or exc}") from None


def _copy_hashing(src: BinaryIO, out: BinaryIO | None) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
    return digest.hexdigest(), size
