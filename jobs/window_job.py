"""Merge the last N days' stats partitions into one window partition <out>/ds=<date>/.

    spark-submit jobs/window_job.py --model conf/synthetic.yaml --stats stats --out windows --ds 2026-12-07 --days 7

The same as ``recshard window`` (see ``--help``): the work is in :mod:`recshard_stats.stages`.
"""

import sys

from recshard_stats.cli import main

if __name__ == "__main__":
    sys.exit(main(["window", *sys.argv[1:]]))
