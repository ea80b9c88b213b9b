"""Approximate profile (HLL sketches + row-sampled count-of-counts) against the exact one, on
the same logs, in one Spark session.

    .venv/bin/python benchmarks/approx_bench.py --samples 10000000 --work /tmp/recshard-bench

Prints, side by side: both profiles' times; per feature and per table the relative error of
every distinct count (against the HLL error bound recorded in the metadata); per table the
largest absolute error of the access CDF F(k) over the exact profile's breakpoints; and the
plan each profile gives (same solver, same limits), both costed on the exact statistics.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--spec", default=str(ROOT / "conf" / "synthetic.yaml"))
    parser.add_argument("--hardware", default=str(ROOT / "conf" / "hardware.yaml"))
    parser.add_argument("--work", default="/tmp/recshard-bench")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--hll-lg-k", type=int, default=14)
    parser.add_argument("--row-sample-bits", type=int, default=0)
    parser.add_argument("--solver", default="highs")
    parser.add_argument("--time-limit", type=float, default=60)
    parser.add_argument(
        "--hash-size-divisor",
        type=int,
        default=1,
        help="profile the same logs with every table's hash_size divided by this: raw ids "
        "then far outnumber rows, the case the approximate mode is for",
    )
    args = parser.parse_args()

    from recshard_stats.cli import build_parser
    from recshard_stats.config import load_hardware_config, load_model_config
    from recshard_stats.generate import generate
    from recshard_stats.options import ProfileOptions, SolveOptions, SparkOptions, from_args
    from recshard_stats.solver.plan import cost_plan
    from recshard_stats.solver.problem import build_problem
    from recshard_stats.solver.solve import solve_problem
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs
    from recshard_stats.stats_reader import load_stats

    work = pathlib.Path(args.work)
    if args.hash_size_divisor > 1:
        args.spec = str(smaller_tables(pathlib.Path(args.spec), args.hash_size_divisor, work))
    logs = work / f"logs-{args.samples}"
    if not (logs / "_SUCCESS").exists():
        generate(args.spec, logs, args.samples, seed=1)
    spark = spark_session("approx-bench", SparkOptions(driver_memory=args.driver_memory))
    stats, seconds = {}, {}
    for mode, extra in (
        ("exact", []),
        (
            "approximate",
            [
                "--approximate",
                "--hll-lg-k",
                str(args.hll_lg_k),
                "--row-sample-bits",
                str(args.row_sample_bits),
            ],
        ),
    ):
        t = time.time()
        path = profile_logs(
            spark,
            from_args(
                ProfileOptions,
                build_parser().parse_args(
                    [
                        "profile",
                        "--model",
                        args.spec,
                        "--input",
                        str(logs),
                        "--out",
                        str(work / f"approx-bench-{mode}"),
                        "--ds",
                        "2026-12-01",
                        *extra,
                    ]
                ),
            ),
        )
        seconds[mode] = time.time() - t
        stats[mode] = load_stats(path)
        print(f"{mode:12s} profile: {seconds[mode]:7.1f} s", flush=True)
    exact, approx = stats["exact"], stats["approximate"]
    settings = approx.metadata.approximate
    assert settings is not None, "the approximate profile records its settings"
    bound = settings.distinct_count_error_bound_99_7
    print(f"approximate / exact time: {seconds['approximate'] / seconds['exact']:.2f}")
    # the aggregates' sizes: exact groups ids one by one, approximate groups them per row
    print(
        f"aggregated id groups: exact {sum(r['unique_raw_ids'] for r in exact.rows('features')):,} "
        f"(distinct raw ids), approximate at most {sum(r['unique_rows'] for r in exact.rows('features')):,} "
        f"(distinct rows)"
    )
    print(
        f"HLL lg_k {args.hll_lg_k}: recorded error bound (3 RSE) {bound:.2%}; row sample rates "
        f"{json.dumps(settings.row_sample_rate)}"
    )

    for level, key, columns in (
        ("features", "feature", ("unique_raw_ids", "unique_rows")),
        ("tables", "table", ("unique_keys", "unique_rows")),
    ):
        a = {r[key]: r for r in approx.rows(level)}
        for column in columns:
            errors = np.array(
                [(a[r[key]][column] - r[column]) / r[column] for r in exact.rows(level) if r[column]]
            )
            print(
                f"{level:8s} {column:15s} relative error: median |e| {np.median(np.abs(errors)):.3%}, "
                f"max |e| {np.abs(errors).max():.3%}, within the bound {np.mean(np.abs(errors) <= bound):.0%} "
                f"of {len(errors)}"
            )
        totals_equal = all(a[r[key]]["total_accesses"] == r["total_accesses"] for r in exact.rows(level))
        print(f"{level:8s} total_accesses identical: {totals_equal}")

    print(
        f"{'table':12s} {'rows':>9s} {'sampled':>8s} {'max |dF|':>9s} {'|dF| k>=64':>10s} {'F(1%) exact/approx':>20s}"
    )
    worst = []
    for r in exact.rows("tables"):
        name = r["table"]
        ce, ca = exact.count_of_counts("table", name), approx.count_of_counts("table", name)
        k = np.array(
            sorted(
                {
                    row["rows"]
                    for row in exact.rows("access_cdf")
                    if row["name"] == name and row["level"] == "table"
                }
            ),
            dtype=float,
        )
        diff = np.abs(ce.cdf(k) - ca.cdf(k))
        worst.append(diff.max())
        one = max(1.0, 0.01 * ce.unique_rows)
        rate = settings.row_sample_rate[name]
        print(
            f"{name:12s} {ce.unique_rows:9d} {rate:8.4f} {diff.max():9.4f} {diff[k >= 64].max(initial=0):10.4f} "
            f"{float(ce.cdf(one)):9.4f}/{float(ca.cdf(one)):.4f}"
        )
    print(f"access CDF: max |dF| over tables {max(worst):.4f}, median {np.median(worst):.4f}")

    model, hardware = load_model_config(args.spec), load_hardware_config(args.hardware)
    on_exact = build_problem(exact, model, hardware)
    options = SolveOptions(solver=args.solver, time_limit_s=args.time_limit)
    costs = {}
    for mode in ("exact", "approximate"):
        plan = solve_problem(build_problem(stats[mode], model, hardware), options).best.plan
        ev = cost_plan(on_exact, plan)
        costs[mode] = ev.max_cost
        print(
            f"plan from {mode:12s} stats, costed on exact stats: slowest GPU {ev.max_cost * 1e3:.4f} ms, "
            f"UVM accesses {ev.uvm_access_fraction:.2%}"
        )
    print(f"plan cost ratio approximate / exact: {costs['approximate'] / costs['exact']:.4f}")


def smaller_tables(spec: pathlib.Path, divisor: int, work: pathlib.Path) -> pathlib.Path:
    """The spec with every hash_size divided (same features, so the same generated logs)."""
    import yaml

    data = yaml.safe_load(spec.read_text())
    for table in data["tables"]:
        table["hash_size"] = max(1, table["hash_size"] // divisor)
    out = work / f"{spec.stem}-hash-div{divisor}.yaml"
    work.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


if __name__ == "__main__":
    main()
