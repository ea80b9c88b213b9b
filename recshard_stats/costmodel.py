"""The one cost model of DESIGN.md, shared by the solver (predictions) and the replay
evaluation (held-out data): per-batch seconds of a table whose accesses are served from HBM
with probability ``hbm_fraction`` and from UVM otherwise."""

from __future__ import annotations


def table_seconds(accesses_per_batch: float, row_bytes: float, hbm_fraction: float,
                  hbm_bandwidth: float, uvm_bandwidth: float) -> float:
    """``a_j * row_bytes_j * (F / BW_hbm + (1 - F) / BW_uvm)``."""
    moved = accesses_per_batch * row_bytes
    return moved * (hbm_fraction / hbm_bandwidth + (1.0 - hbm_fraction) / uvm_bandwidth)
