"""`python bench/scale/traced_operator.py OUT ARGS`: `python -m devkit.operator ARGS`; each SIGUSR1 appends a census of
the process' memory to OUT: RSS, the live Python objects by type (count and shallow size, from the garbage collector's
lists), pymalloc's arenas, and the threads. With TRACEMALLOC_FRAMES=n in the environment, tracemalloc runs from the
start and the census adds the heap's largest allocation sites (slow: the operator runs several times slower).

For fleet_tuning.py --trace-memory: where the operator's memory per object goes. RSS minus what the Python objects
hold is native: the interpreter, C extensions, thread stacks, and the allocators' free lists.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import sys
import threading
import time
import tracemalloc
from collections import Counter
from contextlib import redirect_stderr
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _rss_mib() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def census() -> list[str]:
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        counts[kind] += 1
        sizes[kind] += sys.getsizeof(obj)
    lines = [f"-- gc-tracked objects: {sum(counts.values())}, shallow {sum(sizes.values()) / 2**20:.1f} MiB"]
    lines += [f"{sizes[k] / 2**20:8.2f} MiB {counts[k]:8d} {k}" for k, _ in sizes.most_common(40)]
    err = io.StringIO()
    with redirect_stderr(err):
        sys._debugmallocstats()
    lines.append("-- pymalloc")
    lines += [x for x in err.getvalue().splitlines() if "arenas" in x or x.startswith("Total")]
    return lines


def dump(out: Path) -> None:
    lines = [f"== {time.strftime('%H:%M:%S')} RSS {_rss_mib():.1f} MiB, threads {threading.active_count()}"]
    if tracemalloc.is_tracing():
        traced, peak = tracemalloc.get_traced_memory()
        lines.append(f"-- tracemalloc: traced {traced / 2**20:.1f} MiB (peak {peak / 2**20:.1f})")
        snap = tracemalloc.take_snapshot()
        lines += [f"{s.size / 2**20:8.2f} MiB {s.count:8d} {s.traceback}" for s in snap.statistics("lineno")[:40]]
    lines += census()
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    out = Path(sys.argv[1])
    frames = int(os.environ.get("TRACEMALLOC_FRAMES", "0"))
    if frames:
        tracemalloc.start(frames)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        dump(out)

    signal.signal(signal.SIGUSR1, on_signal)
    from devkit.operator import main as operator_main

    return operator_main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
