"""The harness's child processes: each the leader of its own process group, its pid recorded on disk.

A start is recorded as a JSON file (pid and argv[0]) until the process is reaped, so a supervisor, or a later
command such as `python -m devkit.cluster down`, can find and end stragglers without ever signalling a recycled
pid (`Recorded.alive` compares argv[0]). Children started with `die_with_parent` also get SIGKILL when the
thread that started them dies; the local cluster's components do not, since they outlive `up`.
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _own_group_dying_with_parent() -> None:
    """In the child, before exec: a process group of its own, and SIGKILL when the parent thread dies."""
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Recorded:
    """A process as recorded at its start: its pid and argv[0]."""

    pid: int
    exe: str

    @staticmethod
    def load(path: Path) -> Recorded | None:
        """The record in `path`, or None when it is missing or unreadable."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            raw = json.loads(path.read_text())
            return Recorded(int(raw["pid"]), str(raw["exe"]))
        return None

    def write(self, path: Path) -> None:
        """Record it in `path`."""
        path.write_text(json.dumps(asdict(self)) + "\n")

    def alive(self) -> bool:
        """The pid runs and still runs the program it was started with (not a zombie, not a recycled pid)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        zombie = stat.rsplit(")", 1)[1].split()[0] == "Z"
        return not zombie and cmdline.split(b"\0", 1)[0].decode(errors="replace") == self.exe


def terminate(procs: Sequence[Recorded], grace_s: float = 10.0) -> list[Recorded]:
    """SIGTERM each live process's group, SIGKILL those still alive after `grace_s`; return the killed ones.

    Works on processes this one did not start (it polls /proc instead of waiting)."""
    live = [p for p in procs if p.alive()]
    for proc in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.alive() for p in live):
        time.sleep(0.1)
    stubborn = [p for p in live if p.alive()]
    for proc in stubborn:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return stubborn


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
        record_as: str | None = None,
        name: str = "",
        die_with_parent: bool = True,
    ) -> Process:
        """Start `argv` with stdout and stderr appended to `log_path`, recorded in `pid_dir` (as
        `<record_as or pid>.json`) when given.

        With `die_with_parent`, PR_SET_PDEATHSIG fires when the *thread* that forked exits: call this from a
        thread that lives as long as the child should (the main thread).
        """
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                # setsid + prctl only: takes no locks
                preexec_fn=_own_group_dying_with_parent if die_with_parent else None,
                start_new_session=not die_with_parent,
            )  # fmt: skip
        record = None
        if pid_dir is not None:
            record = pid_dir / f"{record_as or popen.pid}.json"
            Recorded(popen.pid, argv[0]).write(record)
        return cls(popen, record, datetime.now(UTC), name or Path(argv[0]).name)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

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

    def kill(self) -> int:
        """SIGKILL the group at once (a crash: no handler runs); return the exit code."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        code = self.popen.wait()
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        return code


def _records(pid_dir: Path) -> list[tuple[Path, Recorded | None]]:
    return [(path, Recorded.load(path)) for path in sorted(pid_dir.glob("*.json"))] if pid_dir.exists() else []


def recorded_alive(pid_dir: Path) -> list[int]:
    """Pids recorded in `pid_dir` that still run the program they were started with; other records go."""
    alive = []
    for path, proc in _records(pid_dir):
        if proc is not None and proc.alive():
            alive.append(proc.pid)
        else:
            path.unlink(missing_ok=True)
    return alive


def kill_recorded(pid_dir: Path, grace_s: float = 5.0) -> list[int]:
    """End every recorded process still alive (SIGTERM to its group, then SIGKILL); return their pids."""
    live = [proc for _, proc in _records(pid_dir) if proc is not None and proc.alive()]
    terminate(live, grace_s)
    recorded_alive(pid_dir)  # drops the records of the ended ones
    return [proc.pid for proc in live]


def processes_mentioning(text: str) -> list[str]:
    """Command lines ("pid: argv", cut at 200 characters) of the processes other than this one that contain `text`
    (what a run left behind, found by a folder or port it was given)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{proc.name}: {cmdline[:200]}")
    return found
