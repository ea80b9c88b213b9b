"""Column-wise split of hot tables (docs/design.md, "Column shards").

A table whose cost alone would set the step time is cut into k column shards (k a power of 2
dividing its dim, at most the GPUs and ``--max-column-shards``): each shard has dim / k columns,
1/k of the row bytes and every one of the table's accesses, so it costs 1/k of the table's
per-byte terms and all of its per-lookup and per-row terms at the same HBM share; it needs the
trainer's id buffer in full and 1/k of its outputs. The shards of a table go to different GPUs and keep the same rows in HBM (TorchRec's ``column_wise``).

How many shards a table gets is a decision of the solve, never fixed beforehand: the search
tries the cuts of :func:`cut_ladder` (the cut :func:`choose_shards` proposes, then every table cut
half as much, down to every table whole) and the MILP chooses among a table's shard counts
(:func:`shard_counts`, :func:`shard_entries`).

The solver places shards like tables (:class:`~recshard_stats.solver.problem.Problem` with a
``parent`` per entry); :func:`table_shards` folds a plan of entries back into the model's tables.
"""

from __future__ import annotations

import dataclasses

from recshard_stats.solver.kernel_groups import has_call_costs
from recshard_stats.solver.plan import Plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import alone_cost, alone_uvm_time, pooled_bound

# a table is cut until its shard alone costs at most this share of a GPU's pooled cost: pieces
# of half a GPU's load or less pack evenly among the other tables
SPLIT_SHARE = 0.5


def choose_shards(problem: Problem, max_column_shards: int) -> tuple[int, ...]:
    """Column shards per table: 1 unless the table alone costs more than SPLIT_SHARE of the
    pooled per-GPU cost, then the fewest that bring a shard below it (or the most allowed)."""
    share = SPLIT_SHARE * pooled_bound(problem)
    shards = []
    for _j, t in enumerate(problem.tables):
        k, most = 1, t.most_column_shards(problem.num_gpus, max_column_shards)
        # a table cheaper than the share in UVM is cheaper than it anywhere: no water-fill needed
        while (
            k < most
            and alone_uvm_time(problem, t.column_shard(k)) > share
            and alone_cost(problem, t.column_shard(k)) > share
        ):
            k *= 2
        shards.append(k)
    return tuple(shards)


# the ladder starts with every table cut as much as it may be while that makes at most this many
# entries: column shards of every table on every GPU share the HBM of all GPUs alike (the pooled
# bound's picture), which balances models of a few dozen tables where the hot ones alone do not.
# Not more: the exact split of shards that keep their siblings' rows is not bounded by the time
# limit (100 tables x 8 GPUs cut 8 ways: 158 s of a 60 s limit, for a worse plan)
ALL_CUT_ENTRIES = 256
# the shares of the tables (largest first) the mixed rungs keep cut as much as the all-cut one
MIXED_CUT_SHARES = (0.25, 0.5, 0.75)


def cut_ladder(problem: Problem, max_column_shards: int) -> list[tuple[int, ...]]:
    """The cuts the search tries, most cut first: every table cut as much as it may be (when that
    stays within ALL_CUT_ENTRIES entries and calls cost nothing fixed) and then, beside it, the
    largest tables cut as much and the rest less (MIXED_CUT_SHARES); :func:`choose_shards`'s, then
    each table's count halved, down to every table whole (always last): fewer shards are tried
    before none."""
    most = tuple(t.most_column_shards(problem.num_gpus, max_column_shards) for t in problem.tables)
    cuts = choose_shards(problem, max_column_shards)
    # with a fixed cost per kernel call every GPU would run every table's rows (each its own call)
    all_cut = most != cuts and sum(most) <= ALL_CUT_ENTRIES and not has_call_costs(problem)
    tail = [cuts]  # choose_shards's, then halved down to every table whole
    while any(k > 1 for k in tail[-1]):
        tail.append(tuple(max(1, k // 2) for k in tail[-1]))
    head = [most] if all_cut else []
    if all_cut:
        # between it and choose_shards's: the largest tables cut as much, the rest less (their
        # shards' id buffers take HBM the rows of the large ones want; a few shards still balance)
        largest = sorted(range(len(most)), key=lambda j: -problem.tables[j].size_bytes)
        for share in MIXED_CUT_SHARES:
            keep = set(largest[: round(share * len(most))])
            rest = max(most) // 2
            while rest >= 1:
                head.append(tuple(k if j in keep else min(k, rest) for j, k in enumerate(most)))
                rest //= 2
    # each cut once, the tail's in place (every table whole stays last)
    return [c for c in dict.fromkeys(head) if c not in tail] + tail


def shard_counts(problem: Problem, max_column_shards: int, most: tuple[int, ...] | None = None):
    """Per table, the shard counts a plan may choose from: 1, 2, 4, ... up to the most it may be
    cut into (or ``most[j]``, when given, if that is fewer)."""
    return tuple(
        tuple(k for k in t.shard_counts(problem.num_gpus, max_column_shards) if most is None or k <= most[j])
        for j, t in enumerate(problem.tables)
    )


@dataclasses.dataclass(frozen=True)
class ShardEntries:
    """Every way of cutting every table at once, for the MILP to choose from: ``entries`` holds,
    per table and per shard count k it may take, k column shards (table order, counts ascending);
    ``option[e]`` is entry e's (table, count)."""

    entries: Problem
    option: tuple[tuple[int, int], ...]

    @property
    def options(self) -> dict[tuple[int, int], list[int]]:
        """(table, count) -> its entries, in column order."""
        out: dict[tuple[int, int], list[int]] = {}
        for e, o in enumerate(self.option):
            out.setdefault(o, []).append(e)
        return out


def shard_entries(problem: Problem, counts: tuple[tuple[int, ...], ...]) -> ShardEntries:
    tables, parent, option = [], [], []
    for j, (t, ks) in enumerate(zip(problem.tables, counts, strict=True)):
        for k in ks:
            tables += [t.column_shard(k)] * k
            parent += [j] * k
            option += [(j, k)] * k
    return ShardEntries(Problem(tuple(tables), problem.hardware, tuple(parent)), tuple(option))


def split_problem(problem: Problem, shards: tuple[int, ...]) -> Problem:
    """The problem with table j replaced by ``shards[j]`` column shards (kept in table order)."""
    if all(k == 1 for k in shards):
        return problem
    tables, parent = [], []
    for j, (t, k) in enumerate(zip(problem.tables, shards, strict=True)):
        tables += [t.column_shard(k)] * k
        parent += [j] * k
    return Problem(tuple(tables), problem.hardware, tuple(parent))


def cuts_of(problem: Problem) -> tuple[int, ...]:
    """Per model table, the shards ``problem`` (a problem after :func:`split_problem`) cuts it into."""
    if not problem.parent:
        return (1,) * len(problem.tables)
    counts = [0] * (max(problem.parent) + 1)
    for p in problem.parent:
        counts[p] += 1
    return tuple(counts)


@dataclasses.dataclass(frozen=True)
class TableShards:
    """Where one model table's entries went: their GPUs (one per column shard, in column order)
    and the rows each keeps in HBM (the same for all its shards)."""

    entries: tuple[int, ...]
    gpus: tuple[int, ...]
    rows_hbm: int


def table_shards(problem: Problem, plan: Plan) -> list[TableShards]:
    """Per model table (in order): its entries in ``problem`` and their placement."""
    parent = problem.parent or tuple(range(len(problem.tables)))
    entries: dict[int, list[int]] = {}
    for j, p in enumerate(parent):
        entries.setdefault(p, []).append(j)
    return [
        TableShards(tuple(e), tuple(plan.gpu[j] for j in e), plan.rows_hbm[e[0]])
        for _, e in sorted(entries.items())
    ]
