"""The operator gives memory it freed back to the OS (`tailtune.operator.allocator`)."""

from __future__ import annotations

import pytest

from tailtune.operator.allocator import _libc_trim, trim

BLOCK = 64 * 1024  # below glibc's mmap threshold (128 KiB): the block lives in the heap, where freeing keeps it


@pytest.mark.skipif(_libc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_freed_memory_in_the_middle_of_the_heap_goes_back_to_the_os() -> None:
    """Caught: memory freed between blocks still in use stays resident (the fleet's creation left hundreds of MiB so
    at 300 objects); the allocator returns on its own only what is freed at the top of its heap."""
    blocks = [bytearray(BLOCK) for _ in range(1024)]  # 64 MiB, written (resident)
    kept = blocks[1::2]
    del blocks  # every other block freed: 32 MiB of holes between the kept ones
    before, after, took = trim()
    assert before is not None and after is not None
    assert before - after >= 16 * 2**20, (before, after)
    assert took < 1.0
    assert len(kept) == 512
