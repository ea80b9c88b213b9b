"""Exact statistics from the small aggregates the Spark job collects (numpy only).

The job never brings per-row data to the driver: it collects pooling-factor histograms
and count-of-counts tables (access count -> rows with that count), whose size depends on
the number of distinct values, not on the number of samples. Everything else is derived
here, and the solver reuses the same functions to rebuild CDFs at any resolution.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import numpy as np


class HitEstimate(enum.Enum):
    """How the plan predicts the accesses of new data to a row the profile counted."""

    HELD_OUT = "held_out"  # Good-Turing: what a sample not used to rank the rows would see
    IN_SAMPLE = "in_sample"  # the profiled counts: rows scored on the data that ranked them


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


def _increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, members]
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            top = blocks.pop()
            below = blocks[-1]
            total = below[1] + top[1]
            below[0] = (below[0] * below[1] + top[0] * top[1]) / total if total else top[0]
            below[1], below[2] = total, below[2] + top[2]
    return np.repeat([b[0] for b in blocks], [int(b[2]) for b in blocks]).astype(np.float64)


def good_turing_values(coc: CountOfCounts, hash_size: int) -> tuple[np.ndarray, float]:
    """Expected accesses in a new sample of the profile's size, of a row the profile saw r times
    (one value per class of ``coc``, hottest first) and of a row it never saw.

    A row's count in the sample that ranked it is optimistic for the hot end (rows seen twice by
    chance rank above rows seen once) and says nothing of never-seen rows; the held-out value is
    Gale and Sampson's Simple Good-Turing ``r*``: Turing's ``(r+1) N_{r+1} / N_r`` (the accesses
    that rows seen r+1 times would lose if one access were left out, which is what a held-out
    access of a row seen r times looks like) while it differs significantly from the smoothed
    ``r (1 + 1/r)^(b+1)`` of a line fitted to log N_r against log r, the smoothed one from there
    on. Never-seen rows share Good-Turing's new mass ``N_1`` (rows seen once) evenly; the seen
    values are scaled so the total stays the profile's accesses; values are made non-decreasing
    in r (never-seen rows lowest), so the top-k sum stays concave in k."""
    total = coc.total_accesses
    if total == 0:
        return np.zeros(len(coc.counts)), 0.0
    r = coc.counts[::-1].astype(np.float64)  # ascending
    n = coc.rows[::-1].astype(np.float64)
    rows_of = dict(zip(r.tolist(), n.tolist(), strict=True))
    if len(r) > 1:
        before = np.concatenate([[0.0], r[:-1]])
        after = np.concatenate([r[1:], [2 * r[-1] - before[-1]]])
        slope = float(np.polyfit(np.log(r), np.log(n / (0.5 * (after - before))), 1)[0])
    else:
        slope = -2.0  # one class: nothing to fit; r* = r^2 / (r + 1), Zipf's law
    star = np.empty_like(r)
    turing = True
    for i, (ri, ni) in enumerate(zip(r.tolist(), n.tolist(), strict=True)):
        smoothed = ri * (1.0 + 1.0 / ri) ** (slope + 1.0)
        above = rows_of.get(ri + 1.0, 0.0)
        if turing and above > 0:
            x = (ri + 1.0) * above / ni
            spread = 1.96 * math.sqrt((ri + 1.0) ** 2 * above / ni**2 * (1.0 + above / ni))
            if abs(x - smoothed) > spread:
                star[i] = x
                continue
        turing = False
        star[i] = smoothed
    unseen_rows = max(hash_size - coc.unique_rows, 0)
    new_mass = float(rows_of.get(1.0, 0.0)) if unseen_rows else 0.0
    seen_mass = float((star * n).sum())
    star *= (total - new_mass) / seen_mass if seen_mass > 0 else 0.0
    unseen_value = new_mass / unseen_rows if unseen_rows else 0.0
    fitted = _increasing(np.concatenate([[unseen_value], star]), np.concatenate([[unseen_rows], n]))
    return fitted[1:][::-1].copy(), float(fitted[0])
