"""Moves against the previous plan: which of a table's columns change GPU, in bytes. A trainer
applying a new plan moves those bytes (parameters and optimizer state), so ``--max-moved-gib``
caps them (:func:`recshard_stats.solver.solve.restrain`)."""

from __future__ import annotations

import numpy as np

from recshard_stats.manifest import Manifest
from recshard_stats.solver.problem import Problem, TableDemand


def previous_ranks(problem: Problem, previous: Manifest) -> tuple[tuple[int, ...] | None, ...]:
    """Per model table, the GPUs of its column shards in the previous plan (None: the previous
    plan has no such table, or one of another shape, so it cannot stay where it was)."""
    before = {t.name: t for t in previous.tables}
    out: list[tuple[int, ...] | None] = []
    for t in problem.tables:
        old = before.get(t.name)
        out.append(
            old.ranks if old is not None and (old.hash_size, old.dim) == (t.hash_size, t.dim) else None
        )
    return tuple(out)


def moved_bytes(table: TableDemand, ranks: tuple[int, ...], before: tuple[int, ...] | None) -> int:
    """Bytes of a (whole, uncut) table's parameters on another GPU than before: column c of k
    equal shards lies on ``ranks[c * k // dim]``. A table new to the plan moves nothing."""
    if before is None:
        return 0
    columns = np.arange(table.dim)
    now = np.asarray(ranks)[columns * len(ranks) // table.dim]
    then = np.asarray(before)[columns * len(before) // table.dim]
    return round(table.size_bytes * float(np.mean(now != then)))
