"""The solve stage end to end: baselines, column shards of hot tables, starts (balanced, LPT,
the baselines), local search, MILP, local search again, exact split, lower bound, and TorchRec's
planner beside them when torchrec is installed."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import time
from typing import TYPE_CHECKING

from recshard_stats.errors import RecShardError
from recshard_stats.manifest import MilpStatus, PlanSource
from recshard_stats.options import SolveOptions
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.column_split import TableShards, choose_shards, split_problem, table_shards
from recshard_stats.solver.heuristic import balanced_plan
from recshard_stats.solver.kernel_groups import has_call_costs, refine
from recshard_stats.solver.local_search import GpuCostModel, improve, lpt_plan
from recshard_stats.solver.milp import MilpResult, solve_milp
from recshard_stats.solver.plan import Plan, PlanCost, cost_plan, violations
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import lower_bound, split_assignment
from recshard_stats.units import MS_PER_S

if TYPE_CHECKING:
    from recshard_stats.torchrec_planner import TorchRecBaseline, TorchRecRating

log = logging.getLogger(__name__)
MILP_BOUND_TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class Outcome:
    best: PlanCost  # the plan to ship, over ``placed``'s entries
    source: PlanSource  # what gave the cheapest plan
    milp: MilpResult
    baselines: tuple[PlanCost, ...]  # over the model's tables, whole
    lower_bound: float  # seconds per batch: valid for every plan with at most max_column_shards shards
    placed: Problem | None = None  # the tables the plan places, hot ones cut into column shards (None: the
    #                                   problem's own tables)
    torchrec: tuple[TorchRecBaseline, ...] = ()  # TorchRec's planner's plans
    torchrec_rating: TorchRecRating | None = None  # the best plan in TorchRec's perf and storage models
    baseline_ratings: tuple[TorchRecRating, ...] = ()  # each baseline's, in order

    @property
    def gap(self) -> float:
        return self.best.max_cost / self.lower_bound - 1 if self.lower_bound > 0 else 0.0


def polish(problem: Problem, plan: Plan, name: str | None = None) -> Plan:
    """Keep the assignment, replace the split by the exact water-filling."""
    return Plan(name or plan.name, plan.gpu, split_assignment(problem, plan.gpu))


def place_shards(problem: Problem, max_column_shards: int) -> Problem:
    """The problem with its hot tables cut into column shards (:mod:`solver.column_split`), or
    as it is when the shards' extra id buffers would not fit."""
    placed = split_problem(problem, choose_shards(problem, max_column_shards))
    if placed is not problem:
        try:
            placed.check_capacity()
        except RecShardError as exc:
            log.warning(
                "tables left whole: their column shards' trainer buffers do not fit (%s)", exc.message
            )
            return problem
        log.info(
            "column shards: %s",
            ", ".join(f"{problem.tables[placed.parent[g[0]]].name} x{len(g)}" for g in placed.shard_groups),
        )
    return placed


def solve_problem(problem: Problem, options: SolveOptions = SolveOptions()) -> Outcome:
    """The plan within ``options.time_limit_s`` of wall time (TorchRec's planner apart): the MILP
    gets what the starts and the first search leave, less the polishing search's share; a MILP
    skipped (start within the MIP gap of the bound, or too big to build in time) leaves its time
    to the polishing search."""
    began = time.time()
    problem.check_capacity()
    baselines = tuple(cost_plan(problem, p) for p in all_baselines(problem))
    bound = lower_bound(problem, options.max_column_shards)
    placed = place_shards(problem, options.max_column_shards)
    model = GpuCostModel(placed)  # the per-GPU cost, for the LPT start and the searches
    # the balanced plan comes split already; the baselines' assignments (of whole tables) get the exact split
    starts = [
        cost_plan(placed, p)
        for p in (
            balanced_plan(placed),
            lpt_plan(placed, model),
            *(polish(placed, b.plan) for b in baselines if placed is problem),
        )
    ]
    # an assignment whose trainer buffers overflow a GPU is no start
    start = min((s for s in starts if not violations(placed, s.plan)), key=lambda e: e.max_cost, default=None)
    start_source = PlanSource.START
    # half before the MILP (its start), half after (polishing the best so far); at most a third of the time limit
    search_s = min(options.local_search_s, options.time_limit_s / 3) / 2
    overrun = 0.0  # how long the search's exact split and costing take past its budget
    if start is not None and search_s > 0:
        t0 = time.time()
        searched = cost_plan(placed, improve(placed, start.plan, search_s, model=model))
        overrun = max(0.0, time.time() - t0 - search_s)
        if searched.max_cost < start.max_cost:
            start, start_source = searched, PlanSource.LOCAL_SEARCH
    left = options.time_limit_s - (time.time() - began) - search_s - overrun
    milp = solve_milp(
        placed,
        dataclasses.replace(options, time_limit_s=max(1.0, left)),
        start.plan if start else None,
        bound,
    )
    if (
        milp.status == MilpStatus.SKIPPED and search_s > 0
    ):  # the MILP's time goes to the search (less its split's
        search_s = max(
            search_s, options.time_limit_s - (time.time() - began) - 2 * overrun
        )  # and the check's)
    candidates: list[tuple[PlanCost, PlanSource]] = []
    if milp.status not in (MilpStatus.NO_INCUMBENT, MilpStatus.SKIPPED):  # else its plan is the start's
        candidates.append((cost_plan(placed, polish(placed, milp.plan, "recshard")), PlanSource.MILP))
    if start is not None:
        candidates.append((start, start_source))
    # the first of the cheapest: the MILP's plan unless the start beat it; then searched further
    best, source = min(candidates, key=lambda c: c[0].max_cost)
    if search_s > 0:
        searched = cost_plan(placed, improve(placed, best.plan, search_s, "recshard", model))
        if searched.max_cost < best.max_cost:
            best, source = searched, PlanSource.LOCAL_SEARCH
    if has_call_costs(placed):
        # the kernel calls' costs, which everything above leaves out: the plan and the best
        # whole-table baseline rearranged with them counted, the baselines as they are beside them
        whole = list(baselines) if placed is problem else []  # costed over ``problem``, which ``placed`` is
        plans = [best.plan] + [b.plan for b in sorted(whole, key=lambda b: b.max_cost)[:1]]
        budget = max(0.5, min(max(search_s, 2.0), options.time_limit_s - (time.time() - began)))
        for start_plan in plans:
            refined = cost_plan(placed, refine(placed, start_plan, budget / len(plans), "recshard"))
            if refined.max_cost < best.max_cost * (1 - 1e-9) and not violations(placed, refined.plan):
                best, source = refined, PlanSource.KERNEL_GROUPS
        for b in whole:
            if b.max_cost < best.max_cost * (1 - 1e-9):
                best, source = (
                    dataclasses.replace(b, plan=dataclasses.replace(b.plan, name="recshard")),
                    PlanSource.BASELINE,
                )
    broken = violations(placed, best.plan)
    assert not broken, broken  # the split never exceeds a capacity by construction
    if all(t.most_column_shards(problem.num_gpus, options.max_column_shards) == 1 for t in problem.tables):
        # the MILP's proven bound is one too when no table may be cut (its cuts lie above the access
        # CDFs), up to the solvers' tolerances (CBC's has been 2.3e-6 above the plan it proved optimal)
        bound = max(bound, (milp.bound_ms or 0.0) / MS_PER_S * (1 - MILP_BOUND_TOLERANCE))
    bound = min(bound, best.max_cost)  # never above the plan shipped
    log.info(
        "plan: %.4f ms/batch (%s), lower bound %.4f ms, gap %.2f%%, best baseline %.4f ms",
        best.max_cost * MS_PER_S,
        source,
        bound * MS_PER_S,
        (best.max_cost / bound - 1) * 100 if bound else 0,
        min(b.max_cost for b in baselines) * MS_PER_S,
    )
    return Outcome(
        best,
        source,
        milp,
        baselines,
        bound,
        None if placed is problem else placed,
        *_torchrec(problem, options, table_shards(placed, best.plan), [b.plan for b in baselines]),
    )


def _torchrec(problem: Problem, options: SolveOptions, shards: list[TableShards], greedy: list[Plan]):
    """TorchRec's planner on the same problem, and the plan (``shards`` per table) and the
    baselines in TorchRec's models; nothing when torchrec is not installed, not wanted, or does
    not load."""
    if not options.torchrec_baselines or importlib.util.find_spec("torchrec") is None:
        return (), None, ()
    try:
        from recshard_stats import torchrec_planner as adapter
    except Exception as exc:  # e.g. an FBGEMM built for another torch: the plan does not need it
        log.warning("TorchRec's planner left out: torchrec does not load (%s)", exc)
        return (), None, ()
    log.info("TorchRec's planner on the same tables (up to %ds per variant)", options.torchrec_timeout_s)
    baselines = tuple(adapter.torchrec_baselines(problem, options.torchrec_timeout_s))
    for b in baselines:
        log.info(
            "%s: %s",
            b.name,
            b.error
            or f"{b.cost.max_cost * MS_PER_S if b.cost else 0:.4f} ms/batch in our model, planned in "
            f"{b.planning_seconds:.1f}s",
        )
    rating = adapter.rate_in_torchrec(
        problem, tuple(s.gpus for s in shards), tuple(s.rows_hbm for s in shards)
    )
    return (baselines, rating, tuple(adapter.rate_in_torchrec(problem, b.gpu, b.rows_hbm) for b in greedy))
