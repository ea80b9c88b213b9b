"""Exact HBM split by water-filling, and the lower bound every plan reports its gap to.

Moving one seen row of table j from UVM to HBM saves ``row_bytes_j * a_j * (1/BW_uvm -
1/BW_hbm) * (1 - p_j) * c / A_j`` per batch, where c is the row's profiled access count,
``A_j`` the table's profiled accesses and ``p_j`` its unseen-row probability (see
``TableDemand.unseen_probability``). Since ``a_j / A_j = B / N`` for every table, the saving
per HBM byte is ``(B / N) * (1/BW_uvm - 1/BW_hbm) * (1 - p_j) * c``: rows of all tables on a
GPU compete on ``(1 - p_j) * c`` alone. So the best split fills rows in decreasing
``(1 - p_j) * c`` across the GPU's tables until the bytes run out (a fractional knapsack over
the count-of-counts segments, optimal up to one row per table).

Rows never seen go to HBM only by whole tables (a table whose remaining rows all fit is made
fully HBM-resident, the ``fused`` kernel, best saving per byte first), so a plan's HBM part
is always "the seen rows, hottest first" or "all rows" -- which keeps the remap and the
trainer's tier lookup exact and simple.
"""

from __future__ import annotations

import numpy as np

from solver.problem import Problem


def _segments(problem: Problem, tables: list[int], relax_unseen: bool):
    """(value per row in count units, rows, owner) of every segment, best first. With
    ``relax_unseen`` each table's unseen rows form one more segment sharing its unseen mass
    evenly (a relaxation: real plans take unseen rows only with the whole table)."""
    value, size, owner = [], [], []
    for j in tables:
        t = problem.tables[j]
        value.append(t.row_values)
        size.append(t.coc.rows.astype(np.float64))
        owner.append(np.full(len(t.coc.counts), j))
        if relax_unseen and t.unique_rows < t.hash_size:
            unseen = t.hash_size - t.unique_rows
            value.append(np.array([t.unseen_probability * t.coc.total_accesses / unseen]))
            size.append(np.array([float(unseen)]))
            owner.append(np.array([j]))
    if not value:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=int)
    value, size, owner = (np.concatenate(a) for a in (value, size, owner))
    # per byte, not per row: tables differ in row_bytes
    per_byte = value / np.array([problem.tables[j].row_bytes for j in owner])
    order = np.argsort(-per_byte, kind="stable")
    return value[order], size[order], owner[order]


def split(problem: Problem, tables: list[int], capacity: float) -> dict[int, int]:
    """Rows in HBM for each of ``tables`` sharing ``capacity`` bytes of HBM."""
    rows = {j: 0 for j in tables}
    left = capacity
    for _, n, j in zip(*_segments(problem, tables, relax_unseen=False)):
        rb = problem.tables[j].row_bytes
        take = min(int(n), int(left // rb))
        rows[j] += take
        left -= take * rb
        if take < n:
            break
    saving_per_byte = {}
    for j in tables:
        t = problem.tables[j]
        rest = t.hash_size - rows[j]
        if rest > 0:
            saving_per_byte[j] = (problem.table_cost(j, rows[j]) - problem.table_cost(j, t.hash_size)) / (
                rest * t.row_bytes)
    for j in sorted(saving_per_byte, key=lambda j: (-saving_per_byte[j], j)):
        t = problem.tables[j]
        rest = t.hash_size - rows[j]
        if rest * t.row_bytes <= left:
            rows[j] = t.hash_size
            left -= rest * t.row_bytes
    return rows


def split_assignment(problem: Problem, gpu: tuple[int, ...]) -> tuple[int, ...]:
    """Best rows_hbm for a given table -> GPU assignment."""
    rows = [0] * len(problem.tables)
    for g in range(problem.num_gpus):
        mine = [j for j, owner in enumerate(gpu) if owner == g]
        for j, h in split(problem, mine, problem.hbm_capacity).items():
            rows[j] = h
    return tuple(rows)


def lower_bound(problem: Problem) -> float:
    """No plan's slowest GPU can beat: (a) the pooled relaxation (all HBM shared, unseen rows
    taken fractionally, water-filled) / G, nor (b) the costliest table alone on a GPU with all
    of its HBM."""
    everything = list(range(len(problem.tables)))
    total = sum(problem.uvm_time(j) for j in everything)
    left = problem.hbm_capacity * problem.num_gpus
    for value, n, j in zip(*_segments(problem, everything, relax_unseen=True)):
        t = problem.tables[j]
        take = min(n, left / t.row_bytes)
        if take <= 0:
            break
        # value * take / A_j of the table's accesses move from UVM to HBM
        total -= (problem.uvm_time(j) - problem.hbm_time(j)) * value * take / t.coc.total_accesses
        left -= take * t.row_bytes
    single = max((problem.table_cost(j, split(problem, [j], problem.hbm_capacity)[j]) for j in everything),
                 default=0.0)
    return max(total / problem.num_gpus, single)
