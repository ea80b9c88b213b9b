"""The one cost model (docs/design.md, "Cost model"), shared by the solver's predictions and the
replay of held-out data: per-batch seconds of a table whose accesses are served from HBM with
probability ``hbm_fraction`` and from UVM otherwise; a GPU costs the sum of its tables, and the
slowest GPU sets the step time."""

from __future__ import annotations

import dataclasses
from typing import Sequence


def table_seconds(accesses_per_batch: float, row_bytes: float, hbm_fraction: float,
                  hbm_bandwidth: float, uvm_bandwidth: float) -> float:
    """``a_j * row_bytes_j * (F / BW_hbm + (1 - F) / BW_uvm)``."""
    moved = accesses_per_batch * row_bytes
    return moved * (hbm_fraction / hbm_bandwidth + (1.0 - hbm_fraction) / uvm_bandwidth)


@dataclasses.dataclass(frozen=True)
class GpuCosts:
    """A placement's cost: per table and per GPU (seconds per batch), and the share of all
    accesses served from UVM."""
    table_cost: tuple[float, ...]
    gpu_cost: tuple[float, ...]
    uvm_access_fraction: float

    @property
    def max_cost(self) -> float:
        return max(self.gpu_cost)

    @property
    def imbalance(self) -> float:
        mean = sum(self.gpu_cost) / len(self.gpu_cost)
        return self.max_cost / mean if mean else 1.0


def placement_cost(num_gpus: int, gpu: Sequence[int], accesses_per_batch: Sequence[float],
                   row_bytes: Sequence[float], hbm_fraction: Sequence[float], hbm_bandwidth: float,
                   uvm_bandwidth: float) -> GpuCosts:
    """Tables (``gpu``, per-batch accesses, row bytes, HBM hit share, each per table) -> their cost."""
    gpu_cost = [0.0] * num_gpus
    table_cost = []
    uvm = total = 0.0
    for g, a, rb, f in zip(gpu, accesses_per_batch, row_bytes, hbm_fraction):
        cost = table_seconds(a, rb, f, hbm_bandwidth, uvm_bandwidth)
        table_cost.append(cost)
        gpu_cost[g] += cost
        uvm += a * (1 - f)
        total += a
    return GpuCosts(tuple(table_cost), tuple(gpu_cost), uvm / total if total else 0.0)


# share of a table's lookups one TorchRec shard serves: ids hash uniformly over rows, so a row
# shard serves its share of the rows; column shards serve every lookup (on their share of the
# bytes); a data-parallel table serves 1/G of the lookups on each rank
_LOOKUP_SHARE = {"row_wise": "rows", "table_row_wise": "rows", "grid_shard": "rows", "data_parallel": "ranks"}


def shard_cost(num_gpus: int, shards, tables, accesses_per_batch: Sequence[float], hbm_fraction,
               hbm_bandwidth: float, uvm_bandwidth: float) -> GpuCosts:
    """A TorchRec plan's shards (``recshard_stats.manifest.TorchRecShard``) costed in this model.
    ``tables``: name, hash_size, dim and row_bytes of each table; ``hbm_fraction(j, rows)``: the HBM
    share of table j's accesses with its ``rows`` hottest rows in HBM. A ``fused`` shard is served
    from HBM, ``fused_uvm`` from UVM, ``fused_uvm_caching`` from a cache of its load factor taken to
    hold the hottest rows."""
    from recshard_stats.export import FUSED_UVM, FUSED_UVM_CACHING

    index = {t.name: j for j, t in enumerate(tables)}
    gpu, accesses, row_bytes, fractions = [], [], [], []
    for s in shards:
        j = index[s.table]
        t = tables[j]
        if s.compute_kernel == FUSED_UVM:
            f = 0.0
        elif s.compute_kernel == FUSED_UVM_CACHING:
            f = float(hbm_fraction(j, s.cache_load_factor * t.hash_size))
        else:
            f = 1.0
        share = {"rows": s.rows / t.hash_size, "ranks": 1.0 / num_gpus}.get(_LOOKUP_SHARE.get(s.sharding_type), 1.0)
        gpu.append(s.rank)
        accesses.append(accesses_per_batch[j] * share)
        row_bytes.append(t.row_bytes * s.cols / t.dim)
        fractions.append(f)
    return placement_cost(num_gpus, gpu, accesses, row_bytes, fractions, hbm_bandwidth, uvm_bandwidth)
