"""Cost model v2 (recshard_stats.costmodel) against independent per-row computations in numpy:
v1 is its special case, a table's cost from the solver's per-row savings equals the cost from
explicit per-row arrays, distinct rows per batch follow 1 - (1 - B/N)^v, and every bound stays
below the enumerated optimum under measured-style terms."""

import dataclasses
import itertools

import numpy as np
import pytest

from recshard_stats.config import HardwareConfig
from recshard_stats.costmodel import CostModel, PassTerms, TableLoad, TierTerms, placement_cost
from recshard_stats.distributions import HitEstimate
from recshard_stats.errors import RecShardError
from recshard_stats.options import SolveOptions
from recshard_stats.solver.plan import Plan, cost_plan
from recshard_stats.solver.problem import Problem
from recshard_stats.solver.solve import polish, solve_problem
from recshard_stats.solver.waterfill import lower_bound
from tests.test_solver import random_problem, table

# terms of the shape the H200 grid gives (seconds): fixed per group, per lookup, per distinct row,
# per byte, and a host per-row term that grows with the table's span
MEASURED_STYLE = CostModel(
    forward=PassTerms(
        TierTerms(fixed_s=10e-6, byte_s=0.4e-12, distinct_byte_s=0.2e-12),
        TierTerms(fixed_s=3e-6, lookup_s=0.8e-9, byte_s=8e-12, span_distinct_s=20e-9),
    ),
    backward=PassTerms(
        TierTerms(
            fixed_s=60e-6, lookup_s=0.75e-9, byte_s=1.7e-12, distinct_s=0.6e-9, distinct_byte_s=1.9e-12
        ),
        TierTerms(
            fixed_s=80e-6, lookup_s=0.77e-9, byte_s=1.5e-12, distinct_byte_s=40e-12, span_distinct_s=2e-9
        ),
    ),
    span_low_bytes=2**27,
    span_high_bytes=2**32,
)


def with_model(problem: Problem, model: CostModel, comm_bandwidth: float = 0.0) -> Problem:
    return dataclasses.replace(
        problem,
        hardware=dataclasses.replace(problem.hardware, cost_model=model, comm_bandwidth=comm_bandwidth),
    )


def test_v1_is_the_bandwidth_special_case():
    model = CostModel.from_bandwidths(897e9, 32e9)
    a, rb, f = 12345.0, 256.0, 0.37
    load = TableLoad(0, a, f, 100.0, 50.0, rb, 1e12)
    assert model.table_seconds(load) == pytest.approx(a * rb * (f / 897e9 + (1 - f) / 32e9), rel=1e-12)
    hw = HardwareConfig(2, 2**30, 0.1, 2**40, 897e9, 32e9, 65536, 4)
    assert hw.costs == model
    cost = placement_cost(model, 2, [load, dataclasses.replace(load, gpu=1, hbm_fraction=1.0)])
    assert cost.gpu_cost == pytest.approx((a * rb * (f / 897e9 + (1 - f) / 32e9), a * rb / 897e9))
    assert cost.uvm_access_fraction == pytest.approx((1 - f) / 2)  # of both tables' lookups


def _explicit_rows(table):
    """Per row of the table, hottest first: its expected accesses of new data (its class's value,
    then the never-seen rows'), by plain expansion of the classes."""
    values = np.repeat(table.row_values, table.coc.rows)
    unseen_rows = table.hash_size - int(table.coc.rows.sum())
    return np.concatenate([values, np.full(unseen_rows, table.unseen_row_value)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table_cost_equals_an_explicit_per_row_computation(seed):
    problem = with_model(random_problem(4, 2, seed=seed), MEASURED_STYLE, comm_bandwidth=50e9)
    problem = dataclasses.replace(
        problem, hardware=dataclasses.replace(problem.hardware, index_bytes=8, output_bytes_per_element=4)
    )
    hw = problem.hardware
    for j, t in enumerate(problem.tables):
        if t.hash_size > 300_000:
            continue
        values = _explicit_rows(t)
        total = t.coc.total_accesses
        q = min(t.accesses_per_batch / total, 1.0)  # a batch larger than the profile holds every row seen
        in_batch = 1 - (1 - q) ** values  # the row is in a batch with this chance
        ramp = np.clip((np.log2(t.size_bytes) - 27) / (32 - 27), 0, 1)
        hbm, host = MEASURED_STYLE.hbm, MEASURED_STYLE.host
        lookup_hbm = min(hbm.lookup_s + hbm.byte_s * t.row_bytes, host.lookup_s + host.byte_s * t.row_bytes)
        lookup_host = host.lookup_s + host.byte_s * t.row_bytes
        distinct_host = host.distinct_s + host.distinct_byte_s * t.row_bytes + host.span_distinct_s * ramp
        distinct_hbm = min(hbm.distinct_s + hbm.distinct_byte_s * t.row_bytes, distinct_host)
        comm = (
            (
                t.accesses_per_batch * hw.index_bytes
                + hw.batch_size * len(t.features) * t.dim * hw.output_bytes_per_element
            )
            / 2
            / 50e9
        )  # all but a G-th of it leaves the GPU
        for rows in (
            0,
            1,
            7,
            t.unique_rows // 3,
            t.unique_rows,
            (t.unique_rows + t.hash_size) // 2,
            t.hash_size,
        ):
            f = values[:rows].sum() / total
            expected = (
                t.accesses_per_batch * (f * lookup_hbm + (1 - f) * lookup_host)
                + in_batch[:rows].sum() * distinct_hbm
                + in_batch[rows:].sum() * distinct_host
                + comm
            )
            assert problem.table_cost(j, rows) == pytest.approx(expected, rel=1e-9), (j, rows)
            # the water-fill's per-row savings add up to the same cost
            seen, unseen = problem.row_savings(j)
            per_row = np.concatenate(
                [np.repeat(seen, t.coc.rows), np.full(t.hash_size - t.unique_rows, unseen)]
            )
            assert problem.uvm_time(j) - per_row[:rows].sum() == pytest.approx(expected, rel=1e-9)


def test_distinct_rows_follow_the_chance_a_row_is_in_a_batch():
    """A profile of 2000 accesses (rows seen 40, 10, 3 and 1 times), batches of 100: each
    profiled access lands in a batch with chance 1/20, so a row seen c times is in it with
    chance 1 - (19/20)^c; checked against a simulation of the batches."""
    full = table("t", [40, 10, 3, 1], [20, 60, 100, 300], hash_size=480, accesses=100.0)  # every row seen
    assert full.coc.total_accesses == 2000
    rng = np.random.default_rng(0)
    counts = np.repeat(full.coc.counts, full.coc.rows)
    hits = rng.binomial(counts[None, :].repeat(2000, 0), 1 / 20)
    assert float(full.distinct_rows(480)) == pytest.approx((hits > 0).sum(axis=1).mean(), rel=0.01)
    # the first 20 rows (seen 40 times each): 20 x (1 - 0.95^40)
    assert float(full.distinct_rows(20)) == pytest.approx(20 * (1 - 0.95**40), rel=1e-12)
    # held out, with never-seen rows: rows seen once are worth less than one access, never-seen
    # rows share the new mass (300 of the 2000 accesses)
    t = table(
        "t", [40, 10, 3, 1], [20, 60, 100, 300], hash_size=5000, accesses=100.0, estimate=HitEstimate.HELD_OUT
    )
    values = _explicit_rows(t)
    assert values[479] < 1 and values[-1] * (5000 - 480) == pytest.approx(300)
    assert float(t.distinct_rows(t.hash_size)) == pytest.approx((1 - 0.95**values).sum(), rel=1e-12)


@pytest.mark.parametrize("seed, hbm_share", [(1, 0.02), (2, 0.3)])
def test_bounds_stay_below_the_enumerated_optimum_with_measured_terms(seed, hbm_share):
    problem = with_model(random_problem(6, 3, seed=seed, hbm_share=hbm_share), MEASURED_STYLE)
    optimum = min(
        cost_plan(problem, polish(problem, Plan("all", gpu, (0,) * 6))).max_cost
        for gpu in itertools.product(range(3), repeat=6)
        if gpu[0] == 0
    )
    assert lower_bound(problem) <= optimum * (1 + 1e-12)
    outcome = solve_problem(
        problem,
        SolveOptions(
            solver="cbc",
            time_limit_s=30,
            mip_gap=0.0,
            cdf_segments=4,
            max_column_shards=1,
            torchrec_baselines=False,
        ),
    )
    assert outcome.lower_bound <= optimum * (1 + 1e-6)
    # the solver leaves each GPU's kernel-group constants out of its objective: within them of the optimum
    assert outcome.best.max_cost <= optimum + MEASURED_STYLE.host.fixed_s + 1e-12


def test_saving_fraction_is_concave_and_runs_from_zero_to_one():
    problem = with_model(random_problem(5, 2, seed=7), MEASURED_STYLE)
    for j, t in enumerate(problem.tables):
        rows = np.unique(np.round(np.linspace(0, t.hash_size, 200)))
        s = problem.saving_fraction(j, rows)
        assert s[0] == pytest.approx(0.0, abs=1e-12) and s[-1] == pytest.approx(1.0, rel=1e-9)
        slopes = np.diff(s) / np.diff(rows)
        assert (np.diff(slopes) <= 1e-12).all(), t.name


def test_the_longest_bag_is_the_profiles_one_in_a_batch_quantile():
    from recshard_stats.solver.problem import longest_bag

    histogram = [(5, 90), (1, 900), (50, 9), (500, 1)]  # 1000 samples
    assert longest_bag(histogram, 1000) == 50.0  # one sample in 1000 is above 50
    assert longest_bag(histogram, 10_000) == 500.0
    assert longest_bag(histogram, 10) == 1.0  # 100 of 1000 above 1: one in 10
    assert longest_bag([], 100) == 1.0


def test_a_calls_forward_takes_at_least_its_longest_bags_serial_sum():
    """Forward of a call = max(fixed + work, chain x longest bag); the backward adds as before."""
    hbm = TierTerms(fixed_s=10e-6, lookup_s=1e-9, chain_s=200e-9)
    host = TierTerms(lookup_s=10e-9)  # dearer than HBM, as measured (the model never lets HBM cost more)
    model = CostModel(PassTerms(hbm, host), PassTerms(TierTerms(fixed_s=5e-6, lookup_s=2e-9), host))
    short = TableLoad(0, 1000.0, 1.0, 0.0, 0.0, 64.0, 1e6, longest_bag=10)
    long = dataclasses.replace(short, longest_bag=500)
    backward = 5e-6 + 1000 * 2e-9
    assert placement_cost(model, 1, [short]).max_cost == pytest.approx(
        10e-6 + 1000 * 1e-9 + backward, rel=1e-12
    )
    assert placement_cost(model, 1, [long]).max_cost == pytest.approx(500 * 200e-9 + backward, rel=1e-12)
    # two tables of one call: their work adds, the longest bag is the longer one's
    both = placement_cost(model, 1, [long, dataclasses.replace(short, gpu=0)]).max_cost
    assert both == pytest.approx(max(10e-6 + 2000 * 1e-9, 500 * 200e-9) + 5e-6 + 2000 * 2e-9, rel=1e-12)


def test_a_row_carries_its_optimizers_state():
    """A row's bytes are its weights and the optimizer's fp32 state, as FBGEMM keeps it: none for
    sgd, one value per row for row-wise Adagrad, one per element for Adagrad, two for Adam; the
    older ``optimizer_state_multiplier`` reads as sgd only at 1.0."""
    from recshard_stats.config import parse_hardware_config

    base = {"num_gpus": 2, "hbm_per_gpu_gib": 1, "host_gib": 8}
    dim = 16
    expected = {"sgd": 64, "rowwise_adagrad": 64 + 4, "adagrad": 64 + 64, "adam": 64 + 128}
    for optimizer, row in expected.items():
        assert parse_hardware_config(base | {"optimizer": optimizer}).row_bytes(dim) == row
    half = parse_hardware_config(base | {"optimizer": "adam", "bytes_per_element": 2})
    assert half.row_bytes(dim) == 32 + 128  # fp16 weights, fp32 moments
    legacy = parse_hardware_config(base | {"optimizer_state_multiplier": 1.0})
    assert legacy.optimizer == "sgd" and legacy.row_bytes(dim) == 64
    with pytest.raises(RecShardError, match="drop optimizer_state_multiplier and set optimizer"):
        parse_hardware_config(base | {"optimizer": "adam", "optimizer_state_multiplier": 1.0})
