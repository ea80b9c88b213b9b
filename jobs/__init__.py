"""spark-submit entry points: argument parsing, SparkSession and I/O only; the work is in recshard_stats."""
