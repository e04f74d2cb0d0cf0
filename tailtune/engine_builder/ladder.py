"""The batch sizes a build times its engine at. Stdlib only: the builder reports them, the tuner plans on them."""

from __future__ import annotations


def ladder(max_batch: int) -> tuple[int, ...]:
    """The batch sizes timed: powers of two up to the profile's max, and the max itself."""
    sizes = []
    b = 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max(1, max_batch))
    return tuple(sizes)
