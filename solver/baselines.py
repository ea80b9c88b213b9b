"""Meta's greedy family (docs/design.md, "Baselines"): sort tables by a cost metric, descending; put each on the
least-loaded GPU (load = sum of the metric) whose HBM still holds the whole table and the
trainer's buffers for it; a table that fits nowhere stays wholly in UVM, on the least-loaded GPU
that still holds its buffers. No statistics beyond the
mean pooling factor are used -- that is what RecShard improves on."""

from __future__ import annotations

import math

from recshard_stats.solver.plan import Plan
from recshard_stats.solver.problem import Problem, TableDemand

METRICS = {
    "size": lambda t: t.size_bytes,
    "lookup": lambda t: t.dim * t.accesses_per_batch,
    "size_lookup": lambda t: t.dim * t.accesses_per_batch * math.log10(max(t.hash_size, 10)),
}


def greedy(problem: Problem, metric: str) -> Plan:
    cost = METRICS[metric]
    load = [0.0] * problem.num_gpus
    free = [problem.hbm_capacity] * problem.num_gpus
    gpu = [0] * len(problem.tables)
    rows = [0] * len(problem.tables)
    order = sorted(range(len(problem.tables)), key=lambda j: (-cost(problem.tables[j]), j))
    for j in order:
        table: TableDemand = problem.tables[j]
        buffers = problem.trainer_bytes[j]
        fits = [g for g in range(problem.num_gpus) if free[g] >= table.size_bytes + buffers]
        candidates = (
            fits or [g for g in range(problem.num_gpus) if free[g] >= buffers] or range(problem.num_gpus)
        )
        g = min(candidates, key=lambda g: (load[g], g))
        gpu[j] = g
        load[g] += cost(table)
        free[g] -= buffers
        if fits:
            rows[j] = table.hash_size
            free[g] -= table.size_bytes
    return Plan(f"greedy_{metric}", tuple(gpu), tuple(rows))


def all_baselines(problem: Problem) -> list[Plan]:
    return [greedy(problem, m) for m in METRICS]
