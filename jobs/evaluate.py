"""Replay held-out logs through a manifest: measured HBM/UVM accesses and per-batch cost of the
RecShard plan and of each baseline, next to what the solver predicted.

    spark-submit jobs/evaluate.py --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys

if __name__ == "__main__":  # spark-submit puts jobs/ first on sys.path, where profile.py shadows the stdlib's
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != os.path.dirname(os.path.abspath(__file__))]

from jobs.common import (add_spark_args, input_errors, job_main, job_parser, local_uri, read_normalized,
                         spark_session)

log = logging.getLogger("recshard.evaluate")

EXAMPLES = """examples:
  recshard evaluate --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02
  recshard evaluate --manifest manifests/ds=2026-12-01 --logs day_1.tsv --out eval.json
"""


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = job_parser(parser, "evaluate", __doc__, EXAMPLES)
    parser.add_argument("--manifest", required=True, help="manifest.json (with remap files) or its directory")
    parser.add_argument("--logs", required=True, nargs="+", help="held-out logs (same format as profiled)")
    parser.add_argument("--out", default=None, help="evaluation JSON (default: <manifest dir>/evaluation.json)")
    parser.add_argument("--max-reject-fraction", type=float, default=0.01)
    add_spark_args(parser)
    return parser


def run(args: argparse.Namespace) -> pathlib.Path:
    from pyspark.sql import functions as F

    from recshard_stats.atomic import write_text_atomic
    from recshard_stats.config import parse_model_config
    from recshard_stats.manifest import load_manifest
    from recshard_stats.profile import profile
    from recshard_stats.replay import summarize, tier_hits

    manifest = load_manifest(args.manifest, require_remap=True)
    model = parse_model_config(manifest.data["model"], source=f"{manifest.path} (model)")
    spark = spark_session("recshard-evaluate", args.master, args.driver_memory)
    with input_errors(spark, model.input_format, args.logs):
        frame = read_normalized(spark, model, args.logs)
        result = profile(spark, frame, model, with_row_counts=True, max_reject_fraction=args.max_reject_fraction)
    try:
        remap = None
        for t in manifest.tables.values():
            part = spark.read.parquet(local_uri(t.remap_path)).select(F.lit(t.name).alias("table"), "row", "index")
            remap = part if remap is None else remap.unionByName(part)
        placement = spark.createDataFrame(
            [(t["name"], t["rows_hbm"], t.get("unseen_hbm_below_row", 0)) for t in manifest.data["tables"]],
            "table string, rows_hbm bigint, unseen_below bigint")
        hits = {r["table"]: r.asDict() for r in tier_hits(result.row_counts, remap, placement).collect()}
    finally:
        result.release()
    num_samples = result.tables["tables"][0]["num_samples"]
    summary = summarize(manifest.data, hits, num_samples)
    summary.update({"manifest": str(manifest.path), "logs": list(args.logs), "ds": manifest.data.get("ds")})
    out = pathlib.Path(args.out) if args.out else manifest.path.parent / "evaluation.json"
    write_text_atomic(out, json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary))
    return out


def format_summary(summary: dict) -> str:
    lines = [f"replayed {summary['num_samples']} held-out samples",
             f"{'plan':<20} {'max GPU ms':>11} {'predicted':>10} {'UVM access':>11} {'predicted':>10} "
             f"{'imbalance':>10} {'vs recshard':>12}"]
    for name, p in summary["plans"].items():
        lines.append(f"{name:<20} {p['max_cost_ms']:>11.4f} {p['predicted_max_cost_ms']:>10.4f} "
                     f"{p['uvm_access_fraction']:>11.2%} {p['predicted_uvm_access_fraction']:>10.2%} "
                     f"{p['imbalance']:>10.2f} {p['cost_vs_recshard']:>11.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return job_main(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
