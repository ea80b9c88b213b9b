"""The solve stage end to end: baselines; for each cut of the ladder (hot tables cut into column
shards, then cut less, down to every table whole) its starts (balanced, LPT, packed, the
baselines) and a local search; where the best is not within the MIP gap of the bound, shard
counts changed a table at a time and the MILP of aligned blocks; the MILP, which chooses each
table's shard count; local search again; exact split; lower bound; and TorchRec's planner beside
them when torchrec is installed."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import time
from typing import TYPE_CHECKING

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import Manifest, MilpStatus, PlanSource
from recshard_stats.options import SolveOptions
from recshard_stats.solver.aligned_blocks import (
    BESIDE_MOST_BLOCKS,
    AlignedBeside,
    aligned_plan,
    block_choices,
    spare_cpus,
)
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.churn import moved_bytes, previous_ranks
from recshard_stats.solver.column_split import (
    TableShards,
    cut_ladder,
    cuts_of,
    shard_counts,
    split_problem,
    table_shards,
)
from recshard_stats.solver.heuristic import balanced_plan, packed_plan
from recshard_stats.solver.kernel_groups import call_lpt_plan, has_call_costs, refine
from recshard_stats.solver.local_search import GpuCostModel, improve, lpt_plan
from recshard_stats.solver.milp import BUILD_PAIRS_PER_SECOND, CutPlan, MilpResult, milp_pairs, solve_milp
from recshard_stats.solver.plan import Plan, PlanCost, cost_plan, violations
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.recut import recut
from recshard_stats.solver.waterfill import lower_bound, split_assignment
from recshard_stats.units import GIB, MS_PER_S

if TYPE_CHECKING:
    from recshard_stats.torchrec_planner import TorchRecBaseline, TorchRecRating

log = logging.getLogger(__name__)
MILP_BOUND_TOLERANCE = 1e-5
# up to this many tables and GPUs the MILP (every shard count of every table a choice) runs
# with no MIP gap: the plan is proven optimal, the gap reported is the solvers' tolerance
SMALL_TABLES, SMALL_GPUS = 12, 8
# the share of the time limit kept for what follows the last timed step (the exact split and
# costing of the plan, the log): the solve ends within its time limit
FINISH_SHARE = 0.05
# lines over each shard's saving in the MILP of aligned blocks: a smaller model explores more in
# its time (the synthetic model at 10^6 samples, 30 s from the all-cut plan: 0.1594 ms with 6,
# 0.1606-0.1616 ms with 16; BENCHMARKS.md)
ALIGNED_SEGMENTS = 6
# on one CPU, the share of the MILP's time left after recut that goes to the MILP of aligned blocks
# (run last): the MILP with every count keeps the rest (it proves plans on the instances where it
# finds them)
ALIGNED_SHARE = 0.75
# the share of the time limit kept for the polish with the kernel calls counted, where the model
# has them: with the H200 calibration a call's longest bag sets much of a GPU's time, which only
# that polish sees (the built-in example: 0.2339 ms with the 4.7 s it had left, 0.2076 ms with this;
# BENCHMARKS.md)
CALL_COST_SHARE = 0.45
# of that time, the share every start of the polish has before the best of them gets the rest
CALL_RACE_SHARE = 0.4


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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan over ``placed`` (the model's tables cut some way), its cost and what gave it."""

    cost: PlanCost
    placed: Problem
    source: PlanSource

    @property
    def cut_plan(self) -> CutPlan:
        return CutPlan(cuts_of(self.placed), self.cost.plan)


class _Clock:
    def __init__(self, seconds: float):
        self.end = time.time() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.time())


def polish(problem: Problem, plan: Plan, name: str | None = None) -> Plan:
    """Keep the assignment, replace the split by the exact water-filling."""
    return Plan(name or plan.name, plan.gpu, split_assignment(problem, plan.gpu))


def _valid(placed: Problem, plan: Plan, source: PlanSource) -> Candidate | None:
    """The plan costed, or None when it breaks a capacity (or puts two shards of a table together)."""
    cost = cost_plan(placed, plan)
    return None if violations(placed, plan, cost) else Candidate(cost, placed, source)


def _cheapest(*candidates: Candidate | None) -> Candidate | None:
    """The first of the cheapest (None when there is none)."""
    return min((c for c in candidates if c is not None), key=lambda c: c.cost.max_cost, default=None)


def search_cut(
    problem: Problem,
    cuts: tuple[int, ...],
    baselines: tuple[PlanCost, ...],
    budget_s: float,
    models: dict[tuple[int, ...], GpuCostModel],
    first: bool,
) -> Candidate | None:
    """The model's tables cut as ``cuts`` says: the best of its starts that fits, searched for
    ``budget_s`` (None: no start fits)."""
    placed = split_problem(problem, cuts)
    model = models.get(cuts) or models.setdefault(cuts, GpuCostModel(placed))
    # the balanced start for the most cut (the costliest to build at scale), LPT for every cut and
    # the cheapest baseline's assignment for whole tables; when none fits, the start that packs
    # the trainer buffers first
    plans = [lpt_plan(placed, model)] + ([balanced_plan(placed, time.time() + budget_s)] if first else [])
    if placed is problem and baselines:  # the baseline's assignment (of whole tables) gets the exact split
        plans.append(polish(problem, min(baselines, key=lambda b: b.max_cost).plan))
    start = _cheapest(*(_valid(placed, p, PlanSource.START) for p in plans))
    start = start or _valid(placed, packed_plan(placed), PlanSource.START)
    if start is None or budget_s <= 0:
        return start
    searched = _valid(
        placed, improve(placed, start.cost.plan, budget_s, model=model), PlanSource.LOCAL_SEARCH
    )
    return _cheapest(start, searched)


def _moves(problem: Problem, candidate: Candidate, before) -> dict[int, int]:
    """Model table -> bytes it moves against the previous plan (tables that move only)."""
    shards = table_shards(candidate.placed, candidate.cost.plan)
    moves = {j: moved_bytes(problem.tables[j], s.gpus, before[j]) for j, s in enumerate(shards)}
    return {j: b for j, b in moves.items() if b}


def _revert(problem: Problem, candidate: Candidate, before, tables: set[int]) -> Candidate | None:
    """The candidate with ``tables`` back on their previous GPUs (cut as before), rows split
    again exactly; None when that breaks a capacity."""
    shards = table_shards(candidate.placed, candidate.cost.plan)
    ranks = [before[j] if j in tables else s.gpus for j, s in enumerate(shards)]
    placed = split_problem(problem, tuple(len(r) for r in ranks))
    gpu = tuple(g for r in ranks for g in r)  # split_problem keeps the entries in table order
    plan = Plan(candidate.cost.plan.name, gpu, (0,) * len(gpu))
    return _valid(placed, polish(placed, plan), PlanSource.RESTRAINED)


def restrain(problem: Problem, best: Candidate, before, cap_bytes: float, deadline: float) -> Candidate:
    """The best plan with moves taken back until at most ``cap_bytes`` change GPU: each step
    takes back the move that costs least per byte it saves (of the 32 largest), then every
    move at once if that is not enough. The bound stays the unrestrained one, so the gap
    reported includes what the cap costs."""
    moves = _moves(problem, best, before)
    current = best
    while sum(moves.values()) > cap_bytes and time.time() < deadline:
        steps = []
        for j in sorted(moves, key=lambda j: -moves[j])[:32]:
            trial = _revert(problem, current, before, {j})
            if trial is not None:
                steps.append(((trial.cost.max_cost - current.cost.max_cost) / moves[j], j, trial))
        if not steps:
            break
        _, j, current = min(steps, key=lambda s: s[:2])
        moves = _moves(problem, current, before)
    if sum(moves.values()) > cap_bytes:
        stay = _revert(problem, current, before, set(moves))
        if stay is None:
            raise RecShardError(
                Reason.INFEASIBLE_HBM,
                f"no plan moves at most {cap_bytes / GIB:.3f} GiB of tables: the tables that move "
                f"({sum(moves.values()) / GIB:.3f} GiB) do not fit back on their previous GPUs with this data",
                fixes=("raise --max-moved-gib", "solve without --max-moved-gib (every table may move)"),
            )
        current = stay
    if current is not best:
        log.info(
            "restrained to %.3f GiB of moves (cap %.3f GiB): %.4f ms/batch against %.4f ms unrestrained",
            sum(_moves(problem, current, before).values()) / GIB,
            cap_bytes / GIB,
            current.cost.max_cost * MS_PER_S,
            best.cost.max_cost * MS_PER_S,
        )
    return current


def solve_problem(
    problem: Problem, options: SolveOptions = SolveOptions(), previous: Manifest | None = None
) -> Outcome:
    """The plan within ``options.time_limit_s`` of wall time (TorchRec's planner apart). Half the
    search time goes to the cuts of the ladder, the MILP gets what they leave less the other half,
    which polishes the best plan after it; a MILP skipped (start within the MIP gap of the bound,
    or too big to build in time) leaves its time to the polishing search. Where the model has
    kernel-call costs, :data:`CALL_COST_SHARE` of the time is kept for the polish that counts them."""
    finish = _Clock(options.time_limit_s * (1 - FINISH_SHARE))
    # with kernel-call costs the exact polish (the only stage that sees them) gets its share first
    call_share = CALL_COST_SHARE if has_call_costs(problem) else 0.0
    clock = _Clock(options.time_limit_s * (1 - FINISH_SHARE - call_share))
    problem.check_capacity()
    baselines = tuple(cost_plan(problem, p) for p in all_baselines(problem))
    bound = lower_bound(problem, options.max_column_shards)
    small = len(problem.tables) <= SMALL_TABLES and problem.num_gpus <= SMALL_GPUS
    mip_gap = 0.0 if small else options.mip_gap
    search_s = min(options.local_search_s, options.time_limit_s / 3) / 2
    # the MILP of aligned blocks (not where the model has kernel calls: it leaves them out, which
    # set much of such a cost), started now in a process of its own where a second CPU is there,
    # and dropped if the ladder's best plan is within the MIP gap
    aligned = not small and options.max_column_shards > 1 and not has_call_costs(problem)
    beside = None
    if aligned and spare_cpus() and block_choices(problem, options.max_column_shards) <= BESIDE_MOST_BLOCKS:
        beside = AlignedBeside(problem, options.max_column_shards, ALIGNED_SEGMENTS, clock.end)
    models: dict[tuple[int, ...], GpuCostModel] = {}
    ladder = cut_ladder(problem, options.max_column_shards)
    ladder_end = time.time() + search_s  # the ladder shares the first half of the search
    tried: list[Candidate | None] = []
    for i, cuts in enumerate(ladder):
        left = max(0.0, min(ladder_end - time.time(), clock.left()))
        if 0 < i < len(ladder) - 1 and left <= 0:
            tried.append(None)  # out of time: the most cut and the whole tables are tried regardless
            continue
        tried.append(search_cut(problem, cuts, baselines, left / (len(ladder) - i), models, first=i == 0))
    start = _cheapest(*tried)
    for cuts, c in zip(ladder, tried, strict=True):
        if c is None:
            log.info("cut %s: no plan found (no start fits the trainer buffers, or no time)", cuts)
    if start is not None:
        log.info(
            "start: %.4f ms/batch (%s), %s",
            start.cost.max_cost * MS_PER_S,
            start.source,
            _describe(problem, start.placed),
        )

    aligned_s = 0.0  # kept for the MILP of aligned blocks where it runs last, in this process
    if (
        start is not None
        and not small
        and options.max_column_shards > 1
        and start.cost.max_cost > bound * (1 + mip_gap)
    ):
        # not yet within the MIP gap: half the MILP's time goes to other shard counts, a table at a
        # time, and the MILP of aligned blocks runs beside, or with most of the rest, last, when the
        # polish may have left time too (the MILP with every count of every table has found no plan
        # of its own on the shipped models in 38-44 s; BENCHMARKS.md)
        end = time.time() + max(0.0, clock.left() - search_s) / 2
        placed, plan = recut(problem, start.placed, start.cost.plan, end, options.max_column_shards)
        start = _cheapest(start, _valid(placed, plan, PlanSource.LOCAL_SEARCH)) or start
        if aligned and beside is None:
            aligned_s = max(0.0, clock.left() - search_s) * ALIGNED_SHARE
    elif beside is not None:
        beside.cancel()
        beside = None

    # the MILP chooses among every shard count of every table when it can be built in a quarter
    # of the time (its bound then holds for every plan), else among the ladder's
    full = shard_counts(problem, options.max_column_shards)
    counts = full
    if milp_pairs(problem, options, full) / BUILD_PAIRS_PER_SECOND > (clock.left() - aligned_s) / 4:
        counts = shard_counts(problem, options.max_column_shards, ladder[0])
    left = clock.left() - search_s - aligned_s
    milp = solve_milp(
        problem,
        dataclasses.replace(options, time_limit_s=max(0.05, left), mip_gap=mip_gap),
        start.cut_plan if start else None,
        bound,
        counts,
    )
    if milp.status == MilpStatus.SKIPPED and search_s > 0:  # the MILP's time goes to the search
        search_s = max(search_s, clock.left() - aligned_s)
    from_milp = None
    if milp.status not in (MilpStatus.NO_INCUMBENT, MilpStatus.SKIPPED):  # else its plan is the start's
        # its own rows (whole where tables are small) or the exact split of its assignment
        placed = split_problem(problem, milp.shards)
        from_milp = _cheapest(
            _valid(placed, polish(placed, milp.plan, "recshard"), PlanSource.MILP),
            _valid(placed, milp.plan, PlanSource.MILP),
        )
    best = _cheapest(from_milp, start)
    assert best is not None, "the MILP ran without a start: it found a plan or raised"
    if search_s > 0 and clock.left() - aligned_s > 0:
        model = models.get(cuts_of(best.placed)) or GpuCostModel(best.placed)
        searched = _valid(
            best.placed,
            improve(best.placed, best.cost.plan, min(search_s, clock.left() - aligned_s), "recshard", model),
            PlanSource.LOCAL_SEARCH,
        )
        best = _cheapest(best, searched) or best
    found = None
    if aligned_s > 0 and clock.left() > 0:  # all the time left: the search may have ended early
        found = aligned_plan(problem, options.max_column_shards, ALIGNED_SEGMENTS, clock.end)
    elif beside is not None:
        found = beside.result(clock.end)
    if found is not None:
        best = _cheapest(best, _valid(*found, PlanSource.ALIGNED_BLOCKS)) or best
    if has_call_costs(problem):
        best = _with_call_costs(problem, best, [c for c in tried if c is not None], baselines, finish)
    if previous is not None and options.max_moved_gib is not None:
        best = restrain(
            problem,
            best,
            previous_ranks(problem, previous),
            options.max_moved_gib * GIB,
            time.time() + max(finish.left(), 1.0),
        )
    best = dataclasses.replace(
        best, cost=dataclasses.replace(best.cost, plan=dataclasses.replace(best.cost.plan, name="recshard"))
    )
    if counts == full and milp.status in (MilpStatus.OPTIMAL, MilpStatus.TIME_LIMIT) and milp.bound_ms:
        # the MILP's proven bound holds for every plan when every shard count was a choice (its cuts
        # lie above the access CDFs), up to the solvers' tolerances (CBC's has been 2.3e-6 above the
        # plan it proved optimal)
        bound = max(bound, milp.bound_ms / MS_PER_S * (1 - MILP_BOUND_TOLERANCE))
    bound = min(bound, best.cost.max_cost)  # never above the plan shipped
    log.info(
        "plan: %.4f ms/batch (%s), lower bound %.4f ms, gap %.2f%%, best baseline %.4f ms; %s",
        best.cost.max_cost * MS_PER_S,
        best.source,
        bound * MS_PER_S,
        (best.cost.max_cost / bound - 1) * 100 if bound else 0,
        min(b.max_cost for b in baselines) * MS_PER_S,
        _describe(problem, best.placed),
    )
    return Outcome(
        best.cost,
        best.source,
        milp,
        baselines,
        bound,
        None if best.placed is problem else best.placed,
        *_torchrec(problem, options, table_shards(best.placed, best.cost.plan), [b.plan for b in baselines]),
    )


def _describe(problem: Problem, placed: Problem) -> str:
    cut = [f"{problem.tables[j].name} x{k}" for j, k in enumerate(cuts_of(placed)) if k > 1]
    return "column shards: " + ", ".join(cut) if cut else "every table whole"


def _with_call_costs(
    problem: Problem,
    best: Candidate,
    cuts: list[Candidate],
    baselines: tuple[PlanCost, ...],
    clock: _Clock,
) -> Candidate:
    """The kernel calls' costs, which everything before leaves out: the plan, the whole tables
    placed with them counted (:func:`call_lpt_plan`), the best plan of every other cut of the
    ladder (more shards mean more calls: the cut cheapest without them need not be with them) and
    the best whole-table baseline rearranged with them counted: each for a short while, then the
    best of them for the rest of the time; the baselines as they are beside them."""
    ranked = sorted(baselines, key=lambda b: b.max_cost)
    others = [c for c in cuts if cuts_of(c.placed) != cuts_of(best.placed)]
    # at most half the race: on thousands of tables the start alone would outlast the time limit
    gathered = call_lpt_plan(problem, time.time() + clock.left() * CALL_RACE_SHARE / 2)
    tries: list[tuple[Problem, Plan]] = []
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for placed, plan in (
        [(best.placed, best.cost.plan)]
        + ([(problem, gathered)] if gathered is not None else [])
        + [(c.placed, c.cost.plan) for c in others]
        + [(problem, b.plan) for b in ranked[:1]]
    ):
        if (cuts_of(placed), plan.gpu) not in seen:  # the plan chosen may be the baseline's
            seen.add((cuts_of(placed), plan.gpu))
            tries.append((placed, plan))
    # each try descends and is kicked for a short while (the plan a try starts from says little
    # of where it ends), then the best of them gets the rest of the time
    race = clock.left() * CALL_RACE_SHARE
    polished: list[Candidate] = []
    for placed, plan in tries:
        budget = min(race / len(tries), clock.left())
        if budget <= 0:
            break
        refined = _valid(placed, refine(placed, plan, budget, "recshard"), PlanSource.KERNEL_GROUPS)
        log.info(
            "calls counted: %s (%s) %.4f ms/batch after %.1fs",
            plan.name,
            _describe(problem, placed),
            refined.cost.max_cost * MS_PER_S if refined else float("nan"),
            budget,
        )
        if refined:
            polished.append(refined)
    leader = _cheapest(*polished)
    if leader is not None and clock.left() > 0:
        leader = _cheapest(
            leader,
            _valid(
                leader.placed,
                refine(leader.placed, leader.cost.plan, clock.left(), "recshard", seed=1),  # new kicks
                PlanSource.KERNEL_GROUPS,
            ),
        )
    if leader is not None and leader.cost.max_cost < best.cost.max_cost * (1 - 1e-9):
        best = leader
    for b in ranked:
        if b.max_cost < best.cost.max_cost * (1 - 1e-9) and not violations(problem, b.plan, b):
            best = Candidate(b, problem, PlanSource.BASELINE)
    return best


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
