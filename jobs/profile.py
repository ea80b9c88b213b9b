"""Profile training logs into per-feature statistics (Parquet) under <out>/ds=<date>/.

    spark-submit jobs/profile.py --model conf/criteo_kaggle.yaml \
        --input /logs/criteo/day_0 --out /stats/criteo --ds 2026-12-01
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys

if __name__ == "__main__":  # spark-submit puts jobs/ first on sys.path, where profile.py shadows the stdlib's
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != os.path.dirname(os.path.abspath(__file__))]

from jobs.common import (add_spark_args, input_errors, job_main, job_parser, read_normalized, spark_session,
                         without_file)

log = logging.getLogger("recshard.profile")

EXAMPLES = """examples:
  recshard profile --model conf/criteo_kaggle.yaml --input day_0.tsv --out stats --ds 2026-12-01
  recshard profile --model conf/synthetic.yaml --input logs/ --out stats --row-counts --sample-fraction 0.1
  recshard profile --model conf/synthetic.yaml --input logs/ --out stats --skip-corrupt-files
  recshard profile --model conf/synthetic.yaml --input logs/ --out stats --approximate --hll-lg-k 16
  spark-submit --master yarn --py-files dist/recshard_stats.zip jobs/profile.py --model ... --input ... --out ...
"""


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = job_parser(parser, "profile", __doc__, EXAMPLES)
    parser.add_argument("--model", required=True, help="model config (YAML/TOML): features, tables, input format")
    parser.add_argument("--input", required=True, nargs="+", help="log files or directories (Parquet or Criteo TSV)")
    parser.add_argument("--out", required=True, help="stats root; the partition is <out>/ds=<date>")
    parser.add_argument("--ds", default=datetime.date.today().isoformat(), help="partition date (default: today)")
    parser.add_argument("--sample-fraction", type=float, default=1.0,
                        help="profile this fraction of samples (Bernoulli, recorded in metadata)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--cdf-points", type=int, default=128, help="access-CDF breakpoints per feature/table")
    parser.add_argument("--row-counts", action="store_true", help="also write per-row access counts (for remap)")
    parser.add_argument("--max-reject-fraction", type=float, default=0.01,
                        help="fail when more than this fraction of rows (or of one column's values) is rejected")
    parser.add_argument("--approximate", action="store_true",
                        help="for inputs with too many distinct ids to count one by one: access counts per "
                             "hashed row, HLL sketches for distinct ids (error bound in the metadata); one "
                             "more pass over the input")
    parser.add_argument("--hll-lg-k", type=int, default=14,
                        help="with --approximate: HLL sketches of 2**k registers, 4..21; relative standard "
                             "error about 1.04/sqrt(2**k) (default 14: 0.81%%)")
    parser.add_argument("--row-sample-bits", type=int, default=0,
                        help="with --approximate: count-of-counts from one row in 2**bits of each table "
                             "(tables keep at least 65536 rows; default 0: every row, exact access CDFs)")
    parser.add_argument("--skip-corrupt-files", action="store_true",
                        help="leave out input files that cannot be read (each costs one more pass over the "
                             "input) and list them in the stats metadata under skipped_files; default: fail")
    parser.add_argument("--max-skipped-files", type=int, default=10,
                        help="with --skip-corrupt-files, fail once more files than this are corrupt (default 10)")
    add_spark_args(parser)
    return parser


def run(args: argparse.Namespace) -> str:
    import pyspark

    from recshard_stats.config import load_model_config
    from recshard_stats.errors import Reason, RecShardError
    from recshard_stats.output import publish_profile
    from recshard_stats.profile import Approximate, profile

    model = load_model_config(args.model)
    if not 0 < args.sample_fraction <= 1:
        raise RecShardError(Reason.CONFIG_INVALID, f"--sample-fraction must be in (0, 1], got {args.sample_fraction}")
    if args.cdf_points < 2:
        raise RecShardError(Reason.CONFIG_INVALID, f"--cdf-points must be at least 2, got {args.cdf_points}")
    approximate = Approximate(args.hll_lg_k, args.row_sample_bits) if args.approximate else None
    spark = spark_session("recshard-profile", args.master, args.driver_memory)
    inputs, skipped = list(args.input), []
    while True:
        try:
            with input_errors(spark, model.input_format, inputs):
                frame = read_normalized(spark, model, inputs, args.sample_fraction, args.seed)
                result = profile(spark, frame, model, cdf_points=args.cdf_points, with_row_counts=args.row_counts,
                                 max_reject_fraction=args.max_reject_fraction, approximate=approximate)
            break
        except RecShardError as exc:
            if not args.skip_corrupt_files or exc.reason is not Reason.INPUT_CORRUPT:
                raise
            if len(skipped) == args.max_skipped_files:
                raise RecShardError(
                    Reason.INPUT_CORRUPT, f"more than {args.max_skipped_files} corrupt input files "
                    f"(skipped so far: {skipped}; the next: {exc.context['file']})",
                    fixes=("check how the logs are written", "raise --max-skipped-files")) from None
            inputs = without_file(spark, inputs, exc.context["file"])
            skipped.append(exc.context["file"])
            log.warning("skipping corrupt input file %s (%d skipped); profiling the remaining %d files again",
                        exc.context["file"], len(skipped), len(inputs))
    metadata = {
        "ds": args.ds, "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "input_paths": list(args.input), "input_format": model.input_format,
        "sample_fraction": args.sample_fraction, "sample_seed": args.seed,
        "input_rows": result.input_rows, "rejected_rows": result.rejected_rows, "skipped_files": skipped,
        "num_samples": result.tables["tables"][0]["num_samples"],
        "hash_functions": {t.name: t.hash for t in model.tables}, "hash_seed": 42,
        "cdf_points": args.cdf_points, "row_counts": args.row_counts,
        "approximate": approximate.metadata(model) if approximate else None,
        "spark_version": pyspark.__version__, "model": model.to_dict(), "model_digest": model.digest(),
    }
    target = publish_profile(spark, result, args.out, args.ds, metadata)
    log.info("profiled %d samples (%d rows rejected) -> %s", metadata["num_samples"], result.rejected_rows, target)
    return target


def main(argv: list[str] | None = None) -> int:
    return job_main(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
