"""Criteo TSV: the profile against a handwritten Spark job and DuckDB counting the same hex ids.

    .venv/bin/python benchmarks/tsv_bench.py --lines 10000000 --work /tmp/recshard-tsv

The logs: the Criteo Kaggle sample (``../shared/data/criteo/criteo_kaggle_7200.tsv``) repeated
to ``--lines`` lines, each copy's categorical ids shifted by a copy-dependent offset (mod 2^32,
written back as 8 hex digits; empty ones stay empty) so distinct ids grow with the size as in
real logs, label and dense columns as they are; written by DuckDB in files of 1M lines.

Timed one after another, each alone, in one Spark session warmed up on the first file:

- handwritten: ``spark.read.text`` + ``split`` + ``stack`` of C1..C26 + ``groupBy(feature,
  id).count()``, to Parquet: the counting a data engineer writes by hand;
- profile: ``recshard profile`` as the CLI runs it (every statistic, rejects checked, atomic
  output), in this session: pyarrow parses the files in the tasks (the default), and with
  ``--parquet-reader spark`` (Spark's text reader and the normalized frame, the path before);
- CLI: the same profile from the shell (a fresh JVM);
- DuckDB, outside Spark on the same files: ``read_csv`` + ``UNPIVOT`` + ``GROUP BY``, to Parquet.

Prints seconds and each ratio to the handwritten job.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRITEO = ROOT.parent / "shared" / "data" / "criteo" / "criteo_kaggle_7200.tsv"
MODEL = ROOT / "conf" / "criteo_kaggle.yaml"
FILE_LINES = 1_000_000
SPARSE = [f"C{i}" for i in range(1, 27)]


def write_logs(source: pathlib.Path, lines: int, out: pathlib.Path) -> None:
    """``lines`` lines of the sample's copies in files of FILE_LINES, with DuckDB."""
    import duckdb

    out.mkdir(parents=True)
    con = duckdb.connect()
    columns = ["label", *[f"I{i}" for i in range(1, 14)], *SPARSE]
    types = ", ".join(f"'{c}': 'VARCHAR'" for c in columns)
    con.execute(
        f"CREATE TABLE sample AS SELECT row_number() OVER () - 1 AS n, * FROM read_csv('{source}', "
        f"delim='\t', header=false, quote='', escape='', columns={{{types}}})"
    )
    (size,) = con.execute("SELECT count(*) FROM sample").fetchall()[0]
    shifted = [
        f"CASE WHEN coalesce({c}, '') = '' THEN '' ELSE lpad(lower(printf('%x', "
        f"(('0x' || {c})::UBIGINT + (c_copy * 2654435761 + {k}) % 4294967296) % 4294967296)), 8, '0') END"
        for k, c in enumerate(SPARSE)
    ]  # in column order: COPY writes them as C1..C26
    for first in range(0, lines, FILE_LINES):
        count = min(FILE_LINES, lines - first)
        select = ", ".join([*(f"coalesce({c}, '')" for c in columns[:14]), *shifted])
        con.execute(
            f"COPY (SELECT {select} FROM (SELECT s.*, (g.i // {size}) AS c_copy FROM "
            f"range({first}, {first + count}) g(i) JOIN sample s ON s.n = g.i % {size}) ORDER BY c_copy, n) "
            f"TO '{out / f'part-{first // FILE_LINES:05d}.tsv'}' (DELIMITER '\t', HEADER false, QUOTE '')"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--criteo", default=str(CRITEO))
    parser.add_argument("--work", default="/tmp/recshard-tsv")
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()

    import duckdb
    from pyspark.sql import functions as F

    from recshard_stats.cli import build_parser
    from recshard_stats.options import ProfileOptions, SparkOptions, from_args
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs

    work = pathlib.Path(args.work)
    logs = work / f"logs-{args.lines}"
    if not logs.exists():
        started = time.perf_counter()
        write_logs(pathlib.Path(args.criteo), args.lines, logs)
        print(f"wrote {args.lines} lines in {time.perf_counter() - started:.1f} s", flush=True)
    files = sorted(logs.glob("*.tsv"))
    cores = os.cpu_count() or 1
    spark = spark_session("recshard-tsv-bench", SparkOptions(driver_memory=args.driver_memory))

    def handwritten(source, out):
        pairs = ", ".join(f"'{c}', v[{14 + i}]" for i, c in enumerate(SPARSE))
        split = spark.read.text(source).select(F.split(F.col("value"), "\t", -1).alias("v"))
        stacked = split.selectExpr(f"stack({len(SPARSE)}, {pairs}) AS (f, id)")
        stacked.where(F.col("id") != "").groupBy("f", "id").count().write.mode("overwrite").parquet(out)

    def profile(source, out, reader="arrow"):
        argv = ["profile", "--model", str(MODEL), "--input", source, "--out", out, "--ds", "2026-12-01"]
        argv += ["--parquet-reader", reader]
        profile_logs(spark, from_args(ProfileOptions, build_parser().parse_args(argv)))

    def spark_reader(source, out):
        profile(source, out, "spark")

    def cli(source, out):
        command = [str(pathlib.Path(sys.executable).with_name("recshard")), "profile", "--model", str(MODEL)]
        command += [
            "--input",
            source,
            "--out",
            out,
            "--ds",
            "2026-12-01",
            "--driver-memory",
            args.driver_memory,
        ]
        subprocess.run(command, check=True, capture_output=True)

    def with_duckdb(source, out):
        con = duckdb.connect()
        con.execute(f"SET threads = {cores}")
        columns = ", ".join(f"'c{i}': 'VARCHAR'" for i in range(40))
        unpivot = ", ".join(f"c{14 + i} AS {c}" for i, c in enumerate(SPARSE))
        con.execute(
            f"COPY (SELECT f, id, count(*) AS n FROM (UNPIVOT (SELECT {unpivot} FROM read_csv('{source}/*.tsv', "
            f"delim='\t', header=false, quote='', escape='', columns={{{columns}}})) ON COLUMNS(*) "
            f"INTO NAME f VALUE id) WHERE id <> '' GROUP BY f, id) TO '{out}' (FORMAT parquet)"
        )

    jobs = {
        "handwritten": handwritten,
        "profile": profile,
        "profile, Spark's reader": spark_reader,
        "CLI": cli,
        "duckdb": with_duckdb,
    }
    warm = str(files[0])
    for name in ("handwritten", "profile", "profile, Spark's reader"):  # warm the session's JVM
        jobs[name](warm, str(work / f"warm-{name}"))
    times = {}
    for name, job in jobs.items():
        out = work / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        job(str(logs), str(out))
        times[name] = time.perf_counter() - started
        print(f"{name:<24} {times[name]:7.1f} s", flush=True)
    print(f"\n{args.lines} Criteo lines, {cores} cores")
    print(f"{'job':<24} {'seconds':>8} {'/ handwritten':>14}")
    for name, seconds in times.items():
        print(f"{name:<24} {seconds:8.1f} {seconds / times['handwritten']:14.2f}")


if __name__ == "__main__":
    main()
