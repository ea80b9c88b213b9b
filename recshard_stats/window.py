"""A window of days: the last N daily stats partitions merged into one, exactly.

A day profiled with ``--id-counts`` keeps every feature's ids with their access counts (keys as
hashed, :data:`recshard_stats.schemas.TABLES` ``id_counts``), so the window recounts from them
what one profile of all its days' logs would have counted: per-row and per-id counts (unique
ids across days are one id), count-of-counts, CDFs, pooling histograms, coverage, rejects. The
days' records go through the profile's own aggregation
(:func:`recshard_stats.profiler.profile_records`), so a window is a stats partition like a
day's, and solve, remap and report read it unchanged.

With a half-life, each day's counts are weighted ``0.5 ** (age / half_life)`` (age: days before
the window's last) and rounded to whole accesses after the merge: an id whose weighted accesses
are under one half is forgotten. Counts stay integers, so the held-out (Good-Turing) estimate
still applies, approximately; without a half-life the merge is exact.
"""

from __future__ import annotations

import dataclasses
import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from recshard_stats.config import ModelConfig
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.hashing import SEED
from recshard_stats.profile_assembly import ProfileLayout
from recshard_stats.record_codes import (
    RecordKind,
    RowOutcome,
    is_multi_hot,
    record_code,
    reject_code,
    reject_columns,
)
from recshard_stats.stats_reader import StatsPartition, check_profiled_with, load_stats


@dataclasses.dataclass(frozen=True)
class WindowDays:
    """The days of a window ending at ``last``: the partitions found (oldest first) and the
    dates that had none."""

    last: str
    found: tuple[StatsPartition, ...]
    missing: tuple[str, ...]

    @property
    def days(self) -> tuple[str, ...]:
        return tuple(p.metadata.ds for p in self.found)


def window_dates(last: str, days: int) -> list[str]:
    """The ``days`` dates ending at ``last``, oldest first."""
    end = datetime.date.fromisoformat(last)
    return [(end - datetime.timedelta(days=age)).isoformat() for age in range(days - 1, -1, -1)]


def find_days(stats_root, last: str, days: int, min_days: int) -> WindowDays:
    """The complete stats partitions ``<stats_root>/ds=<date>`` of the window's dates; fewer than
    ``min_days`` is an error naming the missing days."""
    import pathlib

    root = pathlib.Path(stats_root)
    found, missing = [], []
    for ds in window_dates(last, days):
        path = root / f"ds={ds}"
        if (path / "_SUCCESS").is_file():
            found.append(load_stats(path))
        else:
            missing.append(ds)
    if len(found) < min_days:
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"the {days}-day window ending {last} has {len(found)} of its days under {root}, "
            f"at least {min_days} needed; missing: {', '.join(missing)}",
            fixes=("profile the missing days (with --id-counts)", "or lower --min-days"),
            context={"missing": list(missing)},
        )
    return WindowDays(last, tuple(found), tuple(missing))


def day_weights(days: tuple[str, ...], last: str, half_life_days: float | None) -> dict[str, float]:
    """Each day's weight: 1 without a half-life, else 0.5 ** (days before ``last`` / half-life)."""
    end = datetime.date.fromisoformat(last)
    return {
        ds: 1.0
        if half_life_days is None
        else 0.5 ** ((end - datetime.date.fromisoformat(ds)).days / half_life_days)
        for ds in days
    }


def check_mergeable(window: WindowDays, model: ModelConfig) -> None:
    """Every day was profiled with what a window merges, the same way (exactly, or with the same
    sketch settings), by this model (tables, features, hashes, hash sizes), with this hash seed
    and at one sample fraction; the first day that was not is named."""
    sizes = {t.name: t.hash_size for t in model.tables}
    first = window.found[0].metadata.approximate
    for part in window.found:
        meta, where = part.metadata, f"day {part.metadata.ds} ({part.path})"
        if not meta.id_counts:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{where} has no per-id counts to merge",
                fixes=("profile that day again with --id-counts",),
            )
        if meta.approximate != first:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{where} was profiled "
                + (f"approximately ({meta.approximate})" if meta.approximate else "exactly")
                + f", day {window.found[0].metadata.ds} "
                + (f"approximately ({first})" if first else "exactly"),
                fixes=("profile the window's days the same way (exact, or with the same sketch settings)",),
            )
        if meta.hash_seed != SEED:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{where} was hashed with seed {meta.hash_seed}, this version hashes with {SEED}",
                fixes=("profile that day again",),
            )
        profiled = {t["name"]: t["hash_size"] for t in meta.model.get("tables", [])}
        resized = sorted(n for n in sizes if n in profiled and profiled[n] != sizes[n])
        if resized:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{where} was profiled with table {resized[0]!r} of {profiled[resized[0]]} rows, "
                f"the model config has {sizes[resized[0]]}",
                fixes=("profile that day again with this model config", "or leave it out of the window"),
            )
        try:
            check_profiled_with(part, model)
        except RecShardError as exc:
            raise RecShardError(exc.reason, f"{where}: {exc.message}", fixes=exc.fixes) from None
        missing = sorted(t.name for t in model.tables if t.name not in profiled)
        if missing:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{where} was profiled without table {missing[0]!r}",
                fixes=("profile that day again with this model config",),
            )
    fractions = {p.metadata.sample_fraction for p in window.found}
    if len(fractions) > 1:
        raise RecShardError(
            Reason.STATS_INVALID,
            f"the window's days were profiled at different sample fractions {sorted(fractions)} "
            f"(days {', '.join(f'{p.metadata.ds}: {p.metadata.sample_fraction}' for p in window.found)})",
            fixes=("profile the days at one sample fraction",),
        )


def _small_records(part: StatsPartition, layout: ProfileLayout) -> list[tuple[int, int, int]]:
    """A day's records of every kind but ids, from its small tables: multi-hot pooling
    histograms, rejects and input rows (a single-hot feature's histogram follows from its ids)."""
    index = {f.name: f.index for f in layout.features}
    columns = {name: i for i, name in enumerate(reject_columns(layout.model))}
    out = [
        (record_code(RecordKind.ROW), int(RowOutcome.PARSED), part.metadata.num_samples),
        (record_code(RecordKind.ROW), int(RowOutcome.MALFORMED), part.metadata.rejected_rows),
    ]
    for r in part.rows("pooling_histogram"):
        feature = layout.features[index[r["feature"]]]
        if is_multi_hot(feature.type):
            out.append((record_code(RecordKind.POOLING, feature.index), r["pooling_factor"], r["samples"]))
    for r in part.rows("rejects"):
        if r["column"] != "*":  # "*": the malformed rows, counted above
            out.append(
                (record_code(RecordKind.REJECT), reject_code(columns[r["column"]], r["reason"]), r["count"])
            )
    return out


def window_records(
    spark: SparkSession, window: WindowDays, layout: ProfileLayout, half_life_days: float | None
) -> DataFrame:
    """Records ``(code, key, count)`` of every day of the window, as the profile aggregates
    them (ids with keys already hashed: aggregate with :func:`merge_layout`)."""
    from recshard_stats.spark_io import local_uri

    weights = day_weights(window.days, window.last, half_life_days)
    codes = _feature_codes(spark, layout)
    frames = []
    for part in window.found:
        weight = F.lit(weights[part.metadata.ds])
        ids = (
            spark.read.parquet(local_uri(part.path / "id_counts"))
            .join(F.broadcast(codes), "feature")
            .select("code", "key", F.col("access_count").alias("count"), weight.alias("w"))
        )
        frames += [ids, _small_frame(spark, part, layout).withColumn("w", weight)]
    records = _union(frames)
    if half_life_days is None:
        return records.drop("w")
    return (
        records.groupBy("code", "key")
        .agg(F.round(F.sum(F.col("count") * F.col("w"))).cast("bigint").alias("count"))
        .where(F.col("count") > 0)
    )


def sketched_window(
    spark: SparkSession, window: WindowDays, layout: ProfileLayout
) -> tuple[DataFrame, DataFrame]:
    """Approximate days: their records ``(code, key, count)`` (ids: each sampled row's accesses,
    row -1 the rest) and their HLL sketches ``(code, ids, rows)``, for
    :func:`recshard_stats.profiler.merge_sketched` (which sums and unions them)."""
    from recshard_stats.spark_io import local_uri

    codes = _feature_codes(spark, layout)
    records, sketches = [], []
    for part in window.found:
        records.append(
            spark.read.parquet(local_uri(part.path / "sampled_row_counts"))
            .join(F.broadcast(codes), "feature")
            .select("code", F.col("row").alias("key"), F.col("access_count").alias("count"))
        )
        records.append(_small_frame(spark, part, layout))
        sketches.append(
            spark.read.parquet(local_uri(part.path / "sketches"))
            .join(F.broadcast(codes), "feature")
            .drop("feature")
        )
    return _union(records), _union(sketches)


def _small_frame(spark: SparkSession, part: StatsPartition, layout: ProfileLayout) -> DataFrame:
    """A day's records besides its ids (:func:`_small_records`) as a frame of the records' schema."""
    return spark.createDataFrame(_small_records(part, layout), "code int, key bigint, count bigint")


def _feature_codes(spark: SparkSession, layout: ProfileLayout) -> DataFrame:
    """(feature, code): each feature's name with the code of its id records."""
    return spark.createDataFrame(
        [(f.name, record_code(RecordKind.ID, f.index)) for f in layout.features], "feature string, code int"
    )


def _union(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def merge_layout(model: ModelConfig) -> ProfileLayout:
    """The model's layout for merged records: their keys are hashed already."""
    layout = ProfileLayout.of(model)
    return dataclasses.replace(
        layout, features=tuple(dataclasses.replace(f, hash_ids=False) for f in layout.features)
    )
