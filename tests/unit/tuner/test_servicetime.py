"""The measured service-time curve t(b): interpolation, pessimism past the data, live learning, merging."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tailtune.tuner.servicetime import (
    MAX_LIVE_POINTS,
    MEMORY_SAMPLES,
    MIN_LIVE_SAMPLES,
    BatchSample,
    Curve,
    CurvePoint,
    ladder,
    learn,
    merged,
)
from tests.sampling import cases

CASES = cases(300)


def _random_points(rng: np.random.Generator) -> list[CurvePoint]:
    """A strictly increasing curve over a random set of sizes."""
    sizes = sorted({int(s) for s in rng.integers(1, 129, int(rng.integers(2, 9)))})
    if len(sizes) < 2:
        sizes = [sizes[0], sizes[0] + 1]
    a, c, p = rng.uniform(0.5, 10), rng.uniform(0.05, 2), rng.uniform(0.6, 1.8)
    return [CurvePoint(batch=b, ms=float(a + c * b**p), source="build") for b in sizes]


def test_interpolates_linearly_between_points() -> None:
    rng = np.random.default_rng(1)
    for _ in range(CASES):
        pts = _random_points(rng)
        curve = Curve(pts)
        k = int(rng.integers(1, len(pts)))
        lo, hi = pts[k - 1], pts[k]
        w = float(rng.uniform(0, 1))
        b = lo.batch + w * (hi.batch - lo.batch)
        est = curve.estimate(b)
        assert est.ms == pytest.approx(lo.ms + w * (hi.ms - lo.ms), rel=1e-9)
        assert not est.extrapolated
        # At a measured size: exactly the measured time.
        assert curve.ms(hi.batch) == pytest.approx(hi.ms)


def test_flat_below_the_first_point() -> None:
    rng = np.random.default_rng(2)
    for _ in range(CASES):
        pts = _random_points(rng)
        curve = Curve(pts)
        b = float(rng.uniform(0, pts[0].batch))
        est = curve.estimate(b)
        assert est.ms == pytest.approx(pts[0].ms) and not est.extrapolated


def test_past_the_last_point_flagged_and_proportional() -> None:
    rng = np.random.default_rng(3)
    for _ in range(CASES):
        pts = _random_points(rng)
        curve = Curve(pts)
        last = pts[-1]
        b = last.batch * float(rng.uniform(1.001, 8))
        est = curve.estimate(b)
        assert est.extrapolated
        # No further batching gain: time per request stays that of the largest measured size.
        assert est.ms == pytest.approx(last.ms * b / last.batch)
        assert est.ms / b >= last.ms / last.batch * (1 - 1e-9)
        assert curve.largest == last.batch


def test_monotone_even_with_a_noisy_dip() -> None:
    rng = np.random.default_rng(4)
    for _ in range(CASES):
        pts = _random_points(rng)
        if len(pts) < 3:
            continue
        k = int(rng.integers(1, len(pts)))
        # A measurement at size k faster than the one below it (noise): the curve must not dip.
        dipped = pts[k].model_copy(update={"ms": pts[k - 1].ms * float(rng.uniform(0.3, 0.99))})
        pts[k] = dipped
        rng.shuffle(pts)  # type: ignore[arg-type]
        curve = Curve(pts)
        grid = np.linspace(0.5, curve.largest * 3, 200)
        times = [curve.ms(float(b)) for b in grid]
        assert all(t2 >= t1 - 1e-12 for t1, t2 in itertools.pairwise(times))


def test_no_data_raises() -> None:
    curve = Curve([])
    assert not curve and curve.largest == 0
    with pytest.raises(ValueError):
        curve.estimate(1)


def test_learn_merges_sample_weighted() -> None:
    rng = np.random.default_rng(5)
    for _ in range(CASES):
        b = int(rng.integers(1, 64))
        n1, n2 = int(rng.integers(1, MEMORY_SAMPLES // 2)), int(rng.integers(1, MEMORY_SAMPLES // 2))
        m1, m2 = float(rng.uniform(1, 50)), float(rng.uniform(1, 50))
        first = learn((), [BatchSample(batch=b, count=n1, ms=m1)])
        assert first == (CurvePoint(batch=b, ms=m1, samples=n1, source="live"),)
        (pt,) = learn(first, [BatchSample(batch=b, count=n2, ms=m2)])
        kept = min(n1, MEMORY_SAMPLES - n2)
        assert pt.ms == pytest.approx((m1 * kept + m2 * n2) / (kept + n2))
        assert min(m1, m2) - 1e-9 <= pt.ms <= max(m1, m2) + 1e-9
        assert pt.samples == min(kept + n2, MEMORY_SAMPLES)
        if n1 + n2 <= MEMORY_SAMPLES:
            # Within memory: the plain sample-weighted mean.
            assert pt.ms == pytest.approx((m1 * n1 + m2 * n2) / (n1 + n2))


def test_learn_ignores_zero_counts_and_bad_samples() -> None:
    rng = np.random.default_rng(6)
    for _ in range(CASES):
        b = int(rng.integers(1, 64))
        base = learn((), [BatchSample(batch=b, count=int(rng.integers(1, 100)), ms=float(rng.uniform(1, 9)))])
        junk = [
            BatchSample(batch=b, count=0, ms=float(rng.uniform(1, 100))),
            BatchSample(batch=b + 1, count=0, ms=5.0),
            BatchSample(batch=b, count=-3, ms=5.0),
            BatchSample(batch=b, count=10, ms=0.0),
            BatchSample(batch=0, count=10, ms=5.0),
        ]
        assert learn(base, junk) == base


def test_learn_keeps_sizes_sorted_and_drops_build_points() -> None:
    build = CurvePoint(batch=3, ms=9.0, samples=1, source="build")
    out = learn((build,), [BatchSample(batch=8, count=4, ms=6.0), BatchSample(batch=2, count=4, ms=3.0)])
    assert [p.batch for p in out] == [2, 8] and all(p.source == "live" for p in out)


def test_learn_memory_bounded_and_follows_drift() -> None:
    pts: tuple[CurvePoint, ...] = learn((), [BatchSample(batch=4, count=MEMORY_SAMPLES, ms=10.0)])
    for _ in range(20):
        pts = learn(pts, [BatchSample(batch=4, count=100, ms=20.0)])
        assert pts[0].samples <= MEMORY_SAMPLES
    # The device slowed down: the old figure fades.
    assert pts[0].ms > 19.0


def test_learn_keeps_at_most_max_live_points_and_this_reads_sizes_first() -> None:
    """An engine of max batch 4096 executes thousands of sizes; the tuner's state (an annotation, 256 KiB in all)
    keeps at most MAX_LIVE_POINTS of them, and a load that moves to new sizes is learned at once."""
    old = learn((), [BatchSample(batch=b, count=MEMORY_SAMPLES, ms=1.0 + b) for b in range(1, 2000)])
    assert len(old) == MAX_LIVE_POINTS
    assert [p.batch for p in old] == sorted(p.batch for p in old)
    rng = np.random.default_rng(8)
    for _ in range(20):
        sizes = sorted({int(x) for x in rng.integers(2000, 4097, size=int(rng.integers(1, 2 * MAX_LIVE_POINTS)))})
        read = [BatchSample(batch=b, count=int(rng.integers(1, 4)), ms=2.0 + b) for b in sizes]
        new = learn(old, read)
        assert len(new) <= MAX_LIVE_POINTS
        kept = {p.batch for p in new}
        # Every size of this read is kept while they fit; past the bound, the most executed of them.
        if len(sizes) <= MAX_LIVE_POINTS:
            assert set(sizes) <= kept
        else:
            assert kept <= set(sizes)
            counts = {s.batch: s.count for s in read}
            assert min(counts[b] for b in kept) >= max(counts[b] for b in set(sizes) - kept)


def test_merged_live_replaces_build_with_enough_samples() -> None:
    rng = np.random.default_rng(7)
    for _ in range(CASES):
        build = _random_points(rng)
        live = []
        for p in build:
            if rng.uniform() < 0.6:
                ms, n = p.ms * float(rng.uniform(0.5, 2)), int(rng.integers(0, 12))
                live.append(CurvePoint(batch=p.batch, ms=ms, samples=n))
        extra = int(rng.integers(1, 200))
        if extra not in {p.batch for p in build}:
            live.append(CurvePoint(batch=extra, ms=3.0, samples=int(rng.integers(0, 3))))
        out = {p.batch: p for p in merged(build, live)}
        assert list(out) == sorted(out)
        live_by = {p.batch: p for p in live}
        for b, p in out.items():
            lp = live_by.get(b)
            from_build = next((q for q in build if q.batch == b), None)
            if lp is not None and (lp.samples >= MIN_LIVE_SAMPLES or from_build is None):
                assert p.source == "live" and p.ms == lp.ms
            else:
                assert from_build is not None
                assert p.source == "build" and p.ms == from_build.ms
        assert set(out) == {p.batch for p in build} | set(live_by)


@pytest.mark.parametrize(
    ("top", "expected"),
    [(64, (1, 2, 4, 8, 16, 32, 64)), (1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (48, (1, 2, 4, 8, 16, 32, 48))],
)
def test_ladder(top: int, expected: tuple[int, ...]) -> None:
    assert ladder(top) == expected


def test_ladder_family() -> None:
    for top in range(1, 300):
        sizes = ladder(top)
        assert sizes[-1] == top and sizes[0] == 1
        assert list(sizes) == sorted(set(sizes))
        assert all(b & (b - 1) == 0 for b in sizes[:-1])
