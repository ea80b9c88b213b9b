"""The profile: normalized logs -> every per-feature and per-table statistic of DESIGN.md.

Passes over the input: **one**. Each sample becomes a small array of records
``(code, key)`` (see :func:`_records`: ids, multi-hot pooling factors, rejected values,
one per row) and a single ``groupBy(code, key).count()`` aggregates them. Everything after works on that aggregate, whose size
is the number of distinct ids, not of samples: hashing to rows, per-row access counts,
count-of-counts. Only count-of-counts and pooling histograms (a few thousand numbers per
feature, independent of input size) reach the driver.
"""

from __future__ import annotations

import dataclasses
import logging

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


def _count_of_counts(per_row: DataFrame, by: str) -> dict:
    """(by, row, c, nkeys) -> {by: (counts, rows, keys)} on the driver (tiny)."""
    out: dict = {}
    for r in per_row.groupBy(by, "c").agg(F.count("*").alias("rows"), F.sum("nkeys").alias("keys")).collect():
        out.setdefault(r[by], []).append((r["c"], r["rows"], r["keys"]))
    return out


def profile(spark: SparkSession, normalized: DataFrame, model: ModelConfig, *,
            cdf_points: int = DEFAULT_CDF_POINTS, with_row_counts: bool = False,
            max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION) -> ProfileResult:
    features = [f.name for f in model.features]
    tables = list(model.tables)
    table_index = {t.name: j for j, t in enumerate(tables)}
    feature_table = [table_index[model.table_of(name).name] for name in features]

    agg = (_records(normalized, model).groupBy("code", "key").count()
           .select(F.shiftright("code", 16).alias("kind"), F.col("code").bitwiseAND(0xFFFF).alias("f"), "key", "count"))
    agg = agg.persist(StorageLevel.MEMORY_AND_DISK)
    cached = [agg]
    try:
        log.info("profile: aggregating %d features (one pass over the input)", len(features))
        pooling: dict[int, dict[int, int]] = {}
        rejects: dict[tuple[int, int], int] = {}
        row_kinds = {0: 0, 1: 0}
        for r in agg.where(F.col("kind") != ID).collect():
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

        conf = spark.createDataFrame(
            [(i, feature_table[i], tables[feature_table[i]].hash_size,
              needs_key_hash(f.type, tables[feature_table[i]].hash)) for i, f in enumerate(model.features)],
            "f int, t int, hash_size bigint, hash_ids boolean")
        # Integer ids that hash with xxhash64 are hashed here, once per distinct id.
        ids = (agg.where(F.col("kind") == ID).join(F.broadcast(conf), "f")
               .withColumn("key", F.when(F.col("hash_ids"), F.xxhash64("key")).otherwise(F.col("key"))))
        per_feature_row = (ids.withColumn("row", F.pmod("key", "hash_size"))
                           .groupBy("f", "t", "row").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys")))
        shared = {j for j, t in enumerate(tables) if len(t.features) > 1}
        # A table fed by several features: the same key from two features is one row and one key.
        per_shared_row = (ids.where(F.col("t").isin(*shared)).groupBy("t", "key", "hash_size")
                          .agg(F.sum("count").alias("count"))
                          .withColumn("row", F.pmod("key", "hash_size"))
                          .groupBy("t", "row").agg(F.sum("count").alias("c"), F.count("*").alias("nkeys")))
        per_feature_row = per_feature_row.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(per_feature_row)
        feature_coc = _count_of_counts(per_feature_row, "f")
        table_coc = _count_of_counts(per_shared_row, "t") if shared else {}
        for i, j in enumerate(feature_table):
            if j not in shared and i in feature_coc:
                table_coc[j] = feature_coc[i]

        row_counts = None
        if with_row_counts:
            per_table_row = per_feature_row.where(~F.col("t").isin(*shared)).select("t", "row", "c") if shared \
                else per_feature_row.select("t", "row", "c")
            if shared:
                per_table_row = per_table_row.unionByName(per_shared_row.select("t", "row", "c"))
            names = spark.createDataFrame([(j, t.name) for j, t in enumerate(tables)], "t int, table string")
            row_counts = (per_table_row.join(F.broadcast(names), "t")
                          .select("table", "row", F.col("c").alias("access_count")))
        out = _assemble(model, feature_table, pooling, rejects, feature_coc, table_coc, num_samples,
                        cdf_points, bad_rows)
        result = ProfileResult(out, row_counts, input_rows, bad_rows, tuple(cached))
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise
    if row_counts is None:
        result.release()
    return result


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
              bad_rows) -> dict[str, list[dict]]:
    tables = list(model.tables)
    out = {name: [] for name in ("features", "tables", "pooling_histogram", "count_of_counts", "access_cdf",
                                 "rejects")}

    def add_distribution(level: str, name: str, triples) -> tuple[CountOfCounts, int]:
        counts, rows, keys = (np.array(v, dtype=np.int64) for v in zip(*triples)) if triples else \
            (np.zeros(0, np.int64),) * 3
        coc = CountOfCounts.of(counts, rows)
        out["count_of_counts"] += [{"level": level, "name": name, "access_count": int(c), "rows": int(r)}
                                   for c, r in zip(coc.counts, coc.rows)]
        points, fractions = access_cdf(coc, cdf_points)
        out["access_cdf"] += [{"level": level, "name": name, "point": p, "rows": int(k), "access_fraction": float(v)}
                              for p, (k, v) in enumerate(zip(points, fractions))]
        return coc, int(keys.sum())

    columns = reject_columns(model)
    for i, feature in enumerate(model.features):
        table = tables[feature_table[i]]
        coc, unique_ids = add_distribution("feature", feature.name, feature_coc.get(i, []))
        if is_multi_hot(feature.type):
            hist = pooling.get(i, {})
        else:
            hist = {1: coc.total_accesses, 0: num_samples - coc.total_accesses}
        hist = sorted((p, n) for p, n in hist.items() if n)
        pf = pooling_stats(np.array([p for p, _ in hist], np.int64), np.array([n for _, n in hist], np.int64))
        out["pooling_histogram"] += [{"feature": feature.name, "pooling_factor": p, "samples": n} for p, n in hist]
        mine = {REJECT_REASONS[reason]: n for (column, reason), n in rejects.items() if column == i}
        out["features"].append({
            "feature": feature.name, "table": table.name, "hash_size": table.hash_size,
            "num_samples": num_samples, "present_samples": pf.present_samples, "coverage": pf.coverage,
            "pf_mean": pf.mean, "pf_mean_present": pf.mean_present, "pf_min": pf.min, "pf_max": pf.max,
            "pf_p50": pf.p50, "pf_p90": pf.p90, "pf_p99": pf.p99,
            "total_accesses": coc.total_accesses, "unique_raw_ids": unique_ids, "unique_rows": coc.unique_rows,
            "expected_unique_rows": expected_unique_rows(table.hash_size, unique_ids),
            "unused_rows": table.hash_size - coc.unique_rows,
            "null_ids": mine.get("null_id", 0),
            "rejected_values": sum(n for reason, n in mine.items() if reason != "null_id"),
        })
    for j, table in enumerate(tables):
        coc, unique_keys = add_distribution("table", table.name, table_coc.get(j, []))
        out["tables"].append({
            "table": table.name, "features": list(table.features), "hash_size": table.hash_size,
            "dim": table.dim, "hash": table.hash, "num_samples": num_samples,
            "total_accesses": coc.total_accesses, "accesses_per_sample": coc.total_accesses / num_samples,
            "unique_keys": unique_keys, "unique_rows": coc.unique_rows,
            "expected_unique_rows": expected_unique_rows(table.hash_size, unique_keys),
            "unused_rows": table.hash_size - coc.unique_rows,
            "max_row_accesses": int(coc.counts[0]) if len(coc.counts) else 0,
        })
    out["rejects"] = [{"column": columns[c], "reason": REJECT_REASONS[r], "count": n}
                      for (c, r), n in sorted(rejects.items())]
    if bad_rows:
        out["rejects"].append({"column": "*", "reason": "wrong_field_count", "count": bad_rows})
    return out
