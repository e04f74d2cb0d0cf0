"""Prometheus queries of the tuner for a fleet of N InferenceServices: one reader per object vs the fleet reader.

    python bench/tuner/fleet_queries.py                  # N = 1, 10, 100, 1000
    python bench/tuner/fleet_queries.py --n 1 10 100

Counted from the readers themselves against a client that counts the queries (no Prometheus, no cluster):
- per tick: N objects due at once, each read by its own `PrometheusReader` (before) or all by one `FleetReader` read
  (after), for the operator's default read (P99 over 60 s, Triton's summary, the breakdown) and for a mixed fleet
  (a quarter with a latency histogram, a quarter with a further P50 target, a tenth with a user's `latencyQuery`);
- per second at the default 30 s interval: before, every object's read; after, the ticks on their phases
  (`operator.ticks.tick_phase` of random uids) gathered into reads as `FleetReads` gathers them (GATHER_SECONDS).
"""

from __future__ import annotations

import argparse
import random
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tailtune.operator.ticks import GATHER_SECONDS, tick_phase  # noqa: E402
from tailtune.tuner.fleet import FleetReader  # noqa: E402
from tailtune.tuner.prom import PrometheusReader, ReadSpec, Target  # noqa: E402

AT = datetime(2026, 1, 1, tzinfo=UTC)
INTERVAL = 30.0


class Counting:
    """Counts the queries; says a latency histogram exists for the models named `h...`, nothing else."""

    def __init__(self) -> None:
        self.calls = 0

    def query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        self.calls += 1
        if promql.startswith("count") and "duration_us_bucket" in promql:
            models = [m for m in promql.split('model=~"')[-1].split('"')[0].split("|") if m.startswith("h")]
            if "by (namespace, model)" in promql:
                return [{"metric": {"namespace": "ns", "model": m}, "value": [0, "5"]} for m in models]
            if 'model="h' in promql:
                return [{"metric": {}, "value": [0, "5"]}]
        return []


def default_fleet(n: int) -> list[ReadSpec]:
    return [ReadSpec(Target("ns", f"s{i}", f"m{i}"), 99, 60, breakdown=True) for i in range(n)]


def mixed_fleet(n: int) -> list[ReadSpec]:
    out = []
    for i in range(n):
        model = f"h{i}" if i % 4 == 1 else f"m{i}"
        user = 'max(gw_seconds{{svc="{name}"}})' if i % 10 == 3 else None
        others = (50.0,) if i % 4 == 2 else ()
        out.append(ReadSpec(Target("ns", f"s{i}", model), 99, 60, latency_query=user, other_percentiles=others,
                            breakdown=True))  # fmt: skip
    return out


def per_tick(specs: list[ReadSpec]) -> tuple[int, int]:
    alone, together = Counting(), Counting()
    for spec in specs:
        PrometheusReader.for_spec(alone, spec).read_signal(AT)
    FleetReader(together).read(specs, AT)
    return alone.calls, together.calls


def reads_per_interval(n: int, rng: random.Random) -> int:
    """How many gathered reads the ticks of n objects make in one interval: the first tick due opens a read that
    the ticks due within GATHER_SECONDS join."""
    phases = sorted(tick_phase(str(uuid.UUID(int=rng.getrandbits(128), version=4)), INTERVAL) for _ in range(n))
    reads, opened = 0, -1e9
    for p in phases:
        if p > opened + GATHER_SECONDS:
            reads, opened = reads + 1, p
    return reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 10, 100, 1000])
    args = parser.parse_args()
    rng = random.Random(41)
    print(f"{'N':>6} | {'default read: per tick':>24} | {'mixed fleet: per tick':>24} | {'queries/s at 30 s':>22}")
    print(f"{'':>6} | {'before':>11} {'after':>12} | {'before':>11} {'after':>12} | {'before':>10} {'after':>11}")
    for n in args.n:
        before, after = per_tick(default_fleet(n))
        mixed_before, mixed_after = per_tick(mixed_fleet(n))
        reads = reads_per_interval(n, rng)
        print(
            f"{n:>6} | {before:>11} {after:>12} | {mixed_before:>11} {mixed_after:>12} | "
            f"{before / INTERVAL:>10.1f} {reads * after / INTERVAL:>11.1f}"
        )


if __name__ == "__main__":
    main()
