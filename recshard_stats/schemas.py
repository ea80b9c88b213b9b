"""Declared schemas of every output table, written once and turned into Spark or Arrow types.

``SCHEMA_VERSION`` changes whenever a table's columns change; readers check it.
"""

from __future__ import annotations

SCHEMA_VERSION = "1"

# table name -> [(column, type)], types in Spark SQL's DDL vocabulary.
TABLES: dict[str, list[tuple[str, str]]] = {
    "features": [
        ("feature", "string"), ("table", "string"), ("hash_size", "bigint"),
        ("num_samples", "bigint"), ("present_samples", "bigint"), ("coverage", "double"),
        ("pf_mean", "double"), ("pf_mean_present", "double"),
        ("pf_min", "bigint"), ("pf_max", "bigint"),
        ("pf_p50", "bigint"), ("pf_p90", "bigint"), ("pf_p99", "bigint"),
        ("total_accesses", "bigint"), ("unique_raw_ids", "bigint"), ("unique_rows", "bigint"),
        ("expected_unique_rows", "double"), ("unused_rows", "bigint"),
        ("null_ids", "bigint"), ("rejected_values", "bigint"),
    ],
    "tables": [
        ("table", "string"), ("features", "array<string>"), ("hash_size", "bigint"),
        ("dim", "int"), ("hash", "string"), ("num_samples", "bigint"),
        ("total_accesses", "bigint"), ("accesses_per_sample", "double"),
        ("unique_keys", "bigint"), ("unique_rows", "bigint"),
        ("expected_unique_rows", "double"), ("unused_rows", "bigint"),
        ("max_row_accesses", "bigint"),
    ],
    "pooling_histogram": [("feature", "string"), ("pooling_factor", "bigint"), ("samples", "bigint")],
    # level is "feature" or "table"; rows accessed exactly access_count times (access_count >= 1).
    "count_of_counts": [("level", "string"), ("name", "string"), ("access_count", "bigint"),
                        ("rows", "bigint")],
    # F(rows) = share of accesses that hit the `rows` hottest rows, at log-spaced points.
    "access_cdf": [("level", "string"), ("name", "string"), ("point", "int"), ("rows", "bigint"),
                   ("access_fraction", "double")],
    # column "*" with reason wrong_field_count is a whole rejected input row.
    "rejects": [("column", "string"), ("reason", "string"), ("count", "bigint")],
    # optional, partitioned by table: access count of every accessed row.
    "row_counts": [("table", "string"), ("row", "bigint"), ("access_count", "bigint")],
}

SMALL_TABLES = ("features", "tables", "pooling_histogram", "count_of_counts", "access_cdf", "rejects")


def spark_schema(name: str):
    from pyspark.sql import types as T

    simple = {"string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType(),
              "double": T.DoubleType(), "array<string>": T.ArrayType(T.StringType(), False)}
    return T.StructType([T.StructField(c, simple[t], True) for c, t in TABLES[name]])


def arrow_schema(name: str):
    import pyarrow as pa

    simple = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(),
              "array<string>": pa.list_(pa.field("element", pa.string(), nullable=False))}  # as Spark writes it
    return pa.schema([(c, simple[t]) for c, t in TABLES[name]])
