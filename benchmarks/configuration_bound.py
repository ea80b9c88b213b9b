"""How far a bound that sees each GPU's packing can go: the configuration LP of a model, solved by
column generation, beside the solve's own bound and its plan.

    PYTHONPATH=. .venv/bin/python benchmarks/configuration_bound.py --stats <stats>/ds=2026-12-01 \
        --model conf/synthetic.yaml --hardware conf/hardware.yaml --plan-ms 0.1620 --budget 120

The solve's bound (``waterfill.lower_bound``) pools all GPUs' HBM, so it cannot see that a shard
holding most of a GPU's HBM leaves little to the shards beside it; the plans of the shipped models
stay 2-5% above it. The configuration LP can. A configuration is what one GPU holds: at most one
shard of each table, of one shard count, whose cost, its HBM shared among them (rows fractional,
saving under ``milp.saving_lines``, above the true saving), is at most z. The LP takes
configurations (lambda_c >= 0) and a share u[j, k] of each table cut into k shards
(sum_k u[j, k] = 1), with every chosen shard in some configuration
(sum_c lambda_c [c holds a shard (j, k)] >= k u[j, k]), and minimises sum_c lambda_c, the GPUs it
takes. Every plan of cost at most z is such a choice with integer lambda (the shards of a table
need not even keep the same rows here), so when the LP needs more than G GPUs, no plan costs
z or less: z is a lower bound. Column generation adds the configuration with the most dual value
(a MILP, HiGHS); the master's value over (the most dual value any configuration has, the pricing
MILP's own bound) is a lower bound on the LP's value at every step (Farley's bound), so a z is
proven as soon as that exceeds G. When the master itself fits in G GPUs, the LP cannot prove z.

Each z is tested within ``--budget`` seconds: first the plan's cost over 1.01 (can this bound prove
the plan within 1%?), then the interval between the solve's bound and the plan is bisected
``--steps`` times. Linear models only: kernel calls' fixed costs and longest bags count only as
the least any GPU's calls cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import time

import highspy
import numpy as np

from recshard_stats.config import load_hardware_config, load_model_config
from recshard_stats.solver.aligned_blocks import ShardOption, shard_options
from recshard_stats.solver.problem import build_problem
from recshard_stats.solver.waterfill import colwise_matrix, lower_bound, run_highs
from recshard_stats.stats_reader import load_stats
from recshard_stats.units import MS_PER_S

_INF = highspy.kHighsInf
_DUAL_TOL = 1e-6  # the share of G (and of one) the LP's numbers must clear


class Outcome(enum.Enum):
    PROVEN = "proven"  # the LP needs more than G GPUs: no plan costs z or less
    FITS = "fits"  # the master fits in G GPUs: this LP cannot prove z
    UNKNOWN = "unknown"  # out of time


@dataclasses.dataclass(frozen=True)
class Test:
    z_ms: float
    outcome: Outcome
    iterations: int
    master: float  # GPUs the restricted master takes (an upper bound on the LP's value)
    farley: float  # a lower bound on the LP's value
    seconds: float


def _master(options: list[ShardOption], configs: list[list[int]]) -> tuple[float, np.ndarray]:
    """(GPUs the configurations found so far take, each option's dual value)."""
    tables = sorted({o.table for o in options})
    row_of_table = {j: len(options) + r for r, j in enumerate(tables)}
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(configs) + len(options), len(options) + len(tables)
    lp.col_cost_ = np.concatenate([np.ones(len(configs)), np.zeros(len(options))])
    lp.col_lower_, lp.col_upper_ = np.zeros(lp.num_col_), np.full(lp.num_col_, _INF)
    # per option: its shards in configurations >= count * u; per table: its u sum to one
    lp.row_lower_ = np.concatenate([np.zeros(len(options)), np.ones(len(tables))])
    lp.row_upper_ = np.concatenate([np.full(len(options), _INF), np.ones(len(tables))])
    columns = [[(i, 1.0) for i in c] for c in configs]
    columns += [[(i, -float(o.count)), (row_of_table[o.table], 1.0)] for i, o in enumerate(options)]
    colwise_matrix(lp, columns)
    solver = run_highs(lp, _INF)
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"the master LP ended {solver.getModelStatus()}")
    duals = np.maximum(np.asarray(solver.getSolution().row_dual)[: len(options)], 0.0)
    return solver.getInfo().objective_function_value, duals


def _price(
    options: list[ShardOption], duals: np.ndarray, z_ms: float, time_limit: float
) -> tuple[float, list[int]]:
    """(a bound on the most dual value one configuration of cost <= z holds, the best one found).
    Columns per option: b (holds it), f (share of its rows in HBM), y (share of its saving)."""
    idx = [i for i in range(len(options)) if duals[i] > 1e-12]
    n = len(idx)
    rows: list[tuple[list[tuple[int, float]], float]] = []  # (terms, upper); every lower is -inf
    for a, i in enumerate(idx):
        o = options[i]
        rows.append(([(n + a, 1.0), (a, -1.0)], 0.0))  # f <= b
        rows.append(([(2 * n + a, 1.0), (a, -1.0)], 0.0))  # y <= b
        rows += [([(2 * n + a, 1.0), (n + a, -s), (a, -b)], 0.0) for s, b in o.lines]
    for j in {options[i].table for i in idx}:  # one shard count of a table
        counts = [a for a, i in enumerate(idx) if options[i].table == j]
        if len(counts) > 1:
            rows.append(([(a, 1.0) for a in counts], 1.0))
    rows.append(
        (
            [(a, options[i].buffers) for a, i in enumerate(idx)]
            + [(n + a, options[i].size) for a, i in enumerate(idx)],
            1.0,
        )
    )
    rows.append(
        (
            [(a, options[i].uvm_ms) for a, i in enumerate(idx)]
            + [(2 * n + a, -options[i].saved_ms) for a, i in enumerate(idx)],
            z_ms,
        )
    )
    columns: list[list[tuple[int, float]]] = [[] for _ in range(3 * n)]
    for r, (terms, _) in enumerate(rows):
        for c, v in terms:
            columns[c].append((r, v))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = 3 * n, len(rows)
    lp.col_cost_ = np.concatenate([duals[idx], np.zeros(2 * n)])
    lp.col_lower_, lp.col_upper_ = np.zeros(3 * n), np.ones(3 * n)
    lp.row_lower_ = np.full(len(rows), -_INF)
    lp.row_upper_ = np.array([upper for _, upper in rows])
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n + [highspy.HighsVarType.kContinuous] * (2 * n)
    colwise_matrix(lp, columns)
    solver = run_highs(lp, time_limit, mip_rel_gap=1e-6)
    bound = solver.getInfo().mip_dual_bound
    if not np.isfinite(bound):
        return float(duals.sum()), []  # no bound found in time: what every option together holds
    solution = solver.getSolution()
    if not solution.value_valid:
        return float(bound), []
    held = np.asarray(solution.col_value)[:n]
    return float(bound), [idx[a] for a in range(n) if held[a] > 0.5]


def test(options: list[ShardOption], num_gpus: int, z_ms: float, budget_s: float) -> Test:
    """Whether the configuration LP proves that no plan costs ``z_ms`` or less."""
    t0 = time.time()
    deadline = t0 + budget_s
    # a shard alone is a configuration when its cost fits; a table none of whose shards fits
    # alone cannot be placed at all
    configs = [[i] for i, o in enumerate(options) if o.alone_ms() <= z_ms]
    if {options[c[0]].table for c in configs} != {o.table for o in options}:
        return Test(z_ms, Outcome.PROVEN, 0, float("inf"), float("inf"), time.time() - t0)
    master = farley = 0.0
    iterations = 0
    while time.time() < deadline:
        iterations += 1
        master, duals = _master(options, configs)
        if master <= num_gpus * (1 - _DUAL_TOL):
            return Test(z_ms, Outcome.FITS, iterations, master, farley, time.time() - t0)
        most, config = _price(options, duals, z_ms, deadline - time.time())
        farley = max(farley, master / max(most, 1.0))
        if farley > num_gpus * (1 + _DUAL_TOL):
            return Test(z_ms, Outcome.PROVEN, iterations, master, farley, time.time() - t0)
        if most <= 1 + _DUAL_TOL or not config or config in configs:
            break  # the LP is solved: its value is at most G (or the pricing found nothing new)
        configs.append(config)
    return Test(z_ms, Outcome.UNKNOWN, iterations, master, farley, time.time() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stats", required=True, help="a stats partition")
    parser.add_argument("--model", default="conf/synthetic.yaml")
    parser.add_argument("--hardware", default="conf/hardware.yaml")
    parser.add_argument("--plan-ms", type=float, required=True, help="the plan's cost to bound (ms)")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per z tested (default 120)")
    parser.add_argument("--steps", type=int, default=4, help="bisections after the 1%% test (default 4)")
    parser.add_argument("--max-column-shards", type=int, default=8)
    parser.add_argument("--cdf-segments", type=int, default=32)
    args = parser.parse_args()

    problem = build_problem(
        load_stats(args.stats), load_model_config(args.model), load_hardware_config(args.hardware)
    )
    options = shard_options(problem, args.max_column_shards, args.cdf_segments)
    least = problem.hardware.costs.least_group_seconds * MS_PER_S if problem.tables else 0.0
    low = lower_bound(problem, args.max_column_shards) * MS_PER_S
    high = args.plan_ms
    print(
        f"{len(problem.tables)} tables x {problem.num_gpus} GPUs, {len(options)} shard options; "
        f"the solve's bound {low:.5f} ms, the plan {high:.5f} ms ({(high / low - 1) * 100:.2f}% above)"
    )
    print(f"{'z ms':>9} {'outcome':>8} {'iter':>5} {'master':>8} {'farley':>8} {'s':>6}")
    proven = low
    for step in range(args.steps + 1):
        z = high / 1.01 if step == 0 else (proven + high) / 2
        result = test(options, problem.num_gpus, z - least, args.budget)
        print(
            f"{z:9.5f} {result.outcome.value:>8} {result.iterations:5d} {result.master:8.4f} "
            f"{result.farley:8.4f} {result.seconds:6.1f}",
            flush=True,
        )
        if result.outcome is Outcome.PROVEN:
            proven = max(proven, z)
        else:
            high = z  # this LP cannot prove z (or not in time): look below it
    print(
        f"proven by the configuration LP: {proven:.5f} ms; the plan {args.plan_ms:.5f} ms is "
        f"{(args.plan_ms / proven - 1) * 100:.2f}% above it (the solve's bound: "
        f"{(args.plan_ms / low - 1) * 100:.2f}%)"
    )


if __name__ == "__main__":
    main()
