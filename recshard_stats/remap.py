"""Per-row access counts -> each table's remap (hottest rows first), as DataFrame transforms.

A row's new index is ``rows hotter than it + its rank among rows of equal count (by row id)``.
The first term comes from the table's count-of-counts (tiny, built on the driver from the
stats partition and broadcast); the second is a window over ``(table, access_count)``, so no
table is ever collected or sorted on the driver. Rows never seen are not written: their
index follows by rule (see :mod:`recshard_stats.manifest`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from recshard_stats.stats_reader import StatsPartition


def hotter_rows(spark: SparkSession, stats: StatsPartition, tables: list[str]) -> DataFrame:
    """(table, access_count, hotter): rows of the table accessed more often than access_count."""
    records = []
    for name in tables:
        coc = stats.count_of_counts("table", name)  # hottest first
        hotter = 0
        for count, rows in zip(coc.counts.tolist(), coc.rows.tolist(), strict=True):
            records.append((name, count, hotter))
            hotter += rows
    return spark.createDataFrame(records, "table string, access_count bigint, hotter bigint")


def remap_rows(row_counts: DataFrame, hotter: DataFrame) -> DataFrame:
    """(table, row, access_count) -> (table, row, index, access_count); ties by row ascending."""
    within = Window.partitionBy("table", "access_count").orderBy("row")
    return (
        row_counts.join(F.broadcast(hotter), ["table", "access_count"])
        .withColumn("index", F.col("hotter") + F.row_number().over(within) - 1)
        .select("table", "row", "index", "access_count")
    )


def unseen_hbm_below(remapped: DataFrame, spill: DataFrame) -> DataFrame:
    """(table, below_row): the never-seen rows under below_row are exactly ``k`` rows.

    spill: (table, k, n_seen) for tables whose HBM part takes k > 0 never-seen rows. A seen
    row s with rank r (seen rows below it) has ``s - r`` unseen rows below it; below_row is
    ``k + r`` for the first s with ``s - r >= k``, else ``k + n_seen``. Only these tables'
    seen rows are ranked."""
    by_row = Window.partitionBy("table").orderBy("row")
    ranked = remapped.join(F.broadcast(spill.select("table", "k")), "table").withColumn(
        "rank", F.row_number().over(by_row) - 1
    )
    first = (
        ranked.where(F.col("row") - F.col("rank") >= F.col("k"))
        .groupBy("table")
        .agg(F.min("rank").alias("rank"))
    )
    return spill.join(first, "table", "left").select(
        "table", (F.col("k") + F.coalesce(F.col("rank"), F.col("n_seen"))).alias("below_row")
    )


def empty_remap_table():
    """The remap of a table no row of which was seen: no rows (every row keeps its place)."""
    import pyarrow as pa

    return pa.table(
        {
            "row": pa.array([], pa.int64()),
            "index": pa.array([], pa.int64()),
            "access_count": pa.array([], pa.int64()),
        }
    )
