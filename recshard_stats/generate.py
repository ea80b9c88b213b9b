"""Synthetic training logs with the shape RecShard is about, written as Parquet in parallel chunks.

The spec is a model config whose features carry a ``synthetic`` block::

    - {name: f07, type: array<int64>,
       synthetic: {coverage: 0.3, pf_mean: 10, pf_max: 200, cardinality: 2000000, zipf: 1.1}}

Per feature: a sample has the feature with probability ``coverage``; a present multi-hot
feature has ``min(Geometric(1/pf_mean), pf_max)`` ids (single-hot: one); ids are drawn
from a bounded power law over ``cardinality`` ranks with exponent ``zipf`` (inverse-CDF of
the continuous law, so memory does not grow with cardinality) and scrambled into
64-bit-looking raw ids. Chunk ``i`` uses the generator ``default_rng([seed, i])``, so the
output depends only on (spec, samples, seed, chunk size, drift), not on the number of processes.

A drifting series (:class:`~recshard_stats.options.SyntheticDrift`): day N shifts each feature's
rank -> id map by N * ``hot_rotation`` of its cardinality (yesterday's colder ids become hot),
sends ``new_ids`` of its draws to ids of day N's own, moves coverage by N * ``coverage_trend``
and scales the mean pooling factor by (1 + ``pooling_shift``) ** N. Day 0, or no drift, is the
spec as written, draw for draw.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recshard_stats.atomic import building_dir
from recshard_stats.config import ModelConfig, parse_model_config, read_config_file
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import SyntheticDrift

log = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 250_000
_SCRAMBLE = np.uint64(0x9E3779B97F4A7C15)  # odd, so rank -> id is a bijection mod 2^63


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    name: str
    type: str
    coverage: float
    pf_mean: float
    pf_max: int
    cardinality: int
    zipf: float


def load_spec(path) -> tuple[ModelConfig, list[FeatureSpec]]:
    data = read_config_file(path)
    model = parse_model_config(data, source=str(path))
    specs = []
    for entry in data["features"]:
        where = f"{path}: feature {entry['name']!r}"
        syn = entry.get("synthetic")
        if not isinstance(syn, dict):
            raise RecShardError(
                Reason.CONFIG_INVALID,
                f"{where} has no 'synthetic' block",
                fixes=("add synthetic: {coverage, pf_mean, pf_max, cardinality, zipf}",),
            )
        multi = entry["type"].startswith("array<")
        try:
            spec = FeatureSpec(
                entry["name"],
                entry["type"],
                float(syn["coverage"]),
                float(syn.get("pf_mean", 1)) if multi else 1.0,
                int(syn.get("pf_max", 1)) if multi else 1,
                int(syn["cardinality"]),
                float(syn.get("zipf", 1.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecShardError(Reason.CONFIG_INVALID, f"{where}: bad synthetic block ({exc})") from None
        if not (
            0 <= spec.coverage <= 1
            and spec.pf_mean >= 1
            and spec.pf_max >= 1
            and spec.cardinality >= 1
            and spec.zipf > 0
        ):
            raise RecShardError(
                Reason.CONFIG_INVALID,
                f"{where}: need 0<=coverage<=1, pf_mean>=1, pf_max>=1, cardinality>=1, zipf>0",
            )
        specs.append(spec)
    return model, specs


def zipf_ranks(rng: np.random.Generator, n: int, cardinality: int, exponent: float) -> np.ndarray:
    """Ranks in [1, cardinality], P(rank >= x) following a bounded power law with this exponent."""
    u = rng.random(n)
    if abs(exponent - 1.0) < 1e-9:
        x = np.power(float(cardinality) + 1.0, u)
    else:
        a = 1.0 - exponent
        x = np.power(u * (np.power(cardinality + 1.0, a) - 1.0) + 1.0, 1.0 / a)
    return np.clip(np.floor(x).astype(np.int64), 1, cardinality)


def raw_ids(ranks: np.ndarray, feature_index: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        scrambled = ranks.astype(np.uint64) * _SCRAMBLE + np.uint64(feature_index * 1_000_003)
    return (scrambled & np.uint64((1 << 63) - 1)).astype(np.int64)


def _strings(spec: FeatureSpec, ids: np.ndarray) -> pa.Array:
    """String ids: the feature's name and the raw id (``f03_12345``)."""
    return pc.binary_join_element_wise(f"{spec.name}_", pc.cast(pa.array(ids), pa.string()), "")


def drifted(spec: FeatureSpec, drift: SyntheticDrift) -> FeatureSpec:
    """The feature's coverage and mean pooling factor on the drift's day."""
    day = drift.day
    return dataclasses.replace(
        spec,
        coverage=min(1.0, max(0.0, spec.coverage + day * drift.coverage_trend)),
        pf_mean=max(1.0, spec.pf_mean * (1.0 + drift.pooling_shift) ** day) if spec.pf_mean > 1 else 1.0,
    )


def _draw_ids(
    rng: np.random.Generator, spec: FeatureSpec, index: int, n: int, drift: SyntheticDrift
) -> np.ndarray:
    ranks = zipf_ranks(rng, n, spec.cardinality, spec.zipf)
    shift = round(drift.day * drift.hot_rotation * spec.cardinality) % spec.cardinality
    if shift:
        ranks = (ranks - 1 + shift) % spec.cardinality + 1
    if drift.day and drift.new_ids:
        # ranks past the cardinality, in a block of the day's own: ids no other day draws
        new = rng.random(n) < drift.new_ids
        ranks = np.where(new, ranks + spec.cardinality * drift.day, ranks)
    return raw_ids(ranks, index)


def _column(
    rng: np.random.Generator, spec: FeatureSpec, index: int, rows: int, drift: SyntheticDrift
) -> pa.Array:
    spec = drifted(spec, drift)
    present = rng.random(rows) < spec.coverage
    if not spec.type.startswith("array<"):
        ids = _draw_ids(rng, spec, index, rows, drift)
        if spec.type == "string":
            return pc.if_else(pa.array(present), _strings(spec, ids), pa.scalar(None, pa.string()))
        return pa.array(ids, mask=~present)
    sizes = np.where(present, np.minimum(rng.geometric(1.0 / spec.pf_mean, rows), spec.pf_max), 0)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    ids = _draw_ids(rng, spec, index, int(offsets[-1]), drift)
    values = _strings(spec, ids) if spec.type == "array<string>" else pa.array(ids, pa.int64())
    # Absent multi-hot features are written half as null arrays, half as empty arrays.
    null = ~present & (rng.random(rows) < 0.5)
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(null))


def _write_chunk(args) -> int:
    specs, rows, seed, chunk, directory, drift = args
    rng = np.random.default_rng([seed, chunk])
    table = pa.table({spec.name: _column(rng, spec, i, rows, drift) for i, spec in enumerate(specs)})
    pq.write_table(table, os.path.join(directory, f"part-{chunk:05d}.parquet"), compression="snappy")
    return rows


def generate(
    spec_path,
    out,
    samples: int,
    *,
    seed: int = 0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    processes: int | None = None,
    drift: SyntheticDrift | None = None,
) -> pathlib.Path:
    """Write ``samples`` rows under ``out`` (replaced atomically, with a ``_SUCCESS`` marker);
    ``drift``: which day of a drifting series."""
    if samples <= 0:
        raise RecShardError(Reason.CONFIG_INVALID, f"samples must be positive, got {samples}")
    _, specs = load_spec(spec_path)
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise RecShardError(
            Reason.OUTPUT_INVALID,
            f"--out {out} is a file: generate writes a directory of Parquet "
            f"files (and replaces only a directory)",
            fixes=("give a directory path",),
        )
    with building_dir(out) as tmp:
        jobs = [
            (specs, min(chunk_rows, samples - start), seed, i, str(tmp), drift or SyntheticDrift())
            for i, start in enumerate(range(0, samples, chunk_rows))
        ]
        processes = processes or min(len(jobs), os.cpu_count() or 1)
        done = 0
        pool = None if processes == 1 else multiprocessing.get_context("spawn").Pool(processes)
        try:
            for rows in pool.imap_unordered(_write_chunk, jobs) if pool else map(_write_chunk, jobs):
                done += rows
                log.info("generated %d / %d samples", done, samples)
        finally:
            if pool:
                pool.close()
                pool.join()
        (tmp / "_SUCCESS").write_text("")
    return out
