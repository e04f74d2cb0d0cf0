"""perf_analyzer, Triton's load generator, prepared from the `tritonclient==2.41.1` wheel.

The current perf-analyzer wheel needs glibc 2.38; the 2.41.1 tritonclient wheel carries a binary that runs
on Debian 12. It is unpacked into `<cache>/perf_analyzer-2.41.1/` (never installed beside the newer
tritonclient). Its two missing libraries, `libcudart.so.12` and `libb64.so.0d`, are linked from the
`nvidia-pytriton` wheel's libraries, so Debian's `libb64-0d` is not needed (a system copy also works).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from devkit.triton.local import cache_dir, find_triton

VERSION = "2.41.1"
_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"


class PerfAnalyzerUnavailable(RuntimeError):
    """perf_analyzer could not be prepared; the message says what to install."""


@dataclass(frozen=True)
class PerfAnalyzer:
    """A runnable perf_analyzer: the binary and the folder to put on LD_LIBRARY_PATH."""

    binary: Path
    lib_dir: Path

    def env(self) -> dict[str, str]:
        """The environment to run it with."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH")) if p
        )
        return env

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run perf_analyzer with `args`; exit code unchecked (it stops at the first failed request)."""
        return subprocess.run(
            [str(self.binary), *args], env=self.env(), capture_output=True, text=True, timeout=timeout
        )


def _link(target: Path, link: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def ensure_perf_analyzer(root: Path | None = None) -> PerfAnalyzer:
    """Download (once, with pip) and unpack perf_analyzer into the cache; check that it starts."""
    base = (root or cache_dir()) / f"perf_analyzer-{VERSION}"
    binary, lib_dir = base / "bin" / "perf_analyzer", base / "lib"
    if not binary.exists():
        with tempfile.TemporaryDirectory() as tmp:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
            done = subprocess.run(
                [*pip, "-d", tmp, f"tritonclient=={VERSION}"], capture_output=True, text=True, timeout=600
            )
            wheels = list(Path(tmp).glob(f"tritonclient-{VERSION}-*.whl"))
            if done.returncode != 0 or not wheels:
                raise PerfAnalyzerUnavailable(
                    f"pip download tritonclient=={VERSION} failed: {done.stderr[-2000:]}"
                )
            binary.parent.mkdir(parents=True, exist_ok=True)
            with (
                zipfile.ZipFile(wheels[0]) as whl,
                whl.open(_MEMBER) as src,
                open(f"{binary}.tmp", "wb") as dst,
            ):
                shutil.copyfileobj(src, dst)
            os.chmod(f"{binary}.tmp", 0o755)
            os.replace(f"{binary}.tmp", binary)
    lib_dir.mkdir(parents=True, exist_ok=True)
    libs = find_triton().libs
    for name, pattern in (("libcudart.so.12", "libcudart-*.so.12*"), ("libb64.so.0d", "libb64-*.so.0d")):
        found = sorted(libs.glob(pattern))
        if found:
            _link(found[0], lib_dir / name)
    pa = PerfAnalyzer(binary, lib_dir)
    check = subprocess.run(
        [str(binary), "--version"], env=pa.env(), capture_output=True, text=True, timeout=60
    )
    if "error while loading shared libraries" in check.stderr:
        raise PerfAnalyzerUnavailable(
            f"perf_analyzer cannot start: {check.stderr.strip()}; try apt-get install -y libb64-0d"
        )
    return pa


@dataclass(frozen=True)
class RequestRecord:
    """One request of a perf_analyzer profile export: send and response times (ns, CLOCK_REALTIME)."""

    sent_ns: int
    response_ns: int | None

    @property
    def latency_ms(self) -> float | None:
        """Client-side latency."""
        return None if self.response_ns is None else (self.response_ns - self.sent_ns) / 1e6


def read_profile_export(path: str | os.PathLike[str]) -> list[RequestRecord]:
    """The requests of every experiment in a `--profile-export-file`, in send order."""
    with open(path) as f:
        doc = json.load(f)
    records = [
        RequestRecord(
            int(r["timestamp"]), int(r["response_timestamps"][-1]) if r["response_timestamps"] else None
        )
        for exp in doc["experiments"]
        for r in exp["requests"]
    ]
    return sorted(records, key=lambda r: r.sent_ns)
