"""Solver outcome -> the typed :class:`~recshard_stats.manifest.Manifest` (docs/design.md, "The manifest")."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pathlib
from typing import TYPE_CHECKING

from recshard_stats import __version__
from recshard_stats.config import HardwareConfig, ModelConfig, digest_of
from recshard_stats.distributions import HitEstimate
from recshard_stats.manifest import (
    BaselinePlan,
    ColumnShard,
    GpuPlacement,
    Manifest,
    ManifestInputs,
    PlanDiff,
    PlanSummary,
    SolverSettings,
    TableChange,
    TablePlacement,
    TorchRecPlan,
)
from recshard_stats.manifest_loader import ManifestFile
from recshard_stats.options import SolveOptions, check_ds
from recshard_stats.solver.churn import moved_bytes, previous_ranks
from recshard_stats.solver.column_split import TableShards, table_shards
from recshard_stats.solver.plan import PlanCost, cost_plan
from recshard_stats.solver.problem import Problem, TableDemand, with_hit_estimate
from recshard_stats.solver.solve import Outcome
from recshard_stats.stats_reader import StatsPartition, stats_digest
from recshard_stats.typed_json import to_plain
from recshard_stats.units import MS_PER_S

if TYPE_CHECKING:
    from recshard_stats.torchrec_planner import TorchRecBaseline

log = logging.getLogger(__name__)
TORCHREC_PLAN_NAME = "torchrec_plan.json"


def baseline_plan(cost: PlanCost, best_cost: float, torchrec_rating_ms: float | None = None) -> BaselinePlan:
    return BaselinePlan(
        name=cost.plan.name,
        max_cost_ms=cost.max_cost * MS_PER_S,
        imbalance=cost.imbalance,
        uvm_access_fraction=cost.uvm_access_fraction,
        cost_vs_recshard=cost.max_cost / best_cost if best_cost > 0 else 1.0,
        gpu=tuple(cost.plan.gpu),
        rows_hbm=tuple(cost.plan.rows_hbm),
        gpu_cost_ms=tuple(c * MS_PER_S for c in cost.gpu_cost),
        torchrec_rating_ms=torchrec_rating_ms,
    )


def torchrec_plan_summary(baseline: TorchRecBaseline, best_cost: float) -> TorchRecPlan:
    cost = baseline.cost
    return TorchRecPlan(
        name=baseline.name,
        planning_seconds=baseline.planning_seconds,
        error=baseline.error,
        shards=baseline.shards,
        max_cost_ms=cost.max_cost * MS_PER_S if cost else None,
        imbalance=cost.imbalance if cost else None,
        uvm_access_fraction=cost.uvm_access_fraction if cost else None,
        cost_vs_recshard=cost.max_cost / best_cost if cost and best_cost > 0 else None,
        gpu_cost_ms=tuple(c * MS_PER_S for c in cost.gpu_cost) if cost else (),
        torchrec_rating_ms=baseline.torchrec_rating_ms,
    )


def solver_settings(options: SolveOptions) -> SolverSettings:
    """The CLI's options as the manifest records them (the same fields, by name)."""
    return SolverSettings(**{f.name: getattr(options, f.name) for f in dataclasses.fields(SolverSettings)})


def build_manifest(
    outcome: Outcome,
    problem: Problem,
    model: ModelConfig,
    hardware: HardwareConfig,
    stats: StatsPartition,
    options: SolveOptions,
    ds: str,
    directory: pathlib.Path | None = None,
) -> Manifest:
    """``directory``: where the manifest will live; the stats' location is written relative to it
    (a copied run still finds its stats: ``ManifestFile.stats_path``)."""
    best = outcome.best
    # each input computed once (the stats digest reads the partition's files); the plan's digest
    # covers all of them but the stats' location
    stats_sha, settings = stats_digest(stats), solver_settings(options)
    model_sha, hardware_sha = model.digest(), hardware.digest()
    digested = {
        "stats_digest": stats_sha,
        "stats_ds": stats.metadata.ds,
        "model_digest": model_sha,
        "hardware_digest": hardware_sha,
        "solver_settings": settings,
    }
    inputs = ManifestInputs(
        stats=stats_location(stats.path, directory),
        stats_digest=stats_sha,
        stats_ds=stats.metadata.ds,
        model_digest=model_sha,
        hardware_digest=hardware_sha,
        solver_settings=settings,
        digest=digest_of(to_plain(digested)),
    )
    placed = outcome.placed or problem
    in_sample = cost_plan(with_hit_estimate(placed, HitEstimate.IN_SAMPLE), best.plan)
    tables = tuple(
        _placement(t, s, best, in_sample, placed)
        for t, s in zip(problem.tables, table_shards(placed, best.plan), strict=True)
    )
    gpus = tuple(
        GpuPlacement(
            rank=g,
            tables=tuple(t.name for t in tables if g in t.ranks),
            hbm_bytes_used=int(best.gpu_hbm_bytes[g]),
            hbm_bytes_capacity=int(problem.hbm_capacity),
            predicted_cost_ms=best.gpu_cost[g] * MS_PER_S,
            trainer_buffer_bytes=best.gpu_buffer_bytes[g],
            kernel_groups_ms=max(
                0.0,
                best.gpu_cost[g]
                - sum(c for c, h in zip(best.table_cost, best.plan.gpu, strict=True) if h == g),
            )
            * MS_PER_S,
        )
        for g in range(problem.num_gpus)
    )
    milp = outcome.milp
    plan = PlanSummary(
        solver=options.solver,
        status=milp.status,
        source=outcome.source,
        objective_ms=best.max_cost * MS_PER_S,
        lower_bound_ms=outcome.lower_bound * MS_PER_S,
        gap=outcome.gap,
        milp_objective_ms=milp.objective_ms,
        milp_bound_ms=milp.bound_ms,
        solve_seconds=milp.solve_seconds,
        imbalance=best.imbalance,
        uvm_access_fraction=best.uvm_access_fraction,
        in_sample_objective_ms=in_sample.max_cost * MS_PER_S,
        in_sample_uvm_access_fraction=in_sample.uvm_access_fraction,
        baselines=tuple(
            baseline_plan(b, best.max_cost, r.rating_ms if r else None)
            for b, r in zip(
                outcome.baselines, outcome.baseline_ratings or (None,) * len(outcome.baselines), strict=True
            )
        ),
        torchrec=tuple(torchrec_plan_summary(b, best.max_cost) for b in outcome.torchrec),
        torchrec_rating_ms=outcome.torchrec_rating.rating_ms if outcome.torchrec_rating else None,
    )
    return Manifest(
        ds=ds,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        producer=f"recshard-stats {__version__}",
        inputs=inputs,
        model=model,
        hardware=hardware,
        plan=plan,
        gpus=gpus,
        tables=tables,
    )


def _placement(
    t: TableDemand, shards: TableShards, best: PlanCost, in_sample: PlanCost, placed: Problem
) -> TablePlacement:
    """A model table's placement from the plan of ``placed``'s entries (its column shards or itself)."""
    e = shards.entries
    cut = (
        tuple(
            ColumnShard(
                gpu=best.plan.gpu[j],
                first_column=i * placed.tables[j].dim,
                columns=placed.tables[j].dim,
                predicted_cost_ms=best.table_cost[j] * MS_PER_S,
                trainer_buffer_bytes=placed.trainer_bytes[j],
            )
            for i, j in enumerate(e)
        )
        if len(e) > 1
        else ()
    )
    return TablePlacement(
        name=t.name,
        features=t.features,
        gpu=shards.gpus[0],
        hash_size=t.hash_size,
        dim=t.dim,
        hash=t.hash,
        rows_hbm=shards.rows_hbm,
        rows_uvm=t.hash_size - shards.rows_hbm,
        unique_rows=t.unique_rows,
        unused_rows=t.hash_size - t.unique_rows,
        predicted_hbm_access_fraction=best.table_hbm_fraction[e[0]],
        in_sample_hbm_access_fraction=in_sample.table_hbm_fraction[e[0]],
        predicted_cost_ms=sum(best.table_cost[j] for j in e) * MS_PER_S,
        accesses_per_batch=t.accesses_per_batch,
        pooling_factor=t.pooling_factor,
        feature_pooling=t.feature_pooling,
        coverage=t.coverage,
        row_bytes=t.row_bytes,
        remap=None,
        trainer_buffer_bytes=sum(placed.trainer_bytes[j] for j in e),
        column_shards=cut,
        longest_bag=t.longest_bag,
    )


def stats_location(stats: pathlib.Path | str, directory: pathlib.Path | None) -> str:
    """The stats partition as the manifest names it: relative to the manifest's directory when
    both are local paths."""
    if directory is None or "://" in str(stats):
        return str(stats)
    return os.path.relpath(pathlib.Path(stats).resolve(), pathlib.Path(directory).resolve())


def manifest_dir(root: str | pathlib.Path, ds: str) -> pathlib.Path:
    return pathlib.Path(root) / f"ds={check_ds(ds)}"


def solve_to_manifest(
    stats_path,
    model_path,
    hardware_path,
    out_root,
    ds: str | None = None,
    options: SolveOptions = SolveOptions(),
    previous=None,
) -> pathlib.Path:
    """``recshard solve``: stats partition + configs -> ``<out_root>/ds=<ds>/manifest.json``
    (plus ``torchrec_plan.json`` beside it), each written atomically. ``previous``: the plan in
    service (a manifest, its directory, or a root whose latest.json points to it), which the
    manifest's diff is taken against and ``options.max_moved_gib`` caps moves from."""
    import json

    from recshard_stats.atomic import building_dir, check_output_root, output_lock, write_text_atomic
    from recshard_stats.config import load_hardware_config, load_model_config
    from recshard_stats.export import torchrec_plan
    from recshard_stats.manifest_loader import MANIFEST_NAME
    from recshard_stats.manifest_publisher import write_manifest
    from recshard_stats.solver.problem import build_problem
    from recshard_stats.solver.solve import solve_problem
    from recshard_stats.stats_reader import load_stats

    model, hardware = load_model_config(model_path), load_hardware_config(hardware_path)
    stats = load_stats(stats_path)
    ds = ds or stats.metadata.ds or datetime.date.today().isoformat()
    target = manifest_dir(out_root, ds)  # checks ds before anything is computed or written
    check_output_root(out_root, "--out")
    problem = build_problem(stats, model, hardware, HitEstimate(options.hit_estimate))
    before = previous_plan(previous, hardware)
    with output_lock(day_lock(target), f"recshard solve of {ds}"):
        outcome = solve_problem(problem, options, before.manifest if before else None)
        manifest = build_manifest(outcome, problem, model, hardware, stats, options, ds, target)
        if before is not None:
            manifest = dataclasses.replace(manifest, diff=plan_diff(problem, manifest, before))
        # the day's directory is built whole and swapped in: a failure (a full disk) leaves the
        # old one as it was, never a manifest without its torchrec_plan.json; the published plan
        # is a snapshot of its own (publish_latest), which a re-solve of its day does not touch
        with building_dir(target) as tmp:
            write_manifest(tmp / MANIFEST_NAME, manifest)
            write_text_atomic(tmp / TORCHREC_PLAN_NAME, json.dumps(torchrec_plan(manifest), indent=2) + "\n")
    return target / MANIFEST_NAME


def previous_plan(where, hardware: HardwareConfig) -> ManifestFile | None:
    """The plan in service at ``where`` (a manifest, its directory, or a root holding latest.json;
    None: nothing published there yet, or a plan for another number of GPUs, whose ranks are not
    these)."""
    from recshard_stats.manifest_loader import MANIFEST_NAME, load_manifest
    from recshard_stats.manifest_publisher import load_published

    if where is None:
        return None
    path = pathlib.Path(where)
    loaded = load_published(path) if path.is_dir() else None
    if loaded is None:
        if not path.exists() or (path.is_dir() and not (path / MANIFEST_NAME).is_file()):
            # a manifests root before its first publish (the daily DAG's first day)
            log.warning("--previous %s: no plan published there yet, so no diff and no cap on moves", path)
            return None
        loaded = load_manifest(path)
    if loaded.manifest.num_gpus != hardware.num_gpus:
        log.warning(
            "--previous %s has %d GPUs, this hardware %d: no diff, no cap on moves",
            loaded.path,
            loaded.manifest.num_gpus,
            hardware.num_gpus,
        )
        return None
    return loaded


def plan_diff(problem: Problem, manifest: Manifest, before: ManifestFile) -> PlanDiff:
    """The tables whose ranks or HBM rows changed against the previous plan, with the bytes that
    change GPU (rows entering and leaving HBM are counted by remap, which has both remaps)."""
    from recshard_stats.manifest_loader import sha256_file

    previous = {t.name: t for t in before.manifest.tables}
    ranks = previous_ranks(problem, before.manifest)
    changes = []
    for j, t in enumerate(manifest.tables):
        old = previous.get(t.name)
        moved = moved_bytes(problem.tables[j], t.ranks, ranks[j])
        if old is None or old.ranks != t.ranks or old.rows_hbm != t.rows_hbm or moved:
            changes.append(
                TableChange(
                    name=t.name,
                    previous_ranks=old.ranks if old is not None else (),
                    ranks=t.ranks,
                    moved_bytes=moved,
                    previous_rows_hbm=old.rows_hbm if old is not None else 0,
                    rows_hbm=t.rows_hbm,
                )
            )
    return PlanDiff(
        previous=str(before.path),
        previous_sha256=sha256_file(before.path),
        previous_ds=before.manifest.ds,
        moved_bytes=sum(c.moved_bytes for c in changes),
        tables=tuple(changes),
    )


def day_lock(day_dir: pathlib.Path) -> pathlib.Path:
    """The lock of a day's manifest directory (solve and remap write it)."""
    return day_dir.parent / f"_lock-{day_dir.name}"
