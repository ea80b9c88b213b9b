"""The MILP, the exact split, the lower bound and the baselines, on instances built in numpy."""

import dataclasses
import logging
import math
import os
import time
from typing import ClassVar

import numpy as np
import pytest

from recshard_stats.config import HardwareConfig
from recshard_stats.distributions import CountOfCounts, HitEstimate
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import MilpStatus, PlanSource
from recshard_stats.options import SolveOptions
from recshard_stats.solver import milp
from recshard_stats.solver.aligned_blocks import spare_cpus
from recshard_stats.solver.baselines import all_baselines, greedy
from recshard_stats.solver.column_split import choose_shards, cut_ladder
from recshard_stats.solver.heuristic import balanced_plan
from recshard_stats.solver.plan import Plan, cost_plan, violations
from recshard_stats.solver.problem import Problem, TableDemand
from recshard_stats.solver.solve import polish, search_cut, solve_problem
from recshard_stats.solver.waterfill import lower_bound, split, split_assignment

SOLVERS = [s for s in milp.SOLVERS if milp.available(s)]


def hardware(**kw) -> HardwareConfig:
    """Hand-sized hardware; the trainer's buffers are left out unless a test sets their sizes."""
    base = {
        "num_gpus": 2,
        "hbm_bytes_per_gpu": 2,
        "hbm_reserved_fraction": 0.0,
        "host_bytes": 100,
        "hbm_bandwidth": 1000.0,
        "uvm_bandwidth": 1.0,
        "batch_size": 1,
        "bytes_per_element": 1,
        "index_bytes": 0,
        "output_bytes_per_element": 0,
    }
    return HardwareConfig(**{**base, **kw})


def table(name, counts, rows, hash_size, dim=1, accesses=None, estimate=HitEstimate.IN_SAMPLE) -> TableDemand:
    """A hand-made table; its rows are worth their counts (in-sample) unless ``estimate`` says
    otherwise, so the hand optima below stay hand-computable (the estimate is tested apart)."""
    coc = CountOfCounts.of(counts, rows)
    return TableDemand(
        name=name,
        features=(name,),
        hash_size=hash_size,
        dim=dim,
        hash="mod",
        row_bytes=float(dim),
        accesses_per_batch=float(coc.total_accesses if accesses is None else accesses),
        coc=coc,
        pooling_factor=1.0,
        hit_estimate=estimate,
    )


def hand_instance() -> Problem:
    """2 GPUs holding 2 one-byte rows each; per access, HBM costs 0.001 and UVM 1.
    A and C: one row hit 3 times, one once; B: two rows hit twice (every row seen, so no
    unseen mass). By hand: a GPU with one table keeps it whole (cost 4 * 0.001); with two it
    keeps their two hottest rows. {A, C} + {B}: max(2 * 4 * (0.75 * 0.001 + 0.25), 0.004) =
    2.006; {A, B} + {C}: A's hot row and one B row -> 1.003 + 2.002 = 3.005. Optimum 2.006."""
    tables = (table("A", [3, 1], [1, 1], 2), table("B", [2], [2], 2), table("C", [3, 1], [1, 1], 2))
    return Problem(tables, hardware())


@pytest.mark.parametrize("solver", ["glpk", "cbc", "highs"])
def test_hand_instance_optimum(solver):
    if solver not in SOLVERS:
        pytest.skip(
            f"{solver} is not installed (scripts/setup.sh installs glpk and cbc, highspy is a dependency)"
        )
    problem = hand_instance()
    outcome = solve_problem(problem, SolveOptions(solver=solver, time_limit_s=10, mip_gap=0.0))
    assert outcome.milp.status == "optimal"
    assert outcome.best.max_cost == pytest.approx(2.006, rel=1e-9)
    gpu = outcome.best.plan.gpu
    assert gpu[0] == gpu[2] != gpu[1]
    assert outcome.best.plan.rows_hbm == (1, 2, 1)
    assert outcome.milp.objective_ms == pytest.approx(2006, rel=1e-6)
    # pooled bound: all four rows shared -> (1.003 + 1.003 + 0.004) / 2
    assert lower_bound(problem) == pytest.approx(1.005, rel=1e-9)
    # the MILP's proven bound is the optimum: its lines through whole rows are F itself here
    assert outcome.lower_bound == pytest.approx(2.006, rel=2e-5)  # less the solvers' tolerance


def test_split_takes_hottest_rows_across_tables():
    problem = hand_instance()
    assert split(problem, [0, 1], 2) == {0: 1, 1: 1}  # counts 3 (A) then 2 (B)
    assert split(problem, [0, 2], 2) == {0: 1, 2: 1}
    assert split(problem, [1], 2) == {1: 2}  # fits whole
    assert split(problem, [0, 1, 2], 6) == {0: 2, 1: 2, 2: 2}


def test_held_out_values_are_simple_good_turing_worked_by_hand():
    # 10 rows, 3 seen (counts 5, 1, 1): 7 accesses, 2 of them to rows seen once, 7 rows never seen
    t = table("T", [5, 1], [1, 2], 10, estimate=HitEstimate.HELD_OUT)
    # Gale & Sampson: Z_r = N_r / ((t - q) / 2) with neighbours q, t (the last t = 2r - q)
    z1, z5 = 2 / (0.5 * (5 - 0)), 1 / (0.5 * (2 * 5 - 1 - 1))
    b = (math.log(z5) - math.log(z1)) / math.log(5)
    # N_2 = 0: no Turing estimate, the smoothed r* = r (1 + 1/r)^(b + 1) from r = 1 on
    star1, star5 = 1 * 2 ** (b + 1), 5 * 1.2 ** (b + 1)
    scale = (7 - 2) / (2 * star1 + star5)  # the seen rows keep all but the new mass N_1 = 2
    assert t.row_values.tolist() == pytest.approx([star5 * scale, star1 * scale], rel=1e-12)
    assert t.unseen_row_value == pytest.approx(2 / 7)
    assert float(t.hbm_fraction(1)) == pytest.approx(star5 * scale / 7)
    assert float(t.hbm_fraction(3)) == pytest.approx(5 / 7)
    assert float(t.hbm_fraction(5)) == pytest.approx((5 + 2 * 2 / 7) / 7)
    assert float(t.hbm_fraction(10)) == pytest.approx(1.0)
    in_sample = dataclasses.replace(t, hit_estimate=HitEstimate.IN_SAMPLE)
    assert float(in_sample.hbm_fraction(1)) == pytest.approx(5 / 7)
    assert float(in_sample.hbm_fraction(3)) == float(in_sample.hbm_fraction(10)) == 1.0
    problem = Problem((t,), hardware(num_gpus=1, hbm_bytes_per_gpu=5))
    assert split(problem, [0], 5) == {0: 5}
    assert split(problem, [0], 2) == {0: 2}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_held_out_hit_share_predicts_a_fresh_sample(seed):
    """Rows of Zipf-like popularity, two independent days of Poisson accesses: ranked by the
    first day's counts (as the remap ranks them), the second day's share of the top-k rows,
    counted with numpy, is what the held-out estimate predicts from the first day alone; the
    in-sample share is optimistic."""
    rng = np.random.default_rng(seed)
    hash_size, samples = 200_000, 300_000
    rates = rng.pareto(1.2, hash_size) + 0.05
    rates *= samples / rates.sum()
    day1, day2 = rng.poisson(rates), rng.poisson(rates)
    counts, rows = np.unique(day1[day1 > 0], return_counts=True)
    held_out = table("T", counts, rows, hash_size, estimate=HitEstimate.HELD_OUT)
    in_sample = dataclasses.replace(held_out, hit_estimate=HitEstimate.IN_SAMPLE)
    order = np.lexsort((np.arange(hash_size), -day1))  # hottest first, then never-seen rows
    for k in (1_000, 10_000, 40_000, int((day1 > 0).sum()), 150_000):
        actual = day2[order[:k]].sum() / day2.sum()
        predicted = float(held_out.hbm_fraction(k))
        assert abs(predicted - actual) < 0.006, (k, predicted, actual)
        if k >= 10_000:  # below the hottest thousand rows, rows seen a few times by chance
            assert float(in_sample.hbm_fraction(k)) - actual > 0.03, k


def random_problem(num_tables, num_gpus, seed, hbm_share=0.25, host_bytes=10**15) -> Problem:
    """Zipf-shaped count-of-counts; total table bytes about 1/hbm_share of all HBM."""
    rng = np.random.default_rng(seed)
    tables = []
    for j in range(num_tables):
        hash_size = int(10 ** rng.uniform(2, 6))
        dim = int(rng.choice([16, 32, 64, 128]))
        draws = rng.zipf(rng.uniform(1.1, 1.8), int(10 ** rng.uniform(2, 5))) % hash_size
        _, per_row = np.unique(draws, return_counts=True)
        counts, rows = np.unique(per_row, return_counts=True)
        accesses = rng.uniform(1e3, 1e5)
        tables.append(table(f"t{j}", counts, rows, hash_size, dim, accesses, HitEstimate.HELD_OUT))
    total = sum(t.size_bytes for t in tables)
    hw = hardware(
        num_gpus=num_gpus,
        hbm_bytes_per_gpu=int(total * hbm_share / num_gpus),
        host_bytes=host_bytes,
        hbm_bandwidth=897e9,
        uvm_bandwidth=32e9,
        batch_size=65536,
        bytes_per_element=4,
    )
    return Problem(tuple(tables), hw)


@pytest.mark.parametrize("solver", SOLVERS)
def test_milp_never_worse_than_baselines_and_respects_capacity(solver):
    problem = random_problem(30, 4, seed=3)
    outcome = solve_problem(problem, SolveOptions(solver=solver, time_limit_s=20, mip_gap=0.01))
    assert violations(outcome.placed or problem, outcome.best.plan) == []  # over its cut, if cut
    for baseline in outcome.baselines:
        assert violations(problem, baseline.plan) == []
        assert outcome.best.max_cost <= baseline.max_cost * (1 + 1e-12)
    assert outcome.best.max_cost >= outcome.lower_bound * (1 - 1e-9)
    used = outcome.best.gpu_hbm_bytes
    assert max(used) <= problem.hbm_capacity
    assert outcome.gap < 0.10


def test_baselines_keep_tables_whole():
    problem = random_problem(20, 4, seed=5)
    for plan in all_baselines(problem):
        for j, t in enumerate(problem.tables):
            assert plan.rows_hbm[j] in (0, t.hash_size)
        ev = cost_plan(problem, plan)
        assert max(ev.gpu_hbm_bytes) <= problem.hbm_capacity


def test_lower_bound_below_every_plan():
    problem = random_problem(15, 3, seed=9)
    bound = lower_bound(problem)
    rng = np.random.default_rng(0)
    from recshard_stats.solver.plan import Plan

    for _ in range(20):
        gpu = tuple(int(g) for g in rng.integers(0, 3, len(problem.tables)))
        plan = polish(problem, Plan("random", gpu, (0,) * len(gpu)))
        assert cost_plan(problem, plan).max_cost >= bound


@pytest.mark.parametrize("seed, hbm_share", [(1, 0.02), (1, 0.3), (2, 0.02)])
def test_every_bound_is_below_the_optimum_found_by_enumeration(seed, hbm_share):
    """Six tables on three GPUs, every assignment enumerated and split exactly: the water-fill
    bound, each solver's proven bound (its cuts lie above the access CDFs; chords under them
    gave bounds 1.2-58% above the optimum on these instances) and the bound a solve reports are
    all at most the optimum, and the solve finds it."""
    import itertools

    from recshard_stats.solver.plan import Plan

    problem = random_problem(6, 3, seed=seed, hbm_share=hbm_share)
    optimum = min(
        cost_plan(problem, polish(problem, Plan("all", gpu, (0,) * 6))).max_cost
        for gpu in itertools.product(range(3), repeat=6)
        if gpu[0] == 0
    )
    assert lower_bound(problem) <= optimum * (1 + 1e-12)
    for solver in SOLVERS:
        options = SolveOptions(
            solver=solver,
            time_limit_s=30,
            mip_gap=0.0,
            cdf_segments=4,
            local_search_s=0,
            max_column_shards=1,
            torchrec_baselines=False,
        )
        result = milp.solve_milp(problem, options)
        assert result.status == "optimal"
        assert result.bound_ms is not None and result.bound_ms / 1e3 <= optimum * (1 + 1e-6), solver
        outcome = solve_problem(problem, options)
        assert outcome.lower_bound <= optimum * (1 + 1e-6)
        assert outcome.best.max_cost == pytest.approx(optimum, rel=1e-6)


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_milp_sees_every_wide_count_class(solver):
    """8 classes of 1,000 rows hit 8..1 times, HBM for 6,500 rows, one GPU. By hand: HBM serves
    (8+7+6+5+4+3) * 1000 + 2 * 500 = 34,000 accesses at 1/1000 s and UVM 2,000 at 1 s: 2,034 s.
    With lines only at log-spaced rows, class 5's line (slope 4) claimed all 36,000 accesses by
    row 6,500, and the MILP's objective was 36 s for a plan costing 2,034 s."""
    problem = Problem(
        (table("t", list(range(8, 0, -1)), [1000] * 8, 8000),),
        hardware(num_gpus=1, hbm_bytes_per_gpu=6500, host_bytes=10**6),
    )
    options = SolveOptions(solver=solver, time_limit_s=20, mip_gap=0.0, max_column_shards=1)
    result = milp.solve_milp(problem, options)
    by_hand_s = (8 + 7 + 6 + 5 + 4 + 3) * 1000 / 1000 + 2 * 500 / 1000 + 2000 * 1.0
    assert result.objective_ms is not None and result.objective_ms / 1e3 == pytest.approx(by_hand_s, rel=1e-6)
    assert cost_plan(problem, result.plan).max_cost == pytest.approx(by_hand_s, rel=1e-6)


def test_infeasible_host_names_the_shortfall():
    problem = random_problem(10, 2, seed=1, host_bytes=1000)
    with pytest.raises(RecShardError) as err:
        solve_problem(problem, SolveOptions(solver=SOLVERS[0]))
    assert err.value.reason is Reason.INFEASIBLE_HOST
    assert "of host memory, config gives 1000 B (short by" in str(err.value)
    assert err.value.context["host_bytes"] == 1000


@pytest.mark.slow
def test_cbc_keeps_its_time_limit_and_returns_a_valid_plan():
    """CBC's own limit is not checked everywhere (its root LP, a warm start's LP): the process
    is killed a second past it, and the start stands when CBC had no plan of its own yet."""
    problem = random_problem(120, 16, seed=11)
    start = polish(problem, min(all_baselines(problem), key=lambda p: cost_plan(problem, p).max_cost))
    result = milp.solve_milp(
        problem, SolveOptions(solver="cbc", time_limit_s=8, mip_gap=0.0), milp.CutPlan((1,) * 120, start)
    )
    # CBC ran (the instance is neither too big to build in 8 s nor proven by the start); how far it
    # got depends on the machine, what it returns does not: at most a second and the file I/O past
    # the limit (which counts from the model's build), a plan within every capacity, and an
    # objective no worse than the start's (the no_worse_than_start cut; without a plan of its
    # own, the start itself)
    assert result.status is not MilpStatus.SKIPPED and result.build_seconds > 0
    assert result.solve_seconds < 8 + 3
    assert violations(problem, result.plan) == [] and len(result.plan.gpu) == 120
    start_cost = cost_plan(problem, start).max_cost
    if result.status is MilpStatus.NO_INCUMBENT:
        assert result.plan.gpu == start.gpu and result.objective_ms is None
    else:
        assert result.objective_ms is not None and result.objective_ms <= start_cost * 1e3 * (1 + 1e-5)


class _NothingFoundSolver:
    """A stand-in for a MILP solver that stops at its time limit without a feasible plan (what
    GLPK does on large instances): the result handling, not the solver, is under test."""

    options: ClassVar[dict] = {}

    def solve(self, model, **kwargs):
        from pyomo.opt import SolverResults, TerminationCondition

        results = SolverResults()
        results.solver.termination_condition = TerminationCondition.maxTimeLimit
        return results


def test_a_solver_stopped_without_a_plan_says_so(monkeypatch):
    monkeypatch.setattr(milp.pyo, "SolverFactory", lambda name: _NothingFoundSolver())
    with pytest.raises(RecShardError) as err:
        milp.solve_milp(hand_instance(), SolveOptions(solver="glpk", time_limit_s=1))
    assert err.value.reason is Reason.NO_INCUMBENT
    assert "glpk stopped (maxTimeLimit) after" in str(err.value) and "without a feasible plan" in str(
        err.value
    )


def test_a_solver_without_a_plan_of_its_own_leaves_the_start_standing(monkeypatch):
    """A MILP that stops without an incumbent (GLPK at scale) does not fail the solve: the
    searched start is shipped, and the manifest's status says the MILP found nothing."""
    monkeypatch.setattr(milp.pyo, "SolverFactory", lambda name: _NothingFoundSolver())
    outcome = solve_problem(
        hand_instance(), SolveOptions(solver="glpk", time_limit_s=1, torchrec_baselines=False)
    )
    assert outcome.milp.status == "no_incumbent" and outcome.milp.objective_ms is None
    assert outcome.source in (PlanSource.START, PlanSource.LOCAL_SEARCH)
    assert outcome.best.max_cost == pytest.approx(2.006, rel=1e-9)  # the search finds the optimum here
    assert outcome.lower_bound == pytest.approx(1.005, rel=1e-9)  # no MILP bound: the water-fill's


class _UncheckedProblem(Problem):
    """Skips the up-front capacity check, so the MILP itself meets the infeasible instance."""

    def check_capacity(self) -> None:
        pass


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_milp_reports_an_infeasible_instance(solver):
    tight = random_problem(6, 2, seed=1, host_bytes=1000)
    with pytest.raises(RecShardError) as err:
        milp.solve_milp(
            _UncheckedProblem(tight.tables, tight.hardware), SolveOptions(solver=solver, time_limit_s=10)
        )
    assert err.value.reason is Reason.INFEASIBLE_HBM
    assert f"{solver} proved the sharding problem infeasible" in str(err.value)


def test_balanced_start_swaps_off_the_slowest_gpu():
    """Costs 3, 3, 2, 2, 2 on 2 GPUs (no HBM to split): longest-first gives {3, 2, 2} and {3, 2}
    (7 vs 5); swapping a 3 with a 2 gives 6 and 6, the optimum."""
    tables = tuple(
        table(name, [1], [1], 1, accesses=a) for name, a in zip("ABCDE", (3, 3, 2, 2, 2), strict=True)
    )
    problem = Problem(tables, hardware(hbm_bytes_per_gpu=1, hbm_reserved_fraction=0.5))
    assert problem.hbm_capacity == 0
    plan = balanced_plan(problem)
    cost = cost_plan(problem, plan)
    assert cost.gpu_cost == pytest.approx((6.0, 6.0))
    assert plan.gpu[0] == plan.gpu[1] and len({plan.gpu[2], plan.gpu[3], plan.gpu[4]}) == 1


def test_unknown_solver_is_a_config_error():
    with pytest.raises(RecShardError, match="unknown solver 'gurobi'"):
        SolveOptions(solver="gurobi")


def test_local_search_moves_a_table_off_the_slowest_gpu_to_the_optimum():
    from recshard_stats.solver.local_search import improve

    problem = hand_instance()
    bad = Plan("bad", (0, 0, 1), (1, 1, 2))  # {A, B} + {C}: 3.005 by hand
    assert cost_plan(problem, polish(problem, bad)).max_cost == pytest.approx(3.005, rel=1e-9)
    better = improve(problem, bad, budget_s=5)
    assert cost_plan(problem, better).max_cost == pytest.approx(2.006, rel=1e-9)
    assert better.gpu[0] == better.gpu[2] != better.gpu[1]


def test_the_search_cost_model_is_the_exact_split():
    """A GPU's cost in the search (rows taken fractionally, interpolated between saving-per-byte
    levels) is the exact split's within one row's saving per table below it and 0.01% above it;
    every plan the search returns respects capacity and is no worse than its start."""
    from recshard_stats.solver.local_search import GpuCostModel, improve, lpt_plan

    problem = random_problem(30, 4, seed=3)
    model = GpuCostModel(problem)
    for _g, tables in enumerate(([0, 1, 2], list(range(10)), list(range(30)))):
        rows = split(problem, tables, problem.rows_capacity(tables))
        exact = sum(problem.table_cost(j, rows[j]) for j in tables)
        worth_a_row = max(
            (problem.uvm_time(j) - problem.hbm_time(j))
            / max(problem.tables[j].coc.total_accesses, 1)
            * problem.tables[j].coc.counts.max(initial=1)
            for j in tables
        )
        assert exact - len(tables) * worth_a_row - 1e-12 <= model.cost(tables) <= exact * (1 + 1e-4)
    for start in (lpt_plan(problem), polish(problem, greedy(problem, "size"))):
        searched = improve(problem, start, budget_s=5)
        assert violations(problem, searched) == []
        assert cost_plan(problem, searched).max_cost <= cost_plan(problem, start).max_cost * (1 + 1e-12)


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_never_accessed_table_is_planned_at_no_cost(solver):
    """A table no sample touched (a feature that was absent all day): every solver plans it,
    at zero cost, beside a table worked out by hand (A alone on a GPU keeps both rows: 4 x 0.001)."""
    never = TableDemand(
        name="Z",
        features=("Z",),
        hash_size=5,
        dim=1,
        hash="mod",
        row_bytes=1.0,
        accesses_per_batch=0.0,
        coc=CountOfCounts.of(np.zeros(0, np.int64), np.zeros(0, np.int64)),
        pooling_factor=0.0,
    )
    problem = Problem((table("A", [3, 1], [1, 1], 2), never), hardware())
    outcome = solve_problem(problem, SolveOptions(solver=solver, time_limit_s=5, torchrec_baselines=False))
    assert outcome.best.max_cost == pytest.approx(0.004, rel=1e-9)
    assert outcome.best.table_cost[1] == 0.0 and outcome.best.plan.rows_hbm[0] == 2
    assert violations(problem, outcome.best.plan) == []


def column_split_instance() -> Problem:
    """No HBM (every access from UVM at 1 byte per second): H (dim 2, 5 accesses) costs 10, A and
    B (dim 1, 1 access each) cost 1. Whole tables: {H} + {A, B} = 10 at best. H cut into two column
    shards of 5: {H0, A} + {H1, B} = 6, the pooled bound (12 / 2)."""
    tables = (
        table("H", [5], [1], 1, dim=2, accesses=5),
        table("A", [1], [1], 1, accesses=1),
        table("B", [1], [1], 1, accesses=1),
    )
    return Problem(tables, hardware(hbm_bytes_per_gpu=1, hbm_reserved_fraction=0.5))


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_hot_table_is_cut_into_column_shards_when_the_optimum_needs_it(solver):
    from recshard_stats.solver.column_split import table_shards

    problem = column_split_instance()
    whole = solve_problem(
        problem, SolveOptions(solver=solver, time_limit_s=10, max_column_shards=1, torchrec_baselines=False)
    )
    assert whole.placed is None and whole.best.max_cost == pytest.approx(10.0)
    assert whole.lower_bound == pytest.approx(10.0)  # H alone: proven optimal among whole tables
    outcome = solve_problem(problem, SolveOptions(solver=solver, time_limit_s=10, torchrec_baselines=False))
    placed = outcome.placed
    assert [t.name for t in placed.tables] == ["H", "H", "A", "B"] and placed.parent == (0, 0, 1, 2)
    assert [(t.dim, t.row_bytes, t.column_shards) for t in placed.tables[:2]] == [(1, 1.0, 2)] * 2
    assert outcome.best.gpu_cost == pytest.approx((6.0, 6.0))
    assert outcome.lower_bound == pytest.approx(6.0) and outcome.gap == pytest.approx(0.0, abs=1e-9)
    assert outcome.milp.status == "skipped"  # the start met the bound: nothing left for the MILP to prove
    h, a, b = table_shards(placed, outcome.best.plan)
    assert h.entries == (0, 1) and sorted(h.gpus) == [0, 1] and {a.gpus[0], b.gpus[0]} == {0, 1}
    assert violations(placed, outcome.best.plan) == []


def test_column_shards_of_a_table_keep_the_same_rows_and_different_gpus():
    """Two GPUs with 2 bytes of HBM each. H (dim 2, rows hit 4, 2, 1 times) cut in two shards of
    1 byte per row; A (dim 1, one row hit 3 times) beside one shard. Split freely, the shard alone
    would keep 2 rows and the one beside A 1 row; shards keep the same rows: 2 each would push A
    to UVM (GPU costs 1.006 and 4.006), 1 each costs 3.004 and 3.007, so both keep 1 and A keeps
    its row. A search may not put both shards on one GPU."""
    from recshard_stats.solver.column_split import split_problem
    from recshard_stats.solver.local_search import improve

    tables = (table("H", [4, 2, 1], [1, 1, 1], 3, dim=2), table("A", [3], [1], 1))
    placed = split_problem(Problem(tables, hardware()), (2, 1))
    assert placed.siblings == ((1,), (0,), ())
    rows = split_assignment(placed, (0, 1, 1))
    assert rows == (1, 1, 1)
    together = Plan("together", (0, 0, 1), split_assignment(placed, (0, 0, 1)))
    apart = improve(placed, together, budget_s=5)
    assert apart.gpu[0] != apart.gpu[1]


def test_a_milp_too_big_to_build_in_its_time_is_skipped_and_the_search_gets_the_time(monkeypatch):
    """At ~1,700 (table, GPU) pairs a second Pyomo would take ~37 s to build 1,009 tables x 64 GPUs:
    a MILP whose build would take over half its time is not built (here: at one pair a second)."""
    monkeypatch.setattr(milp, "BUILD_PAIRS_PER_SECOND", 1.0)
    problem = random_problem(30, 4, seed=3)
    outcome = solve_problem(
        problem,
        SolveOptions(solver="cbc", time_limit_s=10, mip_gap=0.0, local_search_s=2, torchrec_baselines=False),
    )
    assert outcome.milp.status == "skipped" and outcome.milp.build_seconds == 0.0
    assert outcome.source in (PlanSource.LOCAL_SEARCH, PlanSource.START)
    assert violations(outcome.placed or problem, outcome.best.plan) == []
    assert outcome.best.max_cost >= outcome.lower_bound


def test_the_ladder_tries_the_largest_tables_cut_most_and_the_rest_less():
    """Between the all-cut rung and choose_shards's: the largest quarter, half and three quarters of
    the tables (by bytes) cut as much as they may be, the rest cut half as much, a quarter, ...,
    whole; most cut first, every table whole last, no cut twice."""
    problem = random_problem(12, 4, seed=5)
    most = tuple(t.most_column_shards(4, 8) for t in problem.tables)
    ladder = cut_ladder(problem, 8)
    assert ladder[0] == most and ladder[-1] == (1,) * 12 and len(set(ladder)) == len(ladder)
    by_size = sorted(range(12), key=lambda j: -problem.tables[j].size_bytes)
    for kept in (3, 6, 9):
        for rest in (2, 1):
            mixed = tuple(most[j] if j in by_size[:kept] else min(most[j], rest) for j in range(12))
            assert mixed in ladder or mixed == choose_shards(problem, 8), (kept, rest)


def test_the_search_fills_small_tables_before_a_shards_held_rows():
    """2 tables of 8,000 rows (8 classes of 1,000 hit 8..1 times) cut in 2, 10 tables of 20 rows
    (5 hit 5 times, 15 once), 1,000 lookups each, 4 GPUs of 20,000 bytes, 1,002 bytes of ids per
    table or shard. A shard held at all 8,000 rows (16,000 bytes) and a few small tables overflow
    a GPU by a few percent; the search counted those small tables wholly in UVM (4,000 s each,
    not 4 s) and, from LPT's start (both tables' shards on two GPUs), found no move: 892 s. HiGHS
    proves 17.772 s the optimum over every cut (the MILP with shard counts chosen, 20 s); this cut
    alone gets within 20% of it."""
    big = [table(f"b{i}", list(range(8, 0, -1)), [1000] * 8, 8000, dim=4, accesses=1000) for i in range(2)]
    small = [table(f"s{i}", [5, 1], [5, 15], 20, dim=4, accesses=1000) for i in range(10)]
    problem = Problem(
        tuple(big + small), hardware(num_gpus=4, hbm_bytes_per_gpu=20000, host_bytes=10**9, index_bytes=1)
    )
    found = search_cut(problem, (2, 2) + (1,) * 10, (), 2.0, {}, first=False)
    assert found is not None
    assert 17.772 * (1 - 1e-9) <= found.cost.max_cost <= 17.772 * 1.2


def fourteen_tables(seed: int) -> Problem:
    """14 tables (not small) of 4-39 rows on 4 GPUs, HBM for 40% of their bytes, some tables hot."""
    rng = np.random.default_rng(seed)
    tables = []
    for j in range(14):
        hash_size = int(rng.integers(4, 40))
        per_row = np.sort(rng.integers(1, 50, size=int(rng.integers(2, hash_size + 1))))
        counts, rows = np.unique(per_row, return_counts=True)
        dim = int(rng.choice([2, 4]))
        hot = float(rng.choice([1, 1, 5]))
        tables.append(table(f"t{j}", counts, rows, hash_size, dim=dim, accesses=float(per_row.sum()) * hot))
    size = sum(t.size_bytes for t in tables)
    hw = hardware(
        num_gpus=4,
        hbm_bytes_per_gpu=int(size * 0.1),
        host_bytes=10**6,
        hbm_bandwidth=50.0,
        output_bytes_per_element=1,
    )
    return Problem(tuple(tables), hw)


@pytest.mark.skipif(
    not spare_cpus(), reason="the MILP of aligned blocks runs beside the stages only with two CPUs"
)
def test_the_milp_of_aligned_blocks_runs_beside_the_other_stages(caplog):
    """Where the ladder's best plan is not within the MIP gap (as on this instance), the
    MILP of aligned blocks, run in a process of its own, brings its plan back within the time limit,
    and the plan shipped is no dearer than it."""
    problem = fourteen_tables(5)
    began = time.time()
    with caplog.at_level(logging.INFO, logger="recshard_stats.solver.aligned_blocks"):
        outcome = solve_problem(
            problem, SolveOptions(time_limit_s=8, max_column_shards=4, torchrec_baselines=False)
        )
    assert time.time() - began <= 8.5
    brought = [r for r in caplog.records if "in a process of its own" in r.getMessage()]
    assert len(brought) == 1
    assert outcome.best.max_cost * 1000 <= brought[0].args[0] + 1e-12
    assert violations(outcome.placed or problem, outcome.best.plan) == []


def test_the_milp_of_aligned_blocks_runs_last_on_one_cpu(caplog):
    """With one CPU to use, the MILP of aligned blocks runs in this process, after the polish,
    and the solve still ends within its time limit."""
    kept = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(kept)})
    try:
        began = time.time()
        with caplog.at_level(logging.INFO, logger="recshard_stats.solver.aligned_blocks"):
            outcome = solve_problem(
                fourteen_tables(5),
                SolveOptions(time_limit_s=8, max_column_shards=4, torchrec_baselines=False),
            )
        took = time.time() - began
    finally:
        os.sched_setaffinity(0, kept)
    assert took <= 8.5
    messages = [r.getMessage() for r in caplog.records]
    assert any("in the MILP (HiGHS" in m for m in messages) and not any(
        "process of its own" in m for m in messages
    )
    assert violations(outcome.placed or fourteen_tables(5), outcome.best.plan) == []
