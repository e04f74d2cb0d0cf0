"""README, "Your own model", run as written: the shell blocks of its local walkthrough, in order, in one bash.

The blocks of "The `tailtune` command" and "On the local cluster" are taken from README.md itself (```bash and
```sh fences; a subsection, block or line marked **real cluster only** is left out) and run verbatim with
`set -e` from the checkout's root, with `.venv/bin` off PATH (the README's `source .venv/bin/activate` has to
put it there) and with one variable set, the one the README tells a user to set for a cluster of their own:
TAILTUNE_CLUSTER_DIR, a temporary folder, so the run never touches `.cache/cluster` or anyone else's cluster.

What the README promises and this checks: every command exits 0, the InferenceService is Ready, Triton answers
the inference request with what the README says it answers (the emulated accelerator's INPUT0 * 2), and the
teardown leaves no process behind (none carrying the cluster folder, nothing on the model server's port).

Marked e2e (about a minute); TAILTUNE_SKIP_E2E=1 skips it. The README uses fixed /tmp paths and port 18081, so
runs on one machine take turns (a file lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## Your own model"
WALKTHROUGH = ("The `tailtune` command", "On the local cluster")  # the local walkthrough's subsections
REAL_ONLY = "real cluster only"
MODEL_PORT = 18081  # examples/local-model.yaml's model URI
LOCK = Path("/tmp/tailtune-readme-walkthrough.lock")
TIMEOUT_S = 170


def section_blocks(readme: str, section: str = SECTION) -> dict[str, list[str]]:
    """The ```bash / ```sh blocks under `section`, per `###` subsection, in order; real-cluster-only ones left out.

    A subsection whose heading, a block whose prose since the previous block, or a line that says
    "real cluster only" is not run.
    """
    lines = readme.splitlines()
    start = lines.index(section)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks: dict[str, list[str]] = {}
    sub, prose, fence, indent, body = "", "", None, 0, []
    for line in lines[start + 1 : end]:
        stripped = line.strip()
        if fence is not None:
            if stripped != "```":
                body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
                continue
            real_only = REAL_ONLY in (sub + prose).lower()
            if fence in ("bash", "sh") and not real_only:
                kept = [b for b in body if REAL_ONLY not in b.lower()]
                blocks.setdefault(sub, []).append("\n".join(kept) + "\n")
            fence, body, prose = None, [], ""
        elif stripped.startswith("### "):
            sub, prose = stripped[4:], ""
        elif stripped.startswith("```"):
            fence, indent = stripped[3:].strip(), len(line) - len(line.lstrip())
        else:
            prose += " " + stripped
    return blocks


def walkthrough_script(readme: str) -> str:
    """The walkthrough's blocks as one bash script, `set -e`, each block echoed before it runs."""
    blocks = section_blocks(readme)
    missing = [s for s in WALKTHROUGH if not blocks.get(s)]
    assert not missing, f"README.md, {SECTION}: no shell blocks under {missing}"
    parts = ["set -euo pipefail"]
    for sub in WALKTHROUGH:
        for n, block in enumerate(blocks[sub], 1):
            parts.append(f"echo '>>> README: {sub}, block {n}'")
            parts.append(block)
    return "\n".join(parts) + "\n"


def test_parses_the_walkthrough_in_order() -> None:
    """The script has the commands a user types, cluster up first, down last, and nothing of the real cluster."""
    script = walkthrough_script(README.read_text())
    assert "source .venv/bin/activate" in script
    up, down = script.index("python -m devkit.cluster up"), script.index("python -m devkit.cluster down")
    assert up < script.index("kubectl apply -f examples/local-model.yaml") < script.index("curl -s") < down
    assert '"data":[0.0,2.0,4.0,…,30.0]' in README.read_text(), "the README no longer says what Triton answers"
    assert "helm install" not in script and "resnet-l4" not in script
    commands = [line.split("#")[0] for line in script.splitlines()]
    assert not any("--watch" in c for c in commands), "a command that never ends cannot run as written"


# ------------------------------------------------------------------------------------------- running it


@contextlib.contextmanager
def _taking_turns() -> Iterator[None]:
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _processes_of(marker: str) -> list[str]:
    """Live processes whose command line or environment carries `marker` (the cluster folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
            state = next(ln for ln in (proc / "status").read_text().splitlines() if ln.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "zombie" not in state and (marker in cmdline or marker in environ):
            found.append(f"{proc.name}: {cmdline.strip()[:200]}")
    return found


def _infer_response(output: str) -> dict[str, object]:
    """The JSON Triton answered to the README's curl (curl -s prints it without a newline)."""
    at = output.find('{"model_name"')
    assert at >= 0, f"no inference response in the walkthrough's output:\n{output[-3000:]}"
    response, _ = json.JSONDecoder().raw_decode(output[at:])
    assert isinstance(response, dict)
    return response


def _expected_output() -> list[float]:
    """OUTPUT0 for the README's input as the README states it: the emulated accelerator returns INPUT0 * 2."""
    return [2.0 * i for i in range(16)]


def _clean_env(cluster_dir: Path) -> dict[str, str]:
    """The caller's environment without the venv or a cluster of its own, plus the README's one variable."""
    venv_bin = str(REPO / ".venv" / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "KUBECONFIG", "PYTHONPATH")}
    return {**env, "PATH": path, "TAILTUNE_CLUSTER_DIR": str(cluster_dir)}


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.skipif(os.environ.get("TAILTUNE_SKIP_E2E") == "1", reason="TAILTUNE_SKIP_E2E=1")
def test_your_own_model_walkthrough_runs_as_written(tmp_path: Path) -> None:
    script = walkthrough_script(README.read_text())
    cluster_dir = tmp_path / "cluster"
    log = tmp_path / "walkthrough.log"
    (tmp_path / "walkthrough.sh").write_text(script)
    env = _clean_env(cluster_dir)
    with _taking_turns():
        assert _port_free(MODEL_PORT), f"port {MODEL_PORT} (the README's model server) is taken"
        started = time.monotonic()
        with log.open("w") as out:
            # Its own process group: on a failure or a timeout everything it started in the background goes.
            proc = subprocess.Popen(
                ["bash", str(tmp_path / "walkthrough.sh")],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                elapsed = time.monotonic() - started
                if rc != 0:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=30)
                    if (cluster_dir / "cluster.json").exists():
                        down = [sys.executable, "-m", "devkit.cluster", "down"]
                        subprocess.run(down, cwd=REPO, env=env, capture_output=True, timeout=120, check=False)
        output = log.read_text()
        sys.stderr.write(f"README walkthrough: {elapsed:.0f} s, exit {rc}\n")
        assert rc == 0, f"the README's walkthrough {'timed out' if rc is None else f'exited {rc}'}:\n{output[-6000:]}"

        # What the README promises.
        assert re.search(r"inferenceservice\.tailtune\.io/my-model condition met", output), output[-3000:]
        assert re.search(r"tailtune-engines\s+Bound", output), "the engine store's claim is not Bound"
        response = _infer_response(output)
        assert response["model_name"] == "my-model"
        (out0,) = [o for o in response["outputs"] if o["name"] == "OUTPUT0"]  # type: ignore[attr-defined]
        assert out0["shape"] == [1, 16]
        assert out0["data"] == pytest.approx(_expected_output(), rel=1e-4, abs=1e-5)

        # The teardown leaves nothing running.
        deadline = time.monotonic() + 10
        while (left := _processes_of(str(cluster_dir))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, "processes left after the README's teardown:\n" + "\n".join(left)
        assert _port_free(MODEL_PORT), f"the model server still listens on {MODEL_PORT}"
        assert not cluster_dir.exists(), "`python -m devkit.cluster down` left the cluster folder"
