"""Exact HBM split by water-filling, and the lower bound every plan reports its gap to.

Moving one seen row of table j from UVM to HBM saves ``(t_uvm_j - t_hbm_j) * v / A_j`` per
batch, where ``t_uvm_j`` / ``t_hbm_j`` are the table's per-batch times all in UVM / all in
HBM, ``A_j`` its profiled accesses and v the row's value (its profiled access count; less for
rows seen once, see ``TableDemand.row_values``). So the best split of a GPU's HBM fills rows
in decreasing saving per byte across its tables until the bytes run out (a fractional
knapsack over the count-of-counts segments, optimal up to one row per table).

Rows never seen come last in every table's order, each worth ``TableDemand.unseen_row_value``
(never more than a seen row), so a table's HBM part is always a prefix of its remap order and
the split is exact. The same knapsack over the GPUs' pooled HBM, divided by G, bounds every
plan from below.
"""

from __future__ import annotations

import numpy as np

from recshard_stats.solver.problem import Problem


def segments(problem: Problem, tables: list[int]):
    """(seconds saved per row, rows, owner) of every segment (count classes, then never-seen
    rows), most seconds saved per HBM byte first."""
    saved, size, owner = [], [], []
    for j in tables:
        t = problem.tables[j]
        # table j's row of value v moves v / A_j of its accesses from UVM to HBM
        per_value = (problem.uvm_time(j) - problem.hbm_time(j)) / max(t.coc.total_accesses, 1)
        saved += [t.row_values * per_value, [t.unseen_row_value * per_value]]
        size += [t.coc.rows.astype(np.float64), [float(t.hash_size - t.unique_rows)]]
        owner += [np.full(len(t.coc.counts) + 1, j)]
    if not saved:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=int)
    saved, size, owner = (np.concatenate(a) for a in (saved, size, owner))
    row_bytes = np.array([problem.tables[j].row_bytes for j in owner])
    order = np.argsort(-saved / row_bytes, kind="stable")
    keep = size[order] > 0
    return saved[order][keep], size[order][keep], owner[order][keep]


def fractional_saving(saved: np.ndarray, size: np.ndarray, density: np.ndarray, capacity: float) -> float:
    """Seconds saved by filling ``capacity`` bytes with segments in the given order (most saving
    per byte first), the one HBM runs out in taken in part. Per segment: ``saved`` seconds in
    all, ``size`` bytes, ``density`` seconds per byte."""
    filled = np.cumsum(size)
    capacity = max(capacity, 0.0)
    whole = int(np.searchsorted(filled, capacity, side="right"))
    saving = float(saved[:whole].sum())
    if whole < len(saved):
        saving += float(density[whole]) * (capacity - (filled[whole - 1] if whole else 0.0))
    return saving


def split(problem: Problem, tables: list[int], capacity: float) -> dict[int, int]:
    """Rows in HBM for each of ``tables`` sharing ``capacity`` bytes of HBM for rows."""
    rows = {j: 0 for j in tables}
    left = max(capacity, 0.0)
    for _, n, j in zip(*segments(problem, tables)):
        rb = problem.tables[j].row_bytes
        take = min(int(n), int(left // rb))
        rows[j] += take
        left -= take * rb
    return rows


def split_assignment(problem: Problem, gpu: tuple[int, ...]) -> tuple[int, ...]:
    """Best rows_hbm for a given table -> GPU assignment (a GPU whose tables' trainer buffers
    overflow it gets no rows: :func:`~recshard_stats.solver.plan.violations` names it)."""
    rows = [0] * len(problem.tables)
    for g in range(problem.num_gpus):
        mine = [j for j, owner in enumerate(gpu) if owner == g]
        for j, h in split(problem, mine, problem.rows_capacity(mine)).items():
            rows[j] = h
    return tuple(rows)


def lower_bound(problem: Problem) -> float:
    """No plan's slowest GPU can beat: (a) all HBM left by the trainer's buffers pooled and
    water-filled (rows taken fractionally), divided by G; (b) the costliest table alone on a GPU
    with all of its HBM; (c) with more tables than GPUs, two of the G + 1 costliest (each alone)
    share a GPU, which costs at least the two cheapest of them alone."""
    everything = list(range(len(problem.tables)))
    total = sum(problem.uvm_time(j) for j in everything)
    per_row, rows, owner = segments(problem, everything)
    row_bytes = np.array([problem.tables[j].row_bytes for j in owner])
    total -= fractional_saving(per_row * rows, rows * row_bytes, per_row / row_bytes, problem.pooled_rows_capacity)
    alone = sorted((problem.table_cost(j, split(problem, [j], problem.rows_capacity([j]))[j]) for j in everything),
                   reverse=True)
    g = problem.num_gpus
    pair = alone[g - 1] + alone[g] if len(alone) > g else 0.0
    return max(total / g, alone[0] if alone else 0.0, pair)
