"""The profile against what else could count the same ids, side by side on the same Parquet.

    .venv/bin/python benchmarks/profile_bench.py --sizes 1000000 10000000 --work /tmp/recshard-bench

Per size, in one Spark session (JVM warmed up on the first size first), each job timed alone:

- scan: every feature column read and reduced to its lengths / null counts (no id decoded);
- full scan: every id decoded once (``bit_xor`` of one ``xxhash64`` over all feature columns);
- handwritten: what a data engineer writes by hand for per-id counts: per feature an
  ``explode``, the union, ``groupBy(feature, id).count()``, written to Parquet;
- profile: ``recshard profile`` as the CLI runs it (every statistic, atomic output), without
  and with ``--row-counts``, and with ``--parquet-reader spark`` (Spark's Parquet reader and
  the normalized frame: the path of TSV/CSV logs and of filesystems pyarrow cannot open);
- DuckDB, outside Spark on the same files: the handwritten query (``UNNEST`` + ``GROUP BY``,
  to Parquet) with as many threads as Spark has cores: what one might pick on one machine.

Prints seconds, ids/s per core, every ratio to the profile, and the profile's time per
sample at the largest size over the smallest.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
JOBS = (
    "scan",
    "full scan",
    "handwritten",
    "duckdb",
    "profile",
    "profile --row-counts",
    "profile, Spark's reader",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--spec", default=str(ROOT / "conf" / "synthetic.yaml"))
    parser.add_argument("--work", default="/tmp/recshard-bench")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument(
        "--rounds", type=int, default=1, help="time each job this many times, keep the fastest"
    )
    args = parser.parse_args()

    import duckdb
    from pyspark.sql import functions as F

    from recshard_stats.config import load_model_config
    from recshard_stats.generate import generate
    from recshard_stats.options import ProfileOptions, SparkOptions
    from recshard_stats.record_codes import is_multi_hot
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs

    model = load_model_config(args.spec)
    features = model.features
    work = pathlib.Path(args.work)
    logs = {}
    for n in args.sizes:
        path = work / f"logs-{n}"
        if not (path / "_SUCCESS").exists():
            t = time.time()
            generate(args.spec, path, n, seed=1)
            print(f"generated {n} samples in {time.time() - t:.1f}s", flush=True)
        logs[n] = path
    spark = spark_session("profile-bench", SparkOptions(driver_memory=args.driver_memory))
    cores = spark.sparkContext.defaultParallelism

    def scan(n):
        df = spark.read.parquet(str(logs[n]))
        terms = [
            F.coalesce(F.size(f.name), F.lit(0))
            if is_multi_hot(f.type)
            else F.col(f.name).isNotNull().cast("int")
            for f in features
        ]
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return df.select(total.alias("ids")).agg(F.sum("ids")).collect()[0][0]

    def full_scan(n):
        df = spark.read.parquet(str(logs[n]))
        return df.select(F.bit_xor(F.xxhash64(*[f.name for f in features]))).collect()[0][0]

    def handwritten(n):
        df = spark.read.parquet(str(logs[n]))
        parts = []
        for f in features:
            ids = F.explode(f.name) if is_multi_hot(f.type) else F.col(f.name)
            part = df.select(F.lit(f.name).alias("feature"), ids.alias("id")).where(F.col("id").isNotNull())
            if "string" in f.type:
                part = part.withColumn("id", F.xxhash64("id"))
            parts.append(part)
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part)
        union.groupBy("feature", "id").count().write.mode("overwrite").parquet(str(work / f"handwritten-{n}"))

    def with_duckdb(n):
        con = duckdb.connect()
        con.execute(f"SET threads = {cores}")
        files = f"read_parquet('{logs[n]}/*.parquet')"
        parts = []
        for f in features:
            value = f"UNNEST({f.name})" if is_multi_hot(f.type) else f.name
            key = (
                "(hash(x) >> 1)::BIGINT" if "string" in f.type else "x"
            )  # strings: a 63-bit hash, as Spark's
            parts.append(f"SELECT '{f.name}' AS feature, {key} AS id FROM (SELECT {value} AS x FROM {files})")
        query = " UNION ALL ".join(parts)
        out = work / f"duckdb-{n}.parquet"
        con.execute(
            f"COPY (SELECT feature, id, count(*) AS count FROM ({query}) WHERE id IS NOT NULL "
            f"GROUP BY feature, id) TO '{out}' (FORMAT parquet)"
        )
        con.close()

    def profile(n, row_counts=False, parquet_reader="arrow"):
        out = work / f"bench-stats-{n}"
        shutil.rmtree(out, ignore_errors=True)
        profile_logs(
            spark,
            ProfileOptions(
                model=args.spec,
                inputs=(str(logs[n]),),
                out=str(out),
                ds="2026-12-01",
                row_counts=row_counts,
                parquet_reader=parquet_reader,
            ),
        )

    jobs = {
        "scan": scan,
        "full scan": full_scan,
        "handwritten": handwritten,
        "duckdb": with_duckdb,
        "profile": profile,
        "profile --row-counts": lambda n: profile(n, row_counts=True),
        "profile, Spark's reader": lambda n: profile(n, parquet_reader="spark"),
    }
    for job in jobs.values():  # warm the JVM (JIT, class loading) so the first size is not penalised
        job(args.sizes[0])
    results = {}
    for n in args.sizes:
        ids = scan(n)
        seconds = {}
        for name in JOBS:
            best = float("inf")
            for _ in range(args.rounds):
                t = time.time()
                jobs[name](n)
                best = min(best, time.time() - t)
            seconds[name] = best
            print(f"  {n} samples: {name}: {best:.1f}s", flush=True)
        results[n] = seconds
        prof = seconds["profile"]
        print(f"\n{n} samples, {ids} ids, {cores} cores (machine cpus={os.cpu_count()})")
        print(f"{'job':>22} {'seconds':>9} {'M ids/s/core':>13} {'profile / job':>14}")
        for name in JOBS:
            print(
                f"{name:>22} {seconds[name]:>9.1f} {ids / seconds[name] / cores / 1e6:>13.2f} "
                f"{prof / seconds[name]:>14.2f}"
            )
        extra = seconds["profile --row-counts"] / prof - 1
        print(f"--row-counts adds {extra:.0%} to the profile\n", flush=True)
    if len(results) > 1:
        small, large = min(results), max(results)
        ratio = (results[large]["profile"] / large) / (results[small]["profile"] / small)
        print(f"profile's time per sample at {large} / at {small}: {ratio:.2f} (1.00 = linear)")
    spark.stop()


if __name__ == "__main__":
    main()
