"""The Spark stages end to end, each a function of a SparkSession and its options dataclass:
read, compute (the DataFrame transforms of :mod:`~recshard_stats.profiler`,
:mod:`~recshard_stats.remap`, :mod:`~recshard_stats.replay`), write atomically. The console
script and the spark-submit jobs only map arguments to these calls.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import pathlib
import shutil

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import DriftOptions, ProfileOptions, RemapOptions, ReplayOptions, WindowOptions
from recshard_stats.spark_io import (
    READ_SETTINGS,
    HadoopFS,
    input_errors,
    local_uri,
    read_partial_counts,
    screen_inputs,
    with_spark_settings,
    without_file,
)

log = logging.getLogger(__name__)


@with_spark_settings(READ_SETTINGS)
def profile_logs(spark, options: ProfileOptions, model=None) -> str:
    """``recshard profile``: logs -> ``<out>/ds=<date>/`` (tables, metadata, ``_SUCCESS``).
    ``model``: the loaded model config, when the caller checked it before starting Spark."""
    import pyspark

    from recshard_stats.config import load_model_config
    from recshard_stats.hashing import SEED
    from recshard_stats.profile_assembly import ProfileLayout, approximate_metadata, pooling_outliers
    from recshard_stats.profiler import profile
    from recshard_stats.schemas import StatsMetadata
    from recshard_stats.stats_output import publish_profile

    model = model or load_model_config(options.model)
    sketch, ds = options.sketch, options.partition_ds
    layout = ProfileLayout.of(model, sketch)
    HadoopFS(spark, options.out).check_writable(options.out)  # before the work, not after it
    screened = screen_inputs(spark, list(options.inputs))
    inputs, skipped = list(screened.paths), list[str]()
    while True:
        try:
            with input_errors(spark, model.input_format, inputs):
                counts = read_partial_counts(
                    spark,
                    model,
                    inputs,
                    parquet_reader=options.parquet_reader,
                    sample_fraction=options.sample_fraction,
                    seed=options.seed,
                )
                result = profile(
                    spark,
                    counts,
                    layout,
                    cdf_points=options.cdf_points,
                    with_row_counts=options.row_counts,
                    with_id_counts=options.id_counts,
                    max_reject_fraction=options.max_reject_fraction,
                    sketch=sketch,
                )
            break
        except RecShardError as exc:
            if not options.skip_corrupt_files or exc.reason is not Reason.INPUT_CORRUPT:
                raise
            if len(skipped) == options.max_skipped_files:
                raise RecShardError(
                    Reason.INPUT_CORRUPT,
                    f"more than {options.max_skipped_files} corrupt input files "
                    f"(skipped so far: {skipped}; the next: {exc.context['file']})",
                    fixes=("check how the logs are written", "raise --max-skipped-files"),
                ) from None
            inputs = without_file(spark, inputs, exc.context["file"])
            skipped.append(exc.context["file"])
            log.warning(
                "skipping corrupt input file %s (%d skipped); profiling the remaining %d files again",
                exc.context["file"],
                len(skipped),
                len(inputs),
            )
    metadata = StatsMetadata(
        ds=ds,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        input_paths=tuple(options.inputs),
        input_format=model.input_format,
        sample_fraction=options.sample_fraction,
        sample_seed=options.seed,
        input_rows=result.input_rows,
        rejected_rows=result.rejected_rows,
        skipped_files=screened.empty + tuple(skipped),
        ignored_files=screened.not_logs,
        num_samples=result.num_samples,
        hash_functions={t.name: t.hash for t in model.tables},
        hash_seed=SEED,
        cdf_points=options.cdf_points,
        row_counts=options.row_counts,
        id_counts=options.id_counts,
        approximate=approximate_metadata(sketch, model) if sketch else None,
        spark_version=pyspark.__version__,
        model=model.to_dict(),
        model_digest=model.digest(),
        pooling_outliers=pooling_outliers(result.tables["features"]),
    )
    for feature, largest in metadata.pooling_outliers.items():
        log.warning(
            "feature %s: a sample with %d ids, far beyond the feature's p99 (a logging bug?)",
            feature,
            largest,
        )
    for row in result.tables["features"]:
        if row["coverage"] == 0 and result.num_samples:
            log.warning(
                "feature %s has no id in any of the %d samples (coverage 0): is its column named "
                "right in the model config, and is it logged?",
                row["feature"],
                result.num_samples,
            )
    target = publish_profile(spark, result, options.out, ds, metadata)
    log.info("profiled %d samples (%d rows rejected) -> %s", result.num_samples, result.rejected_rows, target)
    return target


@with_spark_settings(READ_SETTINGS)
def merge_window(spark, options: WindowOptions, model=None) -> str:
    """``recshard window``: the last ``days`` day partitions -> ``<out>/ds=<date>/``, a stats
    partition of all of them (with row and id counts), published like a day's."""
    import pyspark

    from recshard_stats.config import load_model_config
    from recshard_stats.hashing import SEED
    from recshard_stats.options import SketchOptions
    from recshard_stats.profile_assembly import ProfileLayout, pooling_outliers
    from recshard_stats.profiler import merge_sketched, profile_records
    from recshard_stats.schemas import StatsMetadata, WindowMetadata
    from recshard_stats.stats_output import publish_profile
    from recshard_stats.window import (
        check_mergeable,
        find_days,
        merge_layout,
        sketched_window,
        window_records,
    )

    model = model or load_model_config(options.model)
    ds = options.partition_ds
    HadoopFS(spark, options.out).check_writable(options.out)
    window = find_days(options.stats, ds, options.days, options.min_days or options.days)
    check_mergeable(window, model)
    if window.missing:
        log.warning("window ending %s: no stats for %s", ds, ", ".join(window.missing))
    log.info("window ending %s: merging %d days (%s)", ds, len(window.found), ", ".join(window.days))
    days = [p.metadata for p in window.found]
    approximate = days[0].approximate
    if approximate is None:
        layout = merge_layout(model)
        result = profile_records(
            spark,
            window_records(spark, window, layout, options.half_life_days),
            layout,
            cdf_points=options.cdf_points,
            with_row_counts=True,
            with_id_counts=True,
            max_reject_fraction=1.0,  # each day was held to its own limit
            sketch=None,
        )
    else:
        if options.half_life_days is not None:
            raise RecShardError(
                Reason.CONFIG_INVALID,
                "--half-life needs exactly profiled days: HLL sketches of approximate days merge only unweighted",
                fixes=("leave --half-life out", "profile the days exactly (without --approximate)"),
            )
        sketch = SketchOptions(approximate.hll_lg_config_k, approximate.row_sample_bits)
        layout = ProfileLayout.of(model, sketch)
        result = merge_sketched(spark, *sketched_window(spark, window, layout), layout, options.cdf_points)
    metadata = StatsMetadata(
        ds=ds,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        input_paths=tuple(str(p.path) for p in window.found),
        input_format=model.input_format,
        sample_fraction=days[0].sample_fraction,
        sample_seed=days[0].sample_seed,
        input_rows=result.input_rows,
        rejected_rows=result.rejected_rows,
        skipped_files=tuple(f for d in days for f in d.skipped_files),
        ignored_files=tuple(f for d in days for f in d.ignored_files),
        num_samples=result.num_samples,
        hash_functions={t.name: t.hash for t in model.tables},
        hash_seed=SEED,
        cdf_points=options.cdf_points,
        row_counts=approximate is None,
        id_counts=True,
        approximate=approximate,
        spark_version=pyspark.__version__,
        model=model.to_dict(),
        model_digest=model.digest(),
        pooling_outliers=pooling_outliers(result.tables["features"]),
        window=WindowMetadata(window.days, window.missing, options.half_life_days),
    )
    target = publish_profile(spark, result, options.out, ds, metadata)
    log.info("merged %d days (%d samples) -> %s", len(window.found), result.num_samples, target)
    return target


@with_spark_settings(READ_SETTINGS)
def remap_manifest(spark, options: RemapOptions) -> pathlib.Path:
    """``recshard remap``: each table's remap (hot rows first) next to a manifest, with checksums.

    The manifest directory is rebuilt in a temporary sibling (old files, new
    ``remap/<table>.parquet``, the completed manifest) and swapped in whole, so a reader sees the
    old plan or the new one, never a manifest whose files do not match. It must be on a
    filesystem the driver can rename in (local disk or a shared mount)."""
    import pyarrow.parquet as pq

    from recshard_stats.atomic import building_dir, output_lock
    from recshard_stats.manifest import RemapFile, complete_with_remaps, invalid_manifest
    from recshard_stats.manifest_loader import MANIFEST_NAME, ManifestFile, load_manifest, sha256_data
    from recshard_stats.manifest_publisher import write_manifest
    from recshard_stats.remap import empty_remap_table, hotter_rows, remap_rows, unseen_hbm_below
    from recshard_stats.solver.manifest_builder import day_lock
    from recshard_stats.stats_reader import load_stats, stats_digest

    loaded = load_manifest(options.manifest, verify_checksums=False)
    manifest = loaded.manifest
    stats = load_stats(options.stats or loaded.stats_path)
    if stats_digest(stats) != manifest.inputs.stats_digest:
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"{stats.path} is not the stats partition {loaded.path} was solved from",
            fixes=("pass --stats with the partition named in the manifest's inputs",),
        )
    if not stats.metadata.row_counts:
        raise RecShardError(
            Reason.STATS_INVALID,
            f"{stats.path} has no per-row access counts",
            fixes=("re-run `recshard profile` with --row-counts",),
        )
    names = [t.name for t in manifest.tables]
    source = loaded.path.parent
    with output_lock(day_lock(source), f"recshard remap of {source.name}"), building_dir(source) as tmp:
        for entry in source.iterdir():
            if entry.name not in ("remap", MANIFEST_NAME) and not entry.name.startswith("_tmp"):
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, tmp / entry.name)
        staging = tmp / "_staging"
        row_counts = spark.read.parquet(local_uri(stats.path / "row_counts"))
        log.info("remapping %d tables", len(names))
        remapped = remap_rows(
            row_counts.where(row_counts.table.isin(names)), hotter_rows(spark, stats, names)
        )
        (
            remapped.repartition("table")
            .sortWithinPartitions("table", "index")
            .write.partitionBy("table")
            .parquet(local_uri(staging))
        )
        spill = [
            (t.name, t.rows_hbm - t.unique_rows, t.unique_rows)
            for t in manifest.tables
            if t.rows_hbm > t.unique_rows
        ]
        below = {}
        if spill:
            written = spark.read.parquet(local_uri(staging))
            below = {
                r["table"]: r["below_row"]
                for r in unseen_hbm_below(
                    written, spark.createDataFrame(spill, "table string, k bigint, n_seen bigint")
                ).collect()
            }
        (tmp / "remap").mkdir()
        remaps = {}
        for t in manifest.tables:
            written = staging / f"table={t.name}"
            target = tmp / "remap" / f"{t.name}.parquet"
            if target.resolve().parent != (tmp / "remap").resolve():  # the name rule's second guard
                raise invalid_manifest(f"table {t.name!r}: its remap would leave {tmp / 'remap'}")
            if written.exists():
                written.rename(target)
                rows = sum(pq.ParquetFile(p).metadata.num_rows for p in target.glob("*.parquet"))
            else:  # a table never accessed: an empty remap, every row keeps its place
                target.mkdir()
                pq.write_table(empty_remap_table(), target / "part-0.parquet")
                rows = 0
            if rows != t.unique_rows:
                raise RecShardError(
                    Reason.STATS_INVALID,
                    f"table {t.name!r}: {rows} rows remapped, stats count {t.unique_rows}",
                    fixes=("re-run the profile with --row-counts",),
                )
            remaps[t.name] = (
                RemapFile(f"remap/{t.name}.parquet", sha256_data(target), rows),
                below.get(t.name, 0),
            )
        shutil.rmtree(staging)
        completed = complete_with_remaps(manifest, remaps)
        if completed.diff is not None:
            completed = dataclasses.replace(
                completed,
                diff=_counted_hbm_changes(completed.diff, ManifestFile(tmp / MANIFEST_NAME, completed)),
            )
        write_manifest(tmp / MANIFEST_NAME, completed)
        log.info("remap files for %d tables written; manifest updated with checksums", len(names))
    path = source / MANIFEST_NAME
    load_manifest(path)  # what was published reads back and verifies
    return path


@with_spark_settings(READ_SETTINGS)
def replay_logs(spark, options: ReplayOptions) -> pathlib.Path:
    """``recshard evaluate``: replay held-out logs through a manifest's remap; the plans' measured
    cost beside the prediction, as ``evaluation.json``."""
    from recshard_stats.atomic import write_text_atomic
    from recshard_stats.manifest_loader import load_manifest
    from recshard_stats.profile_assembly import ProfileLayout
    from recshard_stats.profiler import profile
    from recshard_stats.replay import (
        EVALUATION_NAME,
        PUBLISHED_EVALUATION_NAME,
        format_summary,
        placements,
        summarize,
        tier_hits,
    )
    from recshard_stats.typed_json import to_plain

    loaded = load_manifest(options.manifest, require_remap=True)
    manifest = loaded.manifest
    published = _published_alike(options.published_root, manifest)
    logs = list(screen_inputs(spark, list(options.logs)).paths)
    with input_errors(spark, manifest.model.input_format, logs):
        counts = read_partial_counts(spark, manifest.model, logs)
        result = profile(
            spark,
            counts,
            ProfileLayout.of(manifest.model),
            with_row_counts=True,
            max_reject_fraction=options.max_reject_fraction,
        )
    out = pathlib.Path(options.out) if options.out else loaded.path.parent / EVALUATION_NAME
    plans = [(loaded, out)]
    if published is not None:
        plans.append((published, out.parent / PUBLISHED_EVALUATION_NAME))
    elif options.published_root is not None:  # an earlier run's figures compare nothing now
        (out.parent / PUBLISHED_EVALUATION_NAME).unlink(missing_ok=True)
    try:
        for plan, target in plans:
            placement = placement_frame(spark, placements(plan.manifest))
            hits = {
                (r["plan"], r["table"]): r.asDict()
                for r in tier_hits(
                    result.row_counts,
                    remap_frame(spark, plan),
                    placement,
                    manifest.hardware.batch_size / max(result.num_samples, 1),
                ).collect()
            }
            summary = summarize(
                plan.manifest, hits, result.num_samples, manifest_path=str(plan.path), logs=options.logs
            )
            write_text_atomic(target, json.dumps(to_plain(summary), indent=2) + "\n")
            if plan is loaded:
                print(format_summary(summary))
            else:
                print(
                    f"the published plan {plan.path} on the same logs: {summary.plans['recshard'].max_cost_ms:.4f} ms"
                )
    finally:
        result.release()
    return out


def _published_alike(root, manifest):
    """The manifest published under ``root`` when it was made for the same model and hardware
    (else None: the publish decision replaces it without a comparison)."""
    from recshard_stats.manifest_publisher import load_published

    if root is None:
        return None
    try:
        published = load_published(root)
    except RecShardError as exc:
        log.warning("the published plan does not load (%s): not replayed", exc.message)
        return None
    if published is None:
        return None
    now, then = manifest.inputs, published.manifest.inputs
    if (now.model_digest, now.hardware_digest) != (then.model_digest, then.hardware_digest):
        log.info("the published plan was made for another model or hardware config: not replayed")
        return None
    return published


def _counted_hbm_changes(diff, new):
    """The diff with rows entering and leaving HBM counted against the previous plan's remap
    (left uncounted, with a warning, when that plan is gone)."""
    from recshard_stats.manifest_loader import load_manifest, with_hbm_changes

    try:
        old = load_manifest(diff.previous, require_remap=True)
    except RecShardError as exc:
        log.warning(
            "rows entering and leaving HBM not counted: the previous plan does not load (%s)", exc.message
        )
        return diff
    return with_hbm_changes(diff, new, old)


def placement_frame(spark, rows):
    """The placements a replay measures (:func:`recshard_stats.replay.placements`) as the frame
    :func:`~recshard_stats.replay.tier_hits` joins."""
    return spark.createDataFrame(rows, "plan string, table string, rows_hbm bigint, unseen_below bigint")


def remap_frame(spark, loaded):
    """(table, row, index) of every table's remap file of a loaded manifest."""
    from pyspark.sql import functions as F

    remap = None
    for t in loaded.manifest.tables:
        part = spark.read.parquet(local_uri(loaded.remap_path(t.name))).select(
            F.lit(t.name).alias("table"), "row", "index"
        )
        remap = part if remap is None else remap.unionByName(part)
    return remap


@with_spark_settings(READ_SETTINGS)
def check_drift(spark, options: DriftOptions) -> pathlib.Path:
    """``recshard drift``: the newest day against a reference partition, and how the published
    plan's HBM rows serve the day -> ``drift.json`` (alerts logged)."""
    from recshard_stats.atomic import write_text_atomic
    from recshard_stats.config import ModelConfig
    from recshard_stats.drift import (
        DEFAULT_THRESHOLDS,
        compare,
        load_thresholds,
        new_ids,
        table_row_counts,
        unmeasured,
    )
    from recshard_stats.manifest_loader import load_manifest
    from recshard_stats.manifest_publisher import load_published
    from recshard_stats.replay import RECSHARD, placements, tier_hits
    from recshard_stats.stats_reader import check_profiled_with, load_stats
    from recshard_stats.typed_json import to_plain

    thresholds = load_thresholds(options.thresholds or DEFAULT_THRESHOLDS)
    out = pathlib.Path(options.out)
    day = load_stats(options.day)
    if options.missing_reference_ok and not (pathlib.Path(options.reference) / "_SUCCESS").is_file():
        log.info(
            "drift of %s: no reference at %s (the first day?): nothing compared",
            day.metadata.ds,
            options.reference,
        )
        write_text_atomic(out, json.dumps(to_plain(unmeasured(day, thresholds)), indent=2) + "\n")
        return out
    reference = load_stats(options.reference)
    for part in (day, reference):
        if not part.metadata.id_counts or part.metadata.approximate is not None:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{part.path} has no per-id counts to compare"
                + (
                    " (an approximate profile keeps sampled rows, not ids)"
                    if part.metadata.approximate
                    else ""
                ),
                fixes=("profile the day exactly with --id-counts (a window of such days has them)",),
            )
    model = ModelConfig.from_dict(day.metadata.model, f"{day.path}: metadata.json model")
    check_profiled_with(reference, model)
    day_ids = spark.read.parquet(local_uri(day.path / "id_counts"))
    reference_ids = spark.read.parquet(local_uri(reference.path / "id_counts"))
    id_drift = {r["feature"]: r.asDict() for r in new_ids(spark, day_ids, reference_ids).collect()}
    hbm = predicted = loaded = None
    if options.published_root is not None:
        loaded = load_published(options.published_root)
    elif options.manifest:
        loaded = load_manifest(options.manifest, model, require_remap=True)
    if loaded is not None and {t.name for t in loaded.manifest.tables} != {t.name for t in model.tables}:
        log.warning("drift: the published plan %s has other tables than the day: not replayed", loaded.path)
        loaded = None
    if loaded is not None:
        placement = placement_frame(spark, [p for p in placements(loaded.manifest) if p[0] == RECSHARD])
        rows = table_row_counts(spark, day_ids, model)
        hbm = {
            r["table"]: (r["accesses"], r["hbm_accesses"])
            for r in tier_hits(rows, remap_frame(spark, loaded), placement, 1.0).collect()
        }
        predicted = {t.name: t.predicted_hbm_access_fraction for t in loaded.manifest.tables}
    report = compare(
        day, reference, id_drift, hbm, predicted, thresholds, str(loaded.path) if loaded is not None else None
    )
    write_text_atomic(out, json.dumps(to_plain(report), indent=2) + "\n")
    for alert in report.alerts:
        log.warning("drift: %s", alert)
    log.info("drift of %s against %s: %d alerts -> %s", report.ds, reference.path, len(report.alerts), out)
    return out
