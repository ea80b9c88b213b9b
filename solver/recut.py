"""Each table's shard count changed, one table at a time, from the best plan found (docs/design.md,
"Column shards"). The ladder's cuts treat tables alike by their size, and the best mix of counts is
often none of them: on the shipped Criteo model the best cut of the ladder planned 4.86% above the
bound, and counts changed one at a time from it 3.80% (BENCHMARKS.md).

A trial cuts table j into k shards instead of its count now. Its new shards go where its old ones
were (cut less: on the cheapest of those GPUs; cut more: on those and the cheapest without one),
every other entry stays, the local search's phases run from there (no kicks, at most
:data:`TRIAL_S`), and the result is split exactly: taken when its slowest GPU is cheaper than the
plan's. Trials that cut a table less come first, cheapest tables first (a cut costs the table's id
buffers on every GPU of a shard, and balances least where a table costs little); first improvement,
until a whole pass gains nothing or the time runs out.
"""

from __future__ import annotations

import time

import numpy as np

from recshard_stats.solver.column_split import cuts_of, shard_counts, split_problem, table_shards
from recshard_stats.solver.local_search import GpuCostModel, descend
from recshard_stats.solver.plan import Plan, cost_plan, violations
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import split_assignment

# the longest one trial's search may run: many trials share the time
TRIAL_S = 0.5
_REL = 1e-9  # a trial must gain this share of the plan's cost


def recut(
    problem: Problem, placed: Problem, plan: Plan, deadline: float, max_column_shards: int
) -> tuple[Problem, Plan]:
    """The plan over ``placed`` (``problem``'s tables cut some way) with its tables' shard counts
    changed one at a time while that lowers its cost (module docstring): (the tables cut as the
    plan ends, the plan). Its input when no trial gains or there is no time."""
    counts = shard_counts(problem, max_column_shards)
    uvm = [problem.uvm_time(j) for j in range(len(problem.tables))]
    cost = cost_plan(placed, plan)
    gained = True
    while gained and time.time() < deadline:
        gained = False
        cuts = cuts_of(placed)
        shards = table_shards(placed, plan)
        gpu_cost = np.asarray(cost.gpu_cost)
        trials = sorted(
            ((j, k) for j, ks in enumerate(counts) for k in ks if k != cuts[j]),
            key=lambda t: (t[1] > cuts[t[0]], uvm[t[0]] / cuts[t[0]], t[1]),
        )
        for j, k in trials:
            if time.time() >= deadline:
                break
            trial = split_problem(problem, tuple(k if t == j else c for t, c in enumerate(cuts)))
            start = []
            for t, s in enumerate(shards):
                start += _recut_gpus(s.gpus, k, gpu_cost) if t == j else list(s.gpus)
            gpu, _ = descend(GpuCostModel(trial), start, min(deadline, time.time() + TRIAL_S))
            candidate = Plan(plan.name, gpu, split_assignment(trial, gpu))
            trial_cost = cost_plan(trial, candidate)
            if trial_cost.max_cost < cost.max_cost * (1 - _REL) and not violations(
                trial, candidate, trial_cost
            ):
                placed, plan, cost, gained = trial, candidate, trial_cost, True
                break
    return placed, plan


def _recut_gpus(gpus: tuple[int, ...], k: int, gpu_cost: np.ndarray) -> list[int]:
    """GPUs for k shards of a table whose shards are on ``gpus``: the cheapest of them when
    fewer, all of them and the cheapest others when more."""
    if k <= len(gpus):
        return sorted(gpus, key=lambda g: gpu_cost[g])[:k]
    others = sorted((g for g in range(len(gpu_cost)) if g not in gpus), key=lambda g: gpu_cost[g])
    return list(gpus) + others[: k - len(gpus)]
