"""`python bench/scale/traced_operator.py OUT ARGS`: `python -m devkit.operator ARGS` with tracemalloc on; each SIGUSR1
appends the Python heap's largest allocation sites (by file and by line) and the process' RSS to OUT.

For fleet_tuning.py --trace-memory: where the operator's memory per object goes (the Python heap; what is not in it,
RSS minus the traced total, is native: the interpreter, C extensions, thread stacks and the allocator's free lists).
"""

from __future__ import annotations

import signal
import sys
import time
import tracemalloc
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FRAMES = 6  # enough to see which handler or library holds an allocation


def _rss_mib() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def dump(out: Path) -> None:
    snap = tracemalloc.take_snapshot()
    traced, peak = tracemalloc.get_traced_memory()
    lines = [f"== {time.strftime('%H:%M:%S')} RSS {_rss_mib():.1f} MiB, traced {traced / 2**20:.1f} MiB "
             f"(peak {peak / 2**20:.1f})"]  # fmt: skip
    for key in ("filename", "lineno"):
        lines.append(f"-- by {key}")
        for stat in snap.statistics(key)[:30]:
            lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} {stat.traceback}")
    lines.append("-- by traceback")
    for stat in snap.statistics("traceback")[:12]:
        lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d}")
        lines += [f"      {f}" for f in stat.traceback.format()]
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    out = Path(sys.argv[1])
    tracemalloc.start(FRAMES)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        dump(out)

    signal.signal(signal.SIGUSR1, on_signal)
    from devkit.operator import main as operator_main

    return operator_main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
