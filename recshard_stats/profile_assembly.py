"""The profile's named state and the assembly of its output rows, in plain Python (no Spark).

The Spark side (:mod:`recshard_stats.profiler`) collects a few small aggregates into a
:class:`CollectedAggregates`; :func:`assemble` turns them, with the model's
:class:`ProfileLayout`, into the rows of every output table (:mod:`recshard_stats.schemas`),
each built with :func:`~recshard_stats.schemas.output_row` so no column can be misspelt.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from recshard_stats.config import ModelConfig
from recshard_stats.distributions import CountOfCounts, access_cdf, expected_unique_rows, pooling_stats
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import SketchOptions
from recshard_stats.record_codes import REJECT_REASONS, is_multi_hot, needs_key_hash, reject_columns
from recshard_stats.schemas import ApproximateMetadata, output_row

MIN_SAMPLED_ROWS = 1 << 16
# a sample with more ids than this, and 100x its feature's p99, is reported as an outlier
OUTLIER_MIN_POOLING = 1000
SAMPLE_BUCKETS = 1 << 20  # a row is sampled when xxhash64(table, row) mod this is below the table's cut


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
    index: int  # position in the model config (column k{index} of the normalized frame)
    name: str
    type: str
    table: int  # index of the table it feeds
    hash_size: int
    hash_ids: bool  # integer ids that xxhash64 turns into keys after aggregation


@dataclasses.dataclass(frozen=True)
class ProfileLayout:
    """Which feature feeds which table, which tables are shared, and each table's row sample."""

    model: ModelConfig
    features: tuple[FeatureLayout, ...]
    shared_tables: frozenset[int]  # tables fed by more than one feature
    sample_bits: tuple[int, ...]  # per table: one row in 2**bits is counted (0: all)

    @classmethod
    def of(cls, model: ModelConfig, sketch: SketchOptions | None = None) -> ProfileLayout:
        table_index = {t.name: j for j, t in enumerate(model.tables)}
        features = []
        for i, f in enumerate(model.features):
            table = model.table_of(f.name)
            features.append(
                FeatureLayout(
                    i,
                    f.name,
                    f.type,
                    table_index[table.name],
                    table.hash_size,
                    needs_key_hash(f.type, table.hash),
                )
            )
        bits = tuple(sample_bits(sketch, t.hash_size) if sketch else 0 for t in model.tables)
        shared = frozenset(j for j, t in enumerate(model.tables) if len(t.features) > 1)
        return cls(model, tuple(features), shared, bits)

    @property
    def feature_table(self) -> tuple[int, ...]:
        return tuple(f.table for f in self.features)

    def features_of(self, table: int) -> list[int]:
        return [f.index for f in self.features if f.table == table]

    def sample_below(self, table: int) -> int:
        """A row of the table is counted when its bucket (of SAMPLE_BUCKETS) is below this."""
        return SAMPLE_BUCKETS >> self.sample_bits[table]


def sample_bits(sketch: SketchOptions, hash_size: int) -> int:
    """A table keeps at least MIN_SAMPLED_ROWS of its rows in the sample (a small one: all)."""
    return max(0, min(sketch.row_sample_bits, math.floor(math.log2(hash_size / MIN_SAMPLED_ROWS))))


def approximate_metadata(sketch: SketchOptions, model: ModelConfig) -> ApproximateMetadata:
    """What the stats metadata records of an approximate profile: the sketch size, the distinct
    counts' error bound and each table's row sample rate."""
    return ApproximateMetadata(
        hll_lg_config_k=sketch.lg_config_k,
        distinct_count_relative_standard_error=sketch.relative_standard_error,
        distinct_count_error_bound_99_7=3 * sketch.relative_standard_error,
        row_sample_bits=sketch.row_sample_bits,
        row_sample_rate={t.name: 2.0 ** -sample_bits(sketch, t.hash_size) for t in model.tables},
    )


# (access count c, rows accessed c times, distinct keys behind those rows) of one feature or table
CountTriples = list[tuple[int, int, int]]


@dataclasses.dataclass(frozen=True)
class SketchedTotals:
    """Approximate mode: a feature's or table's exact accesses, its HLL estimate of distinct ids,
    and of distinct rows (None where every row was counted, so count-of-counts has it exactly)."""

    accesses: int
    distinct_ids: float
    distinct_rows: float | None


@dataclasses.dataclass(frozen=True)
class CollectedAggregates:
    """Everything the Spark side brings to the driver: small, independent of the input size."""

    num_samples: int  # parseable input rows
    bad_rows: int  # unparseable input rows
    pooling: dict[int, dict[int, int]]  # multi-hot feature -> pooling factor -> samples
    rejects: dict[tuple[int, int], int]  # (column, reason index) -> rejected values
    feature_ids: dict[int, int]  # feature -> ids it contributed (exact in both modes)
    feature_coc: dict[int, CountTriples]  # feature -> its count-of-counts
    table_coc: dict[int, CountTriples]  # table -> its count-of-counts
    feature_totals: dict[int, SketchedTotals] | None = None  # approximate mode only
    table_totals: dict[int, SketchedTotals] | None = None

    @property
    def input_rows(self) -> int:
        return self.num_samples + self.bad_rows


def check_rejects(model: ModelConfig, aggregates: CollectedAggregates, limit: float) -> None:
    """No usable sample, no id in any feature, more null ids in one multi-hot column than
    ``limit`` of its ids, or more rejects in one column (or more unparseable rows) than ``limit``
    of the input rows: a clear error with the numbers."""
    input_rows, bad_rows = aggregates.input_rows, aggregates.bad_rows
    if aggregates.num_samples == 0:
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"the input has no usable samples ({input_rows} rows read, {bad_rows} unparseable)",
            fixes=(
                "check the input path and the day's partition",
                "check the input format in the model config",
            ),
        )
    columns = reject_columns(model)
    if not any(aggregates.feature_ids.get(i, 0) for i in range(len(model.features))):
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"none of the {aggregates.num_samples} samples has an id in any of the {len(model.features)} features "
            f"(every value is null or empty)",
            fixes=(
                "check that the feature columns of the model config are the ones the logs fill",
                "check the day's partition",
            ),
        )
    for (column, reason), n in sorted(aggregates.rejects.items()):
        if REJECT_REASONS[reason] != "null_id":
            continue
        ids = n + aggregates.feature_ids.get(column, 0)
        if n / ids > limit:
            raise RecShardError(
                Reason.TOO_MANY_REJECTS,
                f"{n} of the {ids} ids in column {columns[column]!r} are null ({n / ids:.2%}), above the limit of "
                f"{limit:.2%}",
                fixes=(
                    "check how the logs fill that column",
                    "raise --max-reject-fraction if such ids are expected",
                ),
                context={"rejected": n, "ids": ids, "column": columns[column]},
            )
    worst_column, worst = "*", bad_rows
    per_column: dict[int, int] = {}
    for (column, reason), n in aggregates.rejects.items():
        if REJECT_REASONS[reason] != "null_id":
            per_column[column] = per_column.get(column, 0) + n
    for column, n in per_column.items():
        if n > worst:
            worst_column, worst = columns[column], n
    if worst / input_rows > limit:
        what = "unparseable rows" if worst_column == "*" else f"rejected values in column {worst_column!r}"
        raise RecShardError(
            Reason.TOO_MANY_REJECTS,
            f"{worst} {what} out of {input_rows} rows ({worst / input_rows:.2%}), above the limit of {limit:.2%}",
            fixes=(
                "check the input format and the model config's feature types",
                "raise --max-reject-fraction if such rows are expected",
            ),
            context={"rejected": worst, "rows": input_rows, "column": worst_column},
        )


@dataclasses.dataclass(frozen=True)
class _Distribution:
    coc: CountOfCounts
    accesses: int
    distinct_keys: int
    distinct_rows: int


class _Builder:
    def __init__(self, cdf_points: int):
        self.cdf_points = cdf_points
        self.out: dict[str, list[dict]] = {
            name: []
            for name in (
                "features",
                "tables",
                "pooling_histogram",
                "count_of_counts",
                "access_cdf",
                "rejects",
            )
        }

    def distribution(
        self,
        level: str,
        name: str,
        triples: CountTriples,
        totals: SketchedTotals | None,
        approximate: bool,
        hash_size: int,
    ) -> _Distribution:
        """Count-of-counts and access-CDF rows of one feature or table, and its totals."""
        counts, rows, keys = (
            (np.array(v, dtype=np.int64) for v in zip(*triples, strict=True))
            if triples
            else (np.zeros(0, np.int64),) * 3
        )
        coc = CountOfCounts.of(counts, rows)
        self.out["count_of_counts"] += [
            output_row("count_of_counts", level=level, name=name, access_count=int(c), rows=int(r))
            for c, r in zip(coc.counts, coc.rows, strict=True)
        ]
        points, fractions = access_cdf(coc, self.cdf_points)
        self.out["access_cdf"] += [
            output_row("access_cdf", level=level, name=name, point=p, rows=int(k), access_fraction=float(v))
            for p, (k, v) in enumerate(zip(points, fractions, strict=True))
        ]
        if not approximate:
            return _Distribution(coc, coc.total_accesses, int(keys.sum()), coc.unique_rows)
        totals = totals or SketchedTotals(0, 0.0, None)
        ids = round(totals.distinct_ids)
        distinct_rows = coc.unique_rows if totals.distinct_rows is None else round(totals.distinct_rows)
        return _Distribution(coc, totals.accesses, ids, min(distinct_rows, ids, hash_size))


def pooling_outliers(feature_rows: list[dict]) -> dict[str, int]:
    """Features whose largest pooling factor is far beyond their p99 (and above
    :data:`OUTLIER_MIN_POOLING`): feature -> that pooling factor. One such sample can be a
    logging bug, and it weighs on the trainer's buffers."""
    return {
        r["feature"]: int(r["pf_max"])
        for r in feature_rows
        if r["pf_max"] > max(OUTLIER_MIN_POOLING, 100 * r["pf_p99"])
    }


def assemble(
    layout: ProfileLayout, aggregates: CollectedAggregates, cdf_points: int
) -> dict[str, list[dict]]:
    """Rows of every small output table, from the collected aggregates."""
    model, agg = layout.model, aggregates
    approximate = agg.feature_totals is not None
    build = _Builder(cdf_points)
    out = build.out
    for f in layout.features:
        table = model.tables[f.table]
        d = build.distribution(
            "feature",
            f.name,
            agg.feature_coc.get(f.index, []),
            (agg.feature_totals or {}).get(f.index),
            approximate,
            table.hash_size,
        )
        counts = (
            agg.pooling.get(f.index, {})
            if is_multi_hot(f.type)
            else {1: d.accesses, 0: max(0, agg.num_samples - d.accesses)}  # a decayed window rounds
        )
        hist = sorted((p, n) for p, n in counts.items() if n)
        pf = pooling_stats(np.array([p for p, _ in hist], np.int64), np.array([n for _, n in hist], np.int64))
        out["pooling_histogram"] += [
            output_row("pooling_histogram", feature=f.name, pooling_factor=p, samples=n) for p, n in hist
        ]
        mine = {REJECT_REASONS[reason]: n for (column, reason), n in agg.rejects.items() if column == f.index}
        out["features"].append(
            output_row(
                "features",
                feature=f.name,
                table=table.name,
                hash_size=table.hash_size,
                num_samples=agg.num_samples,
                present_samples=pf.present_samples,
                coverage=pf.coverage,
                pf_mean=pf.mean,
                pf_mean_present=pf.mean_present,
                pf_min=pf.min,
                pf_max=pf.max,
                pf_p50=pf.p50,
                pf_p90=pf.p90,
                pf_p99=pf.p99,
                total_accesses=d.accesses,
                unique_raw_ids=d.distinct_keys,
                unique_rows=d.distinct_rows,
                expected_unique_rows=expected_unique_rows(table.hash_size, d.distinct_keys),
                unused_rows=table.hash_size - d.distinct_rows,
                null_ids=mine.get("null_id", 0),
                rejected_values=sum(n for reason, n in mine.items() if reason != "null_id"),
            )
        )
    for j, table in enumerate(model.tables):
        d = build.distribution(
            "table",
            table.name,
            agg.table_coc.get(j, []),
            (agg.table_totals or {}).get(j),
            approximate,
            table.hash_size,
        )
        out["tables"].append(
            output_row(
                "tables",
                table=table.name,
                features=list(table.features),
                hash_size=table.hash_size,
                dim=table.dim,
                hash=table.hash,
                num_samples=agg.num_samples,
                total_accesses=d.accesses,
                accesses_per_sample=d.accesses / agg.num_samples,
                unique_keys=d.distinct_keys,
                unique_rows=d.distinct_rows,
                expected_unique_rows=expected_unique_rows(table.hash_size, d.distinct_keys),
                unused_rows=table.hash_size - d.distinct_rows,
                max_row_accesses=int(d.coc.counts[0]) if len(d.coc.counts) else 0,
            )
        )
    columns = reject_columns(model)
    out["rejects"] = [
        output_row("rejects", column=columns[c], reason=REJECT_REASONS[r], count=n)
        for (c, r), n in sorted(agg.rejects.items())
    ]
    if agg.bad_rows:
        out["rejects"].append(
            output_row("rejects", column="*", reason="wrong_field_count", count=agg.bad_rows)
        )
    return out
