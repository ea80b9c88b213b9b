"""``recshard``: one console script, a thin subcommand over each library function / job."""

from __future__ import annotations

import argparse
import pathlib
import sys

from recshard_stats.manifest import load_manifest, publish_latest

EXAMPLES = """examples:
  recshard run --out example_run                   # the built-in example, end to end
  recshard generate --spec conf/synthetic.yaml --samples 1000000 --out logs/ds=2026-12-01
  recshard profile --model conf/synthetic.yaml --input logs/ds=2026-12-01 --out stats --ds 2026-12-01 --row-counts
  recshard solve --stats stats/ds=2026-12-01 --model conf/synthetic.yaml --hardware conf/hardware.yaml --out manifests
  recshard remap --manifest manifests/ds=2026-12-01
  recshard evaluate --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02
  recshard report --manifest manifests/ds=2026-12-01 --out report.html
  recshard validate --manifest manifests/ds=2026-12-01 --model conf/synthetic.yaml
  recshard publish --manifest manifests/ds=2026-12-01 --root manifests

each command's --help has its options and more examples.
"""


def _generate(args) -> None:
    from recshard_stats.generate import generate

    print(generate(args.spec, args.out, args.samples, seed=args.seed, chunk_rows=args.chunk_rows,
                   processes=args.processes))


SOLVE_EXAMPLES = """examples:
  recshard solve --stats stats/ds=2026-12-01 --model conf/synthetic.yaml --hardware conf/hardware.yaml --out manifests
  recshard solve ... --solver glpk --time-limit 30 --mip-gap 0.02
"""


def _solve(args) -> None:
    from solver.manifest import solve_to_manifest
    from solver.milp import MilpOptions

    options = MilpOptions(solver=args.solver, time_limit_s=args.time_limit, mip_gap=args.mip_gap,
                          cdf_segments=args.cdf_segments, symmetry_breaking=not args.no_symmetry_breaking)
    print(solve_to_manifest(args.stats, args.model, args.hardware, args.out, args.ds, options))


RUN_EXAMPLES = """examples:
  recshard run                                      # 200k samples/day into ./example_run
  recshard run --samples 2000000 --solver highs --out /tmp/big_run
"""
CONF = pathlib.Path(__file__).resolve().parents[1] / "conf"


def _report(args) -> None:
    from recshard_stats.report import write_report

    print(write_report(args.manifest, args.out, args.stats, args.evaluation))


def _run(args) -> None:
    """Each stage through its own entry point, exactly as a user would call it."""
    import datetime

    from jobs import evaluate as evaluate_job
    from jobs import profile as profile_job
    from jobs import remap as remap_job
    from recshard_stats.generate import generate

    out = pathlib.Path(args.out)
    held_out = (datetime.date.fromisoformat(args.ds) + datetime.timedelta(days=1)).isoformat()
    steps = 6
    print(f"[1/{steps}] generating {args.samples} samples for {args.ds} and {held_out}", flush=True)
    logs = {ds: generate(args.spec, out / "logs" / f"ds={ds}", args.samples, seed=seed)
            for seed, ds in enumerate((args.ds, held_out))}
    print(f"[2/{steps}] profiling {args.ds}", flush=True)
    stats = profile_job.run(profile_job.build_parser().parse_args(
        ["--model", args.spec, "--input", str(logs[args.ds]), "--out", str(out / "stats"), "--ds", args.ds,
         "--row-counts"]))
    print(f"[3/{steps}] solving with {args.solver}", flush=True)
    _solve(build_parser().parse_args(
        ["solve", "--stats", str(stats), "--model", args.spec, "--hardware", args.hardware,
         "--out", str(out / "manifests"), "--solver", args.solver, "--time-limit", str(args.time_limit)]))
    manifest = out / "manifests" / f"ds={args.ds}"
    print(f"[4/{steps}] writing remap files", flush=True)
    remap_job.run(remap_job.build_parser().parse_args(["--manifest", str(manifest), "--stats", str(stats)]))
    print(f"[5/{steps}] replaying the held-out day {held_out}", flush=True)
    evaluate_job.run(evaluate_job.build_parser().parse_args(
        ["--manifest", str(manifest), "--logs", str(logs[held_out])]))
    print(f"[6/{steps}] writing the report", flush=True)
    from recshard_stats.report import write_report

    report = write_report(manifest, out / "report.html", stats)
    print(f"done: manifest {manifest / 'manifest.json'}, report {report}")


def _validate(args) -> None:
    manifest = load_manifest(args.manifest, args.model, require_remap=True)
    plan = manifest.plan
    print(f"{manifest.path}: valid; {len(manifest.tables)} tables on {manifest.num_gpus} GPUs, "
          f"{plan['objective_ms']:.4f} ms/batch, gap {plan['gap']:.2%}, solver {plan['solver']} ({plan['status']})")


def build_parser() -> argparse.ArgumentParser:
    from jobs import profile as profile_job
    from jobs import evaluate as evaluate_job
    from jobs import remap as remap_job

    parser = argparse.ArgumentParser(prog="recshard", description="RecShard: profile logs, solve the sharding "
                                     "MILP, hand a manifest to training.", epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter

    gen = sub.add_parser("generate", help="write synthetic Parquet logs", formatter_class=fmt,
                         epilog="example:\n  recshard generate --spec conf/synthetic.yaml --samples 10000000 --out logs")
    gen.add_argument("--spec", default="conf/synthetic.yaml", help="model config with synthetic blocks")
    gen.add_argument("--samples", type=int, required=True)
    gen.add_argument("--out", required=True, help="output directory (replaced atomically)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--chunk-rows", type=int, default=250_000, help="rows per Parquet file")
    gen.add_argument("--processes", type=int, default=None, help="worker processes (default: all cores)")
    gen.set_defaults(func=_generate)

    prof = sub.add_parser("profile", help="profile logs into stats Parquet (Spark)", formatter_class=fmt,
                          epilog=profile_job.EXAMPLES)
    profile_job.build_parser(prof)
    prof.set_defaults(func=lambda a: print(profile_job.run(a)))

    solve = sub.add_parser("solve", help="solve the sharding MILP -> manifest.json", formatter_class=fmt,
                           epilog=SOLVE_EXAMPLES)
    solve.add_argument("--stats", required=True, help="a stats partition, <stats>/ds=<date>")
    solve.add_argument("--model", required=True, help="model config (tables, hash sizes, dims)")
    solve.add_argument("--hardware", required=True, help="hardware config (GPUs, HBM, host, bandwidths)")
    solve.add_argument("--out", required=True, help="manifest root; writes <out>/ds=<date>/manifest.json")
    solve.add_argument("--ds", default=None, help="partition date (default: the stats partition's)")
    solve.add_argument("--solver", default="cbc", choices=("glpk", "cbc", "highs"))
    solve.add_argument("--time-limit", type=float, default=60.0, help="seconds (default 60)")
    solve.add_argument("--mip-gap", type=float, default=0.01, help="relative MIP gap to stop at (default 0.01)")
    solve.add_argument("--cdf-segments", type=int, default=16,
                       help="linear pieces of each table's access CDF in the MILP (default 16)")
    solve.add_argument("--no-symmetry-breaking", action="store_true")
    solve.set_defaults(func=_solve)

    remap = sub.add_parser("remap", help="write remap files (hot rows first) next to a manifest (Spark)",
                           formatter_class=fmt, epilog=remap_job.EXAMPLES)
    remap_job.build_parser(remap)
    remap.set_defaults(func=lambda a: print(remap_job.run(a)))

    evaluate = sub.add_parser("evaluate", help="replay held-out logs through a manifest (Spark)",
                              formatter_class=fmt, epilog=evaluate_job.EXAMPLES)
    evaluate_job.build_parser(evaluate)
    evaluate.set_defaults(func=lambda a: print(evaluate_job.run(a)))

    report = sub.add_parser("report", help="self-contained HTML report of a plan", formatter_class=fmt,
                            epilog="example:\n  recshard report --manifest manifests/ds=2026-12-01 --out report.html")
    report.add_argument("--manifest", required=True, help="manifest.json or its directory")
    report.add_argument("--stats", default=None, help="stats partition (default: the manifest's inputs.stats)")
    report.add_argument("--evaluation", default=None,
                        help="evaluation JSON (default: evaluation.json beside the manifest, if any)")
    report.add_argument("--out", required=True, help="HTML file to write")
    report.set_defaults(func=_report)

    validate = sub.add_parser("validate", help="check a manifest the way a trainer loads it", formatter_class=fmt,
                              epilog="example:\n  recshard validate --manifest manifests/ds=2026-12-01 "
                              "--model conf/synthetic.yaml")
    validate.add_argument("--manifest", required=True)
    validate.add_argument("--model", default=None, help="the trainer's model config, to match against")
    validate.set_defaults(func=_validate)

    publish = sub.add_parser("publish", help="point <root>/latest.json at a manifest once it validates",
                             formatter_class=fmt, epilog="example:\n  recshard publish --manifest "
                             "manifests/ds=2026-12-01 --root manifests")
    publish.add_argument("--manifest", required=True)
    publish.add_argument("--root", required=True, help="the directory holding latest.json")
    publish.add_argument("--model", default=None)
    publish.set_defaults(func=lambda a: print(publish_latest(a.root, a.manifest, a.model)))

    run = sub.add_parser("run", help="the whole pipeline on generated logs: generate, profile, solve, remap, "
                         "evaluate on a held-out day, report", formatter_class=fmt, epilog=RUN_EXAMPLES)
    run.add_argument("--out", default="example_run", help="working directory (default: example_run)")
    run.add_argument("--spec", default=str(CONF / "synthetic.yaml"), help="synthetic model config")
    run.add_argument("--hardware", default=str(CONF / "hardware_example.yaml"))
    run.add_argument("--samples", type=int, default=200_000, help="samples per generated day (default 200000)")
    run.add_argument("--solver", default="cbc", choices=("glpk", "cbc", "highs"))
    run.add_argument("--time-limit", type=float, default=60.0)
    run.add_argument("--ds", default="2026-12-01", help="the profiled day; the next day is held out")
    run.set_defaults(func=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from jobs.common import run_main, setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(getattr(args, "verbose", False))
    return run_main(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
