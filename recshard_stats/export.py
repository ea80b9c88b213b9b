"""The plan in TorchRec's terms, as JSON a TorchRec user applies without this package.

Per table: ``sharding_type`` ``table_wise`` on one rank; compute kernel ``fused`` when the whole
table is in HBM, else ``fused_uvm_caching`` with the HBM share of rows as ``cache_load_factor``
(TorchRec's UVM cache keeps that fraction of rows in HBM); and ``ParameterConstraints``-style
``pooling_factors`` (mean ids per sample, per feature). Apply it as::

    from torchrec.distributed.planner.types import ParameterConstraints
    constraints = {name: ParameterConstraints(sharding_types=[t["sharding_type"]],
                                              compute_kernels=[t["compute_kernel"]],
                                              pooling_factors=t["pooling_factors"],
                                              cache_params=CacheParams(load_factor=t["cache_load_factor"]))
                   for name, t in plan["tables"].items()}

and pin each table to ``ranks`` with a ``ParameterSharding`` of that kernel. Importing torch
or torchrec is not needed to write it.
"""

from __future__ import annotations

from recshard_stats.manifest import Manifest


def torchrec_plan(manifest: Manifest) -> dict:
    tables = {}
    for t in manifest.tables:
        tables[t.name] = {
            "sharding_type": "table_wise",
            "ranks": [t.gpu],
            "compute_kernel": "fused" if t.fully_in_hbm else "fused_uvm_caching",
            "cache_load_factor": None if t.fully_in_hbm else t.rows_hbm / t.hash_size,
            "num_embeddings": t.hash_size,
            "embedding_dim": t.dim,
            "feature_names": list(t.features),
            "pooling_factors": list(t.feature_pooling),
        }
    return {"format": "torchrec-plan", "source_manifest_digest": manifest.inputs.digest,
            "world_size": manifest.num_gpus, "tables": tables}
