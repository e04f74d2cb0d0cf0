"""`tailtune demo --quick` end to end: a real local cluster, real Triton processes, real Prometheus, real load.

Marked e2e (minutes, not seconds); TAILTUNE_SKIP_E2E=1 skips it. The demo runs in its own work folder and
brings its own cluster up and down, so it does not touch a cluster the other e2e tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from devkit.demo import Plan, demo_service, engine_store_manifests
from devkit.procs import processes_mentioning
from tests.children import run_to_end

REPO = Path(__file__).resolve().parents[2]


def test_the_plan_steps_a_quarter_in() -> None:
    args = argparse.Namespace(quick=True, duration=None, low_rps=30.0, high_rps=100.0)
    assert Plan.from_args(args) == Plan(30.0, 100.0, 30.0, 120.0)
    args = argparse.Namespace(quick=False, duration=None, low_rps=30.0, high_rps=100.0)
    assert Plan.from_args(args) == Plan(30.0, 100.0, 60.0, 240.0)


def test_the_example_gets_this_runs_model_url_digest_and_prometheus(demo_doc: dict[str, Any]) -> None:
    doc = demo_service(demo_doc, "http://127.0.0.1:5555/m.onnx", "ab" * 32, "http://127.0.0.1:6666")
    assert doc["spec"]["model"]["uri"] == "http://127.0.0.1:5555/m.onnx"
    assert doc["spec"]["model"]["sha256"] == "ab" * 32
    assert doc["spec"]["metrics"]["prometheusUrl"] == "http://127.0.0.1:6666"
    assert demo_doc["spec"]["model"]["uri"] != doc["spec"]["model"]["uri"]  # the example itself is untouched
    # The demo's pods must land on the runtime's nodes, and the emulated device be named.
    assert doc["spec"]["serving"]["nodeSelector"] == {"dev.tailtune.io/local-runtime": "true"}
    assert "emulated-gpu.dev.tailtune.io/base-ms" in doc["spec"]["serving"]["podAnnotations"]


def test_the_engine_store_is_a_hostpath_volume_bound_to_the_claim(tmp_path: Path) -> None:
    ns, pv, pvc = engine_store_manifests("tailtune-demo", "tailtune-engines", tmp_path)
    assert ns["metadata"]["name"] == "tailtune-demo"
    assert pv["spec"]["hostPath"] == {"path": str(tmp_path)}
    assert pv["spec"]["claimRef"] == {"namespace": "tailtune-demo", "name": "tailtune-engines"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]


@pytest.mark.e2e
@pytest.mark.skipif(os.environ.get("TAILTUNE_SKIP_E2E") == "1", reason="TAILTUNE_SKIP_E2E=1")
@pytest.mark.timeout(480)
def test_quick_demo_brings_p99_under_the_slo_after_the_load_step(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    result = run_to_end(
        [sys.executable, "-m", "devkit.demo", "--quick", "--out", str(out), "--workdir", str(work)],
        cwd=REPO, timeout=450, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    logs = "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
        for p in sorted((work / "logs").glob("*.log"))
    )
    assert result.returncode == 0, (
        f"demo exited {result.returncode}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}\n{logs}"
    )
    for name in ("report.png", "summary.json", "summary.md", "timeline.json"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is True
    assert summary["after"]["p99_ms"] <= summary["slo_ms"]
    assert summary["after"]["throughput_rps"] >= 0.9 * summary["high_rps"]
    assert summary["settle_s"] is not None and summary["time_to_first_ready_s"] is not None
    assert summary["decisions"], "the tuner changed nothing after the load step"
    for line in ("time from command to first Ready pod", "time to settle after the load step",
                 "throughput before tuning", "throughput after tuning", "PASS"):  # fmt: skip
        assert line in result.stdout, line
    assert processes_mentioning(str(work)) == [], "processes left behind"
