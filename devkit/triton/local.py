"""Start and stop a real local `tritonserver`, the one the `nvidia-pytriton` wheel carries.

Used by the Triton tests, the benchmarks and the local demo runtime (one server per fake pod, each bound to
its own loopback IP such as 127.0.1.5). Only the Python backend ships in that wheel.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from devkit.ports import free_ports

PYTRITON_DIST = "nvidia-pytriton"


class TritonNotFound(RuntimeError):
    """The `nvidia-pytriton` wheel (and so `tritonserver`) is not installed in this environment."""


class TritonStartError(RuntimeError):
    """`tritonserver` exited or did not become live in time; the message carries the end of its log."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel's server pieces live."""

    binary: Path
    libs: Path
    python_backend: Path
    stub: Path
    version: str


def cache_dir() -> Path:
    """`${TAILTUNE_CACHE:-~/.cache/tailtune}`: git-ignored home of prepared binaries."""
    return Path(os.environ.get("TAILTUNE_CACHE", Path.home() / ".cache" / "tailtune")).expanduser()


def venv_site_packages() -> str:
    """The site-packages of the running interpreter: the Python backend's models import numpy from here."""
    return sysconfig.get_paths()["purelib"]


def find_triton() -> TritonInstall:
    """Locate the tritonserver binary, its libraries and the Python backend inside the installed wheel."""
    try:
        version = metadata.version(PYTRITON_DIST)
    except metadata.PackageNotFoundError as e:
        raise TritonNotFound(f"{PYTRITON_DIST} is not installed: pip install {PYTRITON_DIST}==0.7.0") from e
    site = Path(venv_site_packages())
    server = site / "pytriton" / "tritonserver"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        binary=server / "bin" / "tritonserver",
        libs=site / "nvidia_pytriton.libs",
        python_backend=server / "backends" / "python",
        stub=server / "python_backend_stubs" / py / "triton_python_backend_stub",
        version=version,
    )
    for p in (install.binary, install.libs, install.python_backend, install.stub):
        if not p.exists():
            raise TritonNotFound(f"{PYTRITON_DIST} {version} lacks {p}")
    return install


def prepare_backend_dir(install: TritonInstall, root: Path | None = None) -> Path:
    """Build `<cache>/triton-backends-<version>/python/` (library, utils, stub) once; return its parent.

    The wheel keeps the stub apart from the backend library, while tritonserver expects them together.
    """
    base = (root or cache_dir()) / f"triton-backends-{install.version}"
    dest = base / "python"
    wanted = {
        "libtriton_python.so": install.python_backend / "libtriton_python.so",
        "triton_python_backend_utils.py": install.python_backend / "triton_python_backend_utils.py",
        "triton_python_backend_stub": install.stub,
    }
    if all((dest / n).exists() for n in wanted):
        return base
    # Build beside the final place and rename, so concurrent test sessions never see half a folder.
    tmp = base.with_name(f"{base.name}.tmp{os.getpid()}-{threading.get_ident()}")
    (tmp / "python").mkdir(parents=True, exist_ok=True)
    for name, src in wanted.items():
        shutil.copy2(src, tmp / "python" / name)
    try:
        tmp.rename(base)
    except OSError:  # another process won the race, or a stale partial folder is in the way
        if not all((dest / n).exists() for n in wanted):
            shutil.rmtree(base, ignore_errors=True)
            tmp.rename(base)
    shutil.rmtree(tmp, ignore_errors=True)
    return base


# What tritonserver prints when a port it was given cannot serve: two endpoints on one port (a usage error),
# or a port someone else bound between our pick and its bind.
_PORT_TROUBLE = re.compile(r"at the same address and port|already in use|Address already in use")
_ERROR_LINE = re.compile(r"E\d{4} ")  # glog: E<month><day> <time> ... an error line
_START_ATTEMPTS = 3


@dataclass
class LocalTriton:
    """A running tritonserver process and its endpoints."""

    process: subprocess.Popen[bytes]
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    model_repository: Path
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        """KServe v2 HTTP endpoint, `http://host:port`."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """KServe v2 gRPC endpoint, `host:port`."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Prometheus metrics endpoint."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def log_since(self, offset: int) -> str:
        """The server's log from byte `offset` on (one start's part of a log that several starts append to)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the server (it drains in-flight requests), SIGKILL after `timeout`; return exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Backend stubs share the server's process group; after a crash they can outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return int(self.process.returncode)

    def __enter__(self) -> LocalTriton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def server_command(
    install: TritonInstall,
    backend_dir: Path,
    model_repository: Path,
    *,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    load_models: Sequence[str] = (),
    exit_timeout_secs: int = 10,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The tritonserver command line: explicit model control, endpoints bound to `host`, P99 summaries on."""
    args = [
        str(install.binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_dir}",
        "--model-control-mode=explicit",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--metrics-config=summary_latencies=true",
        "--allow-gpu-metrics=false",
        f"--exit-timeout-secs={exit_timeout_secs}",
    ]
    args += [f"--load-model={m}" for m in load_models]
    args += list(extra_args)
    return args


def start_tritonserver(
    model_repository: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    load_models: Sequence[str] = (),
    exit_timeout_secs: int = 10,
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    ready_timeout: float = 120.0,
) -> LocalTriton:
    """Start tritonserver on `model_repository` and wait until `/v2/health/live` answers.

    Ports left as None are picked free on `host`. With `load_models`, the HTTP endpoint only listens once
    those models have loaded and warmed up, so `ready_timeout` must cover that. On SIGTERM the server waits
    up to `exit_timeout_secs` for in-flight requests and unloads (a model whose reload Triton refused never
    finishes unloading in 2.51, so shutdown then takes the whole timeout). The caller owns `stop()`.
    """
    install = find_triton()
    backend_dir = prepare_backend_dir(install)
    repo = Path(model_repository).resolve()
    given = (http_port, grpc_port, metrics_port)
    picked = free_ports(sum(p is None for p in given), host)
    for attempt in range(1, _START_ATTEMPTS + 1):
        it = iter(picked)
        ports = [p if p is not None else next(it) for p in given]
        log = Path(log_path) if log_path is not None else repo.parent / f"tritonserver-{host}-{ports[0]}.log"
        args = server_command(
            install,
            backend_dir,
            repo,
            host=host,
            http_port=ports[0],
            grpc_port=ports[1],
            metrics_port=ports[2],
            load_models=load_models,
            exit_timeout_secs=exit_timeout_secs,
            extra_args=extra_args,
        )
        offset = log.stat().st_size if log.exists() else 0
        server = _launch(install, args, host, ports, repo, log)
        try:
            return _wait_live(server, ready_timeout, offset)
        except TritonStartError:
            # Another process took a port we picked between the pick and the server's bind: pick again,
            # unless the caller fixed every port (then the error is theirs to see).
            if attempt == _START_ATTEMPTS or not picked or not _PORT_TROUBLE.search(server.log_since(offset)):
                raise
            picked = free_ports(len(picked), host)
    raise AssertionError("unreachable: the last attempt raises")


def _launch(install: TritonInstall, args: list[str], host: str, ports: list[int], repo: Path, log: Path) -> LocalTriton:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(install.libs), env.get("LD_LIBRARY_PATH")) if p)
    # The backend stub embeds Python and finds its prefix through `python3` on PATH: put the venv's first.
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return LocalTriton(proc, host, ports[0], ports[1], ports[2], repo, log, args)


def _wait_live(server: LocalTriton, ready_timeout: float, offset: int) -> LocalTriton:
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if not server.running():
            raise TritonStartError(f"tritonserver exited with {server.process.returncode}: {_why(server, offset)}")
        if _http_ok(f"{server.http_url}/v2/health/live"):
            return server
        time.sleep(0.2)
    with contextlib.suppress(Exception):
        server.stop()
    raise TritonStartError(f"tritonserver not live after {ready_timeout:.0f} s: {_why(server, offset)}")


def _why(server: LocalTriton, offset: int) -> str:
    """The server's error lines first (a usage error prints its reason after the whole usage text), then
    the end of its log."""
    text = server.log_since(offset)
    reasons = [ln for ln in text.splitlines() if _ERROR_LINE.match(ln) or _PORT_TROUBLE.search(ln)]
    return "\n".join([*reasons[-5:], "--- end of its log:", text[-4000:]])
