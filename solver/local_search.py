"""Local search over the assignment: moves and swaps off the slowest GPU, each judged by the
exact split of the two GPUs it touches.

A GPU's cost with a given set of tables is their all-in-UVM time less what its HBM saves when
filled with rows in decreasing saving per byte (the water-filling of :mod:`solver.waterfill`).
Each table's segments (seconds saved per row, rows, bytes) are computed once, so a GPU's cost is
a concatenation, a sort and a cumulative sum in numpy: well under a millisecond for the tables
of one GPU. From a start, the search moves one table of the slowest GPU to another GPU, or
swaps it with one there, taking the first change that lowers the slowest of the two below the
slowest GPU's cost, until none does or the time budget runs out. The result is split exactly
(:func:`~recshard_stats.solver.waterfill.split_assignment`) like every other plan.
"""

from __future__ import annotations

import time

import numpy as np

from recshard_stats.solver.plan import Plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import fractional_saving, segments, split_assignment

_EPS = 1e-12


class GpuCostModel:
    """Cost of any set of tables on one GPU, from precomputed per-table segments."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.uvm = np.array([problem.uvm_time(j) for j in range(len(problem.tables))])
        self.buffers = np.array(problem.trainer_bytes, dtype=np.float64)
        self.density, self.bytes, self.saved = [], [], []
        for j, t in enumerate(problem.tables):
            per_row, rows, _ = segments(problem, [j])
            self.density.append(per_row / t.row_bytes)      # seconds saved per HBM byte
            self.bytes.append(rows * t.row_bytes)
            self.saved.append(per_row * rows)                # seconds the whole segment saves

    def cost(self, tables: list[int]) -> float:
        """Seconds per batch of a GPU holding ``tables`` with its HBM split exactly (rows taken
        fractionally); infinite when their trainer buffers overflow its HBM."""
        if not tables:
            return 0.0
        capacity = self.problem.hbm_capacity - self.buffers[tables].sum()
        if capacity < 0:
            return float("inf")
        density = np.concatenate([self.density[j] for j in tables])
        size = np.concatenate([self.bytes[j] for j in tables])
        saved = np.concatenate([self.saved[j] for j in tables])
        order = np.argsort(-density, kind="stable")
        return float(self.uvm[tables].sum() - fractional_saving(saved[order], size[order], density[order], capacity))


def lpt_plan(problem: Problem, model: GpuCostModel | None = None) -> Plan:
    """Longest processing time first, by the exact model: the tables, costliest in UVM first,
    each onto the GPU whose exact cost grows the least with it (its buffers must fit)."""
    model = model or GpuCostModel(problem)
    members: list[list[int]] = [[] for _ in range(problem.num_gpus)]
    cost = [0.0] * problem.num_gpus
    gpu = [0] * len(problem.tables)
    for j in sorted(range(len(problem.tables)), key=lambda j: (-model.uvm[j], j)):
        new = [model.cost(m + [j]) for m in members]
        h = int(np.argmin([max(n, c) for n, c in zip(new, cost)]))
        members[h].append(j)
        cost[h], gpu[j] = new[h], h
    assignment = tuple(gpu)
    return Plan("lpt", assignment, split_assignment(problem, assignment))


def improve(problem: Problem, plan: Plan, budget_s: float = 10.0, name: str | None = None,
            model: GpuCostModel | None = None) -> Plan:
    """The plan's assignment improved by moves and swaps off the slowest GPU, exactly split
    (``model``: the problem's, when the caller has built it already)."""
    model = model or GpuCostModel(problem)
    members = [[j for j, g in enumerate(plan.gpu) if g == h] for h in range(problem.num_gpus)]
    cost = [model.cost(m) for m in members]
    deadline = time.time() + budget_s
    while time.time() < deadline:
        worst = int(np.argmax(cost))
        change = _first_improvement(model, members, cost, worst, deadline)
        if change is None:
            break
        h, moved_out, moved_in, new_worst, new_h = change
        members[worst] = [j for j in members[worst] if j != moved_out] + ([moved_in] if moved_in is not None else [])
        members[h] = [j for j in members[h] if j != moved_in] + [moved_out]
        cost[worst], cost[h] = new_worst, new_h
    gpu = [0] * len(problem.tables)
    for h, tables in enumerate(members):
        for j in tables:
            gpu[j] = h
    assignment = tuple(gpu)
    return Plan(name or plan.name, assignment, split_assignment(problem, assignment))


def _first_improvement(model: GpuCostModel, members, cost, worst: int, deadline: float):
    """The first move or swap that brings the worst GPU and its partner both below the worst
    GPU's cost: (partner, table out of worst, table into worst or None, their new costs)."""
    target = cost[worst] - max(_EPS, 1e-9 * cost[worst])
    mine = sorted(members[worst], key=lambda j: -model.uvm[j])  # the costliest tables first
    others = sorted((h for h in range(len(members)) if h != worst), key=lambda h: cost[h])
    for j in mine:
        rest = [t for t in members[worst] if t != j]
        new_worst = model.cost(rest)
        for h in others:
            if cost[h] >= target:
                break
            new_h = model.cost(members[h] + [j])
            if max(new_worst, new_h) < target:
                return h, j, None, new_worst, new_h
        if time.time() > deadline:
            return None
    for j in mine:
        rest = [t for t in members[worst] if t != j]
        for h in others:
            if cost[h] >= target:
                break
            for k in members[h]:
                new_worst = model.cost(rest + [k])
                if new_worst >= target:
                    continue
                new_h = model.cost([t for t in members[h] if t != k] + [j])
                if new_h < target:
                    return h, j, k, new_worst, new_h
            if time.time() > deadline:
                return None
    return None
