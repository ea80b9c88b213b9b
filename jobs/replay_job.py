"""Replay held-out logs through a manifest: measured HBM/UVM accesses and per-batch cost of
each plan beside the prediction.

    spark-submit jobs/replay_job.py --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02

The same as ``recshard evaluate`` (see ``--help``): the work is in :mod:`recshard_stats.stages`.
"""

import sys

from recshard_stats.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
