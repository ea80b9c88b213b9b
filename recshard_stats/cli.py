"""``recshard``: one console script, a thin subcommand over each library function / job."""

from __future__ import annotations

import argparse
import sys

from recshard_stats.errors import RecShardError

EXAMPLES = """examples:
  recshard run --out example_run                   # the built-in example, end to end
  recshard generate --spec conf/synthetic.yaml --samples 1000000 --out logs/ds=2026-12-01
  recshard profile --model conf/synthetic.yaml --input logs/ds=2026-12-01 --out stats --ds 2026-12-01
"""


def _generate(args) -> None:
    from recshard_stats.generate import generate

    print(generate(args.spec, args.out, args.samples, seed=args.seed, chunk_rows=args.chunk_rows,
                   processes=args.processes))


def build_parser() -> argparse.ArgumentParser:
    from jobs import profile as profile_job

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
    return parser


def main(argv: list[str] | None = None) -> int:
    from jobs.common import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(getattr(args, "verbose", False))
    try:
        args.func(args)
    except RecShardError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        for key, value in exc.context.items():
            print(f"  {key}: {value}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
