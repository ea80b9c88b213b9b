"""Atomic publication of a stats partition ``<out>/ds=<date>/`` on any Hadoop filesystem.

Everything is written into a unique temporary directory next to the target
(``<out>/_tmp-ds=<date>-<uuid>``), ``_SUCCESS`` last, and then renamed into place. A
failed or killed run leaves at most a ``_tmp-*`` directory (ignored by readers), never a
partial partition; two runs of the same day cannot mix their files.
"""

from __future__ import annotations

import json
import logging
import uuid

from pyspark.sql import SparkSession

from recshard_stats.profile import ProfileResult
from recshard_stats.schemas import SCHEMA_VERSION, SMALL_TABLES, spark_schema

log = logging.getLogger(__name__)


class HadoopFS:
    """The few filesystem calls the job needs, through Spark's own Hadoop client (local, HDFS, S3...)."""

    def __init__(self, spark: SparkSession, uri: str):
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self.fs = self._path(uri).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, uri: str):
        return self._path(uri)

    def exists(self, uri: str) -> bool:
        return self.fs.exists(self.path(uri))

    def write_text(self, uri: str, text: str) -> None:
        stream = self.fs.create(self.path(uri), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def rename(self, src: str, dst: str) -> None:
        if not self.fs.rename(self.path(src), self.path(dst)):
            raise OSError(f"could not rename {src} to {dst}")

    def delete(self, uri: str) -> None:
        self.fs.delete(self.path(uri), True)


def partition_uri(out: str, ds: str) -> str:
    return f"{out.rstrip('/')}/ds={ds}"


def publish_profile(spark: SparkSession, result: ProfileResult, out: str, ds: str, metadata: dict) -> str:
    """Write every table, metadata.json and _SUCCESS, then move the partition into place."""
    target = partition_uri(out, ds)
    tmp = f"{out.rstrip('/')}/_tmp-ds={ds}-{uuid.uuid4().hex}"
    fs = HadoopFS(spark, out)
    try:
        for name in SMALL_TABLES:
            (spark.createDataFrame(result.tables[name], spark_schema(name)).coalesce(1)
             .write.mode("error").parquet(f"{tmp}/{name}"))
        if result.row_counts is not None:
            log.info("writing per-row access counts")
            (result.row_counts.repartition("table").write.mode("error")
             .partitionBy("table").parquet(f"{tmp}/row_counts"))
        fs.write_text(f"{tmp}/metadata.json", json.dumps({"schema_version": SCHEMA_VERSION, **metadata},
                                                         indent=2, sort_keys=True))
        fs.write_text(f"{tmp}/_SUCCESS", "")
        # Replace an earlier run of the same day: move it aside first so the target is never partial.
        old = None
        if fs.exists(target):
            old = f"{tmp}-replaced"
            fs.rename(target, old)
        fs.rename(tmp, target)
        if old:
            fs.delete(old)
    except BaseException:
        fs.delete(tmp)
        raise
    finally:
        result.release()
    log.info("published %s", target)
    return target
