"""Write each table's remap (hot rows first) next to a manifest and record their checksums.

    spark-submit jobs/remap.py --manifest manifests/ds=2026-12-01 --stats stats/ds=2026-12-01

The manifest directory is rebuilt in a temporary sibling (old files, new remap/<table>.parquet,
the manifest with checksums) and swapped in whole, so a reader sees the old plan or the new
one, never a manifest whose files do not match. The manifest directory must be on a
filesystem the driver can rename in (local disk or a shared mount).
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import shutil
import sys

if __name__ == "__main__":  # spark-submit puts jobs/ first on sys.path, where profile.py shadows the stdlib's
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != os.path.dirname(os.path.abspath(__file__))]

from jobs.common import add_spark_args, job_main, job_parser, local_uri, spark_session

log = logging.getLogger("recshard.remap")

EXAMPLES = """examples:
  recshard remap --manifest manifests/ds=2026-12-01 --stats stats/ds=2026-12-01
  spark-submit --master yarn --py-files dist/recshard_stats.zip jobs/remap.py --manifest ... --stats ...
"""


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = job_parser(parser, "remap", __doc__, EXAMPLES)
    parser.add_argument("--manifest", required=True, help="manifest.json or its directory")
    parser.add_argument("--stats", default=None,
                        help="stats partition profiled with --row-counts (default: the manifest's inputs.stats)")
    add_spark_args(parser)
    return parser


def run(args: argparse.Namespace) -> pathlib.Path:

    import pyarrow.parquet as pq

    from recshard_stats.atomic import building_dir
    from recshard_stats.errors import Reason, RecShardError
    from recshard_stats.manifest import MANIFEST_NAME, load_manifest, sha256_data, write_manifest
    from recshard_stats.remap import hotter_rows, remap_rows, unseen_hbm_below
    from recshard_stats.stats import load_stats
    from solver.manifest import stats_digest

    manifest = load_manifest(args.manifest, verify_checksums=False)
    data = manifest.data
    stats = load_stats(args.stats or data["inputs"]["stats"])
    if stats_digest(stats) != data["inputs"]["stats_digest"]:
        raise RecShardError(Reason.MANIFEST_MISMATCH,
                            f"{stats.path} is not the stats partition {manifest.path} was solved from",
                            fixes=("pass --stats with the partition named in the manifest's inputs",))
    if not stats.metadata.get("row_counts"):
        raise RecShardError(Reason.STATS_INVALID, f"{stats.path} has no per-row access counts",
                            fixes=("re-run `recshard profile` with --row-counts",))
    names = [t["name"] for t in data["tables"]]
    spark = spark_session("recshard-remap", args.master, args.driver_memory)
    # table names such as "123" must stay strings when read back from table=<name> directories
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    source = manifest.path.parent
    with building_dir(source) as tmp:
        for entry in source.iterdir():
            if entry.name not in ("remap", MANIFEST_NAME) and not entry.name.startswith("_tmp"):
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, tmp / entry.name)
        staging = tmp / "_staging"
        row_counts = spark.read.parquet(local_uri(stats.path / "row_counts"))
        log.info("remapping %d tables", len(names))
        remapped = remap_rows(row_counts.where(row_counts.table.isin(names)), hotter_rows(spark, stats, names))
        (remapped.repartition("table").sortWithinPartitions("table", "index")
         .write.partitionBy("table").parquet(local_uri(staging)))
        spill = [(t["name"], t["rows_hbm"] - t["unique_rows"], t["unique_rows"]) for t in data["tables"]
                 if t["rows_hbm"] > t["unique_rows"]]
        below = {}
        if spill:
            written = spark.read.parquet(local_uri(staging))
            below = {r["table"]: r["below_row"] for r in unseen_hbm_below(
                written, spark.createDataFrame(spill, "table string, k bigint, n_seen bigint")).collect()}
        (tmp / "remap").mkdir()
        for t in data["tables"]:
            written = staging / f"table={t['name']}"
            target = tmp / "remap" / f"{t['name']}.parquet"
            if written.exists():
                written.rename(target)
                rows = sum(pq.ParquetFile(p).metadata.num_rows for p in target.glob("*.parquet"))
            else:  # a table never accessed: an empty remap, every row keeps its place
                target.mkdir()
                pq.write_table(_empty_remap(), target / "part-0.parquet")
                rows = 0
            if rows != t["unique_rows"]:
                raise RecShardError(Reason.STATS_INVALID,
                                    f"table {t['name']!r}: {rows} rows remapped, stats count {t['unique_rows']}",
                                    fixes=("re-run the profile with --row-counts",))
            t["remap"] = {"path": f"remap/{t['name']}.parquet", "sha256": sha256_data(target), "rows": rows}
            t["unseen_hbm_below_row"] = below.get(t["name"], 0)
        shutil.rmtree(staging)
        write_manifest(tmp / MANIFEST_NAME, data)
        log.info("remap files for %d tables written; manifest updated with checksums", len(names))
    path = source / MANIFEST_NAME
    load_manifest(path)  # what was published reads back and verifies
    return path


def _empty_remap():
    import pyarrow as pa

    return pa.table({"row": pa.array([], pa.int64()), "index": pa.array([], pa.int64()),
                     "access_count": pa.array([], pa.int64())})


def main(argv: list[str] | None = None) -> int:
    return job_main(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
