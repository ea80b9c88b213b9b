"""The RecShard MILP (docs/design.md, "The MILP") in Pyomo, and its solution as plain data.

Units keep the solvers' numerics sane: cost in milliseconds per batch, capacities as shares, and
``f[e, g]`` the *fraction* of entry e's rows held in HBM of GPU g (rows = f * hash_size).

The shard count of each table is a decision of the model: its entries are the column shards of
every count the table may take (:func:`~recshard_stats.solver.column_split.shard_entries`),
``u[j, k]`` picks one count per table, and the picked count's shards are placed on distinct GPUs
with the same rows in HBM. A table that may only stay whole has one entry, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import subprocess
import time

import numpy as np
import pyomo.environ as pyo
from pyomo.opt import TerminationCondition

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import MilpStatus
from recshard_stats.options import SOLVERS, SolveOptions
from recshard_stats.solver.column_split import ShardEntries, shard_entries, split_problem
from recshard_stats.solver.plan import Plan, cost_plan
from recshard_stats.solver.problem import Problem, breakpoints
from recshard_stats.units import MS_PER_S, fmt_bytes

log = logging.getLogger(__name__)

_PYOMO_NAME = {"glpk": "glpk", "cbc": "cbc", "highs": "appsi_highs"}
# Pyomo builds this model at about 1,700 (table, GPU) pairs a second on 2 cores (400 tables x 16 GPUs,
# 6,280 pairs: 3.7 s, BENCHMARKS.md); a MILP whose build would take over half its time is not built
BUILD_PAIRS_PER_SECOND = 1500.0
# tables of at most this many rows keep a whole number of them in HBM: one row is over a
# thousandth of such a table, and rounding the model's fraction down can cost more than the
# plan's gap (a 2-row table: half of it); bigger tables' fractions are rounded when read
WHOLE_ROWS_UP_TO = 1000
_TINY = 1e-7


@dataclasses.dataclass(frozen=True)
class CutPlan:
    """A plan of the model's tables cut into ``shards[j]`` column shards each: ``plan`` is over
    :func:`~recshard_stats.solver.column_split.split_problem` of them."""

    shards: tuple[int, ...]
    plan: Plan


@dataclasses.dataclass(frozen=True)
class MilpResult:
    plan: Plan  # assignment from the MILP, split as the MILP chose (no_incumbent: the start)
    status: MilpStatus
    objective_ms: float | None  # the MILP's own objective (F relaxed to lines above it: optimistic)
    bound_ms: float | None  # the solver's best bound on its objective, when reported: a lower bound
    #                            on every plan's exact cost
    solve_seconds: float  # wall, the model build included
    build_seconds: float = 0.0  # building the Pyomo model
    shards: tuple[int, ...] = ()  # per model table, the column shards ``plan`` cuts it into (empty: none cut)


def order_by_cost(problem: Problem) -> list[int]:
    return sorted(range(len(problem.tables)), key=lambda j: (-problem.uvm_time(j), j))


def _clean(coefficient: float) -> float:
    return 0.0 if abs(coefficient) < _TINY else coefficient


def allowed_pairs(problem: Problem, options: SolveOptions) -> list[tuple[int, int]]:
    """The (table, GPU) pairs the model has variables for. Identical GPUs: with symmetry breaking
    the i-th costliest table may only use GPUs 0..i (removes permuted copies)."""
    rank = {j: i for i, j in enumerate(order_by_cost(problem))}
    return [
        (j, g)
        for j in range(len(problem.tables))
        for g in range(problem.num_gpus)
        if not options.symmetry_breaking or g <= rank[j]
    ]


def whole_tables(problem: Problem) -> tuple[tuple[int, ...], ...]:
    return ((1,),) * len(problem.tables)


def saving_lines(problem: Problem, j: int, segments: int) -> list[tuple[float, float]]:
    """(slope, intercept) of lines over the share f of table j's rows in HBM that all lie above
    S(f), its share of the saving all-in-HBM gives, touching it at ~``segments`` breakpoints.
    S is concave and linear between whole rows: the line through each breakpoint with S's slope
    just right of it lies above S, so a saving claimed under the lowest of these lines is never
    less than a plan really gets, and a bound over them is a true lower bound (chords lie under S)."""
    table = problem.tables[j]
    rows, frac = breakpoints(problem, j, segments)
    right = problem.saving_fraction(j, np.minimum(rows + 1, table.hash_size))
    lines = []
    for r, value, after in zip(rows, frac, right, strict=True):
        slope = (after - value) * table.hash_size if r < table.hash_size else 0.0
        f = r / table.hash_size
        if slope < _TINY:  # flat at the line's highest value: still above S, no tiny coefficient
            lines.append((0.0, float(value + slope * (1 - f))))
        else:
            lines.append((float(slope), float(value - slope * f)))
    if len(rows) == 1:  # never accessed: no hits at all
        lines.append((0.0, 0.0))
    return lines


def build_model(
    problem: Problem,
    options: SolveOptions = SolveOptions(),
    counts: tuple[tuple[int, ...], ...] | None = None,
) -> pyo.ConcreteModel:
    """The MILP over the entries of every shard count in ``counts`` (per table; default: every
    table whole). ``m.entries`` keeps the :class:`ShardEntries` for reading the solution."""
    choice = shard_entries(problem, counts or whole_tables(problem))
    entries = choice.entries
    m = pyo.ConcreteModel(name="recshard")
    m.entries = choice
    gpus = range(problem.num_gpus)
    m.T, m.G = pyo.Set(initialize=range(len(entries.tables))), pyo.Set(initialize=gpus)
    allowed = allowed_pairs(entries, options)
    m.A = pyo.Set(initialize=allowed, dimen=2)
    m.x = pyo.Var(m.A, domain=pyo.Binary)
    m.f = pyo.Var(m.A, bounds=(0, 1))
    m.y = pyo.Var(m.A, bounds=(0, 1))
    m.z = pyo.Var(domain=pyo.NonNegativeReals)
    whole_rows = [(e, g) for e, g in allowed if entries.tables[e].hash_size <= WHOLE_ROWS_UP_TO]
    m.rows = pyo.Var(
        whole_rows, domain=pyo.NonNegativeIntegers, bounds=lambda m, e, g: (0, entries.tables[e].hash_size)
    )
    m.hbm_rows_are_whole = pyo.Constraint(
        whole_rows, rule=lambda m, e, g: entries.tables[e].hash_size * m.f[e, g] == m.rows[e, g]
    )
    groups = choice.options
    m.O = pyo.Set(initialize=list(groups), dimen=2)
    m.u = pyo.Var(m.O, domain=pyo.Binary)  # table j cut into k shards

    by_table: dict[int, list[int]] = {}
    by_gpu: dict[int, list[int]] = {}
    for e, g in allowed:
        by_table.setdefault(e, []).append(g)
        by_gpu.setdefault(g, []).append(e)

    counts_of: dict[int, list[int]] = {}
    for j, k in groups:
        counts_of.setdefault(j, []).append(k)
    m.one_cut_per_table = pyo.Constraint(
        range(len(problem.tables)), rule=lambda m, j: sum(m.u[j, k] for k in counts_of[j]) == 1
    )
    m.each_chosen_shard_on_one_gpu = pyo.Constraint(
        m.T, rule=lambda m, e: sum(m.x[e, g] for g in by_table[e]) == m.u[choice.option[e]]
    )
    m.hbm_rows_only_where_placed = pyo.Constraint(m.A, rule=lambda m, e, g: m.f[e, g] <= m.x[e, g])
    m.hbm_hits_only_where_placed = pyo.Constraint(m.A, rule=lambda m, e, g: m.y[e, g] <= m.x[e, g])
    cut = [o for o, es in groups.items() if len(es) > 1]
    m.column_shards_apart = pyo.Constraint(
        [(o, g) for o in cut for g in gpus if sum(g in by_table[e] for e in groups[o]) > 1],
        rule=lambda m, j, k, g: sum(m.x[e, g] for e in groups[j, k] if g in by_table[e]) <= 1,
    )
    pairs = [(e, nxt) for o in cut for e, nxt in zip(groups[o], groups[o][1:], strict=False)]
    # TorchRec cuts a table's columns, never its rows apart
    m.column_shards_keep_the_same_rows = pyo.Constraint(
        range(len(pairs)),
        rule=lambda m, i: (
            sum(m.f[pairs[i][0], g] for g in by_table[pairs[i][0]])
            == sum(m.f[pairs[i][1], g] for g in by_table[pairs[i][1]])
        ),
    )
    if options.symmetry_breaking:
        # a table's shards are alike: the next one on a higher GPU removes their permuted copies
        m.column_shards_in_gpu_order = pyo.Constraint(
            range(len(pairs)),
            rule=lambda m, i: (
                sum(g * m.x[pairs[i][1], g] for g in by_table[pairs[i][1]])
                - sum(g * m.x[pairs[i][0], g] for g in by_table[pairs[i][0]])
                >= m.u[choice.option[pairs[i][0]]]
            ),
        )

    cuts = [
        (e, slope, intercept)
        for e in range(len(entries.tables))
        for slope, intercept in saving_lines(entries, e, options.cdf_segments)
    ]
    # one row per cut and entry, not per GPU: an entry is on one GPU, so its f and y summed over
    # the GPUs are those of that GPU (a weaker LP relaxation than a row per GPU, G times fewer rows)
    m.hbm_hits_under_access_cdf = pyo.Constraint(
        range(len(cuts)),
        rule=lambda m, c: (
            sum(m.y[cuts[c][0], g] - cuts[c][1] * m.f[cuts[c][0], g] for g in by_table[cuts[c][0]])
            <= cuts[c][2]
        ),
    )

    # capacities in units of themselves: coefficients stay near 1 whatever the byte counts;
    # an entry's trainer buffers take HBM on its GPU whatever its rows (no usable HBM: in bytes)
    cap = problem.hbm_capacity if problem.hbm_capacity > 0 else 1.0
    m.hbm_capacity = pyo.Constraint(
        m.G,
        rule=lambda m, g: (
            sum(
                entries.tables[e].size_bytes / cap * m.f[e, g]
                + _clean(entries.trainer_bytes[e] / cap) * m.x[e, g]
                for e in by_gpu.get(g, [])
            )
            <= problem.hbm_capacity / cap
            if by_gpu.get(g)
            else pyo.Constraint.Skip
        ),
    )
    host = problem.hardware.host_bytes
    total = sum(t.size_bytes for t in problem.tables) / host
    m.host_capacity = pyo.Constraint(
        expr=total - sum(entries.tables[e].size_bytes / host * m.f[e, g] for e, g in allowed) <= 1
    )
    uvm = [entries.uvm_time(e) for e in range(len(entries.tables))]
    hbm = [entries.hbm_time(e) for e in range(len(entries.tables))]

    def gpu_cost(m, g):
        return sum(MS_PER_S * (uvm[e] * m.x[e, g] - (uvm[e] - hbm[e]) * m.y[e, g]) for e in by_gpu.get(g, []))

    m.gpu_cost = pyo.Expression(m.G, rule=gpu_cost)
    m.slowest_gpu = pyo.Constraint(m.G, rule=lambda m, g: m.z >= m.gpu_cost[g])
    m.step_time = pyo.Objective(expr=m.z, sense=pyo.minimize)
    return m


def available(solver: str) -> bool:
    if solver not in SOLVERS:
        return False
    if solver in ("glpk", "cbc"):
        return shutil.which("glpsol" if solver == "glpk" else "cbc") is not None
    return bool(pyo.SolverFactory(_PYOMO_NAME[solver]).available(exception_flag=False))


def solve_milp(
    problem: Problem,
    options: SolveOptions = SolveOptions(),
    start: CutPlan | None = None,
    lower_bound: float | None = None,
    counts: tuple[tuple[int, ...], ...] | None = None,
) -> MilpResult:
    """The MILP's plan, or the start's when the MILP could not better it in time: it is skipped
    when the start is within ``mip_gap`` of ``lower_bound`` (seconds, valid for this problem) or
    when building it would take over half of its time. ``counts``: per table, the shard counts
    it may take (default: every table whole); the result's ``shards`` says which it took."""
    if not available(options.solver):
        raise RecShardError(
            Reason.SOLVER_UNAVAILABLE,
            f"solver {options.solver!r} is not installed",
            fixes=(
                "run scripts/setup.sh (installs glpk-utils, coinor-cbc, highspy)",
                "pick another --solver",
            ),
        )
    problem.check_capacity()
    counts = counts or whole_tables(problem)
    pairs = milp_pairs(problem, options, counts)
    start_cost = (
        cost_plan(split_problem(problem, start.shards), start.plan).max_cost if start is not None else None
    )  # seconds
    if (
        start is not None
        and start_cost is not None
        and lower_bound
        and start_cost <= lower_bound * (1 + options.mip_gap)
    ):
        log.info("MILP skipped: the start is within the MIP gap (%g) of the lower bound", options.mip_gap)
        return _as_start(start, options, MilpStatus.SKIPPED, None, 0.0)
    if start is not None and pairs / BUILD_PAIRS_PER_SECOND > options.time_limit_s / 2:
        log.info(
            "MILP skipped: building it (%d table x GPU pairs, ~%.0fs) would take over half of its %.0fs; "
            "the search gets the time",
            pairs,
            pairs / BUILD_PAIRS_PER_SECOND,
            options.time_limit_s,
        )
        return _as_start(start, options, MilpStatus.SKIPPED, None, 0.0)
    t0 = time.time()
    m = build_model(problem, options, counts)
    if start_cost is not None:
        # no plan worse than the start: prunes the search (no solver gets a warm start here, see
        # CBC below). The start's exact cost: its copy with the GPUs numbered as the symmetry
        # breaking wants, y = F (under every cut), reaches it in the model too.
        start_ms = start_cost * MS_PER_S
        m.no_worse_than_start = pyo.Constraint(expr=m.z <= start_ms * (1 + 1e-6) + 1e-9)
    build_seconds = time.time() - t0
    # the time limit is for the whole MILP stage: the solver gets what the build left
    limit = max(1.0, options.time_limit_s - build_seconds)
    opt = pyo.SolverFactory(_PYOMO_NAME[options.solver])
    kwargs: dict[str, object] = {"load_solutions": False}
    if options.solver == "glpk":
        opt.options.update({"mipgap": options.mip_gap})
    elif options.solver == "cbc":
        # CBC's preprocessing has declared a suboptimal plan of this model "optimal" (seen on the
        # built-in example with coinor-cbc 2.10); without it CBC finds the optimum HiGHS proves.
        # Neither its feasibility pump nor its reading of a warm start (fixing the start's integers
        # and solving the LP) checks the time limit: 41 s and 46 s past a 20 s limit at 400 tables
        # x 16 GPUs. Both are left out; the start bounds the search through no_worse_than_start.
        opt.options.update({"ratioGap": options.mip_gap, "preprocess": "off", "feas": "off"})
    else:
        # straight to HiGHS: the legacy solve() resets opt.config.time_limit to its own default
        opt.highs_options.update({"time_limit": limit, "mip_rel_gap": options.mip_gap})
    log.info(
        "solving the MILP with %s: %d tables x %d GPUs, %d variables, built in %.1fs, %.0fs left of the "
        "time limit",
        options.solver,
        len(problem.tables),
        problem.num_gpus,
        m.nvariables(),
        build_seconds,
        limit,
    )
    if options.solver in ("glpk", "cbc"):
        # their time limit (Pyomo passes it on), and the process killed a second past it: neither
        # binary checks it everywhere (CBC solves its root LP first: 12 s at 400 tables x 16 GPUs)
        kwargs["timelimit"] = (
            max(1, int(limit)) if options.solver == "glpk" else limit
        )  # glpsol: whole seconds
    try:
        results = opt.solve(m, **kwargs)
    except subprocess.TimeoutExpired:
        results = None
    seconds = time.time() - t0
    if results is None:
        return _without_incumbent(options, start, seconds, build_seconds, "killed at the time limit", None)
    tc = results.solver.termination_condition
    if tc == TerminationCondition.infeasible and start is None:
        buffers = sorted(problem.trainer_bytes, reverse=True)
        raise RecShardError(
            Reason.INFEASIBLE_HBM,
            f"{options.solver} proved the sharding problem infeasible: no assignment of the {len(buffers)} "
            f"tables (or of their column shards) packs their trainer buffers (largest "
            f"{fmt_bytes(buffers[0]) if buffers else '0 B'}, {fmt_bytes(sum(buffers))} in all) and their "
            f"rows into {problem.num_gpus} GPUs of {fmt_bytes(problem.hbm_capacity)} usable HBM and "
            f"{fmt_bytes(problem.hardware.host_bytes)} of host memory",
            fixes=(
                "raise hbm_per_gpu_gib or lower hbm_reserved_fraction",
                f"lower batch_size ({problem.hardware.batch_size})",
                "add GPUs",
            ),
        )
    has_solution = len(results.solution) > 0 if hasattr(results, "solution") else False
    if (
        tc
        not in (
            TerminationCondition.optimal,
            TerminationCondition.maxTimeLimit,
            TerminationCondition.feasible,
        )  # not intermediateNonInteger: CBC stopped with its LP relaxation, not a plan
        or not has_solution
    ):
        return _without_incumbent(options, start, seconds, build_seconds, str(tc), _bound(results))
    m.solutions.load_from(results)
    shards, plan = _read_plan(m, problem, f"milp_{options.solver}")
    status = MilpStatus.OPTIMAL if tc == TerminationCondition.optimal else MilpStatus.TIME_LIMIT
    log.info("%s: %s after %.1fs, objective %.4f ms", options.solver, status, seconds, pyo.value(m.z))
    return MilpResult(plan, status, float(pyo.value(m.z)), _bound(results), seconds, build_seconds, shards)


def _read_plan(m: pyo.ConcreteModel, problem: Problem, name: str) -> tuple[tuple[int, ...], Plan]:
    """The shard count the solution took per table, and its plan over the problem cut so."""
    choice: ShardEntries = m.entries
    # the largest u and x: a solver's integers are whole only up to its tolerance
    taken = dict.fromkeys(range(len(problem.tables)), (-1.0, 1))
    for j, k in choice.options:
        taken[j] = max(taken[j], (pyo.value(m.u[j, k]), k))
    shards = [taken[j][1] for j in range(len(problem.tables))]
    where: dict[int, tuple[float, int]] = {}
    for e, g in m.A:
        where[e] = max(where.get(e, (-1.0, g)), (pyo.value(m.x[e, g]), g))
    gpu: dict[int, int] = {}
    rows: dict[int, int] = {}
    for e, (_, g) in where.items():
        gpu[e] = g
        rows[e] = math.floor(pyo.value(m.f[e, g]) * choice.entries.tables[e].hash_size + 1e-6)
        if (e, g) in m.rows:  # a whole number already, up to the solver's integrality tolerance
            rows[e] = round(pyo.value(m.rows[e, g]))
    # the chosen options' entries, in table then column order: the entries of split_problem
    chosen = [e for (j, k), es in choice.options.items() if shards[j] == k for e in es]
    return tuple(shards), Plan(name, tuple(gpu[e] for e in chosen), tuple(rows[e] for e in chosen))


def milp_pairs(problem: Problem, options: SolveOptions, counts: tuple[tuple[int, ...], ...]) -> int:
    """The (entry, GPU) pairs the MILP over these shard counts has variables for (as
    :func:`allowed_pairs` makes them, without costing the entries to rank them)."""
    entries = sum(k for ks in counts for k in ks)
    g = problem.num_gpus
    if not options.symmetry_breaking:
        return entries * g
    return sum(min(i + 1, g) for i in range(entries))


def _as_start(
    start: CutPlan,
    options: SolveOptions,
    status: MilpStatus,
    bound: float | None,
    seconds: float,
    build_seconds: float = 0.0,
) -> MilpResult:
    """The start, standing for the MILP's plan (skipped, or stopped without a plan of its own)."""
    return MilpResult(
        dataclasses.replace(start.plan, name=f"milp_{options.solver}"),
        status,
        None,
        bound,
        seconds,
        build_seconds,
        start.shards,
    )


def _without_incumbent(
    options: SolveOptions,
    start: CutPlan | None,
    seconds: float,
    build_seconds: float,
    why: str,
    bound: float | None,
) -> MilpResult:
    """The start stands when the solver found no plan of its own (the status says so); without
    a start that is an error."""
    if start is None:
        raise RecShardError(
            Reason.NO_INCUMBENT,
            f"{options.solver} stopped ({why}) after {seconds:.1f}s without a feasible plan",
            fixes=("raise --time-limit", "try --solver cbc or highs"),
            context={"termination": why},
        )
    log.warning(
        "%s stopped (%s) after %.1fs without a plan of its own; keeping the start",
        options.solver,
        why,
        seconds,
    )
    return _as_start(start, options, MilpStatus.NO_INCUMBENT, bound, seconds, build_seconds)


def _bound(results) -> float | None:
    """The solver's proven lower bound on the objective (ms), where it reports a finite one."""
    try:
        bound = float(results.problem.lower_bound)
    except (AttributeError, TypeError, ValueError):
        return None
    return bound if math.isfinite(bound) else None
