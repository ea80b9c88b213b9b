import numpy as np
from pyspark.sql import functions as F

from recshard_stats.hashing import keys_of, rows_of, xxhash64_int64, xxhash64_strings

INTS = [0, 1, -1, 7, 2**31, -(2**31), 2**62 + 12345, -(2**63), 2**63 - 1, 123456789012345]
STRINGS = ["", "a", "abc", "hello world", "é漢字", "x" * 31, "y" * 32, "z" * 33, "q" * 100, "0f3a9c"]


def test_int_twin_matches_spark(spark):
    df = spark.createDataFrame([(v,) for v in INTS], "v bigint")
    spark_keys = [r[0] for r in df.select(F.xxhash64("v")).collect()]
    assert xxhash64_int64(INTS).tolist() == spark_keys


def test_string_twin_matches_spark(spark):
    df = spark.createDataFrame([(v,) for v in STRINGS], "v string")
    spark_keys = [r[0] for r in df.select(F.xxhash64("v")).collect()]
    assert xxhash64_strings(STRINGS).tolist() == spark_keys


def test_rows_match_spark_pmod_for_negative_keys(spark):
    keys = xxhash64_int64(INTS)
    df = spark.createDataFrame([(int(k),) for k in keys], "k bigint")
    spark_rows = [r[0] for r in df.select(F.pmod("k", F.lit(1000003))).collect()]
    assert rows_of(keys, 1000003).tolist() == spark_rows
    assert all(0 <= r < 1000003 for r in spark_rows)


def test_keys_of_each_type():
    assert keys_of(["ff", "10"], "hex", "mod").tolist() == [255, 16]
    assert keys_of([5, -5], "int64", "mod").tolist() == [5, -5]
    assert keys_of([5], "int64", "xxhash64").tolist() == xxhash64_int64([5]).tolist()
    assert rows_of(np.array([-3, 13]), 10).tolist() == [7, 3]
