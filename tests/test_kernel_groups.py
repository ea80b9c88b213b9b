"""Kernel-group-aware polishing (solver/kernel_groups.py): with a fixed cost per kernel call, tables
of one row size gather on a GPU and a tier whose rows save less than its call is emptied;
checked against every assignment enumerated and against the exact cost model."""

import dataclasses
import itertools
import time

import numpy as np
import pytest

from recshard_stats.costmodel import CostModel, PassTerms, TierTerms
from recshard_stats.options import SolveOptions
from recshard_stats.solver import kernel_groups
from recshard_stats.solver.kernel_groups import ExactGpuCost, call_lpt_plan, refine
from recshard_stats.solver.local_search import lpt_plan
from recshard_stats.solver.plan import Plan, cost_plan, violations
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.solve import polish, solve_problem
from tests.test_solver import hardware, random_problem, table

CALLS = CostModel(PassTerms(TierTerms(fixed_s=50e-6, byte_s=1e-12), TierTerms(fixed_s=60e-6, byte_s=40e-12)))
# the same, and each call's forward at least 1 us per id of its longest bag (the H200's chain)
CHAINED = CostModel(
    PassTerms(
        TierTerms(fixed_s=50e-6, byte_s=1e-12, chain_s=1e-6),
        TierTerms(fixed_s=60e-6, byte_s=40e-12, chain_s=1e-6),
    )
)


def test_calls_gather_tables_of_one_row_size_on_a_gpu():
    """Four small tables (two of 16 columns, two of 64) on two GPUs with room for all of them in
    HBM: each GPU pays one call per row size it holds, so the optimum puts the two 16-column
    tables on one GPU and the 64-column ones on the other."""
    tables = tuple(
        table(f"t{i}", [3, 1], [5, 10], 20, dim, accesses=1000.0) for i, dim in enumerate((16, 64, 16, 64))
    )
    hw = dataclasses.replace(
        hardware(num_gpus=2, hbm_bytes_per_gpu=10**6, host_bytes=10**9), cost_model=CALLS
    )
    problem = Problem(tables, hw)
    alternating = polish(problem, Plan("p", (0, 0, 1, 1), (0,) * 4))
    refined = refine(problem, alternating, 10.0)
    gpus = {g: sorted(problem.tables[j].dim for j in range(4) if refined.gpu[j] == g) for g in (0, 1)}
    assert sorted(gpus.values()) == [[16, 16], [64, 64]]
    assert cost_plan(problem, refined).max_cost < cost_plan(problem, alternating).max_cost
    # all in HBM: one call of 50 us per GPU and pass, plus the bytes
    assert cost_plan(problem, refined).max_cost == pytest.approx(50e-6 + 2 * 1000 * 64 * 1e-12, rel=1e-9)


def test_the_start_with_calls_counted_puts_a_table_where_its_row_size_runs():
    """Two busy tables (64 and 16 columns) on two GPUs, then a light one of each size: placed
    with the calls counted, each light table joins the busy one of its size (one 50-us call per
    GPU); the solver's LPT, which leaves calls out, puts the first light table beside the less
    busy GPU's other size (two calls there)."""
    cols = (64, 16, 64, 16)
    accesses = (1000.0, 1000.0, 10.0, 10.0)
    tables = tuple(
        table(f"t{i}", [3, 1], [5, 10], 20, d, accesses=a)
        for i, (d, a) in enumerate(zip(cols, accesses, strict=True))
    )
    hw = dataclasses.replace(
        hardware(num_gpus=2, hbm_bytes_per_gpu=10**6, host_bytes=10**9), cost_model=CALLS
    )
    problem = Problem(tables, hw)
    gathered = call_lpt_plan(problem)
    assert gathered is not None and not violations(problem, gathered)
    assert gathered.gpu[0] == gathered.gpu[2] != gathered.gpu[1] == gathered.gpu[3]
    assert gathered.rows_hbm == (20, 20, 20, 20)  # all in HBM: the host call costs more
    # the 64-column GPU: one call, and each id's 64 bytes at 1e-12 s per byte
    assert cost_plan(problem, gathered).max_cost == pytest.approx(50e-6 + (1000 + 10) * 64 * 1e-12, rel=1e-9)
    assert call_lpt_plan(problem, deadline=time.time() - 1) is None  # no time: no start
    linear = lpt_plan(problem)
    assert linear.gpu[2] == linear.gpu[1]
    assert cost_plan(problem, linear).max_cost >= 100e-6


@pytest.mark.parametrize("seed", [0, 1])
def test_the_start_with_calls_counted_is_split_as_each_gpu_is_best(seed):
    """On six tables on three GPUs, the start's rows on each GPU are those the exact cost of that
    GPU's tables chooses, its cost their costliest GPU's, never below the best of all 243
    assignments; polished, it is within 2% of that best."""
    problem, best, _ = _enumerated(6, seed)
    gathered = call_lpt_plan(problem)
    assert gathered is not None and not violations(problem, gathered)
    oracle = ExactGpuCost(problem, {})
    per_gpu = [oracle.best([j for j in range(6) if gathered.gpu[j] == g]) for g in range(3)]
    for _, rows in per_gpu:
        assert all(gathered.rows_hbm[j] == r for j, r in rows.items())
    cost = cost_plan(problem, gathered).max_cost
    assert cost == pytest.approx(max(c for c, _ in per_gpu), rel=1e-12)
    assert best <= cost * (1 + 1e-9)
    assert cost_plan(problem, refine(problem, gathered, 20.0)).max_cost <= best * 1.02


@pytest.mark.parametrize(("seed", "chained"), list(itertools.product(range(4), (False, True))))
def test_the_solve_with_calls_reaches_every_assignment_enumerated(seed, chained):
    """The whole solve on nine tables on three GPUs (whole tables): its starts, each polished for a
    while and the best for the rest, end at the best of all 6,561 assignments (each GPU's rows
    chosen by :meth:`ExactGpuCost.best`); ``chained``: with bags of 10 to 200 ids, whose serial
    sum sets a call's floor."""
    problem, best, _ = _enumerated(9, seed, CHAINED if chained else CALLS)
    if chained:  # the chain sets some GPU's time in the optimum
        assert best > 1.1 * _enumerated(9, seed)[1]
    options = SolveOptions(time_limit_s=20, max_column_shards=1, torchrec_baselines=False)
    shipped = solve_problem(problem, options).best
    assert not violations(problem, shipped.plan)
    assert shipped.max_cost == pytest.approx(best, rel=1e-9)


def test_an_hbm_tier_that_saves_less_than_its_call_is_emptied():
    """A table whose few HBM rows save 2 us while the HBM call costs 50 us: all of it in host
    memory is cheaper, though the water-fill puts its hottest rows in HBM."""
    t = table("t", [10, 1], [1, 1000], 100_000, 16, accesses=200.0)
    hw = dataclasses.replace(
        hardware(num_gpus=1, hbm_bytes_per_gpu=16 * 10, host_bytes=10**9), cost_model=CALLS
    )
    problem = Problem((t,), hw)
    filled = polish(problem, Plan("p", (0,), (0,)))
    assert filled.rows_hbm[0] > 0
    cost, rows = ExactGpuCost(problem, {}).best([0])
    assert rows[0] == 0
    assert cost == pytest.approx(cost_plan(problem, Plan("p", (0,), (0,))).max_cost, rel=1e-12)
    assert cost < cost_plan(problem, filled).max_cost


def _enumerated(num_tables: int, seed: int, model: CostModel = CALLS) -> tuple[Problem, float, Plan]:
    """Tables on three GPUs with call costs: the problem, the best of all its assignments (each
    GPU's rows chosen by :meth:`ExactGpuCost.best`) and a round-robin start. With a chain term in
    ``model``, table j's longest bag holds 10 to 200 ids."""
    base = random_problem(num_tables, 3, seed=seed, hbm_share=0.2)
    if model.hbm.chain_s > 0:
        bags = np.random.default_rng(seed).integers(10, 201, size=num_tables)
        base = dataclasses.replace(
            base,
            tables=tuple(
                dataclasses.replace(t, longest_bag=float(b)) for t, b in zip(base.tables, bags, strict=True)
            ),
        )
    problem = dataclasses.replace(base, hardware=dataclasses.replace(base.hardware, cost_model=model))
    oracle = ExactGpuCost(problem, {})
    best = min(
        max(oracle.best([j for j in range(num_tables) if gpu[j] == g])[0] for g in range(3))
        for gpu in itertools.product(range(3), repeat=num_tables)
        if gpu[0] == 0
    )
    start = polish(problem, Plan("p", tuple(j % 3 for j in range(num_tables)), (0,) * num_tables))
    return problem, best, start


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_refine_matches_every_assignment_enumerated(seed):
    """Six tables on three GPUs: the refined plan is never worse than where it started, is valid,
    and is within 2% of the best of all 243 assignments, each GPU's rows chosen alike."""
    problem, best, start = _enumerated(6, seed)
    refined = refine(problem, start, 20.0)
    assert not violations(problem, refined)
    cost = cost_plan(problem, refined).max_cost
    assert cost <= cost_plan(problem, start).max_cost * (1 + 1e-12)
    assert best <= cost * (1 + 1e-9) and cost <= best * 1.02


@pytest.mark.parametrize("seed", [1, 2, 3, 10])
def test_kicks_take_the_polish_out_of_a_local_optimum(seed, monkeypatch):
    """Nine tables on three GPUs, where moves and swaps off the slowest GPU stop more than 10% above
    the best of all 6,561 assignments (each GPU's rows chosen alike): the kicks reach it."""
    problem, best, start = _enumerated(9, seed)
    kicked = refine(problem, start, 20.0)
    assert not violations(problem, kicked)
    assert cost_plan(problem, kicked).max_cost == pytest.approx(best, rel=1e-9)
    monkeypatch.setattr(kernel_groups, "KICKS_WITHOUT_GAIN", 0)
    assert cost_plan(problem, refine(problem, start, 20.0)).max_cost > best * 1.1


@pytest.mark.slow
def test_the_solve_never_ships_a_plan_worse_than_a_whole_table_baseline_with_calls_counted():
    base = random_problem(20, 4, seed=9, hbm_share=0.1)
    problem = dataclasses.replace(base, hardware=dataclasses.replace(base.hardware, cost_model=CALLS))
    outcome = solve_problem(problem, SolveOptions(solver="cbc", time_limit_s=20, torchrec_baselines=False))
    assert all(outcome.best.max_cost <= b.max_cost * (1 + 1e-9) for b in outcome.baselines)
    assert outcome.lower_bound <= outcome.best.max_cost
