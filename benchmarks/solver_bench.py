"""Sharding quality and solve time at paper scale, every solver and baseline side by side.

    .venv/bin/python benchmarks/solver_bench.py --stats /tmp/recshard-bench/stats-10000000/ds=2026-12-01 \
        --sizes 100x8 400x16 1000x64 --solvers glpk cbc highs --time-limit 60

Instances: N tables cloned from the profiled tables of a stats partition (their real
count-of-counts, so real access CDFs and unseen-row mass), each with a random dim (16..256)
and a random traffic multiplier (0.2..5x); per-GPU HBM sized so that all table bytes are
``--pressure`` (default 5) times all HBM. Reports per solver: build + solve seconds, the
plan's gap to the lower bound, and for every plan (RecShard and the greedy baselines) the
slowest GPU's cost relative to RecShard's (the throughput gain), load imbalance (max/mean
GPU cost) and the share of accesses served from UVM.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


from recshard_stats.config import HardwareConfig
from recshard_stats.stats_reader import load_stats
from recshard_stats.solver import milp
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.heuristic import balanced_plan
from recshard_stats.options import SolveOptions
from recshard_stats.solver.plan import cost_plan
from recshard_stats.solver.problem import Problem, TableDemand
from recshard_stats.solver.solve import solve_problem
from recshard_stats.solver.waterfill import lower_bound


def instance(stats_path: str, num_tables: int, num_gpus: int, pressure: float, seed: int) -> Problem:
    stats = load_stats(stats_path)
    profiled = [r for r in stats.rows("tables") if r["total_accesses"] > 0]
    rng = np.random.default_rng(seed)
    tables = []
    for j in range(num_tables):
        row = profiled[j % len(profiled)]
        dim = int(rng.choice([16, 32, 64, 128, 256]))
        tables.append(TableDemand(
            name=f"t{j:04d}_{row['table']}", features=(f"f{j}",), hash_size=row["hash_size"], dim=dim,
            hash=row["hash"], row_bytes=dim * 4.0,
            accesses_per_batch=65536 * row["accesses_per_sample"] * float(rng.uniform(0.2, 5.0)),
            coc=stats.count_of_counts("table", row["table"]), pooling_factor=1.0))
    total = sum(t.size_bytes for t in tables)
    hw = HardwareConfig(num_gpus=num_gpus, hbm_bytes_per_gpu=int(total / pressure / num_gpus),
                        hbm_reserved_fraction=0.0, host_bytes=int(total * 2), hbm_bandwidth=897e9,
                        uvm_bandwidth=32e9, batch_size=65536, bytes_per_element=4, optimizer_state_multiplier=1.0)
    return Problem(tuple(tables), hw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stats", required=True, help="a stats partition (e.g. from benchmarks/profile_bench.py)")
    parser.add_argument("--sizes", nargs="+", default=["100x8", "400x16", "1000x64"])
    parser.add_argument("--solvers", nargs="+", default=["glpk", "cbc", "highs"],
                        help="glpk, cbc, highs, or heuristic (the balanced warm start alone)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--mip-gap", type=float, default=0.01)
    parser.add_argument("--pressure", type=float, default=5.0, help="total table bytes / total HBM")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    for size in args.sizes:
        n, g = (int(x) for x in size.split("x"))
        problem = instance(args.stats, n, g, args.pressure, args.seed)
        print(f"\n== {n} tables x {g} GPUs, table bytes {args.pressure:g}x HBM "
              f"({sum(t.size_bytes for t in problem.tables) / 2**30:.1f} GiB of tables) ==", flush=True)
        for solver in args.solvers:
            if solver == "heuristic":  # the MILP's warm start alone, for sizes the MILP cannot take
                t0 = time.time()
                plan = cost_plan(problem, balanced_plan(problem))
                wall, bound = time.time() - t0, lower_bound(problem)
                print(f"heuristic: {wall:.1f}s wall, gap to lower bound {plan.max_cost / bound - 1:.2%}")
                report([plan, *(cost_plan(problem, p) for p in all_baselines(problem))])
                continue
            if not milp.available(solver):
                print(f"{solver}: not installed")
                continue
            t0 = time.time()
            try:
                outcome = solve_problem(problem, SolveOptions(solver=solver, time_limit_s=args.time_limit, mip_gap=args.mip_gap))
            except Exception as exc:  # a benchmark reports a failed solver and goes on
                print(f"{solver}: failed after {time.time() - t0:.1f}s: {exc}", flush=True)
                continue
            wall = time.time() - t0
            best = outcome.best
            print(f"{solver}: {wall:.1f}s wall (MILP {outcome.milp.solve_seconds:.1f}s, status {outcome.milp.status}, "
                  f"plan from {outcome.source}), gap to lower bound {outcome.gap:.2%}", flush=True)
            report([best, *outcome.baselines])


def report(plans) -> None:
    """The first plan is RecShard's; gains are relative to it."""
    best = plans[0]
    print(f"  {'plan':<20} {'max GPU ms':>10} {'gain':>7} {'imbalance':>9} {'UVM acc':>8}")
    for ev in plans:
        name = "recshard" if ev is best else ev.plan.name
        print(f"  {name:<20} {ev.max_cost * 1e3:>10.4f} {ev.max_cost / best.max_cost:>6.2f}x "
              f"{ev.imbalance:>9.2f} {ev.uvm_access_fraction:>8.2%}", flush=True)


if __name__ == "__main__":
    main()
