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

With torchrec installed, TorchRec's own planner plans the same instance too (as it comes, and fed
the profile's statistics; see ``recshard_stats.torchrec.torchrec_baselines``): its plans are costed
in our model beside the greedy baselines, and every plan, RecShard's included, is rated in
TorchRec's perf model, with TorchRec's HBM estimate of its busiest rank against the usable HBM.
``--sizes example`` takes the tables and hardware of ``--model`` / ``--hardware`` as they are.

    .venv/bin/python benchmarks/solver_bench.py --stats example_run/stats/ds=2026-12-01 --sizes example \
        --model conf/synthetic.yaml --hardware conf/hardware_example.yaml --solvers highs
"""

from __future__ import annotations

import argparse
import time

import numpy as np


from recshard_stats.config import HardwareConfig, load_hardware_config, load_model_config
from recshard_stats.stats_reader import load_stats
from recshard_stats.solver import milp
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.heuristic import balanced_plan
from recshard_stats.solver.local_search import improve, lpt_plan
from recshard_stats.options import SolveOptions
from recshard_stats.solver.plan import cost_plan
from recshard_stats.solver.problem import Problem, TableDemand, build_problem
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
                        help="glpk, cbc, highs, heuristic (the balanced warm start alone) or search (the LPT "
                             "start and the local search alone)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--mip-gap", type=float, default=0.01)
    parser.add_argument("--local-search", type=float, default=SolveOptions.local_search_s,
                        help="seconds of local search (in each solve: half before the MILP, half after)")
    parser.add_argument("--pressure", type=float, default=5.0, help="total table bytes / total HBM")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="conf/synthetic.yaml", help="with --sizes example: the model config")
    parser.add_argument("--hardware", default="conf/hardware_example.yaml", help="with --sizes example")
    parser.add_argument("--no-torchrec", action="store_true", help="skip TorchRec's planner even if installed")
    parser.add_argument("--torchrec-timeout", type=int, default=300,
                        help="TorchRec's planning time limit per variant, seconds (it keeps its best plan so far)")
    args = parser.parse_args()

    for size in args.sizes:
        if size == "example":
            problem = build_problem(load_stats(args.stats), load_model_config(args.model),
                                    load_hardware_config(args.hardware))
        else:
            n, g = (int(x) for x in size.split("x"))
            problem = instance(args.stats, n, g, args.pressure, args.seed)
        total = sum(t.size_bytes for t in problem.tables)
        print(f"\n== {size}: {len(problem.tables)} tables x {problem.num_gpus} GPUs, table bytes "
              f"{total / (problem.hbm_capacity * problem.num_gpus):.1f}x usable HBM ({total / 2**30:.1f} GiB of tables) ==",
              flush=True)
        torchrec = None if args.no_torchrec else torchrec_rows(problem, args.torchrec_timeout)
        for solver in args.solvers:
            if solver == "heuristic":  # the MILP's warm start alone, for sizes the MILP cannot take
                t0 = time.time()
                plan = cost_plan(problem, balanced_plan(problem))
                wall, bound = time.time() - t0, lower_bound(problem)
                print(f"heuristic: {wall:.1f}s wall, gap to lower bound {plan.max_cost / bound - 1:.2%}")
                report([plan, *(cost_plan(problem, p) for p in all_baselines(problem))])
                continue
            if solver == "search":  # the LPT start and the local search alone, no MILP
                t0 = time.time()
                start = lpt_plan(problem)
                lpt_wall = time.time() - t0
                plan = cost_plan(problem, improve(problem, start, args.local_search))
                wall, bound = time.time() - t0, lower_bound(problem)
                lpt_gap = cost_plan(problem, start).max_cost / bound - 1
                print(f"search: {wall:.1f}s wall (LPT {lpt_wall:.1f}s, gap {lpt_gap:.2%}), "
                      f"gap to lower bound {plan.max_cost / bound - 1:.2%}", flush=True)
                report([plan, *(cost_plan(problem, p) for p in all_baselines(problem))])
                continue
            if not milp.available(solver):
                print(f"{solver}: not installed")
                continue
            t0 = time.time()
            try:
                # TorchRec's planner runs once per instance, above, not once per solver
                outcome = solve_problem(problem, SolveOptions(solver=solver, time_limit_s=args.time_limit,
                                                              mip_gap=args.mip_gap, local_search_s=args.local_search,
                                                              torchrec_baselines=False))
            except Exception as exc:  # a benchmark reports a failed solver and goes on
                print(f"{solver}: failed after {time.time() - t0:.1f}s: {exc}", flush=True)
                continue
            wall = time.time() - t0
            best = outcome.best
            print(f"{solver}: {wall:.1f}s wall (MILP {outcome.milp.solve_seconds:.1f}s with its build "
                  f"{outcome.milp.build_seconds:.1f}s, status {outcome.milp.status}, "
                  f"plan from {outcome.source}), gap to lower bound {outcome.gap:.2%}", flush=True)
            report([best, *outcome.baselines])
            if torchrec is not None:
                report_torchrec(problem, best, outcome.baselines, torchrec)


def torchrec_rows(problem: Problem, timeout_s: int):
    """TorchRec's planner on the instance, or None where torchrec is not installed."""
    try:
        from recshard_stats.torchrec import torchrec_baselines
    except ImportError:
        print("torchrec: not installed (scripts/setup.sh installs it)")
        return None
    return torchrec_baselines(problem, timeout_s)


def report_torchrec(problem: Problem, best, greedy, baselines) -> None:
    """Every plan in both cost models: RecShard's and the greedy ones (pinned to their ranks and
    kernels) and TorchRec's own, with TorchRec's HBM estimate of the busiest rank / usable HBM."""
    from recshard_stats.torchrec import rate_in_torchrec

    print(f"  {'plan':<20} {'max GPU ms':>10} {'gain':>7} {'imbalance':>9} {'UVM acc':>8} {'TorchRec ms':>11} "
          f"{'HBM need/usable':>15} {'plan s':>7}  layouts")
    for cost in (best, *greedy):
        rating = rate_in_torchrec(problem, cost.plan.gpu, cost.plan.rows_hbm)
        name = "recshard" if cost is best else cost.plan.name
        print(f"  {name:<20} {cost.max_cost * 1e3:>10.4f} {cost.max_cost / best.max_cost:>6.2f}x "
              f"{cost.imbalance:>9.2f} {cost.uvm_access_fraction:>8.2%} {rating.rating_ms:>11.4f} "
              f"{max(rating.hbm_needed) / rating.hbm_usable:>14.2f}x {'':>7}  table_wise, pinned", flush=True)
    for b in baselines:
        if b.cost is None:
            print(f"  {b.name:<20} no plan after {b.planning_seconds:.1f}s: {b.error.splitlines()[0]}")
            continue
        print(f"  {b.name:<20} {b.cost.max_cost * 1e3:>10.4f} {b.cost.max_cost / best.max_cost:>6.2f}x "
              f"{b.cost.imbalance:>9.2f} {b.cost.uvm_access_fraction:>8.2%} {b.torchrec_rating_ms:>11.4f} "
              f"{'':>15} {b.planning_seconds:>7.1f}  {', '.join(f'{k}: {v}' for k, v in sorted(b.layouts.items()))}",
              flush=True)


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
