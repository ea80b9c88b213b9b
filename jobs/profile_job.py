"""Profile training logs into per-feature statistics (Parquet) under <out>/ds=<date>/.

    spark-submit jobs/profile_job.py --model conf/criteo_kaggle.yaml --input day_0 --out stats --ds 2026-12-01

The same as ``recshard profile`` (see ``--help``): the work is in :mod:`recshard_stats.stages`.
"""

import sys

from recshard_stats.cli import main

if __name__ == "__main__":
    sys.exit(main(["profile", *sys.argv[1:]]))
