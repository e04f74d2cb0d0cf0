"""Live service time from Triton's batch statistics: the pure delta arithmetic, then a real tritonserver."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from devkit.triton.local import LocalTriton
from devkit.triton.repository import local_model_input
from tailtune.api.v1alpha1 import Batching, Warmup
from tailtune.triton import control
from tailtune.triton.stats import BatchStatsReader, counter_deltas, parse_batch_stats, summarize

from .conftest import Deployer, infer

# What `get_inference_statistics(as_json=True)` returns: 64-bit numbers as strings, zero fields left out.
DOC = {
    "model_stats": [
        {
            "name": "m",
            "version": "1",
            "batch_stats": [
                {
                    "batch_size": "1",
                    "compute_input": {"count": "3", "ns": "3000"},
                    "compute_infer": {"count": "3", "ns": "6000000"},
                    "compute_output": {"count": "3", "ns": "3000"},
                },
                {"batch_size": "4", "compute_infer": {"count": "2", "ns": "20000000"}},
            ],
        },
        {"name": "other", "batch_stats": [{"batch_size": "1", "compute_infer": {"count": "9", "ns": "9"}}]},
    ]
}


def test_parse_sums_input_infer_output() -> None:
    assert parse_batch_stats(DOC, "m") == {1: (3, 6_006_000), 4: (2, 20_000_000)}
    assert parse_batch_stats({}, "m") == {}


def test_deltas_and_restarts() -> None:
    before = {1: (3, 6_000_000), 4: (2, 20_000_000)}
    after = {1: (5, 10_000_000), 4: (2, 20_000_000), 8: (1, 30_000_000)}
    assert counter_deltas(before, after) == {1: (2, 4_000_000), 8: (1, 30_000_000)}
    assert counter_deltas(after, before) is None  # counters went backwards
    assert counter_deltas(after, {1: (9, 1)}) is None  # sizes vanished: the model reloaded
    assert summarize([{1: (2, 4_000_000)}, {1: (2, 2_000_000), 8: (1, 30_000_000)}]) == ((1, 4, 1.5), (8, 1, 30.0))


def test_reader_baselines_new_and_restarted_pods() -> None:
    reads = {"a": [{1: (3, 3_000_000)}, {1: (5, 7_000_000)}, {1: (1, 1_000_000)}, {1: (2, 3_000_000)}]}
    reader = BatchStatsReader("m", fetch=lambda address, model: reads[address].pop(0))
    assert reader.read(["a"]) == ()  # first sight: baseline only
    assert reader.read(["a"]) == ((1, 2, 2.0),)
    assert reader.read(["a"]) == ()  # restarted: reset
    assert reader.read(["a"]) == ((1, 1, 2.0),)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.triton
def test_deltas_from_a_real_tritonserver(triton: LocalTriton, deployer: Deployer) -> None:
    # t(b) = 4 + 1 * b ms on the emulated device; warmup executes sizes 1 and 4 before the model is ready.
    inp = local_model_input(
        "emulated_gpu",
        "stats",
        dim=8,
        batching=Batching(max_batch_size=8),
        warmup=Warmup(batch_sizes=[1, 4], count=2),
    )
    deployer.deploy("emulated_gpu", inp, base_ms=4, per_item_ms=1, exponent=1)
    pod, dead = triton.grpc_url, f"127.0.0.1:{_closed_port()}"
    reader = BatchStatsReader("stats")
    # Warmup executions are in Triton's counters already; the first read takes them as the baseline.
    assert reader.read([pod, dead]) == ()

    sent = {1: 5, 4: 3}
    for batch, times in sent.items():
        for _ in range(times):  # one request at a time: each executes as its own batch
            infer(triton, "stats", np.ones((batch, 8), dtype=np.float32))
    got = reader.read([pod, dead])  # the dead pod contributes nothing and breaks nothing
    assert {b: n for b, n, _ in got} == sent
    for batch, _, ms in got:
        assert 4 + batch <= ms < 4 + batch + 200  # the emulated device time, plus the backend's overhead

    assert reader.read([pod]) == ()  # nothing executed since
    # The same server under a second address stands for a second pod: new, so only a baseline.
    infer(triton, "stats", np.ones((2, 8), dtype=np.float32))
    again = reader.read([pod, pod.replace("127.0.0.1", "localhost")])
    assert [(b, n) for b, n, _ in again] == [(2, 1)]

    # A reload restarts Triton's counters: that pod is reset, then counted again.
    control.unload_model(pod, "stats")
    deployer.load("stats")
    assert reader.read([pod]) == ()
    infer(triton, "stats", np.ones((1, 8), dtype=np.float32))
    assert [(b, n) for b, n, _ in reader.read([pod])] == [(1, 1)]
