"""recshard-stats: statistical, feature-based embedding sharding (RecShard).

The library holds what every stage shares: configs, schemas, statistics, hashing and
the manifest contract. Spark is imported only by the modules that need it, so a trainer
can use :mod:`recshard_stats.manifest` and :mod:`recshard_stats.hashing` with numpy and
pyarrow alone.
"""

__version__ = "0.1.0"
