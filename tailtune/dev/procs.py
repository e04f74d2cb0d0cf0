"""Child processes that cannot outlive their parent: own process group, SIGKILL on the parent's death.

Each start is recorded as `<pid_dir>/<pid>.json` (pid and argv[0]) until the process is reaped, so a
supervisor can find and end stragglers after a crash (`kill_recorded`), never signalling a recycled pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """In the child, before exec: a process group of its own, and SIGKILL when the parent thread dies."""
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Process:
    """A started child (the leader of its own process group)."""

    popen: subprocess.Popen[bytes]
    record: Path | None
    started_at: datetime
    name: str

    @classmethod
    def start(
        cls,
        argv: list[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        pid_dir: Path | None = None,
        name: str = "",
    ) -> Process:
        """Start `argv` with stdout and stderr appended to `log_path`.

        PR_SET_PDEATHSIG fires when the *thread* that forked exits: call this from a thread that lives as
        long as the child should (the main thread).
        """
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                preexec_fn=_child_setup,  # setsid + prctl only: takes no locks
            )  # fmt: skip
        record = None
        if pid_dir is not None:
            record = pid_dir / f"{popen.pid}.json"
            record.write_text(json.dumps({"pid": popen.pid, "exe": argv[0]}) + "\n")
        return cls(popen, record, datetime.now(UTC), name or Path(argv[0]).name)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit code once it ended (then the record goes), else None."""
        code = self.popen.poll()
        if code is not None and self.record is not None:
            self.record.unlink(missing_ok=True)
        return code

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM the group, SIGKILL it after `grace_s` (and any member left); return the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", self.name, self.pid, grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        code = self.popen.wait()
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        return code


def _alive(pid: int, exe: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    zombie = stat.rsplit(")", 1)[1].split()[0] == "Z"
    return not zombie and cmdline.split(b"\0", 1)[0].decode(errors="replace") == exe


def recorded_alive(pid_dir: Path) -> list[int]:
    """Pids recorded in `pid_dir` that still run the program they were started with."""
    alive = []
    for path in sorted(pid_dir.glob("*.json")) if pid_dir.exists() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            rec = json.loads(path.read_text())
            if _alive(int(rec["pid"]), str(rec["exe"])):
                alive.append(int(rec["pid"]))
                continue
        path.unlink(missing_ok=True)
    return alive


def kill_recorded(pid_dir: Path, grace_s: float = 5.0) -> list[int]:
    """End every recorded process still alive (SIGTERM to its group, then SIGKILL); return their pids."""
    pids = recorded_alive(pid_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and recorded_alive(pid_dir):
        time.sleep(0.1)
    for pid in recorded_alive(pid_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return pids
