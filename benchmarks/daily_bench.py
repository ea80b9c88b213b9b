"""The daily loop over generated drifting days (issue 27): how many plans are published, and the
replayed time lost against re-planning every day.

    .venv/bin/python benchmarks/daily_bench.py --work /tmp/recshard-daily --days 14

Each day (synthetic.yaml, drifting: hot ids rotate, new ids, coverage and pooling move) runs the
DAG's steps in one Spark session, exactly as the commands run them: generate -> profile
(--id-counts) -> window (the last --window days) -> drift (against the window of the day before)
-> solve (from the window) -> remap -> evaluate (the day's logs through the candidate and the
published plan) -> publish --compare (margin 2%). The next day's logs are then replayed through
the plan in service (the published one) and through the day's candidate (the policy "publish
every plan"): their difference, summed over the days, is what keeping a plan cost. All times
are the cost model's replayed slowest GPU per batch (not measured on a GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import shutil
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERIES = {"hot_rotation": 0.0005, "new_ids": 0.02, "coverage_trend": -0.005, "pooling_shift": 0.01}


@dataclasses.dataclass
class Day:
    ds: str
    published: bool
    reason: str
    candidate_ms: float  # the candidate on its own day (replayed)
    published_ms: float | None  # the plan published before, on that day
    alerts: int
    next_in_service_ms: float | None = None  # the next day, through the plan in service
    next_every_day_ms: float | None = None  # the next day, through this day's candidate
    seconds: float = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=pathlib.Path, required=True)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--half-life", type=float, default=None, help="the window's half-life in days")
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--spec", type=pathlib.Path, default=ROOT / "conf" / "synthetic.yaml")
    parser.add_argument("--hardware", type=pathlib.Path, default=ROOT / "conf" / "hardware_example.yaml")
    args = parser.parse_args()

    from recshard_stats.cli import setup_logging
    from recshard_stats.drift import load_drift
    from recshard_stats.generate import generate
    from recshard_stats.manifest_publisher import beside_candidate, load_latest, publish_if_better
    from recshard_stats.options import (
        DriftOptions,
        ProfileOptions,
        RemapOptions,
        ReplayOptions,
        SolveOptions,
        SyntheticDrift,
        WindowOptions,
    )
    from recshard_stats.replay import load_evaluation
    from recshard_stats.solver.manifest_builder import solve_to_manifest
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import check_drift, merge_window, profile_logs, remap_manifest, replay_logs

    setup_logging()
    shutil.rmtree(args.work, ignore_errors=True)
    work = args.work
    spark = spark_session("recshard-daily-bench")
    start = datetime.date(2026, 12, 1)
    dates = [(start + datetime.timedelta(days=d)).isoformat() for d in range(args.days + 1)]
    spec, manifests = str(args.spec), work / "manifests"
    days: list[Day] = []
    previous = None  # (candidate manifest dir, published manifest path after its decision)
    for d, ds in enumerate(dates):
        began = time.perf_counter()
        logs = generate(
            spec, work / "logs" / f"ds={ds}", args.samples, seed=d, drift=SyntheticDrift(day=d, **SERIES)
        )
        if previous is not None:  # the day's logs through yesterday's plan in service and its candidate
            candidate, in_service = previous
            serve = load_evaluation(
                replay_logs(spark, ReplayOptions(str(in_service), (str(logs),), out=str(work / "serve.json")))
            ).plans["recshard"]
            every = load_evaluation(
                replay_logs(spark, ReplayOptions(str(candidate), (str(logs),), out=str(work / "every.json")))
            ).plans["recshard"]
            days[-1].next_in_service_ms, days[-1].next_every_day_ms = serve.max_cost_ms, every.max_cost_ms
        if d == args.days:
            break  # the last date only scores the day before
        stats = profile_logs(
            spark,
            ProfileOptions(model=spec, inputs=(str(logs),), out=str(work / "stats"), ds=ds, id_counts=True),
        )
        window = merge_window(
            spark,
            WindowOptions(
                model=spec,
                stats=str(work / "stats"),
                out=str(work / "windows"),
                ds=ds,
                days=args.window,
                min_days=1,
                half_life_days=args.half_life,
            ),
        )
        yesterday = work / "windows" / f"ds={dates[d - 1]}" if d else work / "none"
        drift = load_drift(
            check_drift(
                spark,
                DriftOptions(
                    day=stats,
                    reference=str(yesterday),
                    out=str(work / "reports" / f"ds={ds}" / "drift.json"),
                    published_root=str(manifests),
                    missing_reference_ok=True,
                ),
            )
        )
        manifest = solve_to_manifest(
            window,
            spec,
            args.hardware,
            manifests,
            ds,
            SolveOptions(time_limit_s=args.time_limit, torchrec_baselines=False),
        ).parent
        remap_manifest(spark, RemapOptions(manifest=str(manifest), stats=window))
        replay_logs(spark, ReplayOptions(str(manifest), (str(logs),), published_root=str(manifests)))
        evaluation, published_evaluation = beside_candidate(manifest)
        decision = publish_if_better(
            manifests,
            manifest,
            evaluation=evaluation,
            published_evaluation=published_evaluation,
        )
        days.append(
            Day(
                ds,
                decision.publish,
                decision.reason,
                load_evaluation(evaluation).plans["recshard"].max_cost_ms,
                decision.published_ms,
                len(drift.alerts),
                seconds=time.perf_counter() - began,
            )
        )
        previous = (manifest, load_latest(manifests).path)
        print(json.dumps(dataclasses.asdict(days[-1])), flush=True)

    print(
        f"\n{args.days} drifting days, {args.samples} samples a day, window {args.window} days "
        f"(half-life: {args.half_life or 'none'}), "
        f"solve time limit {args.time_limit:g} s; replayed slowest GPU, ms per batch (cost model)"
    )
    print(
        f"{'day':<11} {'decision':<9} {'candidate':>9} {'published':>9} {'next: in service':>16} "
        f"{'next: every-day':>15} {'alerts':>6} {'s':>5}"
    )
    for day in days:
        published = f"{day.published_ms:.4f}" if day.published_ms is not None else "-"
        print(
            f"{day.ds:<11} {'publish' if day.published else 'keep':<9} {day.candidate_ms:>9.4f} {published:>9} "
            f"{day.next_in_service_ms or 0:>16.4f} {day.next_every_day_ms or 0:>15.4f} {day.alerts:>6} "
            f"{day.seconds:>5.0f}"
        )
    served = sum(d.next_in_service_ms or 0.0 for d in days)
    replanned = sum(d.next_every_day_ms or 0.0 for d in days)
    print(
        f"published {sum(d.published for d in days)} of {len(days)} plans; over the {len(days)} next days "
        f"the plans in service replay at {served:.4f} ms in all, publishing every plan {replanned:.4f} ms: "
        f"{served - replanned:+.4f} ms ({served / replanned - 1:+.2%}) lost by keeping plans"
    )


if __name__ == "__main__":
    main()
