"""Each cut of the ladder (``solver/column_split.cut_ladder``) searched on its own, beside its own
lower bound: where a model's plan loses against the bound, in the search of a cut or in the cuts.

    PYTHONPATH=. .venv/bin/python benchmarks/ladder_bench.py --stats <stats>/ds=2026-12-01 \
        --model conf/criteo_kaggle.yaml --hardware conf/hardware_criteo.yaml --budget 3

Per cut, most cut first (as the solve tries them): the plan the solve's search of that cut finds
(``solve.search_cut``: its starts, then the local search for ``--budget`` seconds, the exact
split), the seconds it took, and the lower bound of plans of exactly that cut (the model cut so,
then ``waterfill.lower_bound`` of it whole: the pooled bound with every shard's buffers). The
bound over every cut (what the solve reports its gap to) comes first. A cut whose plan is far
above its own bound is the search's loss; a cut whose bound is above the best plan cannot help.
"""

from __future__ import annotations

import argparse
import time

from recshard_stats.config import load_hardware_config, load_model_config
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.column_split import cut_ladder, split_problem
from recshard_stats.solver.local_search import GpuCostModel
from recshard_stats.solver.plan import cost_plan
from recshard_stats.solver.problem import build_problem
from recshard_stats.solver.solve import search_cut
from recshard_stats.solver.waterfill import lower_bound
from recshard_stats.stats_reader import load_stats
from recshard_stats.units import MS_PER_S


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stats", required=True, help="a stats partition")
    parser.add_argument("--model", default="conf/synthetic.yaml")
    parser.add_argument("--hardware", default="conf/hardware.yaml")
    parser.add_argument("--budget", type=float, default=3.0, help="search seconds per cut (default 3)")
    parser.add_argument("--max-column-shards", type=int, default=8)
    args = parser.parse_args()

    problem = build_problem(
        load_stats(args.stats), load_model_config(args.model), load_hardware_config(args.hardware)
    )
    baselines = tuple(cost_plan(problem, b) for b in all_baselines(problem))
    print(
        f"{len(problem.tables)} tables x {problem.num_gpus} GPUs; bound over every cut "
        f"{lower_bound(problem, args.max_column_shards) * MS_PER_S:.5f} ms"
    )
    print(f"{'plan ms':>9} {'cut bound ms':>12} {'above':>7} {'s':>5}  shards per table")
    models: dict[tuple[int, ...], GpuCostModel] = {}
    for i, cuts in enumerate(cut_ladder(problem, args.max_column_shards)):
        t0 = time.time()
        found = search_cut(problem, cuts, baselines, args.budget, models, first=i == 0)
        seconds = time.time() - t0
        bound = lower_bound(split_problem(problem, cuts), 1)
        plan = found.cost.max_cost if found else float("nan")
        print(
            f"{plan * MS_PER_S:9.5f} {bound * MS_PER_S:12.5f} {(plan / bound - 1) * 100:6.2f}% "
            f"{seconds:5.1f}  {','.join(map(str, cuts))}"
        )


if __name__ == "__main__":
    main()
