"""Merging a window of days against profiling one day (issue 27).

    .venv/bin/python benchmarks/window_bench.py --work /tmp/recshard-window --samples 10000000 --days 7

Generates ``--days`` drifting days of synthetic.yaml logs (not timed), then in one Spark
session: profiles the first day without and with ``--id-counts`` (what the per-id counts cost),
profiles the other days with them, and merges the window of all of them (``recshard window``).
Prints each time and the merge against one day's profile.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import shutil
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERIES = {"hot_rotation": 0.0005, "new_ids": 0.02}


def _size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=pathlib.Path, required=True)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--spec", type=pathlib.Path, default=ROOT / "conf" / "synthetic.yaml")
    args = parser.parse_args()

    from recshard_stats.cli import setup_logging
    from recshard_stats.generate import generate
    from recshard_stats.options import ProfileOptions, SyntheticDrift, WindowOptions
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import merge_window, profile_logs

    setup_logging()
    shutil.rmtree(args.work, ignore_errors=True)
    spec = str(args.spec)
    dates = [(datetime.date(2026, 12, 1) + datetime.timedelta(days=d)).isoformat() for d in range(args.days)]
    logs = {}
    for d, ds in enumerate(dates):
        logs[ds] = generate(
            spec, args.work / "logs" / f"ds={ds}", args.samples, seed=d, drift=SyntheticDrift(day=d, **SERIES)
        )
    spark = spark_session("recshard-window-bench")

    def profile(ds: str, out: str, id_counts: bool) -> float:
        began = time.perf_counter()
        profile_logs(
            spark, ProfileOptions(model=spec, inputs=(str(logs[ds]),), out=out, ds=ds, id_counts=id_counts)
        )
        return time.perf_counter() - began

    plain = profile(dates[0], str(args.work / "plain"), False)
    with_ids = [profile(ds, str(args.work / "stats"), True) for ds in dates]
    began = time.perf_counter()
    merge_window(
        spark,
        WindowOptions(
            model=spec,
            stats=str(args.work / "stats"),
            out=str(args.work / "windows"),
            ds=dates[-1],
            days=args.days,
        ),
    )
    merge = time.perf_counter() - began
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    print(f"\ncommit {commit.strip()}; {args.days} days of {args.samples} samples (synthetic.yaml, drifting)")
    print(f"profile of day 1 without --id-counts: {plain:.1f} s")
    print(f"profile with --id-counts, per day: {', '.join(f'{t:.1f}' for t in with_ids)} s")
    first = args.work / "stats" / f"ds={dates[0]}"
    print(
        f"day 1 partition: {_size(first) / 1e6:.0f} MB, of which id_counts {_size(first / 'id_counts') / 1e6:.0f} MB; "
        f"without: {_size(args.work / 'plain' / f'ds={dates[0]}') / 1e6:.0f} MB"
    )
    mean = sum(with_ids) / len(with_ids)
    print(f"window of {args.days} days: {merge:.1f} s = {merge / mean:.2f}x one day's profile ({mean:.1f} s)")


if __name__ == "__main__":
    main()
