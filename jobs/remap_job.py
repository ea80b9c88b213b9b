"""Write each table's remap (hot rows first) next to a manifest and record their checksums.

    spark-submit jobs/remap_job.py --manifest manifests/ds=2026-12-01 --stats stats/ds=2026-12-01

The same as ``recshard remap`` (see ``--help``): the work is in :mod:`recshard_stats.stages`.
"""

import sys

from recshard_stats.cli import main

if __name__ == "__main__":
    sys.exit(main(["remap", *sys.argv[1:]]))
