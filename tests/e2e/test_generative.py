"""A generative InferenceService end to end on the local cluster (issue 39): `tailtune demo --generative --quick`.

Real tritonserver pods (the EMULATED inflight-batching LLM inside, devkit.llm), a real Prometheus, the operator and
the streaming client, in the demo's own cluster (it brings it up and down; the session's cluster is not touched).
The service goes Ready behind its warmup, streams every request's tokens, and through a step in request rate and
prompt length (1.5 -> 4 req/s, 256 -> 1024-token prompts) its P99 TTFT/TPOT hold the targets once the tuner has
acted; status.generative agrees with the client's percentiles of the same requests within 5 %.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from devkit.procs import processes_mentioning
from tests.children import run_to_end

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# Issue 39's bar: the server's percentiles within 5 % of the client's on the same run.
AGREEMENT = 0.05


@pytest.mark.skipif(os.environ.get("TAILTUNE_SKIP_E2E") == "1", reason="TAILTUNE_SKIP_E2E=1")
@pytest.mark.timeout(330)
def test_generative_service_holds_ttft_and_tpot_through_a_load_step(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    result = run_to_end(
        [sys.executable, "-m", "devkit.demo", "--generative", "--quick", "--out", str(out), "--workdir", str(work)],
        cwd=REPO, timeout=300, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    logs = "\n".join(
        f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
        for p in sorted((work / "logs").glob("*.log"))
    )
    summary_path = out / "summary.json"
    assert summary_path.exists(), (
        f"demo exited {result.returncode}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}\n{logs}"
    )
    s = json.loads(summary_path.read_text())
    print(json.dumps({k: s[k] for k in ("after", "probe", "ttft_error", "tpot_error", "replicas_max", "decisions")}))
    # Ready behind warmup, every request streamed to its last token.
    assert s["time_to_first_ready_s"] is not None
    assert s["requests"] > 100 and s["failed"] == 0 and s["tokens"] > 20 * s["requests"]
    # status.generative against the client on the probe's requests.
    assert abs(s["ttft_error"]) <= AGREEMENT and abs(s["tpot_error"]) <= AGREEMENT, s
    # Through the step: the targets hold once the tuner acted (the step needs more than one replica: on one, the
    # emulated L4's prefills of 4 x 1024 tokens/s stall the decode steps well past the TPOT target).
    w = s["after"]
    assert w["ttft_p99_ms"] <= s["ttft_target_ms"] and w["tpot_p99_ms"] <= s["tpot_target_ms"], w
    assert s["replicas_max"] >= 2 and any("ScaledOut" in d for d in s["decisions"]), s["decisions"]
    assert result.returncode == 0 and "PASS" in result.stdout
    assert (out / "report.png").stat().st_size > 0
    assert processes_mentioning(str(work)) == [], "processes left behind"
