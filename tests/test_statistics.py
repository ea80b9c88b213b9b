import numpy as np
import pytest

from recshard_stats.distributions import (
    CountOfCounts,
    access_cdf,
    breakpoint_rows,
    expected_unique_rows,
    pooling_stats,
)


def test_pooling_stats_against_numpy():
    rng = np.random.default_rng(1)
    pf = rng.integers(0, 50, 5000)
    values, counts = np.unique(pf, return_counts=True)
    s = pooling_stats(values, counts)
    present = pf[pf > 0]
    assert s.num_samples == 5000 and s.present_samples == len(present)
    assert s.mean == pytest.approx(pf.mean()) and s.mean_present == pytest.approx(present.mean())
    for q, got in ((50, s.p50), (90, s.p90), (99, s.p99)):
        assert got == np.percentile(present, q, method="inverted_cdf")
    assert (s.min, s.max) == (present.min(), present.max())


def test_expected_unique_rows():
    assert expected_unique_rows(10, 0) == 0
    assert expected_unique_rows(1, 5) == 1
    assert expected_unique_rows(100, 1) == pytest.approx(1.0)
    h, n = 10**7, 10**7
    assert expected_unique_rows(h, n) == pytest.approx(h * (1 - np.exp(-1)), rel=1e-6)


def test_cdf_from_count_of_counts_equals_sorting_rows():
    rng = np.random.default_rng(2)
    row_counts = rng.zipf(1.3, 20000) % 5000 + 1
    counts, rows = np.unique(row_counts, return_counts=True)
    coc = CountOfCounts.of(counts, rows)
    ordered = np.sort(row_counts)[::-1]
    cum = np.cumsum(ordered) / ordered.sum()
    for k in (1, 2, 17, 1000, 19999, 20000, 50000):
        assert coc.cdf(k) == pytest.approx(cum[min(k, 20000) - 1])
    points, fractions = access_cdf(coc, 100)
    assert points[0] == 1 and points[-1] == 20000 and len(points) <= 100
    assert np.all(np.diff(fractions) >= 0) and fractions[-1] == pytest.approx(1.0)


def test_breakpoints_are_log_spaced():
    pts = breakpoint_rows(10**6, 100)
    assert pts[0] == 1 and pts[-1] == 10**6 and np.all(np.diff(pts) > 0)
    assert (pts < 1000).sum() > 30  # the hot head is resolved
    assert breakpoint_rows(1, 100).tolist() == [1]
