"""The emulated LLM engine's scheduler and roofline, by hand-computed cases (pure, no tritonserver)."""

from __future__ import annotations

import itertools

import pytest

from devkit.llm.engine import (
    LLAMA3_8B_FP16_H100,
    LLAMA3_8B_FP16_L4,
    LLAMA3_8B_KV_BYTES_PER_TOKEN,
    Engine,
    EngineConfig,
    EngineConfigError,
    Refused,
    Sequence,
    run_to_completion,
)


def test_roofline_figures_of_llama3_8b() -> None:
    """KV bytes per token 2*32*8*128*2; a lone decode step reads the 16 GB of weights (53.5 ms on an L4's
    300 GB/s, 4.8 ms on an H100's 3.35 TB/s); a 1024-token prefill is compute bound on the L4 (16 GFLOP a token
    at 121 TFLOP/s); the L4 keeps 0.9 of its 7.9 GB left for 54519 tokens of KV."""
    assert LLAMA3_8B_KV_BYTES_PER_TOKEN == 131072
    l4, h100 = EngineConfig(roofline=LLAMA3_8B_FP16_L4), EngineConfig(roofline=LLAMA3_8B_FP16_H100)
    assert l4.iteration_seconds(1, 0) == pytest.approx(16.06e9 / 300e9)
    assert h100.iteration_seconds(1, 0) == pytest.approx(16.06e9 / 3.35e12)
    assert l4.iteration_seconds(1024, 1024) == pytest.approx(2 * 8.03e9 * 1024 / 121e12)
    assert l4.kv_tokens == 54519 and l4.total_blocks == 54519 // 64


def test_decode_step_grows_with_the_context_it_reads() -> None:
    """TPOT of one sequence: each step reads the weights and its context's KV (caught: a step that ignored the
    context would make long conversations as fast as short ones)."""
    cfg = EngineConfig(roofline=LLAMA3_8B_FP16_L4)
    _, times = run_to_completion(Engine(cfg), [Sequence("a", 8000, 3)])
    gaps = [b - a for a, b in zip(times["a"], times["a"][1:], strict=False)]
    expected = (16.06e9 + 8001 * 131072) / 300e9
    assert gaps[0] == pytest.approx(expected, rel=1e-3)
    assert gaps[1] > gaps[0]


def test_guaranteed_no_evict_caps_running_sequences_by_reserved_kv() -> None:
    """2048 tokens of KV hold four sequences of 480 + 32 tokens reserved whole: never a fifth, never a pause."""
    engine = Engine(EngineConfig(kv_cache_tokens=2048))
    for i in range(8):
        engine.submit(Sequence(i, 480, 32))
    most = 0
    while (it := engine.plan()) is not None:
        most = max(most, len(engine.running))
        engine.complete(it)
    assert most == 4 and engine.paused == 0


def test_max_utilization_admits_more_and_pauses_when_the_cache_fills() -> None:
    """max_utilization admits on the KV needed now, so more run at once; when their growth no longer fits it
    pauses the latest admitted, which resumes later and still gets every token it asked for."""
    engine = Engine(EngineConfig(kv_cache_tokens=2048, policy="max_utilization"))
    seqs = [Sequence(i, 400, 300) for i in range(4)]
    for s in seqs:
        engine.submit(s)
    it = engine.plan()
    assert it is not None and len(engine.running) == 4
    _, times = run_to_completion(engine, [])
    assert engine.paused > 0
    assert sorted(len(v) for v in times.values()) == [300] * 4


def test_a_prompt_beyond_max_num_tokens_needs_chunked_prefill() -> None:
    """Without chunked prefill a prompt longer than max_num_tokens is refused with the fix named; with it, the
    prompt is prefilled in chunks and a running sequence keeps getting a token every iteration (its longest
    gap is one chunk's time, not the whole prompt's)."""
    plain = Engine(EngineConfig(max_num_tokens=1024))
    with pytest.raises(Refused, match="enable chunked prefill"):
        plain.submit(Sequence("long", 4096, 4))

    def longest_gap(chunked: bool) -> float:
        engine = Engine(EngineConfig(max_num_tokens=4096 if not chunked else 1024, chunked_prefill=chunked))
        engine.submit(Sequence("short", 16, 40))
        it = engine.plan()
        assert it is not None
        engine.complete(it)  # the short one decodes from here on
        engine.submit(Sequence("long", 4000, 2))
        _, times = run_to_completion(engine, [])
        short = [0.0, *times["short"]]  # its first token came out of the iteration before, at time 0
        return max(b - a for a, b in itertools.pairwise(short))

    whole, chunked = longest_gap(False), longest_gap(True)
    assert whole == pytest.approx(2 * 8.03e9 * 4001 / 121e12, rel=0.01)
    assert chunked < whole / 3


def test_admission_is_in_arrival_order() -> None:
    """A sequence that does not fit keeps the ones behind it waiting, as TensorRT-LLM's FIFO scheduler does
    (caught: skipping ahead would let short requests starve a long one)."""
    engine = Engine(EngineConfig(kv_cache_tokens=1024))
    engine.submit(Sequence("a", 500, 12))
    engine.submit(Sequence("big", 900, 12))
    engine.submit(Sequence("small", 64, 8))
    engine.plan()
    assert [s.key for s in engine.running] == ["a"]
    assert [s.key for s in engine.waiting] == ["big", "small"]


def test_bad_settings_and_requests_name_the_fix() -> None:
    """Settings the engine cannot run with and requests it cannot take fail with the parameter named."""
    with pytest.raises(EngineConfigError, match="batch_scheduler_policy"):
        EngineConfig(policy="fifo")  # type: ignore[arg-type]
    with pytest.raises(EngineConfigError, match="no KV cache"):
        EngineConfig(kv_cache_tokens=10)
    engine = Engine(EngineConfig(kv_cache_tokens=1024, max_queue_size=1))
    with pytest.raises(Refused, match="exceed the whole KV cache"):
        engine.submit(Sequence("x", 1000, 100))
    engine.submit(Sequence("a", 10, 10))
    with pytest.raises(Refused, match="max_queue_size"):
        engine.submit(Sequence("b", 10, 10))
