"""Live service time from Triton's statistics extension: executions and compute time per executed batch size.

Triton keeps, per model and per batch size it executed, cumulative counts and nanoseconds of compute input,
infer and output (`ModelStatistics.batch_stats`). `BatchStatsReader` reads them from each pod over gRPC and
returns what changed since its previous read of that pod, summed over pods, as plain tuples
`(batch, executions, mean ms)` so this package needs nothing from the tuner.

Triton 2.51 counts `model_warmup` samples here too, and the first execution of a size is slow: a pod's
first read only sets its baseline, so neither reaches the deltas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

log = logging.getLogger(__name__)

# batch size -> (executions, compute ns of input + infer + output), cumulative since the model loaded.
Counters = dict[int, tuple[int, int]]
# (batch, executions, mean ms of input + infer + output) over one interval.
BatchDelta = tuple[int, int, float]


def parse_batch_stats(doc: Mapping[str, Any], model_name: str) -> Counters:
    """Counters of `model_name` in a `get_inference_statistics(as_json=True)` answer, summed over versions. Pure.

    The JSON form writes 64-bit numbers as strings and leaves zero fields out.
    """
    out: Counters = {}
    for model in doc.get("model_stats") or []:
        if model.get("name", model_name) != model_name:
            continue
        for entry in model.get("batch_stats") or []:
            batch = int(entry.get("batch_size", 0))
            count = int((entry.get("compute_infer") or {}).get("count", 0))
            ns = sum(int((entry.get(part) or {}).get("ns", 0)) for part in _PARTS)
            if batch > 0:
                old_count, old_ns = out.get(batch, (0, 0))
                out[batch] = (old_count + count, old_ns + ns)
    return out


_PARTS = ("compute_input", "compute_infer", "compute_output")


def counter_deltas(previous: Counters, current: Counters) -> Counters | None:
    """Per size, what `current` adds to `previous`; None when a counter went backwards (the model restarted). Pure."""
    if any(size not in current or current[size][0] < count for size, (count, _) in previous.items()):
        return None
    out: Counters = {}
    for size, (count, ns) in current.items():
        old_count, old_ns = previous.get(size, (0, 0))
        if count > old_count:
            out[size] = (count - old_count, max(0, ns - old_ns))
    return out


def summarize(deltas: Iterable[Counters]) -> tuple[BatchDelta, ...]:
    """Sum per-pod deltas per size: `(batch, executions, mean ms)`, by batch size. Pure."""
    total: Counters = {}
    for pod in deltas:
        for size, (count, ns) in pod.items():
            old_count, old_ns = total.get(size, (0, 0))
            total[size] = (old_count + count, old_ns + ns)
    return tuple((size, count, ns / count / 1e6) for size, (count, ns) in sorted(total.items()) if count > 0)


def fetch_batch_stats(url: str, model_name: str, timeout_s: float = 2.0) -> Counters:
    """Read one Triton's batch statistics of `model_name` over gRPC (`host:port`). Raises InferenceServerException."""
    client = grpcclient.InferenceServerClient(url.removeprefix("grpc://").rstrip("/"))
    try:
        doc = client.get_inference_statistics(model_name, as_json=True, client_timeout=timeout_s)
    finally:
        client.close()
    return parse_batch_stats(doc, model_name)


class BatchStatsReader:
    """Keeps the previous read per pod address; `read` returns the deltas since then, summed over pods.

    A pod seen for the first time contributes nothing (it sets the baseline); a pod whose counters went
    backwards (restarted, or the model reloaded) is reset the same way; a pod that cannot be read contributes
    nothing and keeps its baseline; pods no longer listed are forgotten.
    """

    def __init__(self, model_name: str, fetch: Callable[[str, str], Counters] = fetch_batch_stats) -> None:
        self.model_name = model_name
        self._fetch = fetch
        self._previous: dict[str, Counters] = {}

    def read(self, addresses: Iterable[str]) -> tuple[BatchDelta, ...]:
        """Read every pod (gRPC `host:port`) and return `(batch, executions, mean ms)` since the last read."""
        wanted = list(dict.fromkeys(addresses))
        deltas: list[Counters] = []
        for address in wanted:
            try:
                current = self._fetch(address, self.model_name)
            except InferenceServerException as exc:
                log.info("batch statistics of %s at %s unavailable: %s", self.model_name, address, exc)
                continue
            deltas.append(self.update(address, current))
        self._previous = {a: c for a, c in self._previous.items() if a in wanted}
        return summarize(deltas)

    def update(self, address: str, current: Counters) -> Counters:
        """Take one pod's counters as its new baseline; return what they add to the old one ({} without one)."""
        previous = self._previous.get(address)
        self._previous[address] = current
        if previous is None:
            return {}
        return counter_deltas(previous, current) or {}
