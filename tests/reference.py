"""Independent statistics in plain numpy/pandas, straight from the definitions in docs/design.md,
to check the Spark job against (shares only the documented hash functions with it)."""

from __future__ import annotations

import collections

import numpy as np


def feature_reference(samples: list, hash_size: int) -> dict:
    """samples: per sample, a list of 64-bit keys (empty = absent)."""
    pf = np.array([len(s) for s in samples])
    present = pf[pf > 0]
    keys = [k for s in samples for k in s]
    rows = collections.Counter(int(k) % hash_size for k in keys)  # Python's % is a pmod
    n = len(samples)
    out = {
        "num_samples": n,
        "present_samples": int((pf > 0).sum()),
        "coverage": float((pf > 0).mean()),
        "pf_mean": float(pf.mean()),
        "pf_mean_present": float(present.mean()) if len(present) else 0.0,
        "pf_min": int(present.min()) if len(present) else 0,
        "pf_max": int(present.max()) if len(present) else 0,
        "total_accesses": len(keys),
        "unique_raw_ids": len(set(keys)),
        "unique_rows": len(rows),
        "unused_rows": hash_size - len(rows),
        "count_of_counts": dict(collections.Counter(rows.values())),
        "pooling_histogram": dict(collections.Counter(pf.tolist())),
        "row_counts": dict(rows),
    }
    for q, name in ((50, "pf_p50"), (90, "pf_p90"), (99, "pf_p99")):
        out[name] = int(np.percentile(present, q, method="inverted_cdf")) if len(present) else 0
    u = len(set(keys))
    out["expected_unique_rows"] = hash_size * (1 - (1 - 1 / hash_size) ** u) if u else 0.0
    return out


def cdf_at(row_counts: dict, k: int) -> float:
    """Share of accesses hitting the k hottest rows, by sorting every row (what the CDF means)."""
    counts = np.sort(np.array(list(row_counts.values())))[::-1]
    return float(counts[:k].sum() / counts.sum())
