"""Drift: the newest day's statistics against a reference (a window of the days before it), and
how the published plan's HBM rows serve the newest day.

Per feature: coverage change; the distance between the pooling-factor distributions, as
**total variation** (half the L1 distance between the two normalised histograms: 0 same, 1
disjoint); the share of the day's distinct ids, and of its accesses, that the reference never
saw. Per table: the share of the day's accesses the published plan's HBM rows would serve,
beside what the plan predicted. Each beyond its threshold (:class:`DriftThresholds`, from a
config file) is an alert. The Spark side is two joins on per-id counts
(:func:`new_ids`, :func:`table_row_counts`); the rest is plain Python.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from recshard_stats.config import read_config_file
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.stats_reader import StatsPartition
from recshard_stats.typed_json import DecodeError, from_plain

DRIFT_NAME = "drift.json"
DEFAULT_THRESHOLDS = pathlib.Path(__file__).parent / "conf" / "drift.yaml"  # conf/drift.yaml


@dataclasses.dataclass(frozen=True)
class DriftThresholds:
    """Beyond any of these a feature or table is an alert (shares and distances in [0, 1])."""

    coverage_change: float  # |day coverage - reference coverage|
    pooling_total_variation: float
    new_id_access_share: float  # share of the day's accesses to ids the reference never saw
    hbm_share_drop: float  # predicted HBM share of the published plan - the day's


def load_thresholds(path) -> DriftThresholds:
    """A thresholds file: every field of :class:`DriftThresholds`, each in [0, 1]."""
    data = read_config_file(path)
    names = [f.name for f in dataclasses.fields(DriftThresholds)]
    unknown, missing = sorted(set(data) - set(names)), [n for n in names if n not in data]
    if unknown or missing:
        raise RecShardError(
            Reason.CONFIG_INVALID,
            f"{path}: "
            + "; ".join(
                ([f"unknown keys {unknown}"] if unknown else [])
                + ([f"missing keys {missing}"] if missing else [])
            ),
            fixes=(f"the keys are {names}",),
        )
    for name in names:
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise RecShardError(
                Reason.CONFIG_INVALID, f"{path}: {name} must be a number in [0, 1], got {value!r}"
            )
    return DriftThresholds(**{n: float(data[n]) for n in names})


@dataclasses.dataclass(frozen=True)
class FeatureDrift:
    feature: str
    coverage: float  # on the newest day
    reference_coverage: float
    pooling_total_variation: float
    ids: int  # distinct ids on the newest day
    new_ids: int  # of them, ids the reference never saw
    accesses: int
    new_id_accesses: int

    @property
    def coverage_change(self) -> float:
        return self.coverage - self.reference_coverage

    @property
    def new_id_share(self) -> float:
        return self.new_ids / self.ids if self.ids else 0.0

    @property
    def new_id_access_share(self) -> float:
        return self.new_id_accesses / self.accesses if self.accesses else 0.0


@dataclasses.dataclass(frozen=True)
class TableDrift:
    table: str
    accesses: int  # on the newest day
    hbm_accesses: int | None  # of them, served by the published plan's HBM rows (None: no plan)
    predicted_hbm_share: float | None  # what the published plan predicted

    @property
    def hbm_share(self) -> float | None:
        if self.hbm_accesses is None:
            return None
        return self.hbm_accesses / self.accesses if self.accesses else 1.0


@dataclasses.dataclass(frozen=True)
class DriftReport:
    """``drift.json``: the newest day against the reference, and the alerts."""

    ds: str
    day: str  # the newest day's stats partition
    reference: str | None  # the reference partition (a window of earlier days, or one day); None: none yet
    reference_days: tuple[str, ...]
    published_manifest: str | None
    thresholds: DriftThresholds
    features: tuple[FeatureDrift, ...]
    tables: tuple[TableDrift, ...]
    alerts: tuple[str, ...]


def load_drift(path) -> DriftReport:
    try:
        return from_plain(DriftReport, json.loads(pathlib.Path(path).read_text()))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, DecodeError) as exc:
        raise RecShardError(
            Reason.INPUT_CORRUPT,
            f"{path} is not a drift report written by `recshard drift` ({exc})",
            fixes=("run `recshard drift` again",),
        ) from None


def total_variation(a: dict[int, int], b: dict[int, int]) -> float:
    """Half the L1 distance between two histograms, each normalised to 1 (0 when one is empty)."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 0.0
    return 0.5 * sum(abs(a.get(k, 0) / na - b.get(k, 0) / nb) for k in set(a) | set(b))


def _histograms(stats: StatsPartition) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for r in stats.rows("pooling_histogram"):
        out.setdefault(r["feature"], {})[r["pooling_factor"]] = r["samples"]
    return out


def new_ids(spark, day_ids, reference_ids):
    """Per feature: the day's distinct ids and accesses, and those of ids the reference lacks.
    Both frames: (feature, key, access_count), one row per id."""
    from pyspark.sql import functions as F

    seen = reference_ids.select("feature", "key", F.lit(True).alias("seen"))
    new = F.col("seen").isNull()
    return (
        day_ids.join(seen, ["feature", "key"], "left")
        .groupBy("feature")
        .agg(
            F.count("*").alias("ids"),
            F.sum(F.when(new, 1).otherwise(0)).alias("new_ids"),
            F.sum("access_count").alias("accesses"),
            F.sum(F.when(new, F.col("access_count")).otherwise(0)).alias("new_id_accesses"),
        )
    )


def table_row_counts(spark, day_ids, model):
    """(table, row, access_count) from per-id counts: a table's row sums its features' ids."""
    from pyspark.sql import functions as F

    tables = spark.createDataFrame(
        [(f.name, model.table_of(f.name).name, model.table_of(f.name).hash_size) for f in model.features],
        "feature string, table string, hash_size bigint",
    )
    return (
        day_ids.join(F.broadcast(tables), "feature")
        .groupBy("table", F.pmod("key", "hash_size").alias("row"))
        .agg(F.sum("access_count").alias("access_count"))
    )


def compare(
    day: StatsPartition,
    reference: StatsPartition,
    id_drift: dict[str, dict],
    hbm: dict[str, tuple[int, int]] | None,
    predicted: dict[str, float] | None,
    thresholds: DriftThresholds,
    published_manifest: str | None,
) -> DriftReport:
    """The report from the two partitions' small tables, the per-feature id counts of
    :func:`new_ids` and, with a published plan, per table (accesses, HBM accesses)."""
    day_features = {r["feature"]: r for r in day.rows("features")}
    reference_features = {r["feature"]: r for r in reference.rows("features")}
    day_hist, reference_hist = _histograms(day), _histograms(reference)
    features = []
    for name, row in day_features.items():
        ids = id_drift.get(name, {"ids": 0, "new_ids": 0, "accesses": 0, "new_id_accesses": 0})
        features.append(
            FeatureDrift(
                feature=name,
                coverage=row["coverage"],
                reference_coverage=reference_features[name]["coverage"]
                if name in reference_features
                else 0.0,
                pooling_total_variation=total_variation(day_hist.get(name, {}), reference_hist.get(name, {})),
                ids=ids["ids"],
                new_ids=ids["new_ids"],
                accesses=ids["accesses"],
                new_id_accesses=ids["new_id_accesses"],
            )
        )
    tables = tuple(
        TableDrift(
            table=r["table"],
            accesses=r["total_accesses"],
            hbm_accesses=hbm.get(r["table"], (0, 0))[1] if hbm is not None else None,
            predicted_hbm_share=predicted.get(r["table"]) if predicted is not None else None,
        )
        for r in day.rows("tables")
    )
    return DriftReport(
        ds=day.metadata.ds,
        day=str(day.path),
        reference=str(reference.path),
        reference_days=reference.metadata.window.days
        if reference.metadata.window
        else (reference.metadata.ds,),
        published_manifest=published_manifest,
        thresholds=thresholds,
        features=tuple(features),
        tables=tables,
        alerts=alerts(features, tables, thresholds),
    )


def unmeasured(day: StatsPartition, thresholds: DriftThresholds) -> DriftReport:
    """The report of a day with nothing to compare it with (the first of a series)."""
    return DriftReport(day.metadata.ds, str(day.path), None, (), None, thresholds, (), (), ())


def alerts(features, tables, thresholds: DriftThresholds) -> tuple[str, ...]:
    """One line per feature or table beyond a threshold, with its numbers."""
    out = []
    for f in features:
        if abs(f.coverage_change) > thresholds.coverage_change:
            out.append(
                f"feature {f.feature}: coverage {f.reference_coverage:.4f} -> {f.coverage:.4f} "
                f"({f.coverage_change:+.4f}, threshold {thresholds.coverage_change})"
            )
        if f.pooling_total_variation > thresholds.pooling_total_variation:
            out.append(
                f"feature {f.feature}: pooling-factor distribution moved by total variation "
                f"{f.pooling_total_variation:.4f} (threshold {thresholds.pooling_total_variation})"
            )
        if f.new_id_access_share > thresholds.new_id_access_share:
            out.append(
                f"feature {f.feature}: {f.new_id_access_share:.2%} of the day's accesses go to ids the "
                f"reference never saw ({f.new_ids} of {f.ids} ids; threshold {thresholds.new_id_access_share:.0%})"
            )
    for t in tables:
        share = t.hbm_share
        if share is not None and t.predicted_hbm_share is not None:
            drop = t.predicted_hbm_share - share
            if drop > thresholds.hbm_share_drop:
                out.append(
                    f"table {t.table}: the published plan's HBM rows serve {share:.2%} of the day's "
                    f"accesses, {t.predicted_hbm_share:.2%} predicted ({drop:.2%} less; threshold "
                    f"{thresholds.hbm_share_drop:.0%})"
                )
    return tuple(out)
