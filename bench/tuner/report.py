"""What bench/tuner's generated-family reports share: running a family, the fleet's percentile on a fine grid and
the recovery read from it, markdown tables, the worst-first listing, writing the report, and PNG panels of two runs
(off / on) of each scenario side by side.

Used by shedding.py, surge.py, predictive.py and novel.py; each keeps its own scenarios, figures and targets.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tailtune.offline.whatif import Run, Setup

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

S = TypeVar("S")
R = TypeVar("R")
SLOT_S = 5.0  # the grid a fleet percentile is read on: finer than the tuner's windows, to time a recovery
OFF_ON = (("off", "C0"), ("on", "C1"))  # the two runs of a scenario and their colors in every panel


def run_family(measure: Callable[[S], R], family: Sequence[S], jobs: int) -> list[R]:
    """`measure` over the family, in `jobs` processes (in this one when 1), in the family's order."""
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(measure, family))
    return [measure(sc) for sc in family]


def family_parser(doc: str | None, count: int, seed: int, count_help: str = "") -> argparse.ArgumentParser:
    """The command line every family benchmark takes: --count, --seed, --jobs (the caller may add more)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=count, help=f"scenarios (default {count}{count_help})")
    ap.add_argument("--seed", type=int, default=seed, help=f"family seed (default {seed})")
    ap.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    return ap


def fmt_s(x: float) -> str:
    """Seconds, whole; "never" for an infinite time."""
    return "never" if math.isinf(x) else f"{x:.0f}"


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines from cells already formatted (padding included)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def worst_first(rows: Sequence[dict[str, Any]], badness: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """The rows ordered worst first: the greatest `badness` first (ties keep the family's order)."""
    return sorted(rows, key=badness, reverse=True)


def named(rows: Iterable[dict[str, Any]]) -> str:
    """The rows' scenario names, comma-separated ("none" for none)."""
    return ", ".join(r["name"] for r in rows) or "none"


def slot_percentile(run: Run, setup: Setup, answered_only: bool, slot_s: float = SLOT_S) -> np.ndarray:
    """Per `slot_s` of arrivals: the setup's percentile (ms) of the latencies (nan: no request in the slot).
    `answered_only`: of the requests answered (a rejected or lost one is left out); else of every request, one never
    answered counting as late (inf), so a queue left at the trace's end never reads as a recovery."""
    n = math.ceil(setup.end_s / slot_s)
    keep = np.isfinite(run.latency) if answered_only else np.ones(len(run.latency), dtype=bool)
    slot = np.minimum((run.arrivals[keep] // slot_s).astype(np.int64), n - 1)
    lat = run.latency[keep]
    bounds = np.searchsorted(slot, np.arange(n + 1), side="left")  # arrivals are in order
    out = np.full(n, np.nan)
    for s in range(n):
        if bounds[s + 1] > bounds[s]:
            out[s] = float(np.percentile(lat[bounds[s] : bounds[s + 1]], setup.percentile, method="higher")) * 1000
    return out


def recovery_s(p: np.ndarray, slo_ms: float, since: float, slot_s: float = SLOT_S) -> float:
    """Seconds from `since` until the slotted percentile `p` stays within the SLO (a slot with nothing answered
    counts as missed); inf when the last slot still misses it."""
    first = int(since // slot_s)
    missed = [s for s in range(first, len(p)) if not (p[s] <= slo_ms)]
    if not missed:
        return 0.0
    if missed[-1] == len(p) - 1:
        return math.inf
    return (missed[-1] + 1) * slot_s - since


def write_report(out: Path, lines: Sequence[str], rows: Any, extra: str = "") -> None:
    """Print the report, write it as out/report.md and the rows as out/results.json; `extra` names the PNGs the
    caller writes beside them."""
    print("\n".join(lines))
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"wrote {out / 'report.md'}, results.json{', ' + extra if extra else ''}")


def figure(nrows: int, ncols: int, figsize: tuple[float, float]) -> tuple[Figure, Any]:
    """A figure of panels (matplotlib without a display), axes indexed [row][column] (a 1-row figure: [column])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=figsize)


def save(fig: Figure, path: Path) -> None:
    """Lay the panels out, write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def off_on_percentile(ax: Axes, row: dict[str, Any], what: str, slot_s: float = SLOT_S) -> None:
    """One scenario's slotted percentile (row[label]["p99_slots"]) with `what` off and on, against its SLO, on a log
    axis; the caller adds its markers, labels and legend."""
    for label, color in OFF_ON:
        p = [np.nan if x is None else x for x in row[label]["p99_slots"]]
        ax.plot([(i + 1) * slot_s for i in range(len(p))], p, color=color, label=f"{what}{label}")
    ax.axhline(row["slo_ms"], color="black", linestyle="--", label="SLO")
    ax.set_yscale("log")


def off_on_bars(ax: Axes, rows: Sequence[dict[str, Any]], value: Callable[[dict[str, Any]], float], what: str) -> None:
    """Per scenario (ticks: the names' first two characters, their number), value(row[label]) off and on side by
    side; the caller adds its target line, labels and legend."""
    idx = np.arange(len(rows))
    for k, (label, color) in enumerate(OFF_ON):
        ax.bar(idx + 0.4 * k, [value(r[label]) for r in rows], 0.4, color=color, label=f"{what}{label}")
    ax.set_xticks(idx + 0.2, [r["name"][:2] for r in rows])
