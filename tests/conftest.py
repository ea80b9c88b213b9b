import os
import pathlib
import shutil
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("RECSHARD_SHARED", ROOT.parent / "shared"))
CRITEO_TSV = SHARED / "data" / "criteo" / "criteo_kaggle_7200.tsv"


def pytest_configure(config):
    # the JVM class archive the first CLI run saves (jvm_class_archive): one per test run, in a
    # temporary directory, so no test depends on the user's cache
    if "RECSHARD_CACHE_DIR" not in os.environ:
        os.environ["RECSHARD_CACHE_DIR"] = config._recshard_cache = tempfile.mkdtemp(
            prefix="recshard-test-cache-"
        )


def pytest_unconfigure(config):
    if getattr(config, "_recshard_cache", None):
        shutil.rmtree(config._recshard_cache, ignore_errors=True)


@pytest.fixture(scope="session")
def spark():
    from recshard_stats.options import SparkOptions
    from recshard_stats.spark_io import spark_session

    session = spark_session("recshard-tests", SparkOptions(master="local[2]", driver_memory="2g"))
    session.conf.set("spark.sql.shuffle.partitions", "4")
    yield session
    session.stop()


@pytest.fixture
def criteo_tsv():
    if not CRITEO_TSV.is_file():
        pytest.skip(f"real Criteo sample not found at {CRITEO_TSV} (../shared is absent)")
    return CRITEO_TSV
