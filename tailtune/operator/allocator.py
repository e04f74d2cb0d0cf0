"""Memory the operator freed, given back to the OS.

glibc's malloc keeps what a thread frees in that thread's arena for reuse: after the operator's busiest moment (a
fleet created or re-listed at once: every body decoded, reconciles in flight on the API client's threads) most of that
memory is free but still resident, and stays so while nothing reuses it. `malloc_trim(0)` returns the free pages of
every arena to the OS. The operator calls it every TRIM_SECONDS from the event loop; where the C library is not glibc
(no `malloc_trim`) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# How often: a trim walks every arena (a few ms on a heap of a few hundred MiB on one core), so once a minute keeps
# it far below a thousandth of a core, and resident memory follows a fleet's shrinking within a minute.
TRIM_SECONDS = 60.0
# A trim that gave back less than this is not worth a log line (at rest each one returns little).
LOG_RELEASED_BYTES = 16 * 2**20


def _libc_trim() -> Any | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def resident_bytes() -> int | None:
    """The process' resident set (VmRSS), None where /proc does not say."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def trim() -> tuple[int | None, int | None, float]:
    """Give the free pages back: (RSS before, RSS after, seconds the call took); RSS None where unknown, nothing done
    where there is no malloc_trim."""
    fn = _libc_trim()
    before = resident_bytes()
    started = time.monotonic()
    if fn is not None:
        fn(0)
    return before, resident_bytes(), time.monotonic() - started


async def trim_forever(seconds: float = TRIM_SECONDS) -> None:
    """Trim every `seconds` until cancelled (the operator exiting)."""
    if _libc_trim() is None:
        log.info("no malloc_trim in this C library: freed memory is left to the allocator")
        return
    while True:
        await asyncio.sleep(seconds)
        before, after, took = trim()
        if before is not None and after is not None and before - after >= LOG_RELEASED_BYTES:
            log.info(
                "allocator: %.0f MiB of freed memory returned to the OS (RSS %.0f -> %.0f MiB, %.0f ms)",
                (before - after) / 2**20, before / 2**20, after / 2**20, 1000 * took,
            )  # fmt: skip
