"""The profile: the logs' partial counts -> every per-feature and per-table statistic
(docs/design.md, "Statistics"), as DataFrame transforms; the driver-side assembly is
:mod:`recshard_stats.profile_assembly`.

Passes over the input: **one** (two in approximate mode). Each task counts its own
``(code, key)`` records in pyarrow (:mod:`~recshard_stats.partition_counts`: ids, multi-hot
pooling factors, rejected values, input rows). In the exact profile the partial counts are
shuffled once, by (table, row), and every aggregate (per id, per row, count-of-counts, the
other records' totals) comes out of one job (:func:`_exact`); their size is the number of
distinct ids, not of samples. Only count-of-counts and pooling histograms (a few thousand
numbers per feature, independent of input size) reach the driver.

**Approximate mode** (:class:`~recshard_stats.options.SketchOptions`), for inputs whose distinct
raw ids are too many to aggregate one by one: ids are counted per hashed row instead (at most
``hash_size`` groups per feature), and the distinct raw ids come from one HLL sketch per
feature (unioned per table), built in a second pass with one group per feature, which Spark
aggregates cheaply. Optionally, only the rows whose ``xxhash64(table, row)`` falls in one of
``2**row_sample_bits`` buckets are counted, and their count-of-counts scaled back up. Totals,
coverage, pooling factors and rejects stay exact.
"""

from __future__ import annotations

import dataclasses
import logging

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from recshard_stats.options import DEFAULT_MAX_REJECT_FRACTION, ProfileOptions, SketchOptions
from recshard_stats.profile_assembly import (
    SAMPLE_BUCKETS,
    CollectedAggregates,
    CountTriples,
    ProfileLayout,
    SketchedTotals,
    assemble,
    check_rejects,
)
from recshard_stats.record_codes import (
    FEATURE_BITS,
    REJECT_REASONS,
    RecordKind,
    RowOutcome,
    decode_record,
    decode_reject,
    record_code,
)

log = logging.getLogger(__name__)

DEFAULT_CDF_POINTS = ProfileOptions.cdf_points


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """Small tables as lists of row dicts (schemas in :mod:`recshard_stats.schemas`), plus the
    distributed per-row and per-id access counts (``None`` unless asked for)."""

    tables: dict[str, list[dict]]
    row_counts: DataFrame | None
    input_rows: int
    rejected_rows: int
    num_samples: int
    cached: tuple[DataFrame, ...] = ()
    id_counts: DataFrame | None = None
    # approximate mode with id counts: each feature's sampled rows' accesses (row -1: every
    # row outside the sample) and its HLL sketches, what a window of approximate days merges
    sampled_row_counts: DataFrame | None = None
    sketches: list[dict] | None = None

    def release(self) -> None:
        """Drop the cached aggregates (after ``row_counts`` and ``id_counts`` have been written)."""
        for frame in self.cached:
            frame.unpersist()


def _records(partial: DataFrame, layout: ProfileLayout) -> DataFrame:
    """Partial counts ``(code, key, text, count)`` (:mod:`~recshard_stats.partition_counts`) ->
    ``(code, key, count)``: each text becomes its key (hex: its value; a string: its XXH64),
    once per distinct text of a task, before the shuffle."""
    hex_codes = [record_code(RecordKind.ID, f.index) for f in layout.features if f.type == "hex"]
    text = F.col("text")
    as_key = F.xxhash64(text)
    if hex_codes:
        as_key = F.when(F.col("code").isin(*hex_codes), F.conv(text, 16, 10).cast("bigint")).otherwise(as_key)
    return partial.select("code", F.when(text.isNull(), F.col("key")).otherwise(as_key).alias("key"), "count")


def _feature_conf(spark: SparkSession, layout: ProfileLayout) -> DataFrame:
    """Per feature (a broadcast side table): its id code, table, hash size, key hashing and row sample."""
    return spark.createDataFrame(
        [
            (
                f.index,
                record_code(RecordKind.ID, f.index),
                f.table,
                f.hash_size,
                f.hash_ids,
                layout.sample_below(f.table),
            )
            for f in layout.features
        ],
        "f int, code int, t int, hash_size bigint, hash_ids boolean, sample_below bigint",
    )


def _count_of_counts(per_row: DataFrame, by: str, scale: dict | None = None) -> dict[int, CountTriples]:
    """(by, row, c, nkeys) -> {by: [(c, rows, keys)]} on the driver (tiny); rows of a sample
    are multiplied by ``scale[by]``."""
    out: dict = {}
    for r in per_row.groupBy(by, "c").agg(F.count("*").alias("rows"), F.sum("nkeys").alias("keys")).collect():
        out.setdefault(r[by], []).append((r["c"], r["rows"] * (scale[r[by]] if scale else 1), r["keys"]))
    return out


def _non_id_counts(agg: DataFrame) -> CollectedAggregates:
    """Approximate mode: pooling histograms, reject counts, ids per feature and input rows from
    the aggregate, in one job (count-of-counts left empty)."""
    ids = (
        agg.where(F.col("kind") == RecordKind.ID.value)
        .groupBy("code")
        .agg(F.lit(0).cast("bigint").alias("key"), F.sum("count").alias("count"))
    )
    rows = (
        agg.where(F.col("kind") != RecordKind.ID.value)
        .select("code", "key", "count")
        .unionByName(ids)
        .collect()
    )
    return _decode(((r["code"], r["key"], r["count"]) for r in rows), {})


def _decode(records, feature_ids: dict[int, int]) -> CollectedAggregates:
    """Collected (code, key, count) records of every kind but ids (id records: key 0, the
    feature's number of ids) -> the aggregates they hold, count-of-counts left empty."""
    pooling: dict[int, dict[int, int]] = {}
    rejects: dict[tuple[int, int], int] = {}
    feature_ids = dict(feature_ids)
    rows = dict.fromkeys(RowOutcome, 0)
    for code, key, count in records:
        kind, feature = decode_record(code)
        if kind == RecordKind.ID:
            feature_ids[feature] = count
        elif kind == RecordKind.POOLING:
            pooling.setdefault(feature, {})[key] = count
        elif kind == RecordKind.REJECT:
            column, reason = decode_reject(key)
            rejects[(column, REJECT_REASONS.index(reason))] = count
        else:
            rows[RowOutcome(key)] = count
    return CollectedAggregates(
        rows[RowOutcome.PARSED], rows[RowOutcome.MALFORMED], pooling, rejects, feature_ids, {}, {}
    )


def profile(
    spark: SparkSession,
    partial: DataFrame,
    layout: ProfileLayout,
    *,
    cdf_points: int = DEFAULT_CDF_POINTS,
    with_row_counts: bool = False,
    with_id_counts: bool = False,
    max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION,
    sketch: SketchOptions | None = None,
) -> ProfileResult:
    """Aggregate the partial counts of the logs (:func:`recshard_stats.spark_io.read_partial_counts`)
    and assemble every output table. ``layout`` must have been made with the same ``sketch`` (its
    row samples)."""
    return profile_records(
        spark,
        _records(partial, layout),
        layout,
        cdf_points=cdf_points,
        with_row_counts=with_row_counts,
        with_id_counts=with_id_counts,
        max_reject_fraction=max_reject_fraction,
        sketch=sketch,
    )


def profile_records(
    spark: SparkSession,
    records: DataFrame,
    layout: ProfileLayout,
    *,
    cdf_points: int,
    with_row_counts: bool,
    with_id_counts: bool,
    max_reject_fraction: float,
    sketch: SketchOptions | None,
) -> ProfileResult:
    """Every output table from records ``(code, key, count)``: a day's logs (:func:`profile`) or
    a window of days' merged counts (:mod:`recshard_stats.window`)."""
    log.info(
        "profile: aggregating %d features (%s)",
        len(layout.features),
        "approximate: row counts, then a pass for the HLL sketches" if sketch else "one pass",
    )
    cached: list[DataFrame] = []  # frames kept in memory, released on failure or after the row counts
    try:
        if sketch is None:
            aggregates, row_counts, id_counts = _exact(
                spark, records, layout, with_row_counts, with_id_counts, cached
            )
            check_rejects(layout.model, aggregates, max_reject_fraction)
            sampled, sketches = None, None
        else:
            conf = _feature_conf(spark, layout)
            agg, sketch_frame = _sketched(records, conf, sketch)
            counted, agg = _counted(agg, cached)
            check_rejects(layout.model, counted, max_reject_fraction)  # before the second pass
            aggregates, sketches = _sketched_distributions(spark, agg, sketch_frame, conf, layout, counted)
            row_counts = id_counts = None
            sampled = _sampled_row_counts(spark, agg, layout) if with_id_counts else None
            sketches = sketches if with_id_counts else None
        tables = assemble(layout, aggregates, cdf_points)
        result = ProfileResult(
            tables,
            row_counts,
            aggregates.input_rows,
            aggregates.bad_rows,
            aggregates.num_samples,
            tuple(cached),
            id_counts,
            sampled,
            sketches,
        )
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise
    if row_counts is None and id_counts is None and result.sampled_row_counts is None:
        result.release()
    return result


def _counted(agg: DataFrame, cached: list[DataFrame]) -> tuple[CollectedAggregates, DataFrame]:
    """Approximate mode: the aggregate ``(code, key, count)`` kept in memory with each record's
    kind and feature, and what it holds besides the sampled rows."""
    agg = (
        agg.withColumn("kind", F.shiftright("code", FEATURE_BITS))
        .withColumn("f", F.col("code").bitwiseAND((1 << FEATURE_BITS) - 1))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    cached.append(agg)
    return _non_id_counts(agg), agg


def _sampled_row_counts(spark: SparkSession, agg: DataFrame, layout: ProfileLayout) -> DataFrame:
    names = spark.createDataFrame([(f.index, f.name) for f in layout.features], "f int, feature string")
    return (
        agg.where(F.col("kind") == RecordKind.ID.value)
        .join(F.broadcast(names), "f")
        .select("feature", F.col("key").alias("row"), F.col("count").alias("access_count"))
    )


def merge_sketched(
    spark: SparkSession, records: DataFrame, sketches: DataFrame, layout: ProfileLayout, cdf_points: int
) -> ProfileResult:
    """A window of approximate days: their records ``(code, key, count)`` (ids: sampled rows, -1
    for the rest) summed per key, and their sketches ``(code, ids, rows)`` unioned per feature,
    through the approximate profile's own assembly."""
    cached: list[DataFrame] = []
    try:
        summed = records.groupBy("code", "key").agg(F.sum("count").alias("count"))
        counted, agg = _counted(summed, cached)
        union = sketches.groupBy("code").agg(
            F.hll_union_agg("ids").alias("ids"), F.hll_union_agg("rows").alias("rows")
        )
        aggregates, collected = _sketched_distributions(
            spark, agg, union, _feature_conf(spark, layout), layout, counted
        )
        return ProfileResult(
            assemble(layout, aggregates, cdf_points),
            None,
            aggregates.input_rows,
            aggregates.bad_rows,
            aggregates.num_samples,
            tuple(cached),
            None,
            _sampled_row_counts(spark, agg, layout),
            collected,
        )
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise


def _exact(
    spark: SparkSession,
    records: DataFrame,
    layout: ProfileLayout,
    with_row_counts: bool,
    with_id_counts: bool,
    cached: list[DataFrame],
) -> tuple[CollectedAggregates, DataFrame | None, DataFrame | None]:
    """Every exact aggregate in one Spark job after **one** shuffle of the partial counts.

    Before the shuffle each id gets its key (integer ids that hash with xxhash64 are hashed here,
    once per distinct id of a task) and its row; an id of a table fed by several features is
    counted twice, under its feature's code and under the table's (kind TABLE: the same key from
    two features is one row and one key). Records are shuffled by (table, row), so the per-id
    and per-row aggregations need no other shuffle; other records keep their key as their row.
    The small results (count-of-counts, pooling, rejects, rows) are one collect. With
    ``with_row_counts`` the per-row frame is kept (in ``cached``) for the row counts; with
    ``with_id_counts`` the per-id frame, for each feature's ids and their accesses (keys as
    hashed, so a window of days re-aggregates them with ``hash_ids`` off)."""
    shared = layout.shared_tables
    levels = spark.createDataFrame(
        [
            (
                record_code(RecordKind.ID, f.index),
                record_code(RecordKind.ID, f.index),
                f.table,
                f.hash_size,
                f.hash_ids,
            )
            for f in layout.features
        ]
        + [
            (
                record_code(RecordKind.ID, f.index),
                record_code(RecordKind.TABLE, f.table),
                f.table,
                f.hash_size,
                f.hash_ids,
            )
            for f in layout.features
            if f.table in shared
        ],
        "code int, level_code int, t int, hash_size bigint, hash_ids boolean",
    )
    joined = records.join(F.broadcast(levels), "code", "left")  # records of other kinds: no table
    key = F.when(F.col("hash_ids"), F.xxhash64("key")).otherwise(F.col("key"))
    row = F.when(F.col("t").isNotNull(), F.pmod(key, F.col("hash_size"))).otherwise(F.col("key"))
    per_key = (
        joined.select(
            F.coalesce("level_code", "code").alias("code"), "t", key.alias("key"), row.alias("row"), "count"
        )
        .repartition("t", "row")
        .groupBy("t", "row", "code", "key")
        .agg(F.sum("count").alias("count"))
    )
    if with_id_counts:
        per_key = per_key.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(per_key)
    per_row = per_key.groupBy("t", "row", "code").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys"))
    if with_row_counts:
        per_row = per_row.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(per_row)
    # ids: (access count, rows, keys) per feature or shared table; other kinds: (key, count)
    by = F.when(F.col("t").isNotNull(), F.col("c")).otherwise(F.col("row"))
    small = per_row.groupBy("code", by.alias("b")).agg(
        F.count("*").alias("rows"), F.sum("nkeys").alias("keys"), F.sum("c").alias("total")
    )
    feature_coc: dict[int, CountTriples] = {}
    shared_coc: dict[int, CountTriples] = {}
    others = []
    for code, b, rows, keys, total in small.collect():  # the one job
        kind, index = decode_record(code)
        if kind in (RecordKind.ID, RecordKind.TABLE):
            (feature_coc if kind == RecordKind.ID else shared_coc).setdefault(index, []).append(
                (b, rows, keys)
            )
        else:
            others.append((code, b, total))
    feature_ids = {f: sum(c * rows for c, rows, _ in triples) for f, triples in feature_coc.items()}
    aggregates = dataclasses.replace(
        _decode(others, feature_ids),
        feature_coc=feature_coc,
        table_coc=_unshared_tables(shared_coc, feature_coc, layout),
    )
    id_counts = None
    if with_id_counts:
        features = spark.createDataFrame(
            [(record_code(RecordKind.ID, f.index), f.name) for f in layout.features],
            "code int, feature string",
        )
        id_counts = per_key.join(F.broadcast(features), "code").select(
            "feature", "key", F.col("count").alias("access_count")
        )
    if not with_row_counts:
        return aggregates, None, id_counts
    # a table's rows: its feature's, or (fed by several) its own
    table_level = [
        record_code(RecordKind.TABLE, j)
        if j in shared
        else record_code(RecordKind.ID, layout.features_of(j)[0])
        for j in range(len(layout.model.tables))
    ]
    names = spark.createDataFrame(
        [(j, t.name) for j, t in enumerate(layout.model.tables)], "t int, table string"
    )
    row_counts = (
        per_row.where(F.col("code").isin(*table_level))
        .join(F.broadcast(names), "t")
        .select("table", "row", F.col("c").alias("access_count"))
    )
    return aggregates, row_counts, id_counts


def _unshared_tables(table_coc: dict, feature_coc: dict, layout: ProfileLayout) -> dict:
    """Tables fed by several features keep their own count-of-counts; the others have their feature's."""
    return {
        **table_coc,
        **{
            f.table: feature_coc[f.index]
            for f in layout.features
            if f.table not in layout.shared_tables and f.index in feature_coc
        },
    }


def _sketched(records: DataFrame, conf: DataFrame, sketch: SketchOptions) -> tuple[DataFrame, DataFrame]:
    """(code, key, count) records -> counts per non-id key (as exact), per sampled row, and one for all
    other ids of a feature; and per feature HLL sketches of its keys and (sampled tables) rows.
    Two aggregations, not one: a sketch per row group would force Spark's slow object aggregate
    onto millions of groups (measured 2.6x the exact profile's time at 10^7 samples)."""
    k = sketch.lg_config_k
    ids = records.join(F.broadcast(conf.drop("f")), "code", "left")  # non-id records: nulls
    key = F.when(F.col("hash_ids"), F.xxhash64("key")).otherwise(F.col("key"))
    row = F.pmod(key, F.col("hash_size"))
    sampled = F.pmod(F.xxhash64(F.col("t"), row), F.lit(SAMPLE_BUCKETS)) < F.col("sample_below")
    bucket = F.when(F.col("hash_size").isNull(), F.col("key")).when(sampled, row).otherwise(F.lit(-1))
    counts = ids.groupBy("code", bucket.alias("key")).agg(F.sum("count").alias("count"))
    # a table that keeps every row counts its rows exactly, so only sampled tables sketch them
    sketched_row = F.when(F.col("sample_below") < SAMPLE_BUCKETS, row)
    sketches = (
        ids.where(F.col("hash_size").isNotNull())
        .groupBy("code")
        .agg(F.hll_sketch_agg(key, k).alias("ids"), F.hll_sketch_agg(sketched_row, k).alias("rows"))
    )
    return counts, sketches


def _sketched_distributions(
    spark: SparkSession,
    agg: DataFrame,
    sketches: DataFrame,
    conf: DataFrame,
    layout: ProfileLayout,
    counted: CollectedAggregates,
) -> tuple[CollectedAggregates, list[dict]]:
    """Count-of-counts of the sampled rows, scaled up; exact totals and HLL distinct counts (per
    table: the union of its features' sketches); and each feature's sketches as collected."""
    bits, shared = layout.sample_bits, sorted(layout.shared_tables)
    ids = agg.where(F.col("kind") == RecordKind.ID.value).join(F.broadcast(conf.select("f", "t")), "f")
    sampled = ids.where(F.col("key") >= 0).select(
        "f", "t", F.col("key").alias("row"), F.col("count").alias("c")
    )
    feature_coc = _count_of_counts(
        sampled.withColumn("nkeys", F.lit(0)), "f", {f.index: 1 << bits[f.table] for f in layout.features}
    )
    # a table fed by several features sums their counts per row (the others' are their feature's)
    per_shared_row = (
        sampled.where(F.col("t").isin(*shared))
        .groupBy("t", "row")
        .agg(F.sum("c").alias("c"))
        .withColumn("nkeys", F.lit(0))
    )
    table_coc = (
        _count_of_counts(per_shared_row, "t", {j: 1 << b for j, b in enumerate(bits)}) if shared else {}
    )
    table_coc = _unshared_tables(table_coc, feature_coc, layout)
    accesses = counted.feature_ids
    # the sketches are a few KiB per feature: collected once, so the second pass runs once
    collected = []
    for r in sketches.collect():
        _, f = decode_record(r["code"])
        collected.append((f, layout.features[f].table, r["ids"], r["rows"]))
    small = spark.createDataFrame(collected, "f int, t int, ids binary, rows binary")

    def estimates(level: str) -> dict[int, tuple[float, float]]:
        union = small.groupBy(level).agg(
            F.hll_sketch_estimate(F.hll_union_agg("ids")).alias("ids"),
            F.hll_sketch_estimate(F.hll_union_agg("rows")).alias("rows"),
        )
        return {r[level]: (r["ids"], r["rows"]) for r in union.collect()}

    # a table whose rows are all kept counts them exactly (None: from its count-of-counts)
    feature_totals = {
        i: SketchedTotals(accesses.get(i, 0), ids_, rows if bits[layout.features[i].table] else None)
        for i, (ids_, rows) in estimates("f").items()
    }
    table_totals = {
        j: SketchedTotals(
            sum(accesses.get(i, 0) for i in layout.features_of(j)), ids_, rows if bits[j] else None
        )
        for j, (ids_, rows) in estimates("t").items()
    }
    kept = [{"feature": layout.features[f].name, "ids": ids_, "rows": rows} for f, _, ids_, rows in collected]
    return (
        dataclasses.replace(
            counted,
            feature_coc=feature_coc,
            table_coc=table_coc,
            feature_totals=feature_totals,
            table_totals=table_totals,
        ),
        kept,
    )
