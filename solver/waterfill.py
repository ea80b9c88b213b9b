"""Exact HBM split by water-filling, and the lower bound every plan reports its gap to.

Moving one seen row of table j from UVM to HBM saves its lookups' and its distinct-row terms
(``Problem.row_savings``: the row's value v, its profiled access count, less for rows seen once
(``TableDemand.row_values``), moves v / A_j of the table's lookups, and the row is in a batch
with chance 1 - (1 - B/N)^v). So the best split of a GPU's HBM fills rows
in decreasing saving per byte across its tables until the bytes run out (a fractional
knapsack over the count-of-counts segments, optimal up to one row per table).

Rows never seen come last in every table's order, each worth ``TableDemand.unseen_row_value``
(never more than a seen row), so a table's HBM part is always a prefix of its remap order and
the split is exact. The same knapsack over the GPUs' pooled HBM, divided by G, bounds every
plan from below.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
from collections.abc import Sequence

import numpy as np

from recshard_stats.solver.problem import Problem, TableDemand


def segments(problem: Problem, tables: list[int]):
    """(seconds saved per row, rows, owner) of every segment (count classes, then never-seen
    rows), most seconds saved per HBM byte first."""
    if not tables:
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=int)
    parts = [problem.row_segments[j] for j in tables]
    saved = np.concatenate([p[0] for p in parts])
    size = np.concatenate([p[1] for p in parts])
    owner = np.repeat(np.asarray(tables, dtype=int), [len(p[0]) for p in parts])
    row_bytes = problem.entry_row_bytes[owner]
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
    """Rows in HBM for each of ``tables`` sharing ``capacity`` bytes of HBM for rows: whole
    segments in order while they fit, then as many rows as fit of each later one."""
    rows = dict.fromkeys(tables, 0)
    _, size, owner = segments(problem, tables)
    if not len(size):
        return rows
    row_bytes = problem.entry_row_bytes[owner]
    whole = int(np.searchsorted(np.cumsum(size * row_bytes), max(capacity, 0.0), side="right"))
    np.add.at(taken := np.zeros(len(problem.tables)), owner[:whole], size[:whole])
    left = max(capacity, 0.0) - float((size[:whole] * row_bytes[:whole]).sum())
    at = whole
    while at < len(size):  # the leftover takes rows of later segments whose rows still fit
        fits = np.flatnonzero(row_bytes[at:] <= left)
        if not len(fits):
            break
        at += int(fits[0])
        take = min(size[at], left // row_bytes[at])
        taken[owner[at]] += take
        left -= take * row_bytes[at]
        at += 1
    for j in tables:
        rows[j] = int(taken[j])
    return rows


def split_assignment(problem: Problem, gpu: tuple[int, ...]) -> tuple[int, ...]:
    """Best rows_hbm for a given table -> GPU assignment (a GPU whose tables' trainer buffers
    overflow it gets no rows: :func:`~recshard_stats.solver.plan.violations` names it).

    The column shards of one table keep the same rows in HBM (TorchRec cuts a table's columns,
    never its rows apart). Four settlements of the tables cut into shards are tried, each GPU's
    other tables sharing what is left: (a) tables settled one after another, each taking, of
    the rows each shard would get on its own GPU, those at the pooled water level
    (``Problem.shard_rows``) and none, the number that leaves the costliest of its GPUs
    cheapest; (b) every table held at the pooled water level, what the search assumed; (c)
    every table at the fewest rows any of its shards would get on its own GPU; (d) the LP's
    rows (:func:`optimal_shard_rows`). From each, every table's rows are settled again with the
    others' fixed while that helps; the best wins, or the best of every combination of rows
    where they are few (:data:`EVERY_SETTLEMENT_UP_TO`). (a) alone, settling a table before the
    others had theirs, gave one 4.2 million rows for the 4,136 of (b), and its GPU twice the
    cost the search expected (Criteo Kaggle); without (d), an assignment on the synthetic model
    was split 25% above the LP's rows."""
    gpus = _GpuSplits(problem, gpu)
    rows = gpus.split_all({})
    if not problem.shard_groups:
        return rows
    greedy: dict[int, int] = {}
    for group in problem.shard_groups:
        best: tuple[tuple[float, float], int] | None = None
        for r in sorted({rows[j] for j in group} | {0, problem.shard_rows[group[0]]}):
            trial = {**greedy, **dict.fromkeys(group, r)}
            maybe = [gpus.cost(g, trial) for g in {gpu[j] for j in group}]
            costs = [c for c in maybe if c is not None]
            if len(costs) == len(maybe) and (best is None or (max(costs), sum(costs)) < best[0]):
                best = ((max(costs), sum(costs)), r)
        assert best is not None, "no rows at all (r = 0) always fit"
        greedy.update(dict.fromkeys(group, best[1]))
    fewest = {j: min(rows[k] for k in group) for group in problem.shard_groups for j in group}
    settlements = (greedy, problem.shard_rows, fewest, optimal_shard_rows(problem, gpu))
    starts = [_ShardSettlement(gpus, fixed) for fixed in dict.fromkeys(_frozen(f) for f in settlements if f)]
    for start in starts:
        if start.cost is not None:  # the greedy one always fits: r = 0 does
            start.descend()
    settled = min(starts + _every_settlement(gpus), key=lambda s: s.score)
    # only the GPUs holding shards split again
    return gpus.split_all(settled.fixed, {gpu[j] for j in settled.fixed}, rows)


# tables cut into shards whose rows' combinations are at most this many are settled by trying
# each: where a row is a large part of a table, the LP's rows rounded down can be a row short on
# two tables at once, which no change of one table's rows mends
EVERY_SETTLEMENT_UP_TO = 4096


def _every_settlement(gpus: _GpuSplits) -> list[_ShardSettlement]:
    """Every combination of the rows of the tables cut into shards (none when they are more than
    :data:`EVERY_SETTLEMENT_UP_TO`)."""
    groups = gpus.problem.shard_groups
    sizes = [gpus.problem.tables[group[0]].hash_size + 1 for group in groups]
    if math.prod(sizes) > EVERY_SETTLEMENT_UP_TO:
        return []
    return [
        _ShardSettlement(gpus, _frozen({j: r for group, r in zip(groups, rows, strict=True) for j in group}))
        for rows in itertools.product(*(range(n) for n in sizes))
    ]


# the LP of the shards' rows is built and solved up to this many columns (segments of the tables
# on GPUs holding shards): 0.5 s on the synthetic model at 10^7 samples (30,000), 10 s at 4000
# tables x 256 GPUs, which the time limit does not have for each split
LP_COLUMNS_UP_TO = 40_000


def optimal_shard_rows(problem: Problem, gpu: tuple[int, ...]) -> dict[int, int]:
    """Rows in HBM of each table cut into shards (the same for all of its shards) that leave the
    costliest GPU holding shards cheapest, its other tables water-filled: an LP (HiGHS), exact
    up to whole rows, since each GPU's cost is convex in those rows (its tables' savings are
    concave in their rows). A table's columns are its segments' rows, hottest first, taken in
    part; each GPU's bytes stay within its HBM and its cost under the LP's ceiling, which is
    minimised. Empty when no table is cut, a GPU's trainer buffers overflow it, or the LP would
    have over :data:`LP_COLUMNS_UP_TO` columns."""
    import highspy

    groups = problem.shard_groups
    holding = sorted({gpu[j] for group in groups for j in group})
    buffers = np.zeros(problem.num_gpus)
    np.add.at(buffers, np.asarray(gpu), np.asarray(problem.trainer_bytes, dtype=np.float64))
    room = problem.hbm_capacity - buffers[holding]  # HBM left for rows on each GPU holding shards
    if not groups or problem.hbm_capacity <= 0 or room.min() < 0:
        return {}
    # the LP's units: each table cut into shards (its entries' GPUs) and each whole table on a GPU
    # holding shards (its own GPU)
    row_of = {g: i for i, g in enumerate(holding)}  # capacity rows 0..H-1, cost rows H..2H-1
    grouped = {j for group in groups for j in group}
    units = [(group[0], [gpu[j] for j in group]) for group in groups]
    units += [(j, [g]) for j, g in enumerate(gpu) if g in row_of and j not in grouped]
    used = [(problem.row_segments[j][1] > 0) & (problem.row_segments[j][0] > 0) for j, _ in units]
    if sum(int(u.sum()) for u in used) > LP_COLUMNS_UP_TO:
        return {}
    h = len(holding)
    uvm = np.zeros(h)
    for j, on in units:
        for g in on:
            uvm[row_of[g]] += problem.uvm_time(j)
    scale = 1.0 / max(float(uvm.max()), 1e-300)  # costs near 1: the solver's tolerances are absolute
    # column 0 is the ceiling T (in every cost row); then one column per unit and segment, each
    # in the capacity and cost rows of the unit's GPUs
    upper, index, value, nonzeros = (
        [np.array([np.inf])],
        [np.arange(h, 2 * h)],
        [-np.ones(h)],
        [np.array([h])],
    )
    widths = []
    for (j, on), kept in zip(units, used, strict=True):
        saved, rows = problem.row_segments[j]
        width, rows_of_on = int(kept.sum()), np.array([row_of[g] for g in on])
        widths.append(width)
        upper.append(rows[kept])
        index.append(np.tile(np.stack([rows_of_on, h + rows_of_on], 1).ravel(), width))
        entries = np.empty((width, len(on), 2))
        entries[:, :, 0] = problem.tables[j].row_bytes / problem.hbm_capacity
        entries[:, :, 1] = -saved[kept, None] * scale
        value.append(entries.ravel())
        nonzeros.append(np.full(width, 2 * len(on)))
    starts = np.concatenate([[0], np.cumsum(np.concatenate(nonzeros))])
    upper_all = np.concatenate(upper)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(upper_all), 2 * h
    lp.col_cost_ = np.eye(1, len(upper_all))[0]
    lp.col_lower_, lp.col_upper_ = np.zeros(len(upper_all)), upper_all
    lp.row_lower_ = np.full(2 * h, -np.inf)
    lp.row_upper_ = np.concatenate([room / problem.hbm_capacity, -uvm * scale])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = np.concatenate(index).astype(np.int32)
    lp.a_matrix_.value_ = np.concatenate(value)
    solver = silent_highs()
    solver.clearModel()
    solver.passModel(lp)
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return {}
    taken = np.asarray(solver.getSolution().col_value)
    ends = 1 + np.cumsum(widths)
    out: dict[int, int] = {}
    for i, group in enumerate(groups):  # the first units, in order
        held = int(np.floor(taken[ends[i] - widths[i] : ends[i]].sum() + 1e-6))
        out.update(dict.fromkeys(group, min(held, problem.tables[group[0]].hash_size)))
    return out


@functools.cache
def silent_highs():
    """One silent HiGHS for the process (callers pass their model, and reset any option they set):
    it prints its banner to fd 1 as the first one starts, which would land in the output of the
    command that solves."""
    import highspy

    sys.stdout.flush()
    kept = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            solver = highspy.Highs()
    finally:
        os.dup2(kept, 1)
        os.close(kept)
    solver.setOptionValue("output_flag", False)
    return solver


def run_highs(lp, time_limit: float, mip_rel_gap: float = 1e-4, start: Sequence[int] = ()):
    """The process's silent HiGHS on ``lp`` for at most ``time_limit`` seconds, the columns in
    ``start`` set to one (a partial solution it completes), its options reset after."""
    import highspy

    solver = silent_highs()
    solver.clearModel()
    solver.setOptionValue("time_limit", max(time_limit, 0.1))
    solver.setOptionValue("mip_rel_gap", mip_rel_gap)
    solver.passModel(lp)
    if start:
        solver.setSolution(len(start), np.asarray(start, dtype=np.int32), np.ones(len(start)))
    solver.run()
    solver.setOptionValue("time_limit", highspy.kHighsInf)
    solver.setOptionValue("mip_rel_gap", 1e-4)
    return solver


def colwise_matrix(lp, columns: Sequence[Sequence[tuple[int, float]]]) -> None:
    """``lp``'s constraint matrix from its columns' (row, value) pairs, rows ascending."""
    import highspy

    starts = np.cumsum([0] + [len(c) for c in columns])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts.astype(np.int32)
    lp.a_matrix_.index_ = np.array([r for c in columns for r, _ in c], dtype=np.int32)
    lp.a_matrix_.value_ = np.array([v for c in columns for _, v in c], dtype=np.float64)
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_


def _frozen(fixed: dict[int, int]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(fixed.items()))


class _GpuSplits:
    """Each GPU's split of one assignment with some tables' rows fixed, and its cost; remembered
    by the rows fixed on that GPU (the settlements below ask for the same ones again and again)."""

    def __init__(self, problem: Problem, gpu: tuple[int, ...]):
        self.problem, self.gpu = problem, gpu
        self.mine: list[list[int]] = [[] for _ in range(problem.num_gpus)]
        for j, g in enumerate(gpu):
            self.mine[g].append(j)
        self._splits: dict[tuple, dict[int, int] | None] = {}
        self._costs: dict[tuple, float | None] = {}
        self._table_costs: dict[tuple[int, int], float] = {}  # most of a GPU's tables keep their rows

    def _key(self, g: int, fixed: dict[int, int]) -> tuple:
        return g, tuple((j, fixed[j]) for j in self.mine[g] if j in fixed)

    def split(self, g: int, fixed: dict[int, int]) -> dict[int, int] | None:
        """Rows of GPU g's tables, those in ``fixed`` as given, the others split over what is
        left (None: the fixed rows do not fit)."""
        key = self._key(g, fixed)
        if key not in self._splits:
            p, mine = self.problem, self.mine[g]
            capacity = p.rows_capacity(mine) - sum(
                fixed[j] * p.tables[j].row_bytes for j in mine if j in fixed
            )
            if capacity < 0 and any(fixed.get(j) for j in mine):
                self._splits[key] = None
            else:
                out = split(p, [j for j in mine if j not in fixed], capacity)
                out.update({j: fixed[j] for j in mine if j in fixed})
                self._splits[key] = out
        return self._splits[key]

    def cost(self, g: int, fixed: dict[int, int]) -> float | None:
        key = self._key(g, fixed)
        if key not in self._costs:
            rows = self.split(g, fixed)
            self._costs[key] = None if rows is None else sum(self._table_cost(j, r) for j, r in rows.items())
        return self._costs[key]

    def _table_cost(self, j: int, rows: int) -> float:
        if (j, rows) not in self._table_costs:
            self._table_costs[j, rows] = self.problem.table_cost(j, rows)
        return self._table_costs[j, rows]

    def split_all(
        self, fixed: dict[int, int], gpus=None, rows: tuple[int, ...] | None = None
    ) -> tuple[int, ...]:
        """Every GPU's split, or only those of ``gpus`` over the other GPUs' ``rows``."""
        out = list(rows) if rows is not None else [0] * len(self.problem.tables)
        for g in range(self.problem.num_gpus) if gpus is None else sorted(gpus):
            for j, r in (self.split(g, fixed) or {}).items():
                out[j] = r
        return tuple(out)


# passes of the descent over the tables cut into shards at most (each pass settles every one)
DESCENT_PASSES = 8


class _ShardSettlement:
    """The rows of every table cut into shards, fixed, and the cost of each GPU holding shards
    with them (None: some GPU's fixed rows do not fit)."""

    def __init__(self, gpus: _GpuSplits, fixed: tuple[tuple[int, int], ...]):
        self.gpus, self.fixed = gpus, dict(fixed)
        # the GPUs holding shards: the others' costs do not change
        costs = {g: gpus.cost(g, self.fixed) for g in sorted({gpus.gpu[j] for j in self.fixed})}
        self.cost: dict[int, float] | None = (
            None if None in costs.values() else {g: c for g, c in costs.items() if c is not None}
        )

    @property
    def score(self) -> tuple[float, float]:
        return _score(self.cost)

    def _with(self, group: tuple[int, ...], rows: int) -> tuple[dict[int, int], dict[int, float] | None]:
        """The fixed rows with ``group``'s set to ``rows``, and the GPUs' costs then."""
        fixed = {**self.fixed, **dict.fromkeys(group, rows)}
        cost = dict(self.cost or {})
        for g in {self.gpus.gpu[j] for j in group}:
            new = self.gpus.cost(g, fixed)
            if new is None:
                return fixed, None
            cost[g] = new
        return fixed, cost

    def descend(self) -> None:
        """Each table's rows settled again, the others' fixed, while that helps: of none, the
        pooled water level's and the rows each of its shards would get on its GPU with the
        others' fixed, the number that lowers the score."""
        gpus, p = self.gpus, self.gpus.problem
        for _ in range(DESCENT_PASSES):
            improved = False
            for group in p.shard_groups:
                others = {j: r for j, r in self.fixed.items() if j not in group}
                own = {(gpus.split(gpus.gpu[j], others) or {}).get(j, 0) for j in group}
                now = self.fixed[group[0]]
                near = {max(now - 1, 0), min(now + 1, p.tables[group[0]].hash_size)}
                for rows in sorted({*own, 0, p.shard_rows[group[0]], *near} - {now}):
                    fixed, cost = self._with(group, rows)
                    if _better(_score(cost), self.score):
                        self.fixed, self.cost, improved = fixed, cost, True
            if not improved:
                return


def _score(cost: dict[int, float] | None) -> tuple[float, float]:
    """The costliest GPU's cost, then the sum of all (inf: some GPU's rows do not fit)."""
    return (max(cost.values()), sum(cost.values())) if cost is not None else (np.inf, np.inf)


def _better(score: tuple[float, float], than: tuple[float, float]) -> bool:
    """Lower costliest GPU, or the same and a lower sum (each by more than rounding)."""
    return score[0] < than[0] * (1 - 1e-12) or (score[0] <= than[0] and score[1] < than[1] * (1 - 1e-12))


def _pooled_total(problem: Problem):
    """The tables' total cost with HBM pooled and water-filled (rows taken fractionally): given
    which tables may have rows in HBM (all when not given), a function of the HBM bytes for their
    rows (all that the trainer's buffers leave when not given). The segments are found once for
    every call, and kept once per choice of tables for every capacity."""
    everything = list(range(len(problem.tables)))
    uvm_total = sum(problem.uvm_time(j) for j in everything)
    per_row, rows, owner = segments(problem, everything)
    row_bytes = problem.entry_row_bytes[owner]
    saved, size, density = per_row * rows, rows * row_bytes, per_row / row_bytes

    def over(in_hbm: list[int] | None = None):
        keep = slice(None) if in_hbm is None else np.isin(owner, in_hbm)
        kept = saved[keep], size[keep], density[keep]

        def total(capacity: float | None = None) -> float:
            room = problem.pooled_rows_capacity if capacity is None else capacity
            return uvm_total - fractional_saving(*kept, room)

        return total

    return over


def pooled_bound(problem: Problem) -> float:
    """All HBM left by the trainer's buffers pooled and water-filled (rows taken fractionally),
    divided by G: what the GPUs' mean cost can at best be."""
    return _pooled_total(problem)()() / problem.num_gpus


def alone_uvm_time(problem: Problem, table: TableDemand) -> float:
    """A table (or column shard) wholly in UVM, priced as the solver prices it."""
    return Problem((table,), problem.hardware).uvm_time(0)


def alone_cost(problem: Problem, table: TableDemand) -> float:
    """A table (or column shard) alone on a GPU with all of its HBM."""
    single = Problem((table,), problem.hardware)
    return single.table_cost(0, split(single, [0], single.rows_capacity([0]))[0])


# row sizes a call bound enumerates at most (3 ** sizes tier choices)
CALL_BOUND_MAX_SIZES = 9


def call_bound(problem: Problem, max_column_shards: int = 1) -> float:
    """The pooled bound with the kernel calls' fixed costs, which :func:`pooled_bound` leaves out
    (0 when the model has none). A plan runs, for each row size it has rows of in HBM, at least
    one HBM call (on some GPU; both passes), and for each row size it has only in host memory at
    least one host call. A table cut into k column shards has rows of 1/k its size, so which
    sizes are present is the plan's choice: over every choice of each size's state (absent, in
    host memory only, in HBM) that leaves every table a size it can take, the least of the
    water-fill over the tables that can take a size in HBM, plus those calls, divided by G."""
    costs = problem.hardware.costs
    fixed = {"host": costs.host.fixed_s, "hbm": costs.hbm.fixed_s}
    if not problem.tables or max(fixed.values()) <= 0:
        return 0.0
    g = problem.num_gpus
    options = []  # per table: the row sizes its shards may have
    for t in problem.tables:
        options.append({t.row_bytes / k for k in t.shard_counts(g, max_column_shards)})
    sizes = sorted(set().union(*options))
    if len(sizes) > CALL_BOUND_MAX_SIZES:
        return 0.0
    pooled_total = _pooled_total(problem)
    best = np.inf
    for states in itertools.product((None, "host", "hbm"), repeat=len(sizes)):
        state = dict(zip(sizes, states, strict=True))
        if any(all(state[s] is None for s in o) for o in options):
            continue  # a table with no size present
        in_hbm = [j for j, o in enumerate(options) if any(state[s] == "hbm" for s in o)]
        calls = sum(fixed[s] for s in states if s is not None)
        best = min(best, (pooled_total(in_hbm)() + calls) / g)
    return float(best)


# rows in HBM at which :func:`heavy_table_bound` prices each table and shard count (a finer grid
# tightens the bound, never makes it invalid), and the tables it tries (the costliest alone)
HEAVY_BOUND_POINTS = 128
HEAVY_BOUND_TABLES = 8


def heavy_table_bound(problem: Problem, max_column_shards: int = 1) -> float:
    """For models with kernel calls: table j cut into k shards, each with r rows in HBM. A GPU
    holding a shard costs at least the shard alone there: its work, its calls' fixed costs and
    the excess its longest bag's chain sets over its forward work (other tables' work on the GPU
    is at least the share of that excess they hide). All GPUs together cost at least k shards'
    work and calls, the other tables water-filled over the HBM left (:func:`pooled_bound`'s
    relaxation), and the least call of each other GPU. Every plan has some k and r, so the least
    over them of the larger of the two (the latter over G) is a bound, for each of the
    :data:`HEAVY_BOUND_TABLES` tables costliest alone; r runs over a grid (every r of a table
    with fewer rows), and between two points each term is taken at the end where it is least
    (each is monotone in r)."""
    costs, g = problem.hardware.costs, problem.num_gpus
    everything = range(len(problem.tables))
    heavy = sorted(everything, key=lambda j: -alone_cost(problem, problem.tables[j]))[:HEAVY_BOUND_TABLES]
    pooled_over = _pooled_total(problem)
    best = 0.0
    for j in heavy:
        others = [i for i in everything if i != j]
        # the others' total: the pooled one with only them in HBM, less j's cost all in UVM
        pooled_others, uvm_j = pooled_over(others), problem.uvm_time(j)
        capacity_others = problem.hbm_capacity * g - problem.buffer_bytes(others)
        table = problem.tables[j]
        least_j = np.inf
        for k in table.shard_counts(g, max_column_shards):
            shard = table.column_shard(k)
            single = Problem((shard,), problem.hardware)
            free = single.rows_capacity([0])
            if free < 0:
                continue  # its buffers do not fit on a GPU
            most = min(shard.hash_size, int(free // shard.row_bytes))
            # both ends of the range, and the points where a tier's call appears or goes
            extra = [0, 1, most, most - 1] if most > 0 else [0]
            grid = np.unique(np.append(np.linspace(0, most, HEAVY_BOUND_POINTS).round(), extra)).astype(
                np.int64
            )
            load = single.load(shard, grid, single.comm_bytes[0])
            work, share, forward_hbm, forward_host = (
                np.broadcast_to(np.asarray(v, dtype=np.float64), grid.shape)
                for v in (
                    costs.table_seconds(load),
                    load.hbm_fraction,
                    costs.forward_seconds(load, "hbm"),
                    costs.forward_seconds(load, "host"),
                )
            )
            # each point's rows alone, and each interval of rows [grid[a], grid[b]] with rows between
            wide = np.flatnonzero(np.diff(grid) > 1)
            a = np.concatenate([np.arange(len(grid)), wide])
            b = np.concatenate([np.arange(len(grid)), wide + 1])
            # a tier's call runs where it serves some lookups, as the cost model counts them
            hbm_call, host_call = share[a] > 0, share[b] < 1
            calls = np.where(hbm_call, costs.hbm.fixed_s, 0.0) + np.where(host_call, costs.host.fixed_s, 0.0)
            chain = costs.forward.hbm.chain_s * shard.longest_bag * share[a] - forward_hbm[b]
            chain_hbm = np.where(hbm_call, np.maximum(0.0, chain - costs.forward.hbm.fixed_s), 0.0)
            chain = costs.forward.host.chain_s * shard.longest_bag * (1 - share[b]) - forward_host[a]
            chain_host = np.where(host_call, np.maximum(0.0, chain - costs.forward.host.fixed_s), 0.0)
            alone = work[b] + calls + chain_hbm + chain_host
            used = single.buffer_bytes([0]) + grid[a] * shard.row_bytes
            rest = np.array([pooled_others(capacity_others - k * u) - uvm_j for u in used])
            together = (k * (work[b] + calls) + rest + (g - k) * costs.least_group_seconds) / g
            least_j = min(least_j, float(np.maximum(alone, together).min()))
        if np.isfinite(least_j):
            best = max(best, least_j)
    return best


def lower_bound(problem: Problem, max_column_shards: int = 1) -> float:
    """No plan of whole tables, or of tables cut into at most ``max_column_shards`` column shards,
    can beat: (a) the pooled bound (:func:`pooled_bound`; cutting a table only adds trainer
    buffers); (b) the costliest table's smallest shard alone on a GPU with all of its HBM; (c) with
    more tables than GPUs, two tables have a shard on one GPU, which costs at least the two cheapest
    of the G + 1 costliest such shards (each alone); each of them plus the least any GPU's calls
    cost; (d) the pooled bound with the calls each row size needs (:func:`call_bound`); (e) with
    kernel calls, a costly table's GPU against the rest (:func:`heavy_table_bound`)."""
    from recshard_stats.solver.kernel_groups import has_call_costs  # it builds on this module

    g = problem.num_gpus
    shards = [t.column_shard(t.most_column_shards(g, max_column_shards)) for t in problem.tables]
    uvm = [alone_uvm_time(problem, t) for t in shards]
    alone: list[float] = []
    # costliest in UVM first; a shard costs at most its UVM time, so once that is below the
    # (G + 1)-th costliest found, no later shard enters the top G + 1
    for j in sorted(range(len(shards)), key=lambda j: -uvm[j]):
        if len(alone) > g and uvm[j] <= alone[g]:
            break
        alone = sorted([*alone, alone_cost(problem, shards[j])], reverse=True)[: g + 1]
    pair = alone[g - 1] + alone[g] if len(alone) > g else 0.0
    # the slowest GPU runs at least one kernel group
    fixed = problem.hardware.costs.least_group_seconds if problem.tables else 0.0
    return max(
        max(pooled_bound(problem), alone[0] if alone else 0.0, pair) + fixed,
        call_bound(problem, max_column_shards),
        heavy_table_bound(problem, max_column_shards) if has_call_costs(problem) else 0.0,
    )
