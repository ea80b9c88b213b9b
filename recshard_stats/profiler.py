"""The profile: normalized logs -> every per-feature and per-table statistic (docs/design.md,
"Statistics"), as DataFrame transforms; the driver-side assembly is
:mod:`recshard_stats.profile_assembly`.

Passes over the input: **one** (two in approximate mode). Each sample becomes a small array of
records ``(code, key)`` (see :func:`_records`: ids, multi-hot pooling factors, rejected values,
one per row) and a single ``groupBy(code, key).count()`` aggregates them. Everything after works
on that aggregate, whose size is the number of distinct ids, not of samples: hashing to rows,
per-row access counts, count-of-counts. Only count-of-counts and pooling histograms (a few
thousand numbers per feature, independent of input size) reach the driver.

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
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from recshard_stats.options import DEFAULT_MAX_REJECT_FRACTION, ProfileOptions, SketchOptions
from recshard_stats.profile_assembly import (SAMPLE_BUCKETS, CollectedAggregates, CountTriples, ProfileLayout,
                                             SketchedTotals, assemble, check_rejects)
from recshard_stats.record_codes import REJECT_REASONS, decode_reject, is_multi_hot

log = logging.getLogger(__name__)

# a record's code is kind << 16 | feature index
ID, POOLING, REJECT, ROW = 0, 1, 2, 3
_FEATURE_BITS = 16
DEFAULT_CDF_POINTS = ProfileOptions.cdf_points


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """Small tables as lists of row dicts (schemas in :mod:`recshard_stats.schemas`), plus the
    distributed per-row access counts (``None`` unless asked for)."""
    tables: dict[str, list[dict]]
    row_counts: DataFrame | None
    input_rows: int
    rejected_rows: int
    num_samples: int
    cached: tuple[DataFrame, ...] = ()

    def release(self) -> None:
        """Drop the cached aggregates (after ``row_counts`` has been written)."""
        for frame in self.cached:
            frame.unpersist()


def _code(kind: int, feature: int = 0) -> Column:
    return F.lit((kind << _FEATURE_BITS) | feature)


def _records(df: DataFrame, layout: ProfileLayout) -> DataFrame:
    """One ``(code, key)`` record per id, per multi-hot feature (key: its pooling factor; a
    single-hot feature's histogram follows from its id count), per rejected value (key: its
    reject code) and per input row (key: 1 if parseable, else 0). Built from two aligned arrays
    with scalar functions only, then ``inline``-d; absent single-hot values are null keys, dropped after."""
    single = [f.index for f in layout.features if not is_multi_hot(f.type)]
    multi = [f.index for f in layout.features if is_multi_hot(f.type)]
    codes, keys = [], []
    if single:
        codes.append(F.array(*[_code(ID, i) for i in single]))
        keys.append(F.array(*[F.col(f"k{i}") for i in single]))
    for i in multi:
        codes.append(F.array_repeat(_code(ID, i), F.size(f"k{i}")))
        keys.append(F.col(f"k{i}"))
    if multi:
        codes.append(F.array(*[_code(POOLING, i) for i in multi]))
        keys.append(F.array(*[F.size(f"k{i}").cast("bigint") for i in multi]))
    codes.append(F.array_repeat(_code(REJECT), F.size("_rejects")))
    keys.append(F.col("_rejects"))
    valid = F.col("_valid")
    row_code, row_key = F.array(_code(ROW)), F.array(valid.cast("bigint"))
    all_codes = F.when(valid, F.concat(*codes, row_code)).otherwise(row_code)
    all_keys = F.when(valid, F.concat(*keys, row_key)).otherwise(row_key)
    return (df.select(F.inline(F.arrays_zip(all_codes.alias("code"), all_keys.alias("key"))))
            .where(F.col("key").isNotNull()))


def _feature_conf(spark: SparkSession, layout: ProfileLayout) -> DataFrame:
    """Per feature (a broadcast side table): its id code, table, hash size, key hashing and row sample."""
    return spark.createDataFrame(
        [(f.index, (ID << _FEATURE_BITS) | f.index, f.table, f.hash_size, f.hash_ids, layout.sample_below(f.table))
         for f in layout.features],
        "f int, code int, t int, hash_size bigint, hash_ids boolean, sample_below bigint")


def _count_of_counts(per_row: DataFrame, by: str, scale: dict | None = None) -> dict[int, CountTriples]:
    """(by, row, c, nkeys) -> {by: [(c, rows, keys)]} on the driver (tiny); rows of a sample
    are multiplied by ``scale[by]``."""
    out: dict = {}
    for r in per_row.groupBy(by, "c").agg(F.count("*").alias("rows"), F.sum("nkeys").alias("keys")).collect():
        out.setdefault(r[by], []).append((r["c"], r["rows"] * (scale[r[by]] if scale else 1), r["keys"]))
    return out


def _non_id_counts(agg: DataFrame) -> tuple[dict, dict, dict, int, int]:
    """Pooling histograms, reject counts, ids per feature and (parseable, unparseable) rows from
    the aggregate, in one job."""
    pooling: dict[int, dict[int, int]] = {}
    rejects: dict[tuple[int, int], int] = {}
    feature_ids: dict[int, int] = {}
    row_kinds = {0: 0, 1: 0}
    ids = agg.where(F.col("kind") == ID).groupBy("kind", "f").agg(F.lit(0).cast("bigint").alias("key"),
                                                                  F.sum("count").alias("count"))
    for r in agg.where(F.col("kind") != ID).select("kind", "f", "key", "count").unionByName(ids).collect():
        if r["kind"] == ID:
            feature_ids[r["f"]] = r["count"]
        elif r["kind"] == POOLING:
            pooling.setdefault(r["f"], {})[r["key"]] = r["count"]
        elif r["kind"] == REJECT:
            column, reason = decode_reject(r["key"])
            rejects[(column, REJECT_REASONS.index(reason))] = r["count"]
        else:
            row_kinds[r["key"]] = r["count"]
    return pooling, rejects, feature_ids, row_kinds[1], row_kinds[0]


def profile(spark: SparkSession, normalized: DataFrame, layout: ProfileLayout, *,
            cdf_points: int = DEFAULT_CDF_POINTS, with_row_counts: bool = False,
            max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION,
            sketch: SketchOptions | None = None) -> ProfileResult:
    """Aggregate the normalized frame and assemble every output table. ``layout`` must have been
    made with the same ``sketch`` (its row samples)."""
    conf = _feature_conf(spark, layout)
    records = _records(normalized, layout)
    if sketch is None:
        agg = records.groupBy("code", "key").count()
    else:
        agg, sketches = _sketched(records, conf, sketch)
    agg = (agg.withColumn("kind", F.shiftright("code", _FEATURE_BITS))
           .withColumn("f", F.col("code").bitwiseAND((1 << _FEATURE_BITS) - 1))
           .persist(StorageLevel.MEMORY_AND_DISK))
    cached = [agg]
    try:
        log.info("profile: aggregating %d features (%s)", len(layout.features),
                 "approximate: row counts, then a pass for the HLL sketches" if sketch else "one pass")
        pooling, rejects, feature_ids, num_samples, bad_rows = _non_id_counts(agg)
        counted = CollectedAggregates(num_samples, bad_rows, pooling, rejects, feature_ids, {}, {})
        check_rejects(layout.model, counted, max_reject_fraction)
        row_counts = None
        if sketch is None:
            feature_coc, table_coc, row_counts, per_row = _exact_distributions(spark, agg, conf, layout,
                                                                               with_row_counts)
            cached.append(per_row)
            aggregates = dataclasses.replace(counted, feature_coc=feature_coc, table_coc=table_coc)
        else:
            aggregates = _sketched_distributions(spark, agg, sketches, conf, layout, counted)
        tables = assemble(layout, aggregates, cdf_points)
        result = ProfileResult(tables, row_counts, aggregates.input_rows, bad_rows, num_samples, tuple(cached))
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise
    if row_counts is None:
        result.release()
    return result


def _unshared_tables(table_coc: dict, feature_coc: dict, layout: ProfileLayout) -> dict:
    """Tables fed by several features keep their own count-of-counts; the others have their feature's."""
    return {**table_coc, **{f.table: feature_coc[f.index] for f in layout.features
                            if f.table not in layout.shared_tables and f.index in feature_coc}}


def _exact_distributions(spark: SparkSession, agg: DataFrame, conf: DataFrame, layout: ProfileLayout,
                         with_row_counts: bool) -> tuple[dict, dict, DataFrame | None, DataFrame]:
    """Count-of-counts per feature and table, the per-row access counts (when asked for), and the
    persisted per-row frame they come from (the caller releases it)."""
    shared = sorted(layout.shared_tables)
    # Integer ids that hash with xxhash64 are hashed here, once per distinct id.
    ids = (agg.where(F.col("kind") == ID).drop("code").join(F.broadcast(conf), "f")
           .withColumn("key", F.when(F.col("hash_ids"), F.xxhash64("key")).otherwise(F.col("key"))))
    per_feature_row = (ids.withColumn("row", F.pmod("key", "hash_size"))
                       .groupBy("f", "t", "row").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys"))
                       .persist(StorageLevel.MEMORY_AND_DISK))
    # A table fed by several features: the same key from two features is one row and one key.
    per_shared_row = (ids.where(F.col("t").isin(*shared)).groupBy("t", "key", "hash_size")
                      .agg(F.sum("count").alias("count"))
                      .withColumn("row", F.pmod("key", "hash_size"))
                      .groupBy("t", "row").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys")))
    feature_coc = _count_of_counts(per_feature_row, "f")
    table_coc = _unshared_tables(_count_of_counts(per_shared_row, "t") if shared else {}, feature_coc, layout)
    if not with_row_counts:
        return feature_coc, table_coc, None, per_feature_row
    per_table_row = per_feature_row.where(~F.col("t").isin(*shared)) if shared else per_feature_row
    per_table_row = per_table_row.select("t", "row", "c")
    if shared:
        per_table_row = per_table_row.unionByName(per_shared_row.select("t", "row", "c"))
    names = spark.createDataFrame([(j, t.name) for j, t in enumerate(layout.model.tables)], "t int, table string")
    row_counts = (per_table_row.join(F.broadcast(names), "t")
                  .select("table", "row", F.col("c").alias("access_count")))
    return feature_coc, table_coc, row_counts, per_feature_row


def _sketched(records: DataFrame, conf: DataFrame, sketch: SketchOptions) -> tuple[DataFrame, DataFrame]:
    """(code, key) records -> counts per non-id key (as exact), per sampled row, and one for all
    other ids of a feature; and per feature HLL sketches of its keys and (sampled tables) rows.
    Two aggregations, not one: a sketch per row group would force Spark's slow object aggregate
    onto millions of groups (measured 2.6x the exact profile's time at 10^7 samples)."""
    k = sketch.lg_config_k
    ids = records.join(F.broadcast(conf.drop("f")), "code", "left")  # non-id records: nulls
    key = F.when(F.col("hash_ids"), F.xxhash64("key")).otherwise(F.col("key"))
    row = F.pmod(key, F.col("hash_size"))
    sampled = F.pmod(F.xxhash64(F.col("t"), row), F.lit(SAMPLE_BUCKETS)) < F.col("sample_below")
    bucket = F.when(F.col("hash_size").isNull(), F.col("key")).when(sampled, row).otherwise(F.lit(-1))
    counts = ids.groupBy("code", bucket.alias("key")).count()
    # a table that keeps every row counts its rows exactly, so only sampled tables sketch them
    sketched_row = F.when(F.col("sample_below") < SAMPLE_BUCKETS, row)
    sketches = (ids.where(F.col("hash_size").isNotNull()).groupBy("code")
                .agg(F.hll_sketch_agg(key, k).alias("ids"), F.hll_sketch_agg(sketched_row, k).alias("rows")))
    return counts, sketches


def _sketched_distributions(spark: SparkSession, agg: DataFrame, sketches: DataFrame, conf: DataFrame,
                            layout: ProfileLayout, counted: CollectedAggregates) -> CollectedAggregates:
    """Count-of-counts of the sampled rows, scaled up; exact totals and HLL distinct counts (per
    table: the union of its features' sketches)."""
    bits, shared = layout.sample_bits, sorted(layout.shared_tables)
    ids = agg.where(F.col("kind") == ID).join(F.broadcast(conf.select("f", "t")), "f")
    sampled = ids.where(F.col("key") >= 0).select("f", "t", F.col("key").alias("row"), F.col("count").alias("c"))
    feature_coc = _count_of_counts(sampled.withColumn("nkeys", F.lit(0)), "f",
                                   {f.index: 1 << bits[f.table] for f in layout.features})
    # a table fed by several features sums their counts per row (the others' are their feature's)
    per_shared_row = (sampled.where(F.col("t").isin(*shared)).groupBy("t", "row").agg(F.sum("c").alias("c"))
                      .withColumn("nkeys", F.lit(0)))
    table_coc = _count_of_counts(per_shared_row, "t", {j: 1 << b for j, b in enumerate(bits)}) if shared else {}
    table_coc = _unshared_tables(table_coc, feature_coc, layout)
    accesses = counted.feature_ids
    # the sketches are a few KiB per feature: collected once, so the second pass runs once
    mask = (1 << _FEATURE_BITS) - 1
    collected = [(r["code"] & mask, layout.features[r["code"] & mask].table, r["ids"], r["rows"])
                 for r in sketches.collect()]
    small = spark.createDataFrame(collected, "f int, t int, ids binary, rows binary")

    def estimates(level: str) -> dict[int, tuple[float, float]]:
        union = small.groupBy(level).agg(F.hll_sketch_estimate(F.hll_union_agg("ids")).alias("ids"),
                                         F.hll_sketch_estimate(F.hll_union_agg("rows")).alias("rows"))
        return {r[level]: (r["ids"], r["rows"]) for r in union.collect()}

    # a table whose rows are all kept counts them exactly (None: from its count-of-counts)
    feature_totals = {i: SketchedTotals(accesses.get(i, 0), ids_, rows if bits[layout.features[i].table] else None)
                      for i, (ids_, rows) in estimates("f").items()}
    table_totals = {j: SketchedTotals(sum(accesses.get(i, 0) for i in layout.features_of(j)), ids_,
                                      rows if bits[j] else None)
                    for j, (ids_, rows) in estimates("t").items()}
    return dataclasses.replace(counted, feature_coc=feature_coc, table_coc=table_coc,
                               feature_totals=feature_totals, table_totals=table_totals)
