"""The profile: normalized logs -> every per-feature and per-table statistic of DESIGN.md.

Passes over the input: **one** (two in approximate mode). Each sample becomes a small array of records
``(code, key)`` (see :func:`_records`: ids, multi-hot pooling factors, rejected values,
one per row) and a single ``groupBy(code, key).count()`` aggregates them. Everything after works on that aggregate, whose size
is the number of distinct ids, not of samples: hashing to rows, per-row access counts,
count-of-counts. Only count-of-counts and pooling histograms (a few thousand numbers per
feature, independent of input size) reach the driver.

**Approximate mode** (:class:`Approximate`), for inputs whose distinct raw ids are too many
to aggregate one by one: ids are counted per hashed row instead (at most ``hash_size`` groups
per feature), and the distinct raw ids come from one HLL sketch per feature (unioned per
table), built in a second pass with one group per feature, which Spark aggregates cheaply. Optionally, only
the rows whose ``xxhash64(table, row)`` falls in one of ``2**row_sample_bits`` buckets are
counted, and their count-of-counts scaled back up. Totals, coverage, pooling factors and
rejects stay exact.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from recshard_stats.config import ModelConfig
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.readers import REJECT_REASONS, decode_reject, is_multi_hot, needs_key_hash, reject_columns
from recshard_stats.statistics import CountOfCounts, access_cdf, expected_unique_rows, pooling_stats

log = logging.getLogger(__name__)

ID, POOLING, REJECT, ROW = 0, 1, 2, 3
DEFAULT_CDF_POINTS = 128
DEFAULT_MAX_REJECT_FRACTION = 0.01
MIN_SAMPLED_ROWS = 1 << 16
SAMPLE_BUCKETS = 1 << 20  # a row is sampled when xxhash64(table, row) mod this is below the table's cut


@dataclasses.dataclass(frozen=True)
class Approximate:
    """Sketch settings. ``lg_config_k``: HLL registers 2**k (4..21); the relative standard error
    of a distinct count is about 1.04 / sqrt(2**k). ``row_sample_bits``: count-of-counts from
    one row in 2**bits (fewer in tables under ``2**bits * MIN_SAMPLED_ROWS`` rows); 0, the
    default, keeps every row, so count-of-counts and CDFs stay exact (BENCHMARKS.md: sampling
    rows misses the hot head, whose few rows carry much of the mass)."""
    lg_config_k: int = 14
    row_sample_bits: int = 0

    def __post_init__(self):
        if not 4 <= self.lg_config_k <= 21:
            raise RecShardError(Reason.CONFIG_INVALID, f"HLL lg_config_k must be in 4..21, got {self.lg_config_k}")
        if not 0 <= self.row_sample_bits <= 16:
            raise RecShardError(Reason.CONFIG_INVALID,
                                f"row_sample_bits must be in 0..16, got {self.row_sample_bits}")

    @property
    def relative_standard_error(self) -> float:
        return 1.04 / math.sqrt(2 ** self.lg_config_k)

    def sample_bits(self, hash_size: int) -> int:
        """A table keeps at least MIN_SAMPLED_ROWS of its rows in the sample (a small one: all)."""
        return max(0, min(self.row_sample_bits, math.floor(math.log2(hash_size / MIN_SAMPLED_ROWS))))

    def metadata(self, model: ModelConfig) -> dict:
        """What the stats metadata records: the sketch size, the distinct counts' error bound and
        each table's row sample rate (the count-of-counts rows are scaled by its inverse)."""
        return {"hll_lg_config_k": self.lg_config_k,
                "distinct_count_relative_standard_error": self.relative_standard_error,
                "distinct_count_error_bound_99_7": 3 * self.relative_standard_error,
                "row_sample_bits": self.row_sample_bits,
                "row_sample_rate": {t.name: 2.0 ** -self.sample_bits(t.hash_size) for t in model.tables}}


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """Small tables as lists of row dicts (schemas in :mod:`recshard_stats.schemas`), plus the
    distributed per-row access counts (``None`` unless asked for)."""
    tables: dict[str, list[dict]]
    row_counts: DataFrame | None
    input_rows: int
    rejected_rows: int
    cached: tuple[DataFrame, ...] = ()

    def release(self) -> None:
        """Drop the cached aggregates (after ``row_counts`` has been written)."""
        for frame in self.cached:
            frame.unpersist()


def _records(df: DataFrame, model: ModelConfig) -> DataFrame:
    """One ``(code, key)`` record per id, per multi-hot feature (key: its pooling factor; a
    single-hot feature's histogram follows from its id count), per rejected value (key: its
    reject code) and per input row (key: 1 if parseable, else 0); ``code = kind << 16 |
    feature``. Built from two aligned arrays with scalar functions only, then ``inline``-d;
    absent single-hot values are null keys, dropped after."""
    single = [i for i, f in enumerate(model.features) if not is_multi_hot(f.type)]
    multi = [i for i, f in enumerate(model.features) if is_multi_hot(f.type)]

    def code(kind: int, f: int = 0) -> Column:
        return F.lit((kind << 16) | f)

    codes, keys = [], []
    if single:
        codes.append(F.array(*[code(ID, i) for i in single]))
        keys.append(F.array(*[F.col(f"k{i}") for i in single]))
    for i in multi:
        codes.append(F.array_repeat(code(ID, i), F.size(f"k{i}")))
        keys.append(F.col(f"k{i}"))
    if multi:
        codes.append(F.array(*[code(POOLING, i) for i in multi]))
        keys.append(F.array(*[F.size(f"k{i}").cast("bigint") for i in multi]))
    codes.append(F.array_repeat(code(REJECT), F.size("_rejects")))
    keys.append(F.col("_rejects"))
    valid = F.col("_valid")
    row_code, row_key = F.array(code(ROW)), F.array(valid.cast("bigint"))
    all_codes = F.when(valid, F.concat(*codes, row_code)).otherwise(row_code)
    all_keys = F.when(valid, F.concat(*keys, row_key)).otherwise(row_key)
    return (df.select(F.inline(F.arrays_zip(all_codes.alias("code"), all_keys.alias("key"))))
            .where(F.col("key").isNotNull()))


def _count_of_counts(per_row: DataFrame, by: str, scale: dict | None = None) -> dict:
    """(by, row, c, nkeys) -> {by: (counts, rows, keys)} on the driver (tiny); rows of a sample
    are multiplied by ``scale[by]``."""
    out: dict = {}
    for r in per_row.groupBy(by, "c").agg(F.count("*").alias("rows"), F.sum("nkeys").alias("keys")).collect():
        out.setdefault(r[by], []).append((r["c"], r["rows"] * (scale[r[by]] if scale else 1), r["keys"]))
    return out


def profile(spark: SparkSession, normalized: DataFrame, model: ModelConfig, *,
            cdf_points: int = DEFAULT_CDF_POINTS, with_row_counts: bool = False,
            max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION,
            approximate: Approximate | None = None) -> ProfileResult:
    if approximate is not None and with_row_counts:
        raise RecShardError(Reason.CONFIG_INVALID, "per-row access counts (--row-counts, for remap) need the "
                            "exact profile", fixes=("drop --approximate", "or drop --row-counts"))
    features = [f.name for f in model.features]
    tables = list(model.tables)
    table_index = {t.name: j for j, t in enumerate(tables)}
    feature_table = [table_index[model.table_of(name).name] for name in features]
    bits = [approximate.sample_bits(t.hash_size) if approximate else 0 for t in tables]
    conf = spark.createDataFrame(
        [(i, (ID << 16) | i, feature_table[i], tables[feature_table[i]].hash_size,
          needs_key_hash(f.type, tables[feature_table[i]].hash), SAMPLE_BUCKETS >> bits[feature_table[i]])
         for i, f in enumerate(model.features)],
        "f int, code int, t int, hash_size bigint, hash_ids boolean, sample_below bigint")

    records = _records(normalized, model)
    if approximate is None:
        agg = records.groupBy("code", "key").count()
    else:
        agg, sketches = _sketched(records, conf, approximate)
    agg = agg.withColumn("kind", F.shiftright("code", 16)).withColumn("f", F.col("code").bitwiseAND(0xFFFF))
    agg = agg.persist(StorageLevel.MEMORY_AND_DISK)
    cached = [agg]
    try:
        log.info("profile: aggregating %d features (%s)", len(features),
                 "approximate: row counts, then a pass for the HLL sketches" if approximate else "one pass")
        pooling: dict[int, dict[int, int]] = {}
        rejects: dict[tuple[int, int], int] = {}
        row_kinds = {0: 0, 1: 0}
        for r in agg.where(F.col("kind") != ID).select("kind", "f", "key", "count").collect():
            if r["kind"] == POOLING:
                pooling.setdefault(r["f"], {})[r["key"]] = r["count"]
            elif r["kind"] == REJECT:
                column, reason = decode_reject(r["key"])
                rejects[(column, REJECT_REASONS.index(reason))] = r["count"]
            else:
                row_kinds[r["key"]] = r["count"]
        num_samples, bad_rows = row_kinds[1], row_kinds[0]
        input_rows = num_samples + bad_rows
        if num_samples == 0:
            raise RecShardError(
                Reason.INPUT_MISSING,
                f"the input has no usable samples ({input_rows} rows read, {bad_rows} unparseable)",
                fixes=("check the input path and the day's partition", "check the input format in the model config"))
        _check_rejects(model, rejects, bad_rows, input_rows, max_reject_fraction)

        shared = {j for j, t in enumerate(tables) if len(t.features) > 1}
        row_counts, totals = None, None
        if approximate is None:
            feature_coc, table_coc, row_counts = _exact_distributions(spark, agg, conf, tables, feature_table,
                                                                      shared, with_row_counts, cached)
        else:
            feature_coc, table_coc, totals = _sketched_distributions(spark, agg, sketches, conf, bits,
                                                                     feature_table, shared)
        out = _assemble(model, feature_table, pooling, rejects, feature_coc, table_coc, num_samples,
                        cdf_points, bad_rows, totals)
        result = ProfileResult(out, row_counts, input_rows, bad_rows, tuple(cached))
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise
    if row_counts is None:
        result.release()
    return result


def _exact_distributions(spark, agg: DataFrame, conf: DataFrame, tables, feature_table: list[int], shared: set,
                         with_row_counts: bool, cached: list) -> tuple[dict, dict, DataFrame | None]:
    # Integer ids that hash with xxhash64 are hashed here, once per distinct id.
    ids = (agg.where(F.col("kind") == ID).drop("code").join(F.broadcast(conf), "f")
           .withColumn("key", F.when(F.col("hash_ids"), F.xxhash64("key")).otherwise(F.col("key"))))
    per_feature_row = (ids.withColumn("row", F.pmod("key", "hash_size"))
                       .groupBy("f", "t", "row").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys")))
    # A table fed by several features: the same key from two features is one row and one key.
    per_shared_row = (ids.where(F.col("t").isin(*shared)).groupBy("t", "key", "hash_size")
                      .agg(F.sum("count").alias("count"))
                      .withColumn("row", F.pmod("key", "hash_size"))
                      .groupBy("t", "row").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys")))
    per_feature_row = per_feature_row.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(per_feature_row)
    feature_coc = _count_of_counts(per_feature_row, "f")
    table_coc = _count_of_counts(per_shared_row, "t") if shared else {}
    _add_unshared_tables(table_coc, feature_coc, feature_table, shared)
    if not with_row_counts:
        return feature_coc, table_coc, None
    per_table_row = per_feature_row.where(~F.col("t").isin(*shared)).select("t", "row", "c") if shared \
        else per_feature_row.select("t", "row", "c")
    if shared:
        per_table_row = per_table_row.unionByName(per_shared_row.select("t", "row", "c"))
    names = spark.createDataFrame([(j, t.name) for j, t in enumerate(tables)], "t int, table string")
    row_counts = (per_table_row.join(F.broadcast(names), "t")
                  .select("table", "row", F.col("c").alias("access_count")))
    return feature_coc, table_coc, row_counts


def _add_unshared_tables(table_coc: dict, feature_coc: dict, feature_table: list[int], shared: set) -> None:
    """A table fed by one feature has that feature's count-of-counts."""
    for i, j in enumerate(feature_table):
        if j not in shared and i in feature_coc:
            table_coc[j] = feature_coc[i]


def _sketched(records: DataFrame, conf: DataFrame, approximate: Approximate) -> tuple[DataFrame, DataFrame]:
    """(code, key) records -> counts per non-id key (as exact), per sampled row, and one for all
    other ids of a feature; and per feature HLL sketches of its keys and (sampled tables) rows.
    Two aggregations, not one: a sketch per row group would force Spark's slow object aggregate
    onto millions of groups (measured 2.6x the exact profile's time at 10^7 samples)."""
    k = approximate.lg_config_k
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
                            bits: list[int], feature_table: list[int], shared: set) -> tuple[dict, dict, dict]:
    """Count-of-counts of the sampled rows, scaled up; exact totals and HLL distinct counts (per
    table: the union of its features' sketches)."""
    ids = agg.where(F.col("kind") == ID).join(F.broadcast(conf.select("f", "t")), "f")
    sampled = ids.where(F.col("key") >= 0).select("f", "t", F.col("key").alias("row"), F.col("count").alias("c"))
    feature_coc = _count_of_counts(sampled.withColumn("nkeys", F.lit(0)), "f",
                                   {i: 1 << bits[j] for i, j in enumerate(feature_table)})
    # a table fed by several features sums their counts per row (the others' are their feature's)
    per_shared_row = (sampled.where(F.col("t").isin(*shared)).groupBy("t", "row").agg(F.sum("c").alias("c"))
                      .withColumn("nkeys", F.lit(0)))
    table_coc = _count_of_counts(per_shared_row, "t", {j: 1 << b for j, b in enumerate(bits)}) if shared else {}
    _add_unshared_tables(table_coc, feature_coc, feature_table, shared)
    accesses = {r["f"]: r["accesses"] for r in ids.groupBy("f").agg(F.sum("count").alias("accesses")).collect()}
    # the sketches are a few KiB per feature: collected once, so the second pass runs once
    collected = [(r["code"] & 0xFFFF, feature_table[r["code"] & 0xFFFF], r["ids"], r["rows"])
                 for r in sketches.collect()]
    small = spark.createDataFrame(collected, "f int, t int, ids binary, rows binary")
    totals: dict = {}
    for level, table_of in (("f", feature_table), ("t", range(len(bits)))):
        for r in small.groupBy(level).agg(F.hll_sketch_estimate(F.hll_union_agg("ids")).alias("ids"),
                                          F.hll_sketch_estimate(F.hll_union_agg("rows")).alias("rows")).collect():
            index = r[level]
            features = [index] if level == "f" else [i for i, j in enumerate(feature_table) if j == index]
            # a table whose rows are all kept counts them exactly (None: from its count-of-counts)
            rows = r["rows"] if bits[table_of[index]] else None
            totals[(level, index)] = (sum(accesses.get(i, 0) for i in features), r["ids"], rows)
    return feature_coc, table_coc, totals


def _check_rejects(model: ModelConfig, rejects: dict, bad_rows: int, input_rows: int, limit: float) -> None:
    columns = reject_columns(model)
    worst_column, worst = "*", bad_rows
    per_column: dict[int, int] = {}
    for (column, reason), n in rejects.items():
        if REJECT_REASONS[reason] != "null_id":
            per_column[column] = per_column.get(column, 0) + n
    for column, n in per_column.items():
        if n > worst:
            worst_column, worst = columns[column], n
    if input_rows and worst / input_rows > limit:
        what = "unparseable rows" if worst_column == "*" else f"rejected values in column {worst_column!r}"
        raise RecShardError(
            Reason.TOO_MANY_REJECTS,
            f"{worst} {what} out of {input_rows} rows ({worst / input_rows:.2%}), above the limit of {limit:.2%}",
            fixes=("check the input format and the model config's feature types",
                   "raise --max-reject-fraction if such rows are expected"),
            context={"rejected": worst, "rows": input_rows, "column": worst_column})


def _assemble(model, feature_table, pooling, rejects, feature_coc, table_coc, num_samples, cdf_points,
              bad_rows, totals: dict | None) -> dict[str, list[dict]]:
    """The output tables. ``totals`` ((level, index) -> accesses, distinct ids, distinct rows or
    None where every row was counted) come from the approximate mode; the exact mode derives them from count-of-counts."""
    tables = list(model.tables)
    out = {name: [] for name in ("features", "tables", "pooling_histogram", "count_of_counts", "access_cdf",
                                 "rejects")}

    def add_distribution(level: str, name: str, triples, key: tuple,
                         hash_size: int) -> tuple[CountOfCounts, int, int, int]:
        counts, rows, keys = (np.array(v, dtype=np.int64) for v in zip(*triples)) if triples else \
            (np.zeros(0, np.int64),) * 3
        coc = CountOfCounts.of(counts, rows)
        out["count_of_counts"] += [{"level": level, "name": name, "access_count": int(c), "rows": int(r)}
                                   for c, r in zip(coc.counts, coc.rows)]
        points, fractions = access_cdf(coc, cdf_points)
        out["access_cdf"] += [{"level": level, "name": name, "point": p, "rows": int(k), "access_fraction": float(v)}
                              for p, (k, v) in enumerate(zip(points, fractions))]
        if totals is None:
            return coc, coc.total_accesses, int(keys.sum()), coc.unique_rows
        accesses, ids, rows = totals.get(key, (0, 0.0, None))
        ids = round(ids)
        rows = coc.unique_rows if rows is None else round(rows)
        return coc, accesses, ids, min(rows, ids, hash_size)

    columns = reject_columns(model)
    for i, feature in enumerate(model.features):
        table = tables[feature_table[i]]
        coc, accesses, unique_ids, unique_rows = add_distribution(
            "feature", feature.name, feature_coc.get(i, []), ("f", i), table.hash_size)
        if is_multi_hot(feature.type):
            hist = pooling.get(i, {})
        else:
            hist = {1: accesses, 0: num_samples - accesses}
        hist = sorted((p, n) for p, n in hist.items() if n)
        pf = pooling_stats(np.array([p for p, _ in hist], np.int64), np.array([n for _, n in hist], np.int64))
        out["pooling_histogram"] += [{"feature": feature.name, "pooling_factor": p, "samples": n} for p, n in hist]
        mine = {REJECT_REASONS[reason]: n for (column, reason), n in rejects.items() if column == i}
        out["features"].append({
            "feature": feature.name, "table": table.name, "hash_size": table.hash_size,
            "num_samples": num_samples, "present_samples": pf.present_samples, "coverage": pf.coverage,
            "pf_mean": pf.mean, "pf_mean_present": pf.mean_present, "pf_min": pf.min, "pf_max": pf.max,
            "pf_p50": pf.p50, "pf_p90": pf.p90, "pf_p99": pf.p99,
            "total_accesses": accesses, "unique_raw_ids": unique_ids, "unique_rows": unique_rows,
            "expected_unique_rows": expected_unique_rows(table.hash_size, unique_ids),
            "unused_rows": table.hash_size - unique_rows,
            "null_ids": mine.get("null_id", 0),
            "rejected_values": sum(n for reason, n in mine.items() if reason != "null_id"),
        })
    for j, table in enumerate(tables):
        coc, accesses, unique_keys, unique_rows = add_distribution(
            "table", table.name, table_coc.get(j, []), ("t", j), table.hash_size)
        out["tables"].append({
            "table": table.name, "features": list(table.features), "hash_size": table.hash_size,
            "dim": table.dim, "hash": table.hash, "num_samples": num_samples,
            "total_accesses": accesses, "accesses_per_sample": accesses / num_samples,
            "unique_keys": unique_keys, "unique_rows": unique_rows,
            "expected_unique_rows": expected_unique_rows(table.hash_size, unique_keys),
            "unused_rows": table.hash_size - unique_rows,
            "max_row_accesses": int(coc.counts[0]) if len(coc.counts) else 0,
        })
    out["rejects"] = [{"column": columns[c], "reason": REJECT_REASONS[r], "count": n}
                      for (c, r), n in sorted(rejects.items())]
    if bad_rows:
        out["rejects"].append({"column": "*", "reason": "wrong_field_count", "count": bad_rows})
    return out
