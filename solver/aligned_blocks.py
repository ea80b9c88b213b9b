"""Plans whose column shards take aligned blocks of GPUs, chosen by a MILP (HiGHS) over every
table's shard count at once (docs/design.md, "Column shards").

A table cut into k shards takes one block of k GPUs that starts at a multiple of k (GPUs 0-3 or
4-7 for k = 4 on 8 GPUs; a whole table is a block of one). Such blocks nest, so a GPU's load is
the sum over the blocks that hold it, and a table's shards, all in one block, keep one share of
its rows in HBM. The MILP picks each table's block (so its count) and that share: the costliest
GPU's cost is minimised, each GPU's HBM holding its shards' buffers and rows, a shard's saving
under the MILP's lines (:func:`~recshard_stats.solver.milp.saving_lines`, above the true saving).

Why: the best plan of the shipped synthetic model at 10^6 samples cut every table into 8, one
shard on each GPU (0.1620 ms, 3.16% above the bound): each table's id buffer then sits on every
GPU. Fewer shards balance only when the tables cut less are laid out together, which neither the
ladder's cuts nor a table recut at a time reach, and the MILP with every count of every table
(each shard on any GPU) found no plan in its time. Blocks leave a few hundred binaries and no
shard of a table interchangeable with its siblings: from that plan HiGHS found 0.1594 ms in 30 s
(1.47%; ``benchmarks/aligned_blocks_bench.py``), and 0.1595 ms (1.51%) in the solve's 60 s
(BENCHMARKS.md). What it finds varies with its time, so the solve takes its plan only when
cheaper, split exactly. Linear models only: kernel calls are left out (the polish counts them).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
import weakref

import numpy as np

import recshard_stats
from recshard_stats.solver.column_split import (
    cuts_of,
    shard_counts,
    shard_entries,
    split_problem,
)
from recshard_stats.solver.milp import WHOLE_ROWS_UP_TO, saving_lines
from recshard_stats.solver.plan import Plan, cost_plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import colwise_matrix, run_highs, split_assignment
from recshard_stats.units import MS_PER_S

log = logging.getLogger(__name__)

# the MIP gap HiGHS stops at: the exact split decides between plans this close anyway
BLOCKS_MIP_GAP = 1e-3
# where it runs in a process of its own: the seconds before the solve's deadline its HiGHS stops,
# for the exact split of its plan and the trip back
BESIDE_MARGIN_S = 1.0
# above this many binaries it is not started beside the ladder (1000 tables on 64 GPUs would have
# 127,000, and the ladder proves such a family's plans within the MIP gap anyway)
BESIDE_MOST_BLOCKS = 20_000


@dataclasses.dataclass(frozen=True)
class ShardOption:
    """One shard of table ``table`` cut into ``count``: costs in ms, bytes as shares of a GPU's HBM."""

    table: int
    count: int
    uvm_ms: float  # all its rows in host memory
    saved_ms: float  # what all its rows in HBM would save
    size: float  # all its rows' bytes
    buffers: float  # the trainer's buffers it takes wherever it is
    lines: tuple[tuple[float, float], ...]  # its saving share lies under each (slope * f + intercept)
    rows: int  # its table's rows

    def alone_ms(self) -> float:
        """Its cost alone on a GPU, all of that GPU's HBM its own (inf: its buffers do not fit)."""
        if self.buffers > 1:
            return float("inf")
        f = min(1.0, (1 - self.buffers) / self.size) if self.size > 0 else 1.0
        return self.uvm_ms - self.saved_ms * min(1.0, *(s * f + b for s, b in self.lines))


def shard_options(problem: Problem, max_column_shards: int, segments: int) -> list[ShardOption]:
    """One option per table and shard count it may take (table order, counts ascending)."""
    choice = shard_entries(problem, shard_counts(problem, max_column_shards))
    entries, cap = choice.entries, problem.hbm_capacity
    out = []
    for (j, k), es in choice.options.items():
        e = es[0]  # the shards of one count are alike
        uvm, hbm = entries.uvm_time(e) * MS_PER_S, entries.hbm_time(e) * MS_PER_S
        out.append(
            ShardOption(
                table=j,
                count=k,
                uvm_ms=uvm,
                saved_ms=uvm - hbm,
                size=entries.tables[e].size_bytes / cap,
                buffers=entries.trainer_bytes[e] / cap,
                lines=tuple(saving_lines(entries, e, segments)),
                rows=entries.tables[e].hash_size,
            )
        )
    return out


def blocks(num_gpus: int, count: int) -> range:
    """The first GPU of each aligned block of ``count`` GPUs."""
    return range(0, num_gpus - count + 1, count)


class _Builder:
    """A HiGHS model built row by row: per column its cost, upper bound, integrality and its
    (row, value) pairs."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.columns: list[list[tuple[int, float]]] = []

    def column(self, cost: float, upper: float, integer: bool = False) -> int:
        self.cost.append(cost)
        self.upper.append(upper)
        self.integer.append(integer)
        self.columns.append([])
        return len(self.cost) - 1

    def row(self, terms: list[tuple[int, float]], lower: float = -np.inf, upper: float = np.inf) -> int:
        r = len(self.row_lower)
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        for c, v in terms:
            self.columns[c].append((r, v))
        return r

    def lp(self):
        import highspy

        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.cost), len(self.row_lower)
        lp.col_cost_ = np.asarray(self.cost)
        lp.col_lower_, lp.col_upper_ = np.zeros(lp.num_col_), np.asarray(self.upper)
        lp.row_lower_, lp.row_upper_ = np.asarray(self.row_lower), np.asarray(self.row_upper)
        kind = highspy.HighsVarType
        lp.integrality_ = [kind.kInteger if i else kind.kContinuous for i in self.integer]
        colwise_matrix(lp, self.columns)
        return lp


def aligned_plan(
    problem: Problem,
    max_column_shards: int,
    segments: int,
    deadline: float,
    from_all_cut: bool = True,
) -> tuple[Problem, Plan] | None:
    """The best plan of aligned blocks HiGHS finds by ``deadline`` (module docstring): (the tables
    cut as it chose, its assignment split exactly), or None when it finds none. It starts from
    every table cut as much as it may be, one shard on each GPU of the first block of that size
    (``from_all_cut``; else from nothing): from there it found better plans than from nothing and
    than from the ladder's best plan (BENCHMARKS.md)."""
    g_count = problem.num_gpus
    options = shard_options(problem, max_column_shards, segments)
    m = _Builder()
    z = m.column(1.0, np.inf)
    cost_terms: list[list[tuple[int, float]]] = [[(z, -1.0)] for _ in range(g_count)]
    hbm_terms: list[list[tuple[int, float]]] = [[] for _ in range(g_count)]
    pick_terms: dict[int, list[tuple[int, float]]] = {}
    held: dict[tuple[int, int, int], int] = {}  # (table, count, first GPU) -> its binary
    for o in options:
        for first in blocks(g_count, o.count):
            a = m.column(0.0, 1.0, integer=True)  # the table takes this block
            f = m.column(0.0, 1.0)  # the share of its rows in HBM
            y = m.column(0.0, 1.0)  # the share of its saving it claims
            held[o.table, o.count, first] = a
            pick_terms.setdefault(o.table, []).append((a, 1.0))
            m.row([(f, 1.0), (a, -1.0)], upper=0.0)
            m.row([(y, 1.0), (a, -1.0)], upper=0.0)
            for slope, intercept in o.lines:
                m.row([(y, 1.0), (f, -slope), (a, -intercept)], upper=0.0)
            if o.rows <= WHOLE_ROWS_UP_TO:  # a row is a large share of it: whole rows, as the split holds
                m.row([(f, float(o.rows)), (m.column(0.0, o.rows, integer=True), -1.0)], lower=0.0, upper=0.0)
            for g in range(first, first + o.count):
                cost_terms[g] += [(a, o.uvm_ms), (y, -o.saved_ms)]
                hbm_terms[g] += [(a, o.buffers), (f, o.size)]
    for terms in pick_terms.values():
        m.row(terms, lower=1.0, upper=1.0)
    for g in range(g_count):
        m.row(cost_terms[g], upper=0.0)
        m.row(hbm_terms[g], upper=1.0)

    most = {o.table: o.count for o in options}  # options come counts ascending
    start = [held[j, k, 0] for j, k in most.items()] if from_all_cut else []
    lp = m.lp()
    # HiGHS 1.16 ends in a solve error where it cannot complete the start (on tiny instances whose
    # buffers do not all fit on the first GPU): the time left then goes to a run from nothing
    found = _run(lp, deadline - time.time(), start) or (
        _run(lp, deadline - time.time(), []) if start else None
    )
    if found is None:
        return None
    value, status = found
    picked = {j: (k, first) for (j, k, first), a in held.items() if value[a] > 0.5}
    cuts = tuple(picked[j][0] for j in range(len(problem.tables)))
    placed = split_problem(problem, cuts)
    gpu = tuple(picked[j][1] + i for j in range(len(problem.tables)) for i in range(cuts[j]))
    plan = Plan("aligned_blocks", gpu, split_assignment(placed, gpu))
    log.info(
        "aligned blocks: %.4f ms/batch in the MILP (HiGHS: %s), %.4f ms split exactly",
        value[z],
        status,
        cost_plan(placed, plan).max_cost * MS_PER_S,
    )
    return placed, plan


def _run(lp, seconds: float, start: list[int]) -> tuple[np.ndarray, str] | None:
    """HiGHS on the model for ``seconds`` from the binaries ``start`` set (a partial solution it
    completes; none: from nothing): (its values, its status), None when it found no solution."""
    solver = run_highs(lp, seconds, BLOCKS_MIP_GAP, start)
    solution = solver.getSolution()
    if not solution.value_valid:
        return None
    return np.asarray(solution.col_value), solver.modelStatusToString(solver.getModelStatus())


def spare_cpus() -> bool:
    """Whether this process may use two CPUs: the MILP of aligned blocks then runs beside the
    solve's other stages rather than after them."""
    return len(os.sched_getaffinity(0)) >= 2


def block_choices(problem: Problem, max_column_shards: int) -> int:
    """The MILP's binaries: one per table, shard count and aligned block of that count."""
    return sum(problem.num_gpus // k for counts in shard_counts(problem, max_column_shards) for k in counts)


class AlignedBeside:
    """:func:`aligned_plan` in a process of its own, started now, read back by :meth:`result` or
    dropped by :meth:`cancel` (or when it is garbage-collected). A fresh interpreter: HiGHS's
    threads do not survive a fork, and multiprocessing's spawn would run the caller's script again
    where it has no main guard. From every table cut as much as it may be, with all the time to
    ``deadline``: alone, the synthetic model at 10^6 samples reached 0.1594 ms in 45 s and 0.1587
    ms in 60 s, against 0.1595 ms with the ~20 s it had after the other stages (BENCHMARKS.md)."""

    def __init__(self, problem: Problem, max_column_shards: int, segments: int, deadline: float):
        self._problem = problem
        # a file, not a pipe: nothing blocks on what it prints
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (open while it runs)
        handle, self._out = tempfile.mkstemp(prefix="recshard-aligned-", suffix=".pickle")
        os.close(handle)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(recshard_stats.__file__)))
        path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, self._out],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._errors,
            env={**os.environ, "PYTHONPATH": path},
        )
        self._end = weakref.finalize(self, _end_process, self._process, self._errors, self._out)
        assert self._process.stdin is not None
        self._process.stdin.write(
            pickle.dumps((problem, max_column_shards, segments, deadline - BESIDE_MARGIN_S))
        )
        self._process.stdin.close()

    def cancel(self) -> None:
        """Its plan is not wanted: the process is ended, its files removed."""
        self._end()

    def result(self, deadline: float) -> tuple[Problem, Plan] | None:
        """Its plan (tables cut as it chose, split exactly), waiting for it until ``deadline``
        at most; None when it found none, failed or was late."""
        try:
            code = self._process.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            log.warning("aligned blocks: no plan by the deadline, the process is ended")
            self.cancel()
            return None
        if code != 0:  # its plan is lost, not the solve
            self._errors.seek(0)
            detail = self._errors.read().decode(errors="replace")[-2000:]
            log.warning("aligned blocks: the process failed (exit code %s): %s", code, detail)
            self.cancel()
            return None
        with open(self._out, "rb") as f:
            found = pickle.load(f)
        self.cancel()
        if found is None:
            return None
        cuts, plan = found
        placed = split_problem(self._problem, cuts)
        log.info(
            "aligned blocks (in a process of its own): %.4f ms/batch split exactly",
            cost_plan(placed, plan).max_cost * MS_PER_S,
        )
        return placed, plan


def _end_process(process: subprocess.Popen, errors, out: str) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
    errors.close()
    if os.path.exists(out):
        os.unlink(out)


def _main(out_path: str) -> None:
    """The process :class:`AlignedBeside` starts: its arguments pickled on stdin, its plan pickled
    to ``out_path``."""
    problem, max_column_shards, segments, deadline = pickle.load(sys.stdin.buffer)
    found = aligned_plan(problem, max_column_shards, segments, deadline)
    with open(out_path, "wb") as f:
        pickle.dump(None if found is None else (cuts_of(found[0]), found[1]), f)


if __name__ == "__main__":
    _main(sys.argv[1])
