"""Where a plan's time goes under a model with kernel-call costs, and what the polish that counts
them (``solver/kernel_groups.refine``) does with its time.

    PYTHONPATH=. .venv/bin/python benchmarks/call_polish_bench.py \
        --stats example_run/windows/ds=2026-12-01 --hardware conf/hardware_example.yaml

Prints: the default solve (``--time-limit``), each refine call inside it (its budget, the
seconds it used, the plan before and after), and per GPU of the shipped plan its cost, the
tables' own terms and the rest (the calls' fixed costs and their longest bags); then the polish
alone from the best whole-table baseline: the descent without kicks (seconds until it stops),
and with kicks for ``--kick-seconds``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from recshard_stats.config import load_hardware_config, load_model_config
from recshard_stats.costmodel import placement_cost
from recshard_stats.options import SolveOptions
from recshard_stats.solver import kernel_groups, solve
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.plan import cost_plan
from recshard_stats.solver.problem import build_problem
from recshard_stats.stats_reader import load_stats
from recshard_stats.units import MS_PER_S, US


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stats", required=True)
    parser.add_argument("--model", default="conf/synthetic.yaml")
    parser.add_argument("--hardware", default="conf/hardware_example.yaml")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--kick-seconds", type=float, default=18.0)
    args = parser.parse_args()
    problem = build_problem(
        load_stats(args.stats), load_model_config(args.model), load_hardware_config(args.hardware)
    )
    costs = problem.hardware.costs

    plain_refine = kernel_groups.refine

    def timed_refine(placed, plan, time_s, name=None, seed=0):
        t0, before = time.time(), cost_plan(placed, plan).max_cost
        out = plain_refine(placed, plan, time_s, name, seed)
        print(
            f"  refine: budget {time_s:.1f}s, used {time.time() - t0:.1f}s, "
            f"{before * MS_PER_S:.4f} -> {cost_plan(placed, out).max_cost * MS_PER_S:.4f} ms"
        )
        return out

    solve.refine = timed_refine  # the solve's own calls, timed
    t0 = time.time()
    outcome = solve.solve_problem(
        problem, SolveOptions(time_limit_s=args.time_limit, torchrec_baselines=False)
    )
    solve.refine = plain_refine
    print(f"default solve: {outcome.best.max_cost * MS_PER_S:.4f} ms in {time.time() - t0:.1f}s")
    placed, plan = outcome.placed or problem, outcome.best.plan
    for g in range(problem.num_gpus):
        loads = [
            dataclasses.replace(placed.load(placed.tables[j], plan.rows_hbm[j], placed.comm_bytes[j]), gpu=0)
            for j in range(len(placed.tables))
            if plan.gpu[j] == g
        ]
        total = placement_cost(costs, 1, loads).max_cost if loads else 0.0
        own = sum(float(costs.table_seconds(load)) for load in loads)
        print(
            f"  GPU {g}: {total / US:.1f} us, tables' terms {own / US:.1f}, calls and longest bags {(total - own) / US:.1f}"
        )

    baseline = min(all_baselines(problem), key=lambda b: cost_plan(problem, b).max_cost)
    start = solve.polish(problem, baseline)
    # commits before the kicks had none: their polish runs once, to its end
    kick_counts = (
        [0, kernel_groups.KICKS_WITHOUT_GAIN] if hasattr(kernel_groups, "KICKS_WITHOUT_GAIN") else [0]
    )
    for kicks in kick_counts:
        saved = getattr(kernel_groups, "KICKS_WITHOUT_GAIN", 0)
        kernel_groups.KICKS_WITHOUT_GAIN = kicks
        budget = args.kick_seconds if kicks else 600.0
        t0 = time.time()
        out = kernel_groups.refine(problem, start, budget)
        kernel_groups.KICKS_WITHOUT_GAIN = saved
        print(
            f"polish from the best baseline, {'no kicks' if kicks == 0 else f'kicks for {budget:.0f}s'}: "
            f"{cost_plan(problem, out).max_cost * MS_PER_S:.4f} ms after {time.time() - t0:.1f}s"
        )


if __name__ == "__main__":
    main()
