"""The stats partition's contract: declared schemas of every output table (turned into Spark or
Arrow types), the typed ``metadata.json``, and :func:`output_row`, which builds a row with
exactly the declared columns.

``SCHEMA_VERSION`` changes whenever a table's columns change; readers check it.
"""

from __future__ import annotations

import dataclasses

SCHEMA_VERSION = "1"

# table name -> [(column, type)], types in Spark SQL's DDL vocabulary.
TABLES: dict[str, list[tuple[str, str]]] = {
    "features": [
        ("feature", "string"),
        ("table", "string"),
        ("hash_size", "bigint"),
        ("num_samples", "bigint"),
        ("present_samples", "bigint"),
        ("coverage", "double"),
        ("pf_mean", "double"),
        ("pf_mean_present", "double"),
        ("pf_min", "bigint"),
        ("pf_max", "bigint"),
        ("pf_p50", "bigint"),
        ("pf_p90", "bigint"),
        ("pf_p99", "bigint"),
        ("total_accesses", "bigint"),
        ("unique_raw_ids", "bigint"),
        ("unique_rows", "bigint"),
        ("expected_unique_rows", "double"),
        ("unused_rows", "bigint"),
        ("null_ids", "bigint"),
        ("rejected_values", "bigint"),
    ],
    "tables": [
        ("table", "string"),
        ("features", "array<string>"),
        ("hash_size", "bigint"),
        ("dim", "int"),
        ("hash", "string"),
        ("num_samples", "bigint"),
        ("total_accesses", "bigint"),
        ("accesses_per_sample", "double"),
        ("unique_keys", "bigint"),
        ("unique_rows", "bigint"),
        ("expected_unique_rows", "double"),
        ("unused_rows", "bigint"),
        ("max_row_accesses", "bigint"),
    ],
    "pooling_histogram": [("feature", "string"), ("pooling_factor", "bigint"), ("samples", "bigint")],
    # level is "feature" or "table"; rows accessed exactly access_count times (access_count >= 1).
    "count_of_counts": [
        ("level", "string"),
        ("name", "string"),
        ("access_count", "bigint"),
        ("rows", "bigint"),
    ],
    # F(rows) = share of accesses that hit the `rows` hottest rows, at log-spaced points.
    "access_cdf": [
        ("level", "string"),
        ("name", "string"),
        ("point", "int"),
        ("rows", "bigint"),
        ("access_fraction", "double"),
    ],
    # column "*" with reason wrong_field_count is a whole rejected input row.
    "rejects": [("column", "string"), ("reason", "string"), ("count", "bigint")],
    # optional, partitioned by table: access count of every accessed row.
    "row_counts": [("table", "string"), ("row", "bigint"), ("access_count", "bigint")],
    # optional: access count of every id of every feature (key: the id as hashed to its row, so
    # row = key mod hash_size); what `recshard window` merges days from
    "id_counts": [("feature", "string"), ("key", "bigint"), ("access_count", "bigint")],
    # approximate mode's instead: each feature's accesses of each sampled row (row -1: all rows
    # outside the sample), and its HLL sketches of ids and (sampled tables) rows
    "sampled_row_counts": [("feature", "string"), ("row", "bigint"), ("access_count", "bigint")],
    "sketches": [("feature", "string"), ("ids", "binary"), ("rows", "binary")],
}

SMALL_TABLES = ("features", "tables", "pooling_histogram", "count_of_counts", "access_cdf", "rejects")


def spark_schema(name: str):
    from pyspark.sql import types as T

    simple = {
        "string": T.StringType(),
        "bigint": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "array<string>": T.ArrayType(T.StringType(), False),
        "binary": T.BinaryType(),
    }
    return T.StructType([T.StructField(c, simple[t], True) for c, t in TABLES[name]])


def arrow_schema(name: str):
    import pyarrow as pa

    simple = {
        "string": pa.string(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "array<string>": pa.list_(pa.field("element", pa.string(), nullable=False)),
        "binary": pa.binary(),
    }  # as Spark writes it
    return pa.schema([(c, simple[t]) for c, t in TABLES[name]])


def output_row(table: str, /, **values) -> dict:
    """A row of output table ``table``: every declared column, no other (a misspelt column is an
    error here, not a silent null in the Parquet file)."""
    columns = [c for c, _ in TABLES[table]]
    if set(values) != set(columns):
        raise KeyError(
            f"{table} row: missing {sorted(set(columns) - set(values))}, "
            f"undeclared {sorted(set(values) - set(columns))}"
        )
    return {c: values[c] for c in columns}


@dataclasses.dataclass(frozen=True)
class ApproximateMetadata:
    """How an approximate profile was computed, and the error bound of its distinct counts."""

    hll_lg_config_k: int
    distinct_count_relative_standard_error: float
    distinct_count_error_bound_99_7: float
    row_sample_bits: int
    row_sample_rate: dict  # table -> share of its rows counted (count-of-counts scaled by the inverse)


@dataclasses.dataclass(frozen=True)
class WindowMetadata:
    """A window partition's days: merged from the stats partitions of ``days`` (oldest first);
    with ``half_life_days`` each day's counts were weighted 0.5 ** (age / half-life), age in days
    before the window's last day, and rounded (a row or id seen keeps a count of at least 1)."""

    days: tuple[str, ...]
    missing_days: tuple[str, ...]  # days of the window that had no stats partition
    half_life_days: float | None


@dataclasses.dataclass(frozen=True)
class StatsMetadata:
    """``metadata.json`` of a stats partition: what was profiled, how, and what was left out."""

    ds: str
    created_at: str
    input_paths: tuple[str, ...]
    input_format: str
    sample_fraction: float
    sample_seed: int
    input_rows: int
    rejected_rows: int
    skipped_files: tuple[str, ...]  # corrupt (with --skip-corrupt-files) or empty input files left out
    num_samples: int
    hash_functions: dict  # table -> "mod" | "xxhash64"
    hash_seed: int
    cdf_points: int
    row_counts: bool
    approximate: ApproximateMetadata | None
    spark_version: str
    model: dict  # the model config as recshard_stats.config.ModelConfig.to_dict gives it
    model_digest: str
    schema_version: str = SCHEMA_VERSION
    # feature -> its outlying largest pooling factor
    pooling_outliers: dict = dataclasses.field(default_factory=dict)
    ignored_files: tuple[str, ...] = ()  # input files whose names say they are not logs (README, *.json, ...)
    # the partition has what a window merges: id_counts (exact), or sampled_row_counts and
    # sketches (approximate)
    id_counts: bool = False
    window: WindowMetadata | None = None  # set on a window partition (`recshard window`)
