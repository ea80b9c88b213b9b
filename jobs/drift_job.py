"""The newest day's stats against the window before it, and the published plan on that day.

    spark-submit jobs/drift_job.py --day stats/ds=2026-12-08 --reference windows/ds=2026-12-07 --out drift.json

The same as ``recshard drift`` (see ``--help``): the work is in :mod:`recshard_stats.stages`.
"""

import sys

from recshard_stats.cli import main

if __name__ == "__main__":
    sys.exit(main(["drift", *sys.argv[1:]]))
