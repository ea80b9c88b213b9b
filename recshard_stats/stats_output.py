"""Atomic publication of a stats partition ``<out>/ds=<date>/`` on any Hadoop filesystem.

Everything is written into a unique temporary directory next to the target
(``<out>/_tmp-ds=<date>-<uuid>``), ``_SUCCESS`` last, and then renamed into place. A
failed or killed run leaves at most a ``_tmp-*`` directory (ignored by readers), never a
partial partition; two runs of the same day write to different temporary directories and
take turns for the final swap (a ``_lock-ds=<date>`` file), so they cannot mix their files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid

from pyspark.sql import SparkSession

from recshard_stats.atomic import STALE_TMP_S
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import check_ds
from recshard_stats.profiler import ProfileResult
from recshard_stats.schemas import SMALL_TABLES, StatsMetadata, spark_schema
from recshard_stats.spark_io import HadoopFS
from recshard_stats.typed_json import to_plain

log = logging.getLogger(__name__)


@contextlib.contextmanager
def publish_lock(fs: HadoopFS, out: str, ds: str, wait_s: float = 600, stale_s: float = 600):
    """Serialises the final swap of one day's partition between concurrent runs. A lock older
    than ``stale_s`` is a killed run's and is taken over."""
    lock = f"{out.rstrip('/')}/_lock-ds={ds}"
    deadline = time.time() + wait_s
    while not fs.create_exclusive(lock, uuid.uuid4().hex):
        if fs.exists(lock) and fs.age_seconds(lock) > stale_s:
            log.warning("removing a stale lock %s", lock)
            fs.delete(lock)
            continue
        if time.time() > deadline:
            raise RecShardError(
                Reason.OUTPUT_BUSY,
                f"another run is publishing {partition_uri(out, ds)} "
                f"(lock {lock} held for over {wait_s:.0f}s)",
                fixes=(f"delete {lock} if no run is active",),
            )
        time.sleep(0.5)
    try:
        yield
    finally:
        fs.delete(lock)


def remove_stale_tmp(fs: HadoopFS, out: str, ds: str, stale_s: float = STALE_TMP_S) -> None:
    """Delete the temporary directories of this day's killed runs (``kill -9`` leaves them);
    a younger one may be a concurrent run's and is left alone."""
    prefix = f"_tmp-ds={ds}-"
    for name, uri, age in fs.children(out):
        if name.startswith(prefix) and age > stale_s:
            log.warning("removing %s, left by a run killed %.1f hours ago", uri, age / 3600)
            fs.delete(uri)


def partition_uri(out: str, ds: str) -> str:
    return f"{out.rstrip('/')}/ds={check_ds(ds)}"


def publish_profile(
    spark: SparkSession, result: ProfileResult, out: str, ds: str, metadata: StatsMetadata
) -> str:
    """Write every table, metadata.json and _SUCCESS, then move the partition into place."""
    target = partition_uri(out, ds)
    tmp = f"{out.rstrip('/')}/_tmp-ds={ds}-{uuid.uuid4().hex}"
    fs = HadoopFS(spark, out)
    try:
        for name in SMALL_TABLES:
            (
                spark.createDataFrame(result.tables[name], spark_schema(name))
                .coalesce(1)
                .write.mode("error")
                .parquet(f"{tmp}/{name}")
            )
        if result.row_counts is not None:
            log.info("writing per-row access counts")
            (
                result.row_counts.repartition("table")
                .write.mode("error")
                .partitionBy("table")
                .parquet(f"{tmp}/row_counts")
            )
        if result.id_counts is not None:
            log.info("writing per-id access counts")
            result.id_counts.write.mode("error").parquet(f"{tmp}/id_counts")
        if result.sampled_row_counts is not None and result.sketches is not None:
            log.info("writing sampled rows' access counts and the HLL sketches")
            result.sampled_row_counts.write.mode("error").parquet(f"{tmp}/sampled_row_counts")
            (
                spark.createDataFrame(result.sketches, spark_schema("sketches"))
                .coalesce(1)
                .write.mode("error")
                .parquet(f"{tmp}/sketches")
            )
        fs.write_text(f"{tmp}/metadata.json", json.dumps(to_plain(metadata), indent=2, sort_keys=True))
        fs.write_text(f"{tmp}/_SUCCESS", "")
        # Replace an earlier run of the same day: move it aside first so the target is never
        # partial; under the lock, so two runs never rename into each other's partition.
        with publish_lock(fs, out, ds):
            old = None
            if fs.exists(target):
                old = f"{tmp}-replaced"
                fs.rename(target, old)
            fs.rename(tmp, target)
        if old:
            fs.delete(old)
        remove_stale_tmp(fs, out, ds)
    except BaseException:
        fs.delete(tmp)
        raise
    finally:
        result.release()
    log.info("published %s", target)
    return target
