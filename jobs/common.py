"""What every job entry point shares: logging, the SparkSession, and one-line errors."""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable

from recshard_stats.errors import RecShardError


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def spark_session(app: str, master: str | None = None, driver_memory: str | None = None):
    """The job's session. Under spark-submit the master and memory come from its flags; run from
    the CLI (no master configured) it is local mode on every core."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    builder = SparkSession.builder.appName(app)
    master = master or conf.get("spark.master", "local[*]")
    builder = builder.master(master)
    if master.startswith("local") and not conf.contains("spark.sql.shuffle.partitions"):
        # Spark's default of 200 shuffle partitions costs more in task overhead than the work
        # itself on a few local cores; a few per core is right there.
        builder = builder.config("spark.sql.shuffle.partitions", str(4 * (os.cpu_count() or 1)))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_main(body: Callable[[], int | None]) -> int:
    """Run a job body; an expected failure becomes one readable line on stderr and exit code 2."""
    try:
        return body() or 0
    except RecShardError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        for key, value in exc.context.items():
            print(f"  {key}: {value}", file=sys.stderr)
        return 2
