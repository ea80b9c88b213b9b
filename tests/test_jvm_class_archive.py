"""The JVM class archive: keyed by the Java runtime and Spark's jars, saved once by the first
local CLI run, mapped by the JVMs after it (seen in /proc/<pid>/maps), and never in the way: a
foreign file at its path or --no-class-archive start a plain JVM, with a quiet console."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from recshard_stats import jvm_class_archive
from recshard_stats.jvm_class_archive import archive_java_options, archive_path

RECSHARD = pathlib.Path(sys.executable).parent / "recshard"


@pytest.fixture
def fake_spark(tmp_path, monkeypatch):
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (home / "jars" / name).write_bytes(b"jar " + name.encode())
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv("RECSHARD_CACHE_DIR", str(tmp_path / "cache"))
    return home


def test_archive_keyed_by_java_jars_and_heap_mode(fake_spark, tmp_path):
    first = archive_path(None)
    assert first is not None and first.parent == tmp_path / "cache" / "jvm"
    assert first.name.startswith("spark-") and first.suffix == ".jsa"
    assert archive_path(None) == first == archive_path("4g") == archive_path("31g")
    # compressed oops end at 32 GiB: the JVM then needs another base archive
    assert archive_path("32g") != first and archive_path("32768m") == archive_path("32g")
    jar = fake_spark / "jars" / "spark-sql.jar"
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    upgraded = archive_path(None)
    assert upgraded != first
    (fake_spark / "jars" / "extra.jar").write_bytes(b"x")
    assert archive_path(None) not in (first, upgraded)


def test_archive_path_none_without_java(fake_spark, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert archive_path(None) is None


def test_java_options_record_then_map(tmp_path):
    path = tmp_path / "spark-x.jsa"
    assert archive_java_options(path).split() == [
        "-XX:+RecordDynamicDumpInfo",
        "-Xlog:cds=off,cds+dynamic=off",
    ]
    path.write_bytes(b"archive")
    assert archive_java_options(path).split() == [
        f"-XX:SharedArchiveFile={path}",
        "-Xlog:cds=off,cds+dynamic=off",
    ]


def test_memory_sizes_in_bytes():
    assert jvm_class_archive._bytes("512m") == 512 * 2**20
    assert jvm_class_archive._bytes("4G") == 4 * 2**30
    assert jvm_class_archive._bytes("2gb") == 2 * 2**30
    assert jvm_class_archive._bytes("1t") == 2**40
    assert jvm_class_archive._bytes("2048") == 2048


# What a fresh process's JVM was started with, and whether it mapped the archive's file.
SESSION = """
import json, os, sys
from recshard_stats.options import SparkOptions
from recshard_stats.jvm_class_archive import save_class_archive
from recshard_stats.spark_io import spark_session
spark = spark_session("archive-test", SparkOptions(master="local[1]", driver_memory="1g",
                                                  class_archive=sys.argv[1] == "on"))
jvm = spark.sparkContext._jvm
pid = jvm.java.lang.ProcessHandle.current().pid()
maps = open(f"/proc/{pid}/maps").read()
saved = save_class_archive(spark)
print(json.dumps({
    "args": [str(a) for a in jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()],
    "mapped": [line.split()[-1] for line in maps.splitlines() if line.endswith(".jsa")],
    "rows": spark.range(100).count(),
    "saved": saved and str(saved),
}))
"""


def _session(env, mode="on"):
    done = subprocess.run(
        [sys.executable, "-c", SESSION, mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[warning][cds" not in done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_first_cli_run_saves_the_archive_and_later_jvms_map_it(tmp_path):
    env = {**os.environ, "RECSHARD_CACHE_DIR": str(tmp_path / "cache")}
    spec = pathlib.Path(__file__).resolve().parents[1] / "conf" / "synthetic.yaml"
    logs = tmp_path / "logs"
    subprocess.run(
        [RECSHARD, "generate", "--spec", spec, "--samples", "2000", "--out", logs, "--processes", "1"],
        env=env,
        check=True,
        capture_output=True,
    )
    profile = [RECSHARD, "profile", "--model", spec, "--input", logs, "--out", tmp_path / "stats"]
    first = subprocess.run(
        [*profile, "--ds", "2026-12-01"], env=env, capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stderr[-3000:]
    saved = list((tmp_path / "cache" / "jvm").iterdir())
    assert len(saved) == 1 and saved[0].name.startswith("spark-") and saved[0].suffix == ".jsa", saved
    assert saved[0].stat().st_size > 20e6  # Spark's classes, not an empty shell
    assert "saved the JVM's class archive" in first.stderr
    # the JVM's own dump message and CDS warnings never reach the console
    assert "Dynamic dump" not in first.stdout + first.stderr
    assert "[warning][cds" not in first.stdout + first.stderr
    archive = str(saved[0])

    later = _session(env)
    assert f"-XX:SharedArchiveFile={archive}" in later["args"] and later["rows"] == 100
    assert archive in later["mapped"]
    assert "-XX:+RecordDynamicDumpInfo" not in later["args"]

    assert later["saved"] is None  # a JVM that mapped the archive saves none again
    assert list((tmp_path / "cache" / "jvm").iterdir()) == saved

    off = _session(env, "off")
    assert not [a for a in off["args"] if "SharedArchiveFile" in a or "RecordDynamicDumpInfo" in a]
    assert archive not in off["mapped"] and off["saved"] is None

    # a file the JVM refuses at the archive's path (another build's, a truncated copy): a plain
    # start, without the JVM's warning on the console
    saved[0].chmod(0o644)
    saved[0].write_bytes(b"not an archive" * 100)
    refused = _session(env)
    assert f"-XX:SharedArchiveFile={archive}" in refused["args"] and refused["rows"] == 100
    assert archive not in refused["mapped"]
