"""Sharding quality and solve time at paper scale, every method side by side, over seeds.

    .venv/bin/python benchmarks/solver_bench.py --stats /tmp/recshard-bench/bench-stats-10000000/ds=2026-12-01 \
        --sizes 100x8 400x16 1000x64 4000x256 --seeds 0 1 2 --solvers cbc glpk highs --no-torchrec

Instances: N tables cloned from the profiled tables of a stats partition (their real
count-of-counts, so real access CDFs and unseen-row mass), each with a random dim (16..256)
and a random traffic multiplier (0.2..5x); per-GPU HBM sized so that all table bytes are
``--pressure`` (default 5) times all HBM; one instance per seed. Methods: the greedy baselines
(whole tables), the warm start (the balanced plan, hot tables cut into column shards), the LPT
start with the local search alone (``--local-search`` seconds) and each MILP solver's whole solve
(``--time-limit`` seconds: starts, search, MILP, search again). Per method: wall seconds, the
slowest GPU's cost, the gap to the best valid bound any method found for the instance (plans
with at most ``--max-column-shards`` shards per table), imbalance (max/mean GPU cost) and the
share of accesses served from UVM; then the mean over the seeds and the worst gap.

With torchrec installed, TorchRec's own planner plans the same instance too (as it comes, and fed
the profile's statistics; see ``recshard_stats.torchrec_planner.torchrec_baselines``): its plans are costed
in our model beside the greedy baselines, and every plan, RecShard's included, is rated in
TorchRec's perf model, with TorchRec's HBM estimate of its busiest rank against the usable HBM.
``--sizes example`` takes the tables and hardware of ``--model`` / ``--hardware`` as they are.

    .venv/bin/python benchmarks/solver_bench.py --stats example_run/stats/ds=2026-12-01 --sizes example \
        --model conf/synthetic.yaml --hardware conf/hardware_example.yaml --solvers highs
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from recshard_stats.config import HardwareConfig, load_hardware_config, load_model_config
from recshard_stats.options import SolveOptions
from recshard_stats.solver import milp
from recshard_stats.solver.baselines import all_baselines
from recshard_stats.solver.column_split import choose_shards, split_problem, table_shards
from recshard_stats.solver.heuristic import balanced_plan
from recshard_stats.solver.local_search import improve, lpt_plan
from recshard_stats.solver.plan import PlanCost, cost_plan
from recshard_stats.solver.problem import Problem, TableDemand, build_problem
from recshard_stats.solver.solve import solve_problem
from recshard_stats.solver.waterfill import lower_bound
from recshard_stats.stats_reader import load_stats


def instance(
    stats_path: str,
    num_tables: int,
    num_gpus: int,
    pressure: float,
    seed: int,
    calibration: str | None = None,
) -> Problem:
    stats = load_stats(stats_path)
    profiled = [r for r in stats.rows("tables") if r["total_accesses"] > 0]
    rng = np.random.default_rng(seed)
    tables = []
    for j in range(num_tables):
        row = profiled[j % len(profiled)]
        dim = int(rng.choice([16, 32, 64, 128, 256]))
        tables.append(
            TableDemand(
                name=f"t{j:04d}_{row['table']}",
                features=(f"f{j}",),
                hash_size=row["hash_size"],
                dim=dim,
                hash=row["hash"],
                row_bytes=dim * 4.0,
                accesses_per_batch=65536 * row["accesses_per_sample"] * float(rng.uniform(0.2, 5.0)),
                coc=stats.count_of_counts("table", row["table"]),
                pooling_factor=1.0,
            )
        )
    total = sum(t.size_bytes for t in tables)
    hw = HardwareConfig(
        num_gpus=num_gpus,
        hbm_bytes_per_gpu=int(total / pressure / num_gpus),
        hbm_reserved_fraction=0.0,
        host_bytes=int(total * 2),
        hbm_bandwidth=897e9,
        uvm_bandwidth=32e9,
        batch_size=65536,
        bytes_per_element=4,
    )
    if calibration:  # the measured cost model instead of the two bandwidths
        from recshard_stats.config import read_config_file
        from recshard_stats.costmodel import calibration_from_file

        hw = dataclasses.replace(
            hw, cost_model=calibration_from_file(read_config_file(calibration), calibration)
        )
    return Problem(tuple(tables), hw)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--stats", required=True, help="a stats partition (e.g. from benchmarks/profile_bench.py)"
    )
    parser.add_argument("--sizes", nargs="+", default=["100x8", "400x16", "1000x64", "4000x256"])
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="one instance per seed and size"
    )
    parser.add_argument(
        "--solvers", nargs="+", default=["cbc", "glpk", "highs"], help="MILP solvers: glpk, cbc, highs"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=SolveOptions.time_limit_s,
        help="seconds for each whole solve (and for the local search alone, the search budget)",
    )
    parser.add_argument("--mip-gap", type=float, default=SolveOptions.mip_gap)
    parser.add_argument(
        "--local-search",
        type=float,
        default=SolveOptions.local_search_s,
        help="seconds of local search (in each solve: half before the MILP, half after; alone: all)",
    )
    parser.add_argument("--max-column-shards", type=int, default=SolveOptions.max_column_shards)
    parser.add_argument("--pressure", type=float, default=5.0, help="total table bytes / total HBM")
    parser.add_argument(
        "--model", default="conf/synthetic.yaml", help="with --sizes example: the model config"
    )
    parser.add_argument("--hardware", default="conf/hardware_example.yaml", help="with --sizes example")
    parser.add_argument(
        "--calibration",
        default=None,
        help="a `recshard calibrate` file: the NxG instances use its cost model (default: v1 bandwidths)",
    )
    parser.add_argument(
        "--no-torchrec", action="store_true", help="skip TorchRec's planner even if installed"
    )
    parser.add_argument(
        "--torchrec-timeout",
        type=int,
        default=300,
        help="TorchRec's planning time limit per variant, seconds (it keeps its best plan)",
    )
    args = parser.parse_args()

    for size in args.sizes:
        rows: list[Row] = []
        for seed in args.seeds if size != "example" else [0]:
            if size == "example":
                problem = build_problem(
                    load_stats(args.stats), load_model_config(args.model), load_hardware_config(args.hardware)
                )
            else:
                n, g = (int(x) for x in size.split("x"))
                problem = instance(args.stats, n, g, args.pressure, seed, args.calibration)
            total = sum(t.size_bytes for t in problem.tables)
            print(
                f"\n== {size}, seed {seed}: {len(problem.tables)} tables x {problem.num_gpus} GPUs, table bytes "
                f"{total / (problem.hbm_capacity * problem.num_gpus):.1f}x usable HBM "
                f"({total / 2**30:.1f} GiB of tables) ==",
                flush=True,
            )
            rows += run_methods(problem, seed, args)
        print_summary(size, rows)


@dataclasses.dataclass
class Row:
    method: str
    seed: int
    wall_s: float
    cost: PlanCost
    bound: float  # the best valid bound of this instance (set once every method ran)
    detail: str = ""

    @property
    def gap(self) -> float:
        return self.cost.max_cost / self.bound - 1 if self.bound > 0 else 0.0


def run_methods(problem: Problem, seed: int, args) -> list[Row]:
    """Every method on one instance; each row's gap is to the best bound any of them proved."""
    rows = []
    t0 = time.time()
    bound = lower_bound(problem, args.max_column_shards)
    print(f"lower bound {bound * 1e3:.4f} ms ({time.time() - t0:.1f}s)", flush=True)
    for plan in all_baselines(problem):
        t0 = time.time()
        rows.append(Row(plan.name, seed, time.time() - t0, cost_plan(problem, plan), bound))
    t0 = time.time()
    placed = split_problem(problem, choose_shards(problem, args.max_column_shards))
    rows.append(Row("warm_start", seed, time.time() - t0, cost_plan(placed, balanced_plan(placed)), bound))
    t0 = time.time()
    start = lpt_plan(placed)
    rows.append(
        Row(
            "local_search",
            seed,
            0.0,
            cost_plan(placed, improve(placed, start, args.local_search)),
            bound,
            f"LPT {cost_plan(placed, start).max_cost * 1e3:.4f} ms",
        )
    )
    rows[-1].wall_s = time.time() - t0
    torchrec = (
        None if args.no_torchrec or seed != args.seeds[0] else torchrec_rows(problem, args.torchrec_timeout)
    )
    for solver in args.solvers:
        if not milp.available(solver):
            print(f"{solver}: not installed")
            continue
        t0 = time.time()
        try:
            # TorchRec's planner runs once per instance, above, not once per solver
            outcome = solve_problem(
                problem,
                SolveOptions(
                    solver=solver,
                    time_limit_s=args.time_limit,
                    mip_gap=args.mip_gap,
                    local_search_s=args.local_search,
                    max_column_shards=args.max_column_shards,
                    torchrec_baselines=False,
                ),
            )
        except Exception as exc:  # a benchmark reports a failed solver and goes on
            print(f"{solver}: failed after {time.time() - t0:.1f}s: {exc}", flush=True)
            continue
        m = outcome.milp
        rows.append(
            Row(
                solver,
                seed,
                time.time() - t0,
                outcome.best,
                outcome.lower_bound,
                f"MILP {m.status} in {m.solve_seconds:.1f}s (build {m.build_seconds:.1f}s), plan from "
                f"{outcome.source}, {len((outcome.placed or problem).shard_groups)} tables cut",
            )
        )
        if torchrec is not None:
            report_torchrec(problem, outcome, torchrec)
    best = max(r.bound for r in rows)
    for r in rows:
        r.bound = best
        print(
            f"  {r.method:<20} {r.wall_s:>7.1f}s {r.cost.max_cost * 1e3:>10.4f} ms  gap {r.gap:>7.2%}  "
            f"imbalance {r.cost.imbalance:.3f}  UVM {r.cost.uvm_access_fraction:.2%}  {r.detail}",
            flush=True,
        )
    return rows


def print_summary(size: str, rows: list[Row]) -> None:
    """Per method, over the seeds: wall time, slowest GPU, gap to the best bound, imbalance, UVM share."""
    seeds = sorted({r.seed for r in rows})
    print(f"\n{size}, seeds {', '.join(map(str, seeds))} (mean over seeds; gap: mean and worst)")
    print(
        f"  {'method':<20} {'wall s':>7} {'max GPU ms':>10} {'gap':>7} {'worst':>7} {'imbalance':>9} {'UVM acc':>8}"
    )
    for method in dict.fromkeys(r.method for r in rows):
        mine = [r for r in rows if r.method == method]

        def mean(f, mine=mine):
            return sum(f(r) for r in mine) / len(mine)

        print(
            f"  {method:<20} {mean(lambda r: r.wall_s):>7.1f} {mean(lambda r: r.cost.max_cost) * 1e3:>10.4f} "
            f"{mean(lambda r: r.gap):>7.2%} {max(r.gap for r in mine):>7.2%} "
            f"{mean(lambda r: r.cost.imbalance):>9.3f} {mean(lambda r: r.cost.uvm_access_fraction):>8.2%}",
            flush=True,
        )


def torchrec_rows(problem: Problem, timeout_s: int):
    """TorchRec's planner on the instance, or None where torchrec is not installed."""
    try:
        from recshard_stats.torchrec_planner import torchrec_baselines
    except ImportError:
        print("torchrec: not installed (scripts/setup.sh installs it)")
        return None
    return torchrec_baselines(problem, timeout_s)


def report_torchrec(problem: Problem, outcome, baselines) -> None:
    """Every plan in both cost models: RecShard's and the greedy ones (pinned to their ranks and
    kernels) and TorchRec's own, with TorchRec's HBM estimate of the busiest rank / usable HBM."""
    from recshard_stats.torchrec_planner import rate_in_torchrec

    best = outcome.best
    shards = table_shards(outcome.placed or problem, best.plan)
    print(
        f"  {'plan':<20} {'max GPU ms':>10} {'gain':>7} {'imbalance':>9} {'UVM acc':>8} {'TorchRec ms':>11} "
        f"{'HBM need/usable':>15} {'plan s':>7}  layouts"
    )
    for cost in (best, *outcome.baselines):
        if cost is best:
            name, rating = (
                "recshard",
                rate_in_torchrec(problem, tuple(s.gpus for s in shards), tuple(s.rows_hbm for s in shards)),
            )
        else:
            name, rating = cost.plan.name, rate_in_torchrec(problem, cost.plan.gpu, cost.plan.rows_hbm)
        print(
            f"  {name:<20} {cost.max_cost * 1e3:>10.4f} {cost.max_cost / best.max_cost:>6.2f}x "
            f"{cost.imbalance:>9.2f} {cost.uvm_access_fraction:>8.2%} {rating.rating_ms:>11.4f} "
            f"{max(rating.hbm_needed) / rating.hbm_usable:>14.2f}x {'':>7}  pinned",
            flush=True,
        )
    for b in baselines:
        if b.cost is None:
            print(f"  {b.name:<20} no plan after {b.planning_seconds:.1f}s: {b.error.splitlines()[0]}")
            continue
        print(
            f"  {b.name:<20} {b.cost.max_cost * 1e3:>10.4f} {b.cost.max_cost / best.max_cost:>6.2f}x "
            f"{b.cost.imbalance:>9.2f} {b.cost.uvm_access_fraction:>8.2%} {b.torchrec_rating_ms:>11.4f} "
            f"{'':>15} {b.planning_seconds:>7.1f}  {', '.join(f'{k}: {v}' for k, v in sorted(b.layouts.items()))}",
            flush=True,
        )


if __name__ == "__main__":
    main()
