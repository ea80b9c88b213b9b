"""Solver outcome -> the manifest of DESIGN.md (the contract lives in recshard_stats.manifest)."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib

from recshard_stats import __version__
from recshard_stats.config import HardwareConfig, ModelConfig, digest_of
from recshard_stats.manifest import SCHEMA_VERSION, sha256_data
from recshard_stats.schemas import SMALL_TABLES
from recshard_stats.stats import StatsPartition
from solver.milp import MilpOptions
from solver.plan import Evaluation
from solver.problem import Problem
from solver.solve import Outcome

_MS = 1e3


def stats_digest(stats: StatsPartition) -> str:
    return digest_of({name: sha256_data(stats.path / name) for name in (*SMALL_TABLES, "metadata.json")})


def plan_summary(ev: Evaluation, best_cost: float) -> dict:
    return {"name": ev.plan.name, "max_cost_ms": ev.max_cost * _MS, "imbalance": ev.imbalance,
            "uvm_access_fraction": ev.uvm_access_fraction,
            "cost_vs_recshard": ev.max_cost / best_cost if best_cost > 0 else 1.0,
            "gpu": list(ev.plan.gpu), "rows_hbm": list(ev.plan.rows_hbm),
            "gpu_cost_ms": [c * _MS for c in ev.gpu_cost]}


def build_manifest(outcome: Outcome, problem: Problem, model: ModelConfig, hardware: HardwareConfig,
                   stats: StatsPartition, options: MilpOptions, ds: str) -> dict:
    best = outcome.best
    inputs = {
        "stats": str(stats.path), "stats_digest": stats_digest(stats), "stats_ds": stats.metadata.get("ds"),
        "model_digest": model.digest(), "hardware_digest": hardware.digest(),
        "solver_options": dataclasses.asdict(options),
    }
    inputs["digest"] = digest_of({k: v for k, v in inputs.items() if k != "stats"})
    tables = []
    for j, t in enumerate(problem.tables):
        rows_hbm = best.plan.rows_hbm[j]
        tables.append({
            "name": t.name, "features": list(t.features), "gpu": best.plan.gpu[j], "hash_size": t.hash_size,
            "dim": t.dim, "hash": t.hash, "rows_hbm": rows_hbm, "rows_uvm": t.hash_size - rows_hbm,
            "unique_rows": t.unique_rows, "unused_rows": t.hash_size - t.unique_rows,
            "predicted_hbm_access_fraction": best.table_hbm_fraction[j],
            "predicted_cost_ms": best.table_cost[j] * _MS,
            "accesses_per_batch": t.accesses_per_batch, "pooling_factor": t.pooling_factor,
            "feature_pooling": list(t.feature_pooling),
            "coverage": t.coverage, "row_bytes": t.row_bytes,
            "remap": None,
        })
    gpus = [{"rank": g, "tables": [t.name for j, t in enumerate(problem.tables) if best.plan.gpu[j] == g],
             "hbm_bytes_used": int(best.gpu_hbm_bytes[g]), "hbm_bytes_capacity": int(problem.hbm_capacity),
             "predicted_cost_ms": best.gpu_cost[g] * _MS} for g in range(problem.num_gpus)]
    milp = outcome.milp
    plan = {
        "solver": options.solver, "status": milp.status, "source": outcome.source,
        "objective_ms": best.max_cost * _MS, "lower_bound_ms": outcome.lower_bound * _MS, "gap": outcome.gap,
        "milp_objective_ms": milp.objective_ms, "milp_bound_ms": milp.bound_ms,
        "solve_seconds": milp.solve_seconds, "imbalance": best.imbalance,
        "uvm_access_fraction": best.uvm_access_fraction,
        "baselines": [plan_summary(b, best.max_cost) for b in outcome.baselines],
    }
    return {
        "schema_version": SCHEMA_VERSION, "kind": "recshard-manifest", "ds": ds,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "producer": f"recshard-stats {__version__}",
        "inputs": inputs, "model": model.to_dict(), "hardware": hardware.to_dict(),
        "plan": plan, "gpus": gpus, "tables": tables,
    }


def manifest_dir(root: str | pathlib.Path, ds: str) -> pathlib.Path:
    return pathlib.Path(root) / f"ds={ds}"


def solve_to_manifest(stats_path, model_path, hardware_path, out_root, ds: str | None = None,
                      options: MilpOptions = MilpOptions()) -> pathlib.Path:
    """``recshard solve``: stats partition + configs -> ``<out_root>/ds=<ds>/manifest.json``
    (plus ``torchrec_plan.json`` beside it), each written atomically."""
    import json

    from recshard_stats.atomic import write_text_atomic
    from recshard_stats.config import load_hardware_config, load_model_config
    from recshard_stats.export import torchrec_plan
    from recshard_stats.manifest import MANIFEST_NAME, write_manifest
    from recshard_stats.stats import load_stats
    from solver.problem import build_problem
    from solver.solve import run

    model, hardware = load_model_config(model_path), load_hardware_config(hardware_path)
    stats = load_stats(stats_path)
    ds = ds or stats.metadata.get("ds") or datetime.date.today().isoformat()
    problem = build_problem(stats, model, hardware)
    outcome = run(problem, options)
    data = build_manifest(outcome, problem, model, hardware, stats, options, ds)
    target = manifest_dir(out_root, ds)
    path = write_manifest(target / MANIFEST_NAME, data)
    write_text_atomic(target / "torchrec_plan.json", json.dumps(torchrec_plan(data), indent=2) + "\n")
    return path
