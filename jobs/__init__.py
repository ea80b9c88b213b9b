"""spark-submit entry points (installed as ``recshard_stats.jobs``): each is the console script's
Spark subcommand of the same stage, so arguments, defaults and errors are those of ``recshard``."""
