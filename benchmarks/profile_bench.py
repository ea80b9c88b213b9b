"""Profile vs plain scan of the same Parquet, at two sizes, in one Spark session.

    .venv/bin/python benchmarks/profile_bench.py --sizes 1000000 10000000 --work /tmp/recshard-bench

(a) scan: read every feature column and reduce it (sum of array sizes / non-null counts), so
    the columns are really decoded; (b) profile: the full job (one pass + aggregates +
    atomic Parquet output), as `recshard profile` runs it. Prints times, profile/scan and
    samples/s per core.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--spec", default=str(ROOT / "conf" / "synthetic.yaml"))
    parser.add_argument("--work", default="/tmp/recshard-bench")
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from recshard_stats.config import load_model_config
    from recshard_stats.generate import generate
    from recshard_stats.options import ProfileOptions, SparkOptions
    from recshard_stats.record_codes import is_multi_hot
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs

    model = load_model_config(args.spec)
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

    def scan(path):
        df = spark.read.parquet(str(path))
        terms = [F.coalesce(F.size(f.name), F.lit(0)) if is_multi_hot(f.type)
                 else F.col(f.name).isNotNull().cast("int") for f in model.features]
        return df.select(sum(terms).alias("ids")).agg(F.sum("ids")).collect()[0][0]

    def full_profile(path, n):
        profile_logs(spark, ProfileOptions(model=args.spec, inputs=(str(path),), out=str(work / f"stats-{n}"),
                                           ds="2026-12-01"))

    # warm the JVM (JIT, class loading) on the smallest input so the first size is not penalised
    scan(logs[args.sizes[0]])
    full_profile(logs[args.sizes[0]], args.sizes[0])
    print(f"\n{'samples':>12} {'ids':>12} {'scan s':>8} {'profile s':>10} {'profile/scan':>13} "
          f"{'samples/s/core':>15}")
    rows = []
    for n in args.sizes:
        t = time.time()
        ids = scan(logs[n])
        t_scan = time.time() - t
        t = time.time()
        full_profile(logs[n], n)
        t_prof = time.time() - t
        rows.append((n, t_prof))
        print(f"{n:>12} {ids:>12} {t_scan:>8.1f} {t_prof:>10.1f} {t_prof / t_scan:>13.2f} "
              f"{n / t_prof / cores:>15.0f}", flush=True)
    if len(rows) > 1:
        (n0, t0), (n1, t1) = rows[0], rows[-1]
        print(f"\ntime per sample at {n1} / at {n0}: {(t1 / n1) / (t0 / n0):.2f} (1.00 = linear); cores={cores}, "
              f"machine cpus={os.cpu_count()}")
    spark.stop()


if __name__ == "__main__":
    main()
