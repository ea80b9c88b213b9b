"""The plan in TorchRec's terms, as JSON (``torchrec_plan.json``) a TorchRec user reads without
this package, and the kernel choice :mod:`recshard_stats.torchrec_trainer` uses too.

It states the layout that runs, the static split (``"layout": "static_split"``), never TorchRec's
cache (whose per-row state the plan leaves no HBM for). Per table: ``sharding_type``
``table_wise`` on one rank, or ``column_wise`` on its column shards' ranks (equal column widths,
in column order); ``ParameterConstraints``-style ``pooling_factors`` (mean ids per sample, per
feature); and its ``parts``, the TorchRec tables it runs as: itself whole (``fused`` when all
its rows are in HBM, ``fused_uvm`` when none are), or ``<table>__hbm`` (its ``rows_hbm`` hottest
rows, ``fused``) and ``<table>__uvm`` (the rest, ``fused_uvm``), each with its first position in
the table's remap order. ``data_type`` is the weights' (from the hardware config's
``bytes_per_element``), ``optimizer`` the trainer's fused embedding optimizer (FBGEMM's
``EmbOptimType``, from the hardware config's ``optimizer``) whose state each table's
``optimizer_state_bytes_per_row`` the plan counts. With torchrec installed,
``recshard_stats.torchrec_trainer.sharding_plan(manifest)`` builds the real ``ShardingPlan``.
"""

from __future__ import annotations

from recshard_stats.config import WEIGHT_DATA_TYPES, optimizer_state_bytes
from recshard_stats.costmodel import ComputeKernel, ShardingType
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import Manifest

HBM_SUFFIX, UVM_SUFFIX = "__hbm", "__uvm"  # a split table's parts, as TorchRec tables
# a hardware config's optimizer -> FBGEMM's EmbOptimType (what TorchRec's fused optimizer runs)
EMB_OPTIM_TYPES = {
    "sgd": "EXACT_SGD",
    "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
    "adagrad": "EXACT_ADAGRAD",
    "adam": "ADAM",
}


def data_type_name(bytes_per_element: int) -> str:
    """The weights' data type of a hardware config's ``bytes_per_element`` (fp32 or fp16)."""
    if bytes_per_element not in WEIGHT_DATA_TYPES:
        raise RecShardError(
            Reason.MANIFEST_INVALID,
            f"bytes_per_element {bytes_per_element}: the weights are fp32 (4) or fp16 (2)",
            fixes=("solve again with bytes_per_element 4 or 2 in the hardware config",),
        )
    return WEIGHT_DATA_TYPES[bytes_per_element]


def parts_of(name: str, hash_size: int, rows_hbm: int) -> list[dict]:
    """The TorchRec tables one table runs as under the static split: name, kernel, rows and the
    remap position of its row 0 (a table left whole keeps its hashed row order)."""
    if rows_hbm in (0, hash_size):
        kernel = ComputeKernel.FUSED if rows_hbm == hash_size else ComputeKernel.FUSED_UVM
        return [{"name": name, "compute_kernel": kernel, "num_embeddings": hash_size, "first_row": 0}]
    return [
        {
            "name": name + HBM_SUFFIX,
            "compute_kernel": ComputeKernel.FUSED,
            "num_embeddings": rows_hbm,
            "first_row": 0,
        },
        {
            "name": name + UVM_SUFFIX,
            "compute_kernel": ComputeKernel.FUSED_UVM,
            "num_embeddings": hash_size - rows_hbm,
            "first_row": rows_hbm,
        },
    ]


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
        tables[t.name] = {
            "sharding_type": ShardingType.COLUMN_WISE if t.column_shards else ShardingType.TABLE_WISE,
            "ranks": list(t.ranks),
            "num_embeddings": t.hash_size,
            "embedding_dim": t.dim,
            "feature_names": list(t.features),
            "pooling_factors": list(t.feature_pooling),
            "parts": parts_of(t.name, t.hash_size, t.rows_hbm),
            "optimizer_state_bytes_per_row": optimizer_state_bytes(manifest.hardware.optimizer, t.dim),
        }
    return {
        "format": "torchrec-plan",
        "version": 3,
        "layout": "static_split",
        "layout_note": "a table with rows in both tiers runs as two TorchRec tables, <table>__hbm (fused) "
        "and <table>__uvm (fused_uvm), as recshard_stats.torchrec_trainer builds them; no TorchRec cache",
        "data_type": data_type_name(manifest.hardware.bytes_per_element),
        "optimizer": EMB_OPTIM_TYPES[manifest.hardware.optimizer],
        "source_manifest_digest": manifest.inputs.digest,
        "world_size": manifest.num_gpus,
        "tables": tables,
    }
