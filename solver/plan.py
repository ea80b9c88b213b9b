"""A plan (table -> GPU, rows in HBM) and its evaluation under the one cost model of DESIGN.md:
``t_j = a_j * row_bytes_j * (F_j(h_j) / BW_hbm + (1 - F_j(h_j)) / BW_uvm)``, GPU cost = sum of
its tables, step time = the slowest GPU."""

from __future__ import annotations

import dataclasses

import numpy as np

from solver.problem import Problem


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    gpu: tuple[int, ...]         # per table
    rows_hbm: tuple[int, ...]    # per table, hottest rows kept in HBM


@dataclasses.dataclass(frozen=True)
class Evaluation:
    plan: Plan
    table_cost: tuple[float, ...]      # seconds per batch
    table_hbm_fraction: tuple[float, ...]
    gpu_cost: tuple[float, ...]
    gpu_hbm_bytes: tuple[float, ...]
    uvm_access_fraction: float         # share of all accesses served from UVM

    @property
    def max_cost(self) -> float:
        return max(self.gpu_cost)

    @property
    def imbalance(self) -> float:
        mean = float(np.mean(self.gpu_cost))
        return self.max_cost / mean if mean else 1.0


def evaluate(problem: Problem, plan: Plan) -> Evaluation:
    g = problem.num_gpus
    gpu_cost, gpu_bytes = [0.0] * g, [0.0] * g
    costs, fractions = [], []
    uvm_accesses = total_accesses = 0.0
    for j, table in enumerate(problem.tables):
        f = float(table.hbm_fraction(plan.rows_hbm[j]))
        cost = problem.table_cost(j, plan.rows_hbm[j])
        costs.append(cost)
        fractions.append(f)
        gpu_cost[plan.gpu[j]] += cost
        gpu_bytes[plan.gpu[j]] += plan.rows_hbm[j] * table.row_bytes
        uvm_accesses += table.accesses_per_batch * (1 - f)
        total_accesses += table.accesses_per_batch
    return Evaluation(plan, tuple(costs), tuple(fractions), tuple(gpu_cost), tuple(gpu_bytes),
                      uvm_accesses / total_accesses if total_accesses else 0.0)


def violations(problem: Problem, plan: Plan) -> list[str]:
    """Every capacity the plan breaks (empty when it is valid)."""
    out = []
    ev = evaluate(problem, plan)
    for g, used in enumerate(ev.gpu_hbm_bytes):
        if used > problem.hbm_capacity + 1e-6:
            out.append(f"GPU {g} uses {used:.0f} B of HBM, capacity {problem.hbm_capacity:.0f} B")
    uvm = sum((t.hash_size - plan.rows_hbm[j]) * t.row_bytes for j, t in enumerate(problem.tables))
    if uvm > problem.hardware.host_bytes:
        out.append(f"UVM needs {uvm:.0f} B, host has {problem.hardware.host_bytes} B")
    for j, t in enumerate(problem.tables):
        if not 0 <= plan.rows_hbm[j] <= t.hash_size:
            out.append(f"table {t.name}: rows_hbm {plan.rows_hbm[j]} outside [0, {t.hash_size}]")
        if not 0 <= plan.gpu[j] < problem.num_gpus:
            out.append(f"table {t.name}: GPU {plan.gpu[j]} does not exist")
    return out
