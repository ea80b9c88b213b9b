"""The MILP of aligned blocks (``solver/aligned_blocks.py``) alone, for a given time, with each
number of lines over the savings asked for, from every table cut as much as it may be (one shard
on each GPU, split exactly) and from nothing: the plan HiGHS ends with, split exactly, beside the
start and the solve's bound.

    PYTHONPATH=. .venv/bin/python benchmarks/aligned_blocks_bench.py --stats <stats>/ds=2026-12-01 \\
        --model conf/synthetic.yaml --hardware conf/hardware.yaml --seconds 30 --segments 6 16
"""

from __future__ import annotations

import argparse
import time

from recshard_stats.config import load_hardware_config, load_model_config
from recshard_stats.solver.aligned_blocks import aligned_plan
from recshard_stats.solver.column_split import cuts_of, split_problem
from recshard_stats.solver.plan import Plan, cost_plan, violations
from recshard_stats.solver.problem import build_problem
from recshard_stats.solver.waterfill import lower_bound, split_assignment
from recshard_stats.stats_reader import load_stats
from recshard_stats.units import MS_PER_S


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stats", required=True, help="a stats partition")
    parser.add_argument("--model", default="conf/synthetic.yaml")
    parser.add_argument("--hardware", default="conf/hardware.yaml")
    parser.add_argument("--seconds", type=float, default=30.0, help="HiGHS's time per run (default 30)")
    parser.add_argument("--segments", type=int, nargs="+", default=[6, 16], help="lines per saving")
    parser.add_argument("--max-column-shards", type=int, default=8)
    args = parser.parse_args()

    problem = build_problem(
        load_stats(args.stats), load_model_config(args.model), load_hardware_config(args.hardware)
    )
    bound = lower_bound(problem, args.max_column_shards)
    cuts = tuple(t.most_column_shards(problem.num_gpus, args.max_column_shards) for t in problem.tables)
    all_cut = split_problem(problem, cuts)
    gpu = tuple(i for k in cuts for i in range(k))
    start_ms = cost_plan(all_cut, Plan("all_cut", gpu, split_assignment(all_cut, gpu))).max_cost * MS_PER_S
    print(
        f"{len(problem.tables)} tables x {problem.num_gpus} GPUs; bound {bound * MS_PER_S:.5f} ms; "
        f"every table cut as much as it may be: {start_ms:.5f} ms ({(start_ms / bound / MS_PER_S - 1) * 100:.2f}%)"
    )
    print(f"{'lines':>5} {'from':>8} {'plan ms':>9} {'gap':>7} {'s':>6}  shards per table")
    for segments in args.segments:
        for name, from_all_cut in (("all cut", True), ("nothing", False)):
            t0 = time.time()
            found = aligned_plan(
                problem, args.max_column_shards, segments, time.time() + args.seconds, from_all_cut
            )
            seconds = time.time() - t0
            if found is None:
                print(f"{segments:5d} {name:>8} {'none':>9}")
                continue
            placed, plan = found
            cost = cost_plan(placed, plan)
            assert not violations(placed, plan, cost), violations(placed, plan, cost)
            shards = ",".join(map(str, cuts_of(placed)))
            print(
                f"{segments:5d} {name:>8} {cost.max_cost * MS_PER_S:9.5f} "
                f"{(cost.max_cost / bound - 1) * 100:6.2f}% {seconds:6.1f}  {shards}",
                flush=True,
            )


if __name__ == "__main__":
    main()
