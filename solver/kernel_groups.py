"""Kernel-group-aware polishing (docs/design.md, "Kernel calls").

Each kernel call a GPU makes (one per tier and row size, forward and backward) has a fixed cost
that the water-fill, the local search and the MILP leave out: for them it is a constant per GPU,
which it is only when every GPU runs every group. A call's forward also takes at least its longest
bag's ids in series (the chain), which sets much of a GPU's time where bags are long (the H200
calibration: 147 ns per id from HBM, 825 ns from host memory, so a 500-id bag costs 73-410 us,
against 15.5 us of fixed cost per HBM call and 3.4 us per host call). So the plan is rearranged
with them counted, by the exact cost of :func:`recshard_stats.costmodel.placement_cost`:

- per GPU, an HBM group whose rows save less than its calls is emptied (its HBM goes to the
  GPU's other tables), and a host group whose tables fit in what HBM is left is moved in whole;
  a split table, which runs its bags in both tiers, is tried whole in each;
- tables move, and swap, off the slowest GPU; from the best plan so far, kicked (two tables moved
  at random), again while time lasts (an iterated local search: the moves alone stop in a local
  optimum, on the built-in example at 0.2100 ms after 6.2 s, and kicks found 0.2077 ms in 18 s:
  ``benchmarks/call_polish_bench.py``);
- besides the plans of the linear stages, a start placed with the calls counted
  (:func:`call_lpt_plan`).

Column shards keep their GPU and rows (their siblings' GPUs depend on them).
"""

from __future__ import annotations

import time

import numpy as np

from recshard_stats.costmodel import TableLoad, placement_cost
from recshard_stats.solver.local_search import KICKS_WITHOUT_GAIN, kick
from recshard_stats.solver.plan import Plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import split

_REL = 1e-9  # a change must gain this share of a cost


def has_call_costs(problem: Problem) -> bool:
    """Whether the model has terms the solver's linear view leaves out: a call's fixed cost, its
    longest bag, a split table's bags in its second tier."""
    costs = problem.hardware.costs
    return any(
        getattr(t, term) > 0
        for t in (costs.hbm, costs.host)
        for term in ("fixed_s", "chain_s", "bag_s", "bag_byte_s")
    )


class ExactGpuCost:
    """The exact cost of any set of tables on one GPU, their rows chosen with the calls counted."""

    def __init__(self, problem: Problem, pinned: dict[int, int]):
        self.problem = problem
        self.pinned = pinned  # entries whose rows stay as given (column shards)
        self.model = problem.hardware.costs
        self._best: dict[
            tuple[int, ...], tuple[float, dict[int, int]]
        ] = {}  # the search asks for a set again
        self._loads: dict[tuple[int, int], TableLoad] = {}  # and for a table's rows again

    def _load(self, j: int, rows: int) -> TableLoad:
        if (j, rows) not in self._loads:
            p = self.problem
            self._loads[j, rows] = p.load(p.tables[j], rows, p.comm_bytes[j])
        return self._loads[j, rows]

    def cost(self, tables: list[int], rows: dict[int, int]) -> float:
        loads = [self._load(j, rows[j]) for j in tables]
        return placement_cost(self.model, 1, loads).max_cost if loads else 0.0

    def _split(
        self, tables: list[int], capacity: float, empty: set[int], full: set[int]
    ) -> dict[int, int] | None:
        p = self.problem
        rows = {j: self.pinned[j] for j in tables if j in self.pinned}
        rows.update(dict.fromkeys(empty, 0))
        rows.update({j: p.tables[j].hash_size for j in full})
        left = capacity - sum(rows[j] * p.tables[j].row_bytes for j in rows)
        if left < 0 and any(rows.values()):
            return None
        rows.update(split(p, [j for j in tables if j not in rows], left))
        return rows

    def _trials(self, free: list[int], rows: dict[int, int], empty: set[int], full: set[int]):
        """(tables with no HBM rows, tables wholly in HBM) to try: each row size's group emptied
        from HBM or moved in whole, then each split table (it runs its bags in both tiers) whole
        in either tier."""
        p = self.problem
        for rb in sorted({p.tables[j].row_bytes for j in free}):
            group = {j for j in free if p.tables[j].row_bytes == rb}
            yield empty | {j for j in group if rows[j] > 0}, full - group
            yield empty - group, full | {j for j in group if rows[j] < p.tables[j].hash_size}
        for j in free:
            if 0 < rows[j] < p.tables[j].hash_size:
                yield empty | {j}, full - {j}
                yield empty - {j}, full | {j}

    def best(self, tables: list[int]) -> tuple[float, dict[int, int]]:
        """(cost, rows) of ``tables`` on one GPU: the water-fill, then groups emptied or filled
        while that lowers the cost (inf when their buffers or pinned rows do not fit)."""
        key = tuple(sorted(tables))
        if key not in self._best:
            self._best[key] = self._search(list(key))
        return self._best[key]

    def _search(self, tables: list[int]) -> tuple[float, dict[int, int]]:
        p = self.problem
        capacity = p.rows_capacity(tables)
        if capacity < 0:
            return float("inf"), {}
        empty: set[int] = set()
        full: set[int] = set()
        rows = self._split(tables, capacity, empty, full)
        if rows is None:
            return float("inf"), {}
        cost = self.cost(tables, rows)
        free = [j for j in tables if j not in self.pinned]
        improved = True
        while improved:  # first improvement, then the trials of the new rows
            improved = False
            for trial_empty, trial_full in self._trials(free, rows, empty, full):
                if (trial_empty, trial_full) == (empty, full):
                    continue
                trial = self._split(tables, capacity, trial_empty, trial_full)
                if trial is None:
                    continue
                c = self.cost(tables, trial)
                if c < cost * (1 - _REL):
                    cost, rows, empty, full, improved = c, trial, trial_empty, trial_full, True
                    break
        return cost, rows


def call_lpt_plan(problem: Problem, deadline: float | None = None) -> Plan | None:
    """Longest processing time first with the calls counted: the tables, whole, costliest in UVM
    first, each onto the GPU whose exact cost (:meth:`ExactGpuCost.best`) is lowest once it holds
    it (of equal ones, the GPU cheapest before). A table joins a GPU whose call of its row size
    already runs where that saves more than the load it adds, which the linear stages, blind to
    calls, never weigh (None: some table's buffers fit on no GPU beside those placed before it, or
    it would not be done by ``deadline``, a ``time.time()``: each table tries every GPU, G exact
    costs, 11 s for 400 tables on 16 GPUs)."""
    model = ExactGpuCost(problem, {})
    on: list[list[int]] = [[] for _ in range(problem.num_gpus)]
    order = sorted(range(len(problem.tables)), key=lambda j: (-problem.uvm_time(j), j))
    start = time.time()
    for placed, j in enumerate(order):
        now = time.time()
        if deadline is not None and now + (now - start) / max(placed, 1) * (len(order) - placed) > deadline:
            return None  # at the pace so far the rest would not be placed in time
        after = [model.best([*tables, j])[0] for tables in on]
        h = min(range(problem.num_gpus), key=lambda h: (after[h], model.best(on[h])[0]))
        if not np.isfinite(after[h]):
            return None
        on[h].append(j)
    gpu, rows = [0] * len(problem.tables), [0] * len(problem.tables)
    for h, tables in enumerate(on):
        for j in tables:
            gpu[j] = h
        for j, r in model.best(tables)[1].items():
            rows[j] = r
    return Plan("call_lpt", tuple(gpu), tuple(rows))


def refine(problem: Problem, plan: Plan, time_s: float, name: str | None = None, seed: int = 0) -> Plan:
    """``plan`` polished with the kernel calls counted: moves and swaps off the slowest GPU,
    each GPU's rows by :meth:`ExactGpuCost.best`, until nothing helps; then, while ``time_s``
    lasts, the best plan so far kicked (two tables moved to random GPUs, drawn from ``seed``) and
    polished again, until :data:`KICKS_WITHOUT_GAIN` kicks in a row find nothing better."""
    deadline = time.time() + time_s
    shards = {j for group in problem.shard_groups for j in group}
    model = ExactGpuCost(problem, {j: plan.rows_hbm[j] for j in shards})
    siblings = problem.siblings
    movable = [j for j in range(len(problem.tables)) if j not in shards]
    rng = np.random.default_rng(seed)

    def allowed(gpu: list[int], j: int, h: int, leaving: int | None = None) -> bool:
        return all(gpu[s] != h or s == leaving for s in siblings[j])

    def descend(gpu: list[int]) -> tuple[float, list[int], list[tuple[float, dict[int, int]]]]:
        on = [[j for j, g in enumerate(gpu) if g == h] for h in range(problem.num_gpus)]
        states = [model.best(tables) for tables in on]
        while time.time() < deadline:
            worst = max(range(problem.num_gpus), key=lambda h: states[h][0])
            peak = states[worst][0]
            best = None
            for j in on[worst]:
                if j in shards:
                    continue
                rest = [k for k in on[worst] if k != j]
                for h in range(problem.num_gpus):
                    if h == worst or not allowed(gpu, j, h) or time.time() > deadline:
                        continue
                    moves: list[tuple[int | None, list[int], list[int]]] = [(None, rest, on[h] + [j])]
                    moves += [
                        (k, [*rest, k], [x for x in on[h] if x != k] + [j])
                        for k in on[h]
                        if k not in shards and allowed(gpu, k, worst, j)
                    ]
                    for k, mine, theirs in moves:
                        a, b = model.best(mine), model.best(theirs)
                        new_peak = max(a[0], b[0])
                        if new_peak < peak * (1 - _REL) and (best is None or new_peak < best[0]):
                            best = (new_peak, j, k, h, a, b, mine, theirs)
            if best is None:
                break
            _, j, k, h, a, b, mine, theirs = best
            gpu[j] = h
            if k is not None:
                gpu[k] = worst
            on[worst], on[h], states[worst], states[h] = mine, theirs, a, b
        return max(s[0] for s in states), gpu, states

    incumbent = descend(list(plan.gpu))
    fruitless = 0
    while movable and fruitless < KICKS_WITHOUT_GAIN and time.time() < deadline:
        gpu = list(incumbent[1])
        kick(problem, gpu, movable, rng)
        kicked = descend(gpu)
        fruitless += 1
        if kicked[0] < incumbent[0] * (1 - _REL):
            incumbent, fruitless = kicked, 0
    rows = list(plan.rows_hbm)
    for state in incumbent[2]:
        for j, r in state[1].items():
            rows[j] = r
    return Plan(name or plan.name, tuple(incumbent[1]), tuple(rows))
