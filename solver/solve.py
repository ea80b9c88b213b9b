"""The solve stage end to end: baselines, starts (balanced, LPT, the baselines), local search,
MILP, local search again, exact split, lower bound, and TorchRec's planner beside them when
torchrec is installed."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import time
from typing import TYPE_CHECKING

from recshard_stats.options import SolveOptions
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.heuristic import balanced_plan
from recshard_stats.solver.local_search import GpuCostModel, improve, lpt_plan
from recshard_stats.solver.milp import MilpResult, solve_milp
from recshard_stats.solver.plan import Plan, PlanCost, cost_plan, violations
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.waterfill import lower_bound, split_assignment

if TYPE_CHECKING:
    from recshard_stats.torchrec import TorchRecBaseline, TorchRecRating

log = logging.getLogger(__name__)
MILP_BOUND_TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class Outcome:
    best: PlanCost              # the plan to ship
    source: str                 # "milp", "local_search" or "warm_start" (what gave the cheapest plan)
    milp: MilpResult
    baselines: tuple[PlanCost, ...]
    lower_bound: float          # seconds per batch: the best of waterfill.lower_bound and the MILP's bound
    torchrec: tuple[TorchRecBaseline, ...] = ()   # TorchRec's planner's plans
    torchrec_rating: TorchRecRating | None = None  # the best plan in TorchRec's perf and storage models
    baseline_ratings: tuple[TorchRecRating, ...] = ()  # each baseline's, in order

    @property
    def gap(self) -> float:
        return self.best.max_cost / self.lower_bound - 1 if self.lower_bound > 0 else 0.0


def polish(problem: Problem, plan: Plan, name: str | None = None) -> Plan:
    """Keep the assignment, replace the split by the exact water-filling."""
    return Plan(name or plan.name, plan.gpu, split_assignment(problem, plan.gpu))


def solve_problem(problem: Problem, options: SolveOptions = SolveOptions()) -> Outcome:
    """The plan within ``options.time_limit_s`` of wall time (TorchRec's planner apart): the MILP
    gets what the starts and the first search leave, less the polishing search's share."""
    began = time.time()
    problem.check_capacity()
    baselines = tuple(cost_plan(problem, p) for p in all_baselines(problem))
    # the balanced plan comes split already; the baselines' assignments get the exact split
    model = GpuCostModel(problem)  # the exact per-GPU cost, for the LPT start and the searches
    starts = [cost_plan(problem, p) for p in (balanced_plan(problem), lpt_plan(problem, model),
                                              *(polish(problem, b.plan) for b in baselines))]
    # an assignment whose trainer buffers overflow a GPU is no start
    start = min((s for s in starts if not violations(problem, s.plan)), key=lambda e: e.max_cost, default=None)
    start_source = "warm_start"
    # half before the MILP (its start), half after (its polish); at most a third of the time limit
    search_s = min(options.local_search_s, options.time_limit_s / 3) / 2
    if start is not None and search_s > 0:
        searched = cost_plan(problem, improve(problem, start.plan, search_s, model=model))
        if searched.max_cost < start.max_cost:
            start, start_source = searched, "local_search"
    left = options.time_limit_s - (time.time() - began) - search_s
    milp = solve_milp(problem, dataclasses.replace(options, time_limit_s=max(1.0, left)), start.plan if start else None)
    candidates = []
    if milp.status != "no_incumbent":  # else its plan is the start's
        polished = cost_plan(problem, polish(problem, milp.plan, "recshard"))
        candidates.append((polished, "milp"))
        if search_s > 0:
            searched = improve(problem, polished.plan, search_s, "recshard", model)
            candidates.append((cost_plan(problem, searched), "local_search"))
    if start is not None:
        candidates.append((start, start_source))
    # the first of the cheapest: the MILP's plan unless a search or the start beat it
    best, source = min(candidates, key=lambda c: c[0].max_cost)
    broken = violations(problem, best.plan)
    assert not broken, broken  # the split never exceeds a capacity by construction
    # the MILP's proven bound is one too (its cuts lie above the access CDFs), up to the solvers'
    # tolerances (CBC's has been 2.3e-6 above the plan it proved optimal): discounted by 1e-5, and
    # never above the plan shipped
    milp_bound = (milp.bound_ms or 0.0) / 1e3 * (1 - MILP_BOUND_TOLERANCE)
    bound = min(max(lower_bound(problem), milp_bound), best.max_cost)
    log.info("plan: %.4f ms/batch (%s), lower bound %.4f ms, gap %.2f%%, best baseline %.4f ms",
             best.max_cost * 1e3, source, bound * 1e3, (best.max_cost / bound - 1) * 100 if bound else 0,
             min(b.max_cost for b in baselines) * 1e3)
    return Outcome(best, source, milp, baselines, bound,
                   *_torchrec(problem, options, best.plan, [b.plan for b in baselines]))


def _torchrec(problem: Problem, options: SolveOptions, plan: Plan, greedy: list[Plan]):
    """TorchRec's planner on the same problem, and the plan and the baselines in TorchRec's
    models; nothing when torchrec is not installed, not wanted, or does not load."""
    if not options.torchrec_baselines or importlib.util.find_spec("torchrec") is None:
        return (), None, ()
    try:
        from recshard_stats import torchrec as adapter
    except Exception as exc:  # e.g. an FBGEMM built for another torch: the plan does not need it
        log.warning("TorchRec's planner left out: torchrec does not load (%s)", exc)
        return (), None, ()
    log.info("TorchRec's planner on the same tables (up to %ds per variant)", options.torchrec_timeout_s)
    baselines = tuple(adapter.torchrec_baselines(problem, options.torchrec_timeout_s))
    for b in baselines:
        log.info("%s: %s", b.name, b.error or f"{b.cost.max_cost * 1e3:.4f} ms/batch in our model, "
                 f"planned in {b.planning_seconds:.1f}s")
    return (baselines, adapter.rate_in_torchrec(problem, plan.gpu, plan.rows_hbm),
            tuple(adapter.rate_in_torchrec(problem, g.gpu, g.rows_hbm) for g in greedy))
