"""The LLM fleet simulator (`tailtune.sim.llm.LlmFleet`) by hand-computed cases, and `tailtune simulate
--generative`'s input errors and report."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tailtune.offline.simulate import main as simulate_main
from tailtune.sim.llm import (
    ROOFLINES,
    EngineConfig,
    LlmFleet,
    LlmRequest,
    TokenLengths,
    percentile,
    poisson_requests,
)

L4 = EngineConfig(roofline=ROOFLINES["l4"])


def test_a_lone_request_takes_the_rooflines_prefill_then_decode_steps() -> None:
    """TTFT is the prefill iteration (compute bound: 2 x params x 1024 / FLOP/s); each later token one memory-bound
    decode step reading the weights and the context."""
    fleet = LlmFleet(L4, 1, start_seconds=0.0)
    fleet.offer([LlmRequest(0.0, 1024, 3)])
    fleet.run_until(10.0)
    rec = fleet.records[0]
    r = L4.roofline
    prefill = max(
        2 * r.params * 1024 / r.fp16_dense_flops_per_s,
        (r.weights_bytes + 1024 * r.kv_bytes_per_token) / r.memory_bandwidth_bytes_per_s,
    )
    steps = [(r.weights_bytes + c * r.kv_bytes_per_token) / r.memory_bandwidth_bytes_per_s for c in (1024, 1025)]
    assert rec.ttft_s == pytest.approx(prefill)
    assert rec.tpot_s == pytest.approx(sum(steps) / 2)
    assert rec.within(prefill * 1.01, 1.0) and not rec.within(prefill * 0.99, 1.0)


def test_the_kv_budget_caps_the_running_sequences() -> None:
    """A cache of 4 blocks of 64 tokens under guaranteed_no_evict holds two 128-token sequences: the third waits."""
    cfg = EngineConfig(roofline=ROOFLINES["l4"], kv_cache_tokens=256)
    fleet = LlmFleet(cfg, 1, start_seconds=0.0)
    fleet.offer([LlmRequest(0.0, 64, 64) for _ in range(3)])
    fleet.run_until(0.5)
    assert len(fleet.replicas[0].engine.running) == 2 and len(fleet.replicas[0].engine.waiting) == 1
    fleet.run_until(60.0)
    first, third = fleet.records[0], fleet.records[2]
    assert third.first_token_at is not None and first.finished_at is not None
    assert third.first_token_at > first.finished_at  # admitted only once a sequence freed its blocks


def test_a_new_replica_serves_after_its_start_and_a_let_go_one_drains() -> None:
    """Scale out: requests go to the replica in force until the new one is ready; scale in: the let-go replica
    finishes what it holds, then leaves (billed until then)."""
    fleet = LlmFleet(L4, 1, start_seconds=30.0)
    fleet.set_replicas(2)
    fleet.offer([LlmRequest(1.0, 100, 1000), LlmRequest(10.0, 100, 1000), LlmRequest(31.0, 100, 50)])
    fleet.run_until(20.0)
    old, new = fleet.replicas
    assert len(old.engine.running) == 2 and not new.engine.running and new.ready_at == 30.0
    fleet.run_until(31.1)
    assert len(new.engine.running) == 1  # ready now, and the least loaded
    fleet.run_until(40.0)
    fleet.set_replicas(1)
    assert fleet.replicas[1].retire_at == 40.0
    fleet.run_until(100.0)
    assert all(r.finished_at is not None for r in fleet.records)
    assert fleet.replicas[1].gone_at is not None and fleet.replicas[1].gone_at <= 100.0
    assert fleet.replica_seconds(100.0) == pytest.approx(100.0 + fleet.replicas[1].gone_at)


def test_a_window_reports_the_engine_metrics() -> None:
    """Arrivals, prompt and output tokens of the window; one TTFT a first token, one TPOT a finished request."""
    fleet = LlmFleet(L4, 1, start_seconds=0.0)
    fleet.offer([LlmRequest(0.1 * k, 200, 10) for k in range(10)])
    fleet.run_until(30.0)
    w = fleet.window()
    assert (w.arrivals, w.prompt_tokens, w.output_tokens, w.asked_output_tokens) == (10, 2000, 100, 100)
    assert len(w.ttft_s) == 10 and len(w.tpot_s) == 10 and w.replicas_ready == 1 and w.waiting == 0


def test_percentile_is_nearest_rank_and_poisson_traces_are_seeded() -> None:
    assert percentile([5, 1, 4, 2, 3], 50) == 3 and percentile([], 99) is None and percentile(range(100), 99) == 98
    a = poisson_requests(lambda _t: 3.0, 200, TokenLengths(), seed=7)
    assert a == poisson_requests(lambda _t: 3.0, 200, TokenLengths(), seed=7)
    assert 450 < len(a) < 750 and all(1 <= r.prompt_tokens <= 4096 for r in a)


def test_simulate_generative_reports_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json reports goodput and replica-seconds; bad input exits 2 naming the flag or the file's line."""
    out = io.StringIO()
    code = simulate_main(
        [
            "--generative",
            "--ttft-ms",
            "2000",
            "--tpot-ms",
            "100",
            "--shape",
            "step",
            "--rate",
            "1",
            "--duration-s",
            "120",
            "--policy",
            "static:1",
            "--json",
        ],
        out,
    )
    s = json.loads(out.getvalue())
    assert code == 0 and 0 <= s["goodput"] <= 1 and s["replica_seconds"] > 0 and s["requests"] > 0
    assert simulate_main(["--generative", "--ttft-ms", "0", "--tpot-ms", "100", "--shape", "step"]) == 2
    assert "--ttft-ms" in capsys.readouterr().err
    bad = tmp_path / "reqs.csv"
    bad.write_text("t_s,prompt_tokens,output_tokens\n0.5,100,10\n0.2,100,x\n")
    assert simulate_main(["--generative", "--ttft-ms", "2000", "--tpot-ms", "100", "--trace", str(bad)]) == 2
    assert f"{bad}:3" in capsys.readouterr().err
