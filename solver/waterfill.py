"""Exact HBM split by water-filling.

Moving one row of table j from UVM to HBM saves ``row_bytes_j * a_j * (1/BW_uvm - 1/BW_hbm)
* c / A_j`` per batch, where c is the row's access count and ``A_j`` the table's profiled
accesses; per HBM byte that is ``(B / N) * (1/BW_uvm - 1/BW_hbm) * c``: the same for every
table. So the best split of a GPU's HBM fills rows in decreasing access count, across its
tables, until the bytes run out (a fractional knapsack over the count-of-counts segments,
optimal up to one row per table). Rows never seen save nothing predicted; they go to HBM only
by whole tables (a table whose remaining rows all fit is made fully HBM-resident, the
``fused`` kernel), so a plan's HBM part is always "the seen rows, hottest first" or "all
rows" -- which keeps the remap and the trainer's tier lookup exact and simple.
"""

from __future__ import annotations

import numpy as np

from solver.problem import Problem


def split(problem: Problem, tables: list[int], capacity: float) -> dict[int, int]:
    """Rows in HBM for each of ``tables`` sharing ``capacity`` bytes of HBM."""
    seg_count, seg_rows, seg_table = [], [], []
    for j in tables:
        coc = problem.tables[j].coc
        seg_count.append(coc.counts.astype(np.float64))
        seg_rows.append(coc.rows.astype(np.float64))
        seg_table.append(np.full(len(coc.counts), j))
    rows = {j: 0 for j in tables}
    left = capacity
    if seg_count:
        counts, seg_n, owner = (np.concatenate(a) for a in (seg_count, seg_rows, seg_table))
        # benefit per byte is proportional to count / samples profiled; all tables share N
        for k in np.argsort(-counts, kind="stable"):
            if left <= 0:
                break
            j = int(owner[k])
            rb = problem.tables[j].row_bytes
            take = min(int(seg_n[k]), int(left // rb))
            rows[j] += take
            left -= take * rb
    for j in sorted(tables, key=lambda j: -problem.uvm_time(j)):
        t = problem.tables[j]
        rest = t.hash_size - rows[j]
        if 0 < rest and rest * t.row_bytes <= left:
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
    """No plan's slowest GPU can beat: (a) the pooled optimum (all HBM shared, water-filled) / G,
    nor (b) the costliest table alone on a GPU with all of its HBM."""
    everything = list(range(len(problem.tables)))
    pooled = split(problem, everything, problem.hbm_capacity * problem.num_gpus)
    total = sum(problem.table_cost(j, h) for j, h in pooled.items())
    single = max((problem.table_cost(j, split(problem, [j], problem.hbm_capacity)[j]) for j in everything), default=0.0)
    return max(total / problem.num_gpus, single)

