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
