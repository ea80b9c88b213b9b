"""A balanced assignment from the pooled split: the MILP's warm start, and its fallback at scale.

The pooled water-filling (all HBM shared, see :mod:`solver.waterfill`) gives every table its
ideal HBM rows, hence a fixed cost ``c_j`` and HBM bytes ``b_j`` (with the trainer's buffers); its total cost / G is the
lower bound. Placing tables so that each GPU's ``sum b_j`` fits its HBM and the ``sum c_j``
are even then gives a plan within the imbalance of the bound: the exact split of each GPU
(polish) can only do better than the pooled rows it can still afford. Longest-processing-time
first (a table that fits on no GPU goes to the emptiest with only the rows it has room for, its
cost re-evaluated, so no GPU starts over capacity), then moves and swaps off the slowest GPU
while they lower it. Column shards of one table never share a GPU.
"""

from __future__ import annotations

import time

import numpy as np

from recshard_stats.solver.plan import Plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import split, split_assignment

MAX_ROUNDS = 10_000


def balanced_plan(problem: Problem, deadline: float | None = None) -> Plan:
    """``deadline`` (a ``time.time()``): stop moving and swapping tables then."""
    tables = list(range(len(problem.tables)))
    g_count, cap = problem.num_gpus, problem.hbm_capacity
    pooled = split(problem, tables, problem.pooled_rows_capacity)
    cost = np.array([problem.table_cost(j, pooled[j]) for j in tables])
    # HBM a table takes: its pooled rows and the trainer's buffers for it
    size = np.array([pooled[j] * problem.tables[j].row_bytes + problem.trainer_bytes[j] for j in tables])
    load, used = np.zeros(g_count), np.zeros(g_count)
    gpu = np.zeros(len(tables), dtype=int)
    placed = np.zeros(len(tables), dtype=bool)
    siblings = problem.siblings

    def free(j: int, h: int, leaving: int | None = None) -> bool:  # no shard of j's table on h
        return all(not placed[s] or gpu[s] != h or s == leaving for s in siblings[j])

    for j in sorted(tables, key=lambda j: (-cost[j], j)):
        fits = np.array([h for h in np.flatnonzero(used + size[j] <= cap).tolist() if free(j, h)], dtype=int)
        if len(fits):
            g = int(fits[np.argmin(load[fits])])
        else:  # on the emptiest GPU, with only the rows it has room for: no GPU starts over capacity
            g = int(min((h for h in range(g_count) if free(j, h)), key=lambda h: used[h]))
            t = problem.tables[j]
            rows = max(0.0, (cap - used[g] - problem.trainer_bytes[j]) // t.row_bytes)
            size[j] = rows * t.row_bytes + problem.trainer_bytes[j]
            cost[j] = problem.table_cost(j, rows)
        gpu[j], load[g], used[g], placed[j] = g, load[g] + cost[j], used[g] + size[j], True

    for _ in range(MAX_ROUNDS):
        if deadline is not None and time.time() > deadline:
            break
        worst = int(np.argmax(load))
        best_peak = load[worst]
        best_move: tuple[int, int, int | None] | None = None
        for j in np.flatnonzero(gpu == worst).tolist():
            for h in range(g_count):
                if h == worst:
                    continue
                if not free(j, h):
                    continue
                if used[h] + size[j] <= cap:  # move j to h
                    peak = max(load[worst] - cost[j], load[h] + cost[j])
                    if peak < best_peak - 1e-15:
                        best_peak, best_move = peak, (j, h, None)
                for k in np.flatnonzero(gpu == h).tolist():  # swap j and k
                    if (
                        cost[k] >= cost[j]
                        or used[h] - size[k] + size[j] > cap
                        or used[worst] - size[j] + size[k] > cap
                        or not free(k, worst, j)
                    ):
                        continue
                    peak = max(load[worst] - cost[j] + cost[k], load[h] - cost[k] + cost[j])
                    if peak < best_peak - 1e-15:
                        best_peak, best_move = peak, (j, h, k)
        if best_move is None:
            break
        j, h, swapped = best_move
        for table, src, dst in ((j, worst, h), *(((swapped, h, worst),) if swapped is not None else ())):
            gpu[table] = dst
            load[src] -= cost[table]
            load[dst] += cost[table]
            used[src] -= size[table]
            used[dst] += size[table]
    assignment = tuple(int(g) for g in gpu)
    return Plan("balanced", assignment, split_assignment(problem, assignment))


def packed_plan(problem: Problem) -> Plan:
    """Trainer buffers first: each table, largest buffers first, onto the GPU with the most HBM
    left that holds no shard of its table (worst-fit decreasing), then split exactly. The start
    that still fits when the buffers nearly fill the GPUs and the cost-led starts overflow one."""
    left = [problem.hbm_capacity] * problem.num_gpus
    gpu = [0] * len(problem.tables)
    placed = [False] * len(problem.tables)
    for j in sorted(range(len(problem.tables)), key=lambda j: (-problem.trainer_bytes[j], j)):
        taken = {gpu[s] for s in problem.siblings[j] if placed[s]}
        g = max((h for h in range(problem.num_gpus) if h not in taken), key=lambda h: (left[h], -h))
        gpu[j], placed[j] = g, True
        left[g] -= problem.trainer_bytes[j]
    assignment = tuple(gpu)
    return Plan("packed", assignment, split_assignment(problem, assignment))
