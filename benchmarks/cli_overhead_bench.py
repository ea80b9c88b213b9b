"""``recshard profile`` from the shell against the same profile in a warm Spark session.

    .venv/bin/python benchmarks/cli_overhead_bench.py --logs /tmp/logs-10000000 --work /tmp/cli-bench

Times, on the same logs, one after another: the CLI with Spark's 1g driver heap, with the
default local-mode heap (half the machine's memory), and with ``--driver-memory`` given; then
two profiles in one session of this process (cold, then warm). Prints seconds and each ratio
to the warm session.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--logs", required=True, help="Parquet logs of the model (recshard generate)")
    parser.add_argument("--model", default=str(ROOT / "conf" / "synthetic.yaml"))
    parser.add_argument("--work", default="/tmp/cli-bench")
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()

    from recshard_stats.cli import build_parser
    from recshard_stats.options import ProfileOptions, SparkOptions, from_args
    from recshard_stats.spark_io import local_driver_memory, spark_session
    from recshard_stats.stages import profile_logs

    work = pathlib.Path(args.work)
    profile = ["profile", "--model", args.model, "--input", args.logs, "--ds", "2026-12-01", "--row-counts"]
    cli = [str(pathlib.Path(sys.executable).with_name("recshard"))]
    times = {}
    for name, extra in (
        ("CLI, Spark's 1g", ["--driver-memory", "1g"]),
        (f"CLI, default ({local_driver_memory()})", []),
        (f"CLI, --driver-memory {args.driver_memory}", ["--driver-memory", args.driver_memory]),
    ):
        shutil.rmtree(work, ignore_errors=True)
        started = time.perf_counter()
        subprocess.run([*cli, *profile, "--out", str(work), *extra], check=True, capture_output=True)
        times[name] = time.perf_counter() - started
        print(f"{name:<36} {times[name]:7.1f} s", flush=True)
    spark = spark_session("cli-overhead-bench", SparkOptions(driver_memory=args.driver_memory))
    for name in ("one session, cold", "one session, warm"):
        shutil.rmtree(work, ignore_errors=True)
        options = from_args(ProfileOptions, build_parser().parse_args([*profile, "--out", str(work)]))
        started = time.perf_counter()
        profile_logs(spark, options)
        times[name] = time.perf_counter() - started
        print(f"{name:<36} {times[name]:7.1f} s", flush=True)
    warm = times["one session, warm"]
    print("\n".join(f"{name:<36} {t:7.1f} s  {t / warm:5.2f}x the warm session" for name, t in times.items()))


if __name__ == "__main__":
    main()
