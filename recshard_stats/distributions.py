"""Exact statistics from the small aggregates the Spark job collects (numpy only).

The job never brings per-row data to the driver: it collects pooling-factor histograms
and count-of-counts tables (access count -> rows with that count), whose size depends on
the number of distinct values, not on the number of samples. Everything else is derived
here, and the solver reuses the same functions to rebuild CDFs at any resolution.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class PoolingStats:
    num_samples: int
    present_samples: int
    coverage: float
    mean: float
    mean_present: float
    min: int
    max: int
    p50: int
    p90: int
    p99: int


def pooling_stats(pooling_factor: np.ndarray, samples: np.ndarray) -> PoolingStats:
    """From the histogram pooling_factor -> samples (pf 0 = feature absent).

    min / max / percentiles are over samples where the feature is present (pf >= 1),
    nearest-rank: the smallest pf whose cumulative share reaches q; 0 when never present.
    """
    pf = np.asarray(pooling_factor, dtype=np.int64)
    n = np.asarray(samples, dtype=np.int64)
    total = int(n.sum())
    present = pf > 0
    pf_p, n_p = pf[present], n[present]
    order = np.argsort(pf_p)
    pf_p, n_p = pf_p[order], n_p[order]
    n_present = int(n_p.sum())
    ids = int((pf_p * n_p).sum())

    def pct(q: float) -> int:
        if n_present == 0:
            return 0
        idx = np.searchsorted(np.cumsum(n_p), math.ceil(q * n_present - 1e-9))
        return int(pf_p[min(int(idx), len(pf_p) - 1)])

    return PoolingStats(
        num_samples=total,
        present_samples=n_present,
        coverage=n_present / total if total else 0.0,
        mean=ids / total if total else 0.0,
        mean_present=ids / n_present if n_present else 0.0,
        min=int(pf_p[0]) if n_present else 0,
        max=int(pf_p[-1]) if n_present else 0,
        p50=pct(0.5),
        p90=pct(0.9),
        p99=pct(0.99),
    )


def expected_unique_rows(hash_size: int, unique_ids: int) -> float:
    """Birthday paradox: expected distinct rows when n distinct ids hash uniformly into H rows,
    ``H * (1 - (1 - 1/H)^n)``, computed without cancellation for large H."""
    if unique_ids == 0:
        return 0.0
    if hash_size == 1:
        return 1.0
    return -hash_size * math.expm1(unique_ids * math.log1p(-1.0 / hash_size))


@dataclasses.dataclass(frozen=True)
class CountOfCounts:
    """Rows grouped by access count, hottest first: ``rows[i]`` rows were accessed ``counts[i]`` times."""

    counts: np.ndarray
    rows: np.ndarray

    @classmethod
    def of(cls, counts, rows) -> CountOfCounts:
        counts = np.asarray(counts, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        keep = (counts > 0) & (rows > 0)
        order = np.argsort(-counts[keep], kind="stable")
        return cls(counts[keep][order], rows[keep][order])

    @property
    def unique_rows(self) -> int:
        return int(self.rows.sum())

    @property
    def total_accesses(self) -> int:
        return int((self.counts * self.rows).sum())

    def top_accesses(self, k) -> np.ndarray:
        """Accesses that hit the k hottest rows (exact, k may be fractional or an array)."""
        return self.top_sum(k, self.counts)

    def top_sum(self, k, per_row) -> np.ndarray:
        """The sum of ``per_row`` (one value per row of each class, hottest class first) over the
        k hottest rows (exact, k may be fractional or an array)."""
        k = np.asarray(k, dtype=np.float64)
        if len(self.counts) == 0:
            return np.zeros_like(k)
        per_row = np.asarray(per_row, dtype=np.float64)
        cum_rows = np.concatenate([[0], np.cumsum(self.rows)])
        cum = np.concatenate([[0.0], np.cumsum(per_row * self.rows)])
        seg = np.clip(np.searchsorted(cum_rows, k, side="right") - 1, 0, len(self.counts) - 1)
        within = np.clip(k - cum_rows[seg], 0, self.rows[seg])
        return np.where(k >= cum_rows[-1], cum[-1], cum[seg] + within * per_row[seg])

    def cdf(self, k) -> np.ndarray:
        total = self.total_accesses
        return self.top_accesses(k) / total if total else np.zeros_like(np.asarray(k, dtype=float))


def breakpoint_rows(unique_rows: int, num_points: int) -> np.ndarray:
    """Row counts log-spaced from 1 to unique_rows (so the hot head is resolved), unique, ending
    exactly at unique_rows; at most num_points of them."""
    if unique_rows <= 0:
        return np.zeros(0, dtype=np.int64)
    pts = np.unique(np.round(np.logspace(0, math.log10(unique_rows), num_points)).astype(np.int64))
    pts = np.unique(np.concatenate([pts[(pts >= 1) & (pts <= unique_rows)], [unique_rows]]))
    return pts


def access_cdf(coc: CountOfCounts, num_points: int) -> tuple[np.ndarray, np.ndarray]:
    rows = breakpoint_rows(coc.unique_rows, num_points)
    return rows, coc.cdf(rows)
