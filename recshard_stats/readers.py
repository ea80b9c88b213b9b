"""Input readers: logs -> the *normalized* frame every statistic is computed from.

The normalized frame has, for feature i of the model config (in config order):

- ``k{i}``: the sample's ids for that feature: an array (``array<bigint>``, or
  ``array<string>`` for string ids; null or empty when absent, and it may hold null ids) for
  multi-hot features, a nullable ``bigint`` or ``string`` for single-hot ones. Ids are not
  keys yet: integer ids stay raw (``xxhash64`` is applied once per distinct id after the
  aggregation, see :func:`needs_key_hash`); string and hex ids stay text (an empty one is
  absent, a hex one is validated by the profile's counter, and each distinct text becomes its
  key after the counting: XXH64 of a string, the value of a hex number);
- ``_rejects``: ``array<bigint>`` (or null) of codes ``column << 8 | reason`` for the values
  of this row that were rejected (they count as absent, and are reported per column and
  reason); null ids of a multi-hot feature are counted by the profile itself;
- ``_valid``: false for a row that could not be parsed at all (it is counted, not used).

Codes: :mod:`recshard_stats.record_codes`. Only scalar functions are used per row, so
Spark keeps the whole projection in generated code (a higher-order lambda such as
``array_compact``'s filter is interpreted: 2.5x slower in issue 17's measurement); the one exception is a
CSV list of integers, which is validated element by element.
Pure DataFrame -> DataFrame code: reading files and the SparkSession belong to ``jobs/``.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from recshard_stats.config import CRITEO_DENSE, CRITEO_SPARSE, ModelConfig
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.record_codes import INT_PATTERN, criteo_integer_checks, is_multi_hot, reject_code

CRITEO_COLUMNS = ("label", *CRITEO_DENSE, *CRITEO_SPARSE)  # a Criteo line's fields, in order
CRITEO_FIELDS = len(CRITEO_COLUMNS)


def _empty() -> Column:
    return F.array().cast("array<bigint>")


def _reject(column: int, reason: str, times: Column | None = None) -> Column:
    return _rejected(reject_code(column, reason), times)


def _rejected(code: int, times: Column | None = None) -> Column:
    """A row's reject codes: ``code``, once or ``times`` times."""
    value = F.lit(code).cast("bigint")
    return F.array(value) if times is None else F.array_repeat(value, times)


def _ids(value: Column, feature_type: str) -> Column:
    """Null ids of a multi-hot feature (and empty strings) stay in, string and hex ids stay text:
    the profile's counter drops absent values, counts null ids and rejects what is not hex;
    each distinct text becomes its key after the counting."""
    if is_multi_hot(feature_type):
        return value.cast("array<string>" if feature_type == "array<string>" else "array<bigint>")
    return value if feature_type in ("string", "hex") else value.cast("bigint")


def _normalize(
    df: DataFrame, values: list[Column], model: ModelConfig, rejects: list[Column], valid: Column
) -> DataFrame:
    ids = [
        _ids(value, feature.type).alias(f"k{i}")
        for i, (feature, value) in enumerate(zip(model.features, values, strict=True))
    ]
    all_rejects = F.concat(*rejects) if rejects else F.lit(None).cast("array<bigint>")
    return df.select(*ids, all_rejects.alias("_rejects"), valid.alias("_valid"))


_PARQUET_TYPES = {
    "array<int64>": (T.ArrayType,),
    "array<string>": (T.ArrayType,),
    "int64": (T.LongType, T.IntegerType, T.ShortType, T.ByteType),
    "string": (T.StringType,),
    "hex": (T.StringType,),
}


def check_parquet_schema(schema: T.StructType, model: ModelConfig, source: str) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    for feature in model.features:
        if feature.name not in fields:
            raise RecShardError(
                Reason.SCHEMA_MISMATCH,
                f"{source}: feature column {feature.name!r} (type {feature.type}) is missing from the logs",
                fixes=(f"columns present: {sorted(fields)[:20]}", "fix the model config's feature names"),
            )
        found = fields[feature.name]
        ok = isinstance(found, _PARQUET_TYPES[feature.type])
        if isinstance(found, T.ArrayType) and feature.type == "array<int64>":
            ok = isinstance(found.elementType, (T.LongType, T.IntegerType))
        if isinstance(found, T.ArrayType) and feature.type == "array<string>":
            ok = isinstance(found.elementType, T.StringType)
        if not ok:
            raise RecShardError(
                Reason.SCHEMA_MISMATCH,
                f"{source}: column {feature.name!r} has type {found.simpleString()}, "
                f"model config says {feature.type}",
                fixes=("change the feature's type in the model config",),
            )


def parquet_read_schema(model: ModelConfig) -> T.StructType:
    """The features' columns as the profile reads them from Parquet: ids as bigint or string."""
    single = {"int64": T.LongType(), "string": T.StringType(), "hex": T.StringType()}
    types = {
        **single,
        "array<int64>": T.ArrayType(T.LongType()),
        "array<string>": T.ArrayType(T.StringType()),
    }
    return T.StructType([T.StructField(f.name, types[f.type]) for f in model.features])


def normalize_parquet(df: DataFrame, model: ModelConfig, source: str = "input") -> DataFrame:
    """Parquet logs with one column per feature (array<int64>, array<string>, int64 or string)."""
    check_parquet_schema(df.schema, model, source)
    return _normalize(df, [F.col(f"`{f.name}`") for f in model.features], model, [], F.lit(True))


def normalize_criteo_tsv(lines: DataFrame, model: ModelConfig) -> DataFrame:
    """Raw Criteo lines (``value`` column of ``spark.read.text``): label, I1..I13, C1..C26,
    tab separated, empty = missing. A line without exactly 40 fields is rejected whole;
    a non-hex categorical or a non-integer label/dense value is rejected alone."""
    fields = F.split(F.col("value"), "\t", -1)
    # F.get returns null past the end (plain indexing raises under ANSI mode on short rows).
    values = [F.get(fields, CRITEO_COLUMNS.index(f.name)) for f in model.features]
    extra = []
    for position, code in criteo_integer_checks(model):
        v = F.get(fields, position)
        bad = v.isNotNull() & (v != "") & ~v.rlike(INT_PATTERN)
        extra.append(F.when(bad, _rejected(code)).otherwise(_empty()))
    valid = F.size(fields) == CRITEO_FIELDS
    return _normalize(lines, values, model, extra, valid)


CORRUPT_COLUMN = "_corrupt_record"


def check_csv_columns(columns: list[str], model: ModelConfig, source: str) -> None:
    missing = [f.name for f in model.features if f.name not in columns]
    assert model.csv is not None, "a CSV header checked against a model of another format"
    if missing:
        raise RecShardError(
            Reason.SCHEMA_MISMATCH,
            f"{source}: feature column(s) {missing} are not in the header {columns[:20]}",
            fixes=(
                "the first line of each file must name the columns",
                "check the model config's feature names",
                f"check input.separator ({model.csv.separator!r})",
            ),
        )


UNDECODABLE = "\ufffd"  # what Java's decoders put in place of bytes the encoding does not map


def _csv_value(
    value: Column, index: int, feature_type: str, list_separator: str
) -> tuple[Column, Column | None]:
    """A CSV field -> the value the typed path takes (as Parquet would hold it), and the rejects
    only text can have (an integer id that is not one). Empty = absent, for every type; in a
    list (``a|b|c``) an empty element is a null id."""
    present = value.isNotNull() & (value != "")
    if feature_type in ("int64", "array<int64>"):
        if feature_type == "int64":
            ok = _is_int64(value)
            return F.when(present & ok, value.try_cast("bigint")), F.when(
                present & ~ok, _reject(index, "not_integer")
            ).otherwise(_empty())
        parts = F.when(present, F.split(value, re.escape(list_separator), -1))
        kept = F.filter(parts, lambda x: (x == "") | _is_int64(x))
        bad = F.coalesce(F.size(parts) - F.size(kept), F.lit(0))
        return F.transform(kept, lambda x: F.when(x != "", x.try_cast("bigint"))), _reject(
            index, "not_integer", bad
        )
    # a byte the file's encoding cannot decode comes out of Spark's reader as U+FFFD: the value is
    # a reject, never the id of a replacement character
    if feature_type == "array<string>":
        parts = F.when(present, F.split(value, re.escape(list_separator), -1))
        kept = F.filter(parts, lambda x: ~x.contains(UNDECODABLE))
        bad = F.coalesce(F.size(parts) - F.size(kept), F.lit(0))
        return kept, _reject(index, "undecodable", bad)
    undecodable = present & value.contains(UNDECODABLE)
    return F.when(~undecodable, value), F.when(undecodable, _reject(index, "undecodable")).otherwise(_empty())


def _is_int64(text: Column) -> Column:
    """Digits, optionally signed, within int64 (raw ids use all 19 digits)."""
    return text.rlike("^[+-]?[0-9]{1,19}$") & text.try_cast("bigint").isNotNull()


def normalize_csv(df: DataFrame, model: ModelConfig) -> DataFrame:
    """CSV/TSV logs read with every column as a string and Spark's ``_corrupt_record`` (a line
    with another number of fields than the header): the features parsed by their declared type,
    multi-hot fields split by ``input.list_separator``."""
    assert model.csv is not None, "CSV logs read for a model of another format"
    values, extra = [], []
    for i, feature in enumerate(model.features):
        value, rejects = _csv_value(F.col(f"`{feature.name}`"), i, feature.type, model.csv.list_separator)
        values.append(value)
        extra += [] if rejects is None else [rejects]
    return _normalize(df, values, model, extra, F.col(CORRUPT_COLUMN).isNull())
