"""A plan (table -> GPU, rows in HBM) and its cost under the one cost model
(:mod:`recshard_stats.costmodel`): each table's lookups and distinct rows in HBM and in host
memory, GPU cost = its tables plus its kernel groups, step time = the slowest GPU."""

from __future__ import annotations

import dataclasses

from recshard_stats.costmodel import GpuCosts, placement_cost
from recshard_stats.solver.problem import Problem


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    gpu: tuple[int, ...]  # per table
    rows_hbm: tuple[int, ...]  # per table, hottest rows kept in HBM


@dataclasses.dataclass(frozen=True)
class PlanCost(GpuCosts):
    """A plan with its predicted cost (from the profiled access CDFs) and HBM use."""

    plan: Plan
    table_hbm_fraction: tuple[float, ...]
    gpu_hbm_bytes: tuple[float, ...]  # rows in HBM
    gpu_buffer_bytes: tuple[int, ...]  # the trainer's buffers of its tables


def cost_plan(problem: Problem, plan: Plan) -> PlanCost:
    loads = [
        problem.load(t, plan.rows_hbm[j], problem.comm_bytes[j], plan.gpu[j])
        for j, t in enumerate(problem.tables)
    ]
    fractions = tuple(float(load.hbm_fraction) for load in loads)
    costs = placement_cost(problem.hardware.costs, problem.num_gpus, loads)
    gpu_bytes = [0.0] * problem.num_gpus
    for j, table in enumerate(problem.tables):
        gpu_bytes[plan.gpu[j]] += plan.rows_hbm[j] * table.row_bytes
    buffers = tuple(
        problem.buffer_bytes([j for j, g in enumerate(plan.gpu) if g == rank])
        for rank in range(problem.num_gpus)
    )
    return PlanCost(
        **{f.name: getattr(costs, f.name) for f in dataclasses.fields(GpuCosts)},
        plan=plan,
        table_hbm_fraction=fractions,
        gpu_hbm_bytes=tuple(gpu_bytes),
        gpu_buffer_bytes=buffers,
    )


def violations(problem: Problem, plan: Plan, cost: PlanCost | None = None) -> list[str]:
    """Every capacity the plan breaks, and column shards of a table that share a GPU or keep
    different rows (empty when it is valid). ``cost``: the plan's, when the caller has it."""
    out = []
    cost = cost or cost_plan(problem, plan)
    for g, (used, buffers) in enumerate(zip(cost.gpu_hbm_bytes, cost.gpu_buffer_bytes, strict=True)):
        if used + buffers > problem.hbm_capacity + 1e-6:
            out.append(
                f"GPU {g} uses {used + buffers:.0f} B of HBM ({used:.0f} B of rows, {buffers:.0f} B of "
                f"trainer buffers), capacity {problem.hbm_capacity:.0f} B"
            )
    uvm = sum((t.hash_size - plan.rows_hbm[j]) * t.row_bytes for j, t in enumerate(problem.tables))
    if uvm > problem.hardware.host_bytes:
        out.append(f"UVM needs {uvm:.0f} B, host has {problem.hardware.host_bytes} B")
    for group in problem.shard_groups:
        gpus = [plan.gpu[j] for j in group]
        if len(set(gpus)) < len(gpus):
            out.append(f"table {problem.tables[group[0]].name}: column shards share a GPU ({gpus})")
        if len({plan.rows_hbm[j] for j in group}) > 1:
            out.append(f"table {problem.tables[group[0]].name}: column shards keep different rows in HBM")
    for j, t in enumerate(problem.tables):
        if not 0 <= plan.rows_hbm[j] <= t.hash_size:
            out.append(f"table {t.name}: rows_hbm {plan.rows_hbm[j]} outside [0, {t.hash_size}]")
        if not 0 <= plan.gpu[j] < problem.num_gpus:
            out.append(f"table {t.name}: GPU {plan.gpu[j]} does not exist")
    return out
