"""``recshard profile`` from the shell against the same profile in a warm Spark session.

    .venv/bin/python benchmarks/cli_overhead_bench.py --logs /tmp/logs-10000000 --work /tmp/cli-bench --repeats 3

One CLI run first, not timed: it saves the JVM class archive if the cache has none, and reads
the logs into the page cache. Then ``--repeats`` rounds, each timing the CLI with the class
archive (the default) and with ``--no-class-archive``, one after the other; then the CLI with
``--server`` against a ``recshard serve`` started here (timed once it serves, after its
warm-up): its first command and ``--repeats`` more; the server is stopped, and then, in this process, one session's
profiles: the first (a cold JVM) and ``--repeats`` more (warm). Prints every time, the medians
and each median's ratio to the warm session's.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import shutil
import statistics
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
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from recshard_stats.cli import build_parser, setup_logging
    from recshard_stats.options import ProfileOptions, from_args
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs

    setup_logging()
    work = pathlib.Path(args.work)
    profile = ["profile", "--model", args.model, "--input", args.logs, "--ds", "2026-12-01", "--row-counts"]
    cli = [str(pathlib.Path(sys.executable).with_name("recshard")), *profile, "--out", str(work)]
    times: dict[str, list[float]] = {}

    def timed(name: str, run) -> None:
        shutil.rmtree(work, ignore_errors=True)
        started = time.perf_counter()
        run()
        times.setdefault(name, []).append(time.perf_counter() - started)
        print(f"{name:<34} {times[name][-1]:7.1f} s", flush=True)

    subprocess.run(cli, check=True, capture_output=True)  # the archive, the page cache
    variants = {"CLI": [], "CLI --no-class-archive": ["--no-class-archive"]}
    for _ in range(args.repeats):
        for name, extra in variants.items():
            timed(name, functools.partial(subprocess.run, [*cli, *extra], check=True, capture_output=True))
    sock = work.with_name(f"{work.name}-server.sock")
    server = subprocess.Popen(
        [str(cli[0]), "serve", "--socket", str(sock)], stderr=subprocess.PIPE, text=True
    )
    assert server.stderr is not None
    while "serving on" not in (line := server.stderr.readline()):
        if not line and server.poll() is not None:
            raise SystemExit(f"recshard serve ended with {server.returncode}")
        if "warmed up" in line:
            print(line.strip(), flush=True)
    served = functools.partial(subprocess.run, [*cli, "--server", str(sock)], check=True, capture_output=True)
    for index in range(args.repeats + 1):
        timed("CLI --server, first" if index == 0 else "CLI --server", served)
    subprocess.run([str(cli[0]), "serve", "--stop", "--socket", str(sock)], check=True, capture_output=True)
    server.wait()
    spark = spark_session("cli-overhead-bench")
    options = from_args(ProfileOptions, build_parser().parse_args([*profile, "--out", str(work)]))
    for index in range(args.repeats + 1):
        timed("session, cold" if index == 0 else "session, warm", lambda: profile_logs(spark, options))
    warm = statistics.median(times["session, warm"])
    print(f"\nmedians over {args.repeats} rounds ({args.logs})")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{name:<34} {median:7.1f} s  {median / warm:5.2f}x the warm session")


if __name__ == "__main__":
    main()
