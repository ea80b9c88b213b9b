"""The plan in TorchRec's terms, as JSON (``torchrec_plan.json``) a TorchRec user reads without
this package, and the kernel choice :mod:`recshard_stats.torchrec_trainer` uses too.

Per table: ``sharding_type`` ``table_wise`` on one rank, or ``column_wise`` on its column shards'
ranks (equal column widths, in column order); compute kernel ``fused`` when the whole
table is in HBM, ``fused_uvm`` when none of it is, else ``fused_uvm_caching`` with the HBM share
of rows as ``cache_load_factor`` (TorchRec's own cache; RecShard's static split of such a table
into an HBM and a UVM part is :func:`recshard_stats.torchrec_trainer.sharding_plan`); and
``ParameterConstraints``-style ``pooling_factors`` (mean ids per sample, per feature). With
torchrec installed, ``recshard_stats.torchrec_trainer.sharding_plan(manifest)`` builds the real
``ShardingPlan`` instead.
"""

from __future__ import annotations

from recshard_stats.costmodel import ComputeKernel, ShardingType
from recshard_stats.manifest import Manifest


def unsplit_kernel(rows_hbm: int, hash_size: int) -> tuple[ComputeKernel, float | None]:
    """TorchRec compute kernel of a table planned whole with ``rows_hbm`` of its rows in HBM, and
    its cache load factor (None: no cache)."""
    if rows_hbm == hash_size:
        return ComputeKernel.FUSED, None
    if rows_hbm == 0:
        return ComputeKernel.FUSED_UVM, None
    return ComputeKernel.FUSED_UVM_CACHING, rows_hbm / hash_size


def torchrec_plan(manifest: Manifest) -> dict:
    tables = {}
    for t in manifest.tables:
        kernel, load_factor = unsplit_kernel(t.rows_hbm, t.hash_size)
        tables[t.name] = {
            "sharding_type": ShardingType.COLUMN_WISE if t.column_shards else ShardingType.TABLE_WISE,
            "ranks": list(t.ranks),
            "compute_kernel": kernel,
            "cache_load_factor": load_factor,
            "num_embeddings": t.hash_size,
            "embedding_dim": t.dim,
            "feature_names": list(t.features),
            "pooling_factors": list(t.feature_pooling),
        }
    return {
        "format": "torchrec-plan",
        "source_manifest_digest": manifest.inputs.digest,
        "world_size": manifest.num_gpus,
        "tables": tables,
    }
