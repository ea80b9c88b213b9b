"""The RecShard MILP (docs/design.md, "The MILP") in Pyomo, and its solution as plain data.

Units keep the solvers' numerics sane: cost in milliseconds per batch, capacities as shares, and
``f[j, g]`` the *fraction* of table j's rows held in HBM of GPU g (rows = f * hash_size).
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
from recshard_stats.solver.plan import Plan, cost_plan
from recshard_stats.solver.problem import Problem, breakpoints
from recshard_stats.units import MS_PER_S

log = logging.getLogger(__name__)

_PYOMO_NAME = {"glpk": "glpk", "cbc": "cbc", "highs": "appsi_highs"}
# Pyomo builds this model at about 1,700 (table, GPU) pairs a second on 2 cores (400 tables x 16 GPUs,
# 6,280 pairs: 3.7 s, BENCHMARKS.md); a MILP whose build would take over half its time is not built
BUILD_PAIRS_PER_SECOND = 1500.0
_TINY = 1e-7


@dataclasses.dataclass(frozen=True)
class MilpResult:
    plan: Plan  # assignment from the MILP, split as the MILP chose (no_incumbent: the start)
    status: MilpStatus
    objective_ms: float | None  # the MILP's own objective (F relaxed to lines above it: optimistic)
    bound_ms: float | None  # the solver's best bound on its objective, when reported: a lower bound
    #                            on every plan's exact cost
    solve_seconds: float  # wall, the model build included
    build_seconds: float = 0.0  # building the Pyomo model


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


def build_model(problem: Problem, options: SolveOptions = SolveOptions()) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="recshard")
    tables, gpus = range(len(problem.tables)), range(problem.num_gpus)
    m.T, m.G = pyo.Set(initialize=tables), pyo.Set(initialize=gpus)
    allowed = allowed_pairs(problem, options)
    m.A = pyo.Set(initialize=allowed, dimen=2)
    m.x = pyo.Var(m.A, domain=pyo.Binary)
    m.f = pyo.Var(m.A, bounds=(0, 1))
    m.y = pyo.Var(m.A, bounds=(0, 1))
    m.z = pyo.Var(domain=pyo.NonNegativeReals)

    by_table: dict[int, list[int]] = {}
    by_gpu: dict[int, list[int]] = {}
    for j, g in allowed:
        by_table.setdefault(j, []).append(g)
        by_gpu.setdefault(g, []).append(j)

    m.each_table_on_one_gpu = pyo.Constraint(m.T, rule=lambda m, j: sum(m.x[j, g] for g in by_table[j]) == 1)
    m.hbm_rows_only_where_placed = pyo.Constraint(m.A, rule=lambda m, j, g: m.f[j, g] <= m.x[j, g])
    m.hbm_hits_only_where_placed = pyo.Constraint(m.A, rule=lambda m, j, g: m.y[j, g] <= m.x[j, g])
    groups = [
        (i, g)
        for i, group in enumerate(problem.shard_groups)
        for g in gpus
        if sum(g in by_table[j] for j in group) > 1
    ]
    m.column_shards_apart = pyo.Constraint(
        groups, rule=lambda m, i, g: sum(m.x[j, g] for j in problem.shard_groups[i] if g in by_table[j]) <= 1
    )

    cuts = []
    for j, table in enumerate(problem.tables):
        rows, frac = breakpoints(problem, j, options.cdf_segments)
        # S (the share of the table's saving, F under v1) is concave and linear between whole rows:
        # the line through each breakpoint with S's slope just right of it lies above S, so the
        # saving the MILP may claim, under the lowest of these lines, is never less than the plan
        # really gets and the solver's bound is a true lower bound (chords lie under S).
        right = problem.saving_fraction(j, np.minimum(rows + 1, table.hash_size))
        for r, value, after in zip(rows, frac, right, strict=True):
            slope = (after - value) * table.hash_size if r < table.hash_size else 0.0
            f = r / table.hash_size
            if slope < _TINY:  # flat at the line's highest value: still above F, no tiny coefficient
                cuts.append((j, 0.0, value + slope * (1 - f)))
            else:
                cuts.append((j, slope, value - slope * f))
        if len(rows) == 1:  # never accessed: no hits at all
            cuts.append((j, 0.0, 0.0))
    # one row per cut and table, not per GPU: a table is on one GPU, so its f and y summed over
    # the GPUs are those of that GPU (a weaker LP relaxation than a row per GPU, G times fewer rows)
    m.hbm_hits_under_access_cdf = pyo.Constraint(
        range(len(cuts)),
        rule=lambda m, c: (
            sum(m.y[cuts[c][0], g] - cuts[c][1] * m.f[cuts[c][0], g] for g in by_table[cuts[c][0]])
            <= cuts[c][2]
        ),
    )

    # capacities in units of themselves: coefficients stay near 1 whatever the byte counts;
    # a table's trainer buffers take HBM on its GPU whatever its rows (no usable HBM: in bytes)
    cap = problem.hbm_capacity if problem.hbm_capacity > 0 else 1.0
    m.hbm_capacity = pyo.Constraint(
        m.G,
        rule=lambda m, g: (
            sum(
                problem.tables[j].size_bytes / cap * m.f[j, g]
                + _clean(problem.trainer_bytes[j] / cap) * m.x[j, g]
                for j in by_gpu.get(g, [])
            )
            <= problem.hbm_capacity / cap
            if by_gpu.get(g)
            else pyo.Constraint.Skip
        ),
    )
    host = problem.hardware.host_bytes
    total = sum(t.size_bytes for t in problem.tables) / host
    m.host_capacity = pyo.Constraint(
        expr=total - sum(problem.tables[j].size_bytes / host * m.f[j, g] for j, g in allowed) <= 1
    )

    def gpu_cost(m, g):
        return sum(
            MS_PER_S
            * (problem.uvm_time(j) * m.x[j, g] - (problem.uvm_time(j) - problem.hbm_time(j)) * m.y[j, g])
            for j in by_gpu.get(g, [])
        )

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
    start: Plan | None = None,
    lower_bound: float | None = None,
) -> MilpResult:
    """The MILP's plan, or the start's when the MILP could not better it in time: it is skipped
    when the start is within ``mip_gap`` of ``lower_bound`` (seconds, valid for this problem) or
    when building it would take over half of its time."""
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
    pairs = len(allowed_pairs(problem, options))
    start_cost = cost_plan(problem, start).max_cost if start is not None else None  # seconds
    if (
        start is not None
        and start_cost is not None
        and lower_bound
        and start_cost <= lower_bound * (1 + options.mip_gap)
    ):
        log.info("MILP skipped: the start is within the MIP gap (%g) of the lower bound", options.mip_gap)
        return MilpResult(
            dataclasses.replace(start, name=f"milp_{options.solver}"), MilpStatus.SKIPPED, None, None, 0.0
        )
    if start is not None and pairs / BUILD_PAIRS_PER_SECOND > options.time_limit_s / 2:
        log.info(
            "MILP skipped: building it (%d table x GPU pairs, ~%.0fs) would take over half of its %.0fs; "
            "the search gets the time",
            pairs,
            pairs / BUILD_PAIRS_PER_SECOND,
            options.time_limit_s,
        )
        return MilpResult(
            dataclasses.replace(start, name=f"milp_{options.solver}"), MilpStatus.SKIPPED, None, None, 0.0
        )
    t0 = time.time()
    m = build_model(problem, options)
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
        raise RecShardError(
            Reason.INFEASIBLE_HBM,
            f"{options.solver} proved the sharding problem infeasible",
            fixes=("raise host_gib or hbm_per_gpu_gib",),
        )
    has_solution = len(results.solution) > 0 if hasattr(results, "solution") else False
    if (
        tc
        not in (
            TerminationCondition.optimal,
            TerminationCondition.maxTimeLimit,
            TerminationCondition.feasible,
            TerminationCondition.intermediateNonInteger,
        )
        or not has_solution
    ):
        return _without_incumbent(options, start, seconds, build_seconds, str(tc), _bound(results))
    m.solutions.load_from(results)
    gpu, rows = [0] * len(problem.tables), [0] * len(problem.tables)
    for j, g in m.A:
        if pyo.value(m.x[j, g]) > 0.5:
            gpu[j] = g
            rows[j] = math.floor(pyo.value(m.f[j, g]) * problem.tables[j].hash_size + 1e-6)
    status = MilpStatus.OPTIMAL if tc == TerminationCondition.optimal else MilpStatus.TIME_LIMIT
    log.info("%s: %s after %.1fs, objective %.4f ms", options.solver, status, seconds, pyo.value(m.z))
    return MilpResult(
        Plan(f"milp_{options.solver}", tuple(gpu), tuple(rows)),
        status,
        float(pyo.value(m.z)),
        _bound(results),
        seconds,
        build_seconds,
    )


def _without_incumbent(
    options: SolveOptions,
    start: Plan | None,
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
    return MilpResult(
        dataclasses.replace(start, name=f"milp_{options.solver}"),
        MilpStatus.NO_INCUMBENT,
        None,
        bound,
        seconds,
        build_seconds,
    )


def _bound(results) -> float | None:
    """The solver's proven lower bound on the objective (ms), where it reports a finite one."""
    try:
        bound = float(results.problem.lower_bound)
    except (AttributeError, TypeError, ValueError):
        return None
    return bound if math.isfinite(bound) else None
