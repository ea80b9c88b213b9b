"""Local search over the assignment: moves and swaps between GPUs, judged by each GPU's split.

A GPU's cost with a given set of tables is their all-in-UVM time less what its HBM saves when
filled with rows in decreasing saving per byte (the water-filling of :mod:`solver.waterfill`).
To judge thousands of changes a second, every table's filling is tabulated once on one grid of
saving-per-byte levels shared by all tables: at each level, the bytes of its rows worth at least
that much and the seconds they save. A GPU's tabulation is then the sum of its tables' (a
vector add per change), the level where its HBM runs out a count, and its saving interpolated
between two levels (1.8% apart near the pooled water level: the interpolation, a chord of the
concave saving curve, is a hair pessimistic). Every change of a neighbourhood is judged at once
in numpy.

Two phases alternate until neither helps or the time budget runs out:

- *the slowest GPU down*: the move of one of its tables to another GPU, or the swap of one with a
  table there, that leaves the higher of the two lowest;
- *HBM where it saves most*: between the slowest GPUs and the others, the change that lowers the
  two GPUs' summed cost most without either passing the slowest: a GPU whose HBM holds rows
  worth less than another's takes hotter, smaller tables from it, so the GPUs' water levels
  meet (at one level everywhere the plan would reach the pooled bound).

Once neither helps, while the budget lasts, the best assignment so far is kicked (two tables
moved to random GPUs) and the phases run again, until 40 kicks in a row find nothing better (an
iterated local search, as the polish with the calls counted does: on the synthetic model's cut
that :func:`~recshard_stats.solver.column_split.choose_shards` proposes, 10^6 samples, the phases
alone stopped at 0.2164 ms after 0.2 s, kicked at 0.2066 ms; BENCHMARKS.md, ``ladder_bench.py``).

Column shards of one table never share a GPU. The result is split exactly
(:func:`~recshard_stats.solver.waterfill.split_assignment`) like every other plan.
"""

from __future__ import annotations

import time

import numpy as np

from recshard_stats.solver.plan import Plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import segments, split_assignment

LEVELS = 256  # saving-per-byte levels within NEAR times the pooled water level (1.8% apart)
FAR_LEVELS = 32  # levels above and below those
NEAR = 10.0
_REL = 1e-9  # a change must gain this share of a cost: no cycling on rounding
# kicks in a row that find no better plan before a search stops short of its time
KICKS_WITHOUT_GAIN = 40


class GpuCostModel:
    """Cost of any set of tables on one GPU, from per-table fillings on a shared level grid."""

    def __init__(self, problem: Problem):
        self.problem = problem
        n = len(problem.tables)
        self.uvm = np.array([problem.uvm_time(j) for j in range(n)])
        self.buffers = np.array(problem.trainer_bytes, dtype=np.float64)
        self.capacity = problem.hbm_capacity
        # a shard's held rows: their bytes (in ``buffers`` too) and the seconds they save; where
        # they do not fit the exact split holds fewer, losing about their mean saving per byte
        self.held, self.held_saving = np.zeros(n), np.zeros(n)
        fills, cache = [], {}
        empty = (np.zeros(0), np.zeros(0), np.zeros(0))
        for j, rows in problem.shard_rows.items():
            # a column shard is held at the pooled water level's rows, as the exact split holds
            # all of its table's shards alike: a fixed cost, its rows' bytes taken like buffers
            self.uvm[j] = problem.table_cost(j, rows)
            self.held[j] = rows * problem.tables[j].row_bytes
            self.held_saving[j] = problem.uvm_time(j) - self.uvm[j]
            self.buffers[j] += self.held[j]
        for j, t in enumerate(problem.tables):
            if j in problem.shard_rows:
                fills.append(empty)
                continue
            key = problem.parent[j] if problem.parent else j
            if key not in cache:
                per_row, rows, _ = segments(problem, [j])
                keep = per_row > 0
                cache[key] = (
                    per_row[keep] / t.row_bytes,
                    rows[keep] * t.row_bytes,
                    per_row[keep] * rows[keep],
                )
            fills.append(cache[key])
        # an overflowing GPU costs more than all tables in UVM, the more the further over: the search
        # (and LPT) can tell a change that lessens an overflow from one that does not
        self.overflow_s = max(float(self.uvm.sum()), 1e-12)
        self.levels = _levels(problem, fills)
        # bytes[j, i] / saved[j, i]: table j's rows worth at least levels[i - 1] per byte (i = 0: none)
        self.bytes = np.zeros((n, len(self.levels) + 1))
        self.saved = np.zeros((n, len(self.levels) + 1))
        for j, (density, size, saved) in enumerate(fills):
            upto = np.searchsorted(-density, -self.levels * (1 - 1e-12), side="right")
            self.bytes[j, 1:] = np.concatenate([[0.0], np.cumsum(size)])[upto]
            self.saved[j, 1:] = np.concatenate([[0.0], np.cumsum(saved)])[upto]

    def cost_of(self, bytes_, saved, uvm, buffers, held=0.0, held_saving=0.0) -> np.ndarray:
        """Costs of GPUs given their summed fillings (``[..., levels + 1]``), UVM times, buffers
        and held shard rows."""
        bytes_, saved = np.asarray(bytes_), np.asarray(saved)
        capacity = self.capacity - np.asarray(buffers, dtype=np.float64)

        def fill(cap: np.ndarray) -> np.ndarray:
            """Seconds saved by ``cap`` bytes of HBM on each GPU."""
            ends = (np.take_along_axis(a, k, -1) for a in (bytes_, saved) for k in _around(bytes_, cap))
            return _interpolated(cap[..., None], *ends)[..., 0]

        free_cap = np.maximum(capacity + held, 0.0)
        # the other tables filled first: read only where the held rows do not fit
        free_fill = (
            fill(free_cap) if np.any((capacity < 0) & (np.asarray(held) > 0)) else np.zeros_like(capacity)
        )
        free_first = (free_fill, np.minimum(free_cap, bytes_[..., -1]))
        return self.settled(
            np.asarray(uvm) - fill(np.maximum(capacity, 0.0)), uvm, capacity, held, held_saving, free_first
        )

    def settled(self, cost, uvm, capacity, held, held_saving, free_first):
        """``cost`` where the GPU's buffers and held shard rows fit (``capacity`` >= 0 left); where
        only the trainer buffers fit, the better of the other tables in UVM and the held rows that
        do not fit lost, or the other tables filled first (``free_first``: their saving and bytes
        in the HBM the buffers leave) and as many held rows lost, each at their mean saving per
        byte; where the buffers overflow, more than all tables in UVM, the more the further over
        (the search and LPT can tell a change that lessens an overflow from one that does not)."""
        capacity, held = np.asarray(capacity, dtype=np.float64), np.asarray(held, dtype=np.float64)
        uvm, held_saving = np.asarray(uvm), np.asarray(held_saving)
        per_byte = held_saving / np.where(held > 0, held, 1.0)
        lost = -capacity * per_byte
        # 4 GPUs: a GPU with a shard's held rows and five small tables that overflow it by 2%
        # had all five in UVM (4,000 s each) where their rows fit for 2% of the held rows
        saving, used = free_first
        filled = uvm - saving + np.maximum(used - capacity, 0.0) * per_byte
        over = np.maximum(-(capacity + held), 0.0)
        overflowing = uvm + held_saving + self.overflow_s * (1.0 + over / max(self.capacity, 1.0))
        return np.where(
            capacity >= 0, cost, np.where(capacity + held >= 0, np.minimum(uvm + lost, filled), overflowing)
        )

    def cost(self, tables) -> float:
        tables = list(tables)
        if not tables:
            return 0.0
        return float(
            self.cost_of(
                self.bytes[tables].sum(0),
                self.saved[tables].sum(0),
                self.uvm[tables].sum(),
                self.buffers[tables].sum(),
                self.held[tables].sum(),
                self.held_saving[tables].sum(),
            )
        )


def _around(bytes_: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The level indices (``[..., 1]``) between which ``cap`` bytes of HBM run out."""
    last = bytes_.shape[-1] - 1
    i = np.minimum((bytes_ <= cap[..., None]).sum(-1) - 1, last)[..., None]
    return i, np.minimum(i + 1, last)


def _interpolated(cap, b0, b1, s0, s1):
    """Seconds saved by ``cap`` bytes of HBM, between two levels whose fills take b0 and b1 bytes
    and save s0 and s1 seconds (a chord of the concave saving curve)."""
    width = b1 - b0
    part = np.clip((cap - b0) / np.where(width > 0, width, 1.0), 0.0, 1.0) * (width > 0)
    return s0 + part * (s1 - s0)


def _levels(problem: Problem, fills) -> np.ndarray:
    """Saving-per-byte levels, highest first: dense around the pooled water level (where every
    GPU's HBM runs out in a balanced plan), sparse far from it (rows there are in HBM, or in UVM,
    whatever the plan)."""
    if not fills or not sum(len(f[0]) for f in fills):
        return np.zeros(0)
    density = np.concatenate([f[0] for f in fills])
    size = np.concatenate([f[1] for f in fills])
    order = np.argsort(-density)
    filled = np.cumsum(size[order])
    held = sum(r * problem.tables[j].row_bytes for j, r in problem.shard_rows.items())  # shards' fixed rows
    capacity = problem.pooled_rows_capacity - held
    water = density[order][min(int(np.searchsorted(filled, capacity)), len(order) - 1)]
    top, low = density.max(), density.min()
    near_top, near_low = min(top, water * NEAR), max(low, water / NEAR)
    levels = np.concatenate(
        [
            np.geomspace(top, near_top, FAR_LEVELS),
            np.geomspace(near_top, near_low, LEVELS),
            np.geomspace(near_low, low, FAR_LEVELS),
        ]
    )
    return np.unique(levels)[::-1]


class _State:
    """An assignment with each GPU's summed filling, for changes judged by vector adds."""

    def __init__(self, model: GpuCostModel, gpu):
        self.model = model
        self.gpu = np.array(gpu, dtype=int)
        g = model.problem.num_gpus
        self.bytes = np.zeros((g, model.bytes.shape[1]))
        self.saved = np.zeros_like(self.bytes)
        self.uvm, self.buffers, self.held, self.held_saving = (np.zeros(g) for _ in range(4))
        for total, per in self._sums():
            np.add.at(total, self.gpu, per)
        self.cost = model.cost_of(self.bytes, self.saved, self.uvm, self.buffers, self.held, self.held_saving)
        # per-table tables with a zero row appended: index -1 (no table) reads it
        self.padded = tuple(
            np.concatenate([a, np.zeros((1, *a.shape[1:]))])
            for a in (model.bytes, model.saved, model.uvm, model.buffers, model.held, model.held_saving)
        )
        siblings = model.problem.siblings
        width = max((len(s) for s in siblings), default=0)
        # siblings[j]: the other shards of j's table, padded with -1 (None: no table is split)
        self.siblings = (
            np.array([list(s) + [-1] * (width - len(s)) for s in siblings], dtype=int) if width else None
        )

    def _sums(self):
        """(per GPU, per table) of every sum the state keeps."""
        m = self.model
        return (
            (self.bytes, m.bytes),
            (self.saved, m.saved),
            (self.uvm, m.uvm),
            (self.buffers, m.buffers),
            (self.held, m.held),
            (self.held_saving, m.held_saving),
        )

    def water_levels(self) -> np.ndarray:
        """Per GPU: the level index where its HBM runs out (higher: rows worth less per byte)."""
        cap = np.maximum(self.model.capacity - self.buffers, 0.0)
        return (self.bytes <= cap[:, None]).sum(1)

    def members(self, h: int) -> np.ndarray:
        return np.flatnonzero(self.gpu == h)

    def _with(self, h: int, out: np.ndarray, into: np.ndarray) -> np.ndarray:
        """Costs of GPU h with, for each pair, table out[i] taken away and into[i] added (-1: none,
        the zero row at the end of the padded tables). Only the bytes are summed over every level;
        the savings only at the two levels around where HBM runs out."""
        bytes_, saved, uvm, buffers, held, held_saving = self.padded
        capacity = self.model.capacity - (self.buffers[h] - buffers[out] + buffers[into])
        held_rows = self.held[h] - held[out] + held[into]
        b = self.bytes[h] - bytes_[out] + bytes_[into]

        def fill(
            level_bytes: np.ndarray, leaving: np.ndarray, joining: np.ndarray, cap: np.ndarray
        ) -> np.ndarray:
            """Seconds saved by ``cap`` bytes of HBM on GPU h, per pair (``level_bytes``: its bytes
            at each level once ``leaving`` goes and ``joining`` comes)."""
            i, nxt = (k[:, 0] for k in _around(level_bytes, cap))
            r = np.arange(len(level_bytes))
            s0 = self.saved[h, i] - saved[leaving, i] + saved[joining, i]
            s1 = self.saved[h, nxt] - saved[leaving, nxt] + saved[joining, nxt]
            return _interpolated(cap, level_bytes[r, i], level_bytes[r, nxt], s0, s1)

        free_cap = np.maximum(capacity + held_rows, 0.0)
        free_fill = np.zeros(len(out))
        short = np.flatnonzero((capacity < 0) & (held_rows > 0))  # only there is it read
        if len(short):
            free_fill[short] = fill(b[short], out[short], into[short], free_cap[short])
        all_uvm = self.uvm[h] - uvm[out] + uvm[into]
        return self.model.settled(
            all_uvm - fill(b, out, into, np.maximum(capacity, 0.0)),
            all_uvm,
            capacity,
            held_rows,
            self.held_saving[h] - held_saving[out] + held_saving[into],
            (free_fill, np.minimum(free_cap, b[:, -1])),
        )

    def _conflicts(self, tables: np.ndarray, h: int, leaving: np.ndarray) -> np.ndarray:
        """Per pair: would tables[i] join GPU h, from which leaving[i] goes, beside a shard of its table?"""
        assert self.siblings is not None, "asked only when a table is split"
        sib = self.siblings[np.maximum(tables, 0)]
        there = (sib >= 0) & (self.gpu[np.maximum(sib, 0)] == h) & (sib != leaving[:, None])
        return (tables >= 0) & there.any(1)

    def changes(self, a: int, b: int):
        """Every move of a table between GPUs a and b and every swap of one of a's with one of
        b's: (table from a or -1, table from b or -1, new cost of a, new cost of b)."""
        ma, mb = self.members(a), self.members(b)
        pa = np.concatenate([ma, np.full(len(mb), -1), np.repeat(ma, len(mb))]).astype(int)
        pb = np.concatenate([np.full(len(ma), -1), mb, np.tile(mb, len(ma))]).astype(int)
        if self.siblings is not None and len(pa):
            keep = ~(self._conflicts(pa, b, pb) | self._conflicts(pb, a, pa))
            pa, pb = pa[keep], pb[keep]
        if not len(pa):
            return pa, pb, np.zeros(0), np.zeros(0)
        return pa, pb, self._with(a, pa, pb), self._with(b, pb, pa)

    def apply(self, a: int, b: int, x: int, y: int, cost_a: float, cost_b: float) -> None:
        for table, src, dst in ((x, a, b), (y, b, a)):
            if table < 0:
                continue
            self.gpu[table] = dst
            for total, per in self._sums():
                total[src] -= per[table]
                total[dst] += per[table]
        self.cost[a], self.cost[b] = cost_a, cost_b


def lpt_plan(problem: Problem, model: GpuCostModel | None = None) -> Plan:
    """Longest processing time first: the tables, costliest in UVM first, each onto the GPU whose
    cost after taking it is lowest (where its buffers fit, else where they overflow least; never
    beside a shard of its table)."""
    model = model or GpuCostModel(problem)
    g = problem.num_gpus
    bytes_, saved = np.zeros((g, model.bytes.shape[1])), np.zeros((g, model.bytes.shape[1]))
    uvm, buffers, held, held_saving = (np.zeros(g) for _ in range(4))
    gpu = [0] * len(problem.tables)
    placed = np.zeros(len(problem.tables), dtype=bool)
    for j in sorted(range(len(problem.tables)), key=lambda j: (-model.uvm[j], j)):
        new = model.cost_of(
            bytes_ + model.bytes[j],
            saved + model.saved[j],
            uvm + model.uvm[j],
            buffers + model.buffers[j],
            held + model.held[j],
            held_saving + model.held_saving[j],
        )
        for s in problem.siblings[j]:
            if placed[s]:
                new[gpu[s]] = np.inf
        h = int(np.argmin(new))
        gpu[j], placed[j] = h, True
        bytes_[h] += model.bytes[j]
        saved[h] += model.saved[j]
        uvm[h] += model.uvm[j]
        buffers[h] += model.buffers[j]
        held[h] += model.held[j]
        held_saving[h] += model.held_saving[j]
    assignment = tuple(gpu)
    return Plan("lpt", assignment, split_assignment(problem, assignment))


def improve(
    problem: Problem,
    plan: Plan,
    budget_s: float = 10.0,
    name: str | None = None,
    model: GpuCostModel | None = None,
    seed: int = 0,
) -> Plan:
    """The plan's assignment improved by the two phases (module docstring), then, while the
    budget lasts, the best assignment so far kicked (two tables moved to random GPUs, drawn from
    ``seed``) and improved again, until :data:`KICKS_WITHOUT_GAIN` kicks in a row find nothing
    better; exactly split (``model``: the problem's, when the caller has built it already)."""
    model = model or GpuCostModel(problem)
    deadline = time.time() + budget_s
    best = _descend(_State(model, plan.gpu), deadline)
    rng = np.random.default_rng(seed)
    fruitless = 0
    while fruitless < KICKS_WITHOUT_GAIN and time.time() < deadline:
        gpu = best.gpu.copy()
        kick(problem, gpu, range(len(gpu)), rng)
        kicked = _descend(_State(model, gpu), deadline)
        fruitless += 1
        if kicked.cost.max() < best.cost.max() * (1 - _REL):
            best, fruitless = kicked, 0
    assignment = tuple(int(g) for g in best.gpu)
    return Plan(name or plan.name, assignment, split_assignment(problem, assignment))


def descend(model: GpuCostModel, gpu, deadline: float) -> tuple[tuple[int, ...], float]:
    """The two phases from the assignment ``gpu`` until neither helps or the deadline: where they
    stop and its slowest GPU's cost as the search judges it (no kicks, no exact split)."""
    state = _descend(_State(model, gpu), deadline)
    return tuple(int(g) for g in state.gpu), float(state.cost.max())


def kick(problem: Problem, gpu, movable, rng: np.random.Generator) -> None:
    """Two of the ``movable`` tables moved, in place, each to a random other GPU that holds no
    shard of its table."""
    for j in rng.choice(movable, size=min(2, len(movable)), replace=False):
        free = [
            h
            for h in range(problem.num_gpus)
            if h != gpu[j] and all(gpu[s] != h for s in problem.siblings[j])
        ]
        if free:
            gpu[j] = int(rng.choice(free))


def _descend(state: _State, deadline: float) -> _State:
    """The two phases (module docstring) until neither helps or the deadline."""
    while time.time() < deadline:
        if _lower_slowest(state, deadline):
            continue
        if not _meet_water_levels(state, deadline):
            break
    return state


def _lower_slowest(state: _State, deadline: float) -> bool:
    """The change between the slowest GPU and another that leaves the higher of the two lowest,
    if it is below the slowest's cost now."""
    worst = int(np.argmax(state.cost))
    target = state.cost[worst] * (1 - _REL)
    best = None
    for h in np.argsort(state.cost):
        if h == worst or state.cost[h] >= target:
            continue
        x, y, cost_w, cost_h = state.changes(worst, int(h))
        if not len(x):
            continue
        peak = np.maximum(cost_w, cost_h)
        i = int(np.argmin(peak))
        if peak[i] < target:  # the first partner with a change, cheapest partners first
            best = (peak[i], int(h), int(x[i]), int(y[i]), float(cost_w[i]), float(cost_h[i]))
            break
        if time.time() > deadline:
            break
    if best is None:
        return False
    _, h, x, y, cost_w, cost_h = best
    state.apply(worst, h, x, y, cost_w, cost_h)
    return True


def _meet_water_levels(state: _State, deadline: float) -> bool:
    """The change between one of the slowest GPUs and another that lowers their summed cost most
    without either reaching the slowest GPU's cost; False when no pair has one."""
    ceiling = state.cost.max() * (1 - _REL)
    order = np.argsort(-state.cost)
    level = state.water_levels()
    for a in order[: max(1, len(order) // 2)]:
        best = None
        # partners whose HBM runs out at the most different saving per byte first: the most to gain
        for b in np.argsort(-np.abs(level - level[a]), kind="stable"):
            if b == a:
                continue
            x, y, cost_a, cost_b = state.changes(int(a), int(b))
            if not len(x):
                continue
            gain = state.cost[a] + state.cost[b] - (cost_a + cost_b)
            gain[(cost_a > ceiling) | (cost_b > ceiling)] = -np.inf
            i = int(np.argmax(gain))
            if gain[i] > _REL * state.cost[a]:  # the first partner with a gain, cheapest partners first
                best = (gain[i], int(b), int(x[i]), int(y[i]), float(cost_a[i]), float(cost_b[i]))
                break
            if time.time() > deadline:
                break
        if best is not None:
            _, b, x, y, cost_a, cost_b = best
            state.apply(int(a), b, x, y, cost_a, cost_b)
            return True
        if time.time() > deadline:
            return False
    return False
