"""Replay evaluation: held-out per-row access counts through a manifest's remap, and the
plans' per-batch cost on that data under the same cost model the solver predicted with.

Spark part (:func:`tier_hits`): a distributed join of held-out row counts with the remap
files; only per-table sums reach the driver. The rest (:func:`summarize`) is plain Python and
gives the typed :class:`Evaluation` (``evaluation.json``, read back by the report).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from recshard_stats.costmodel import GpuCosts, TableLoad, TierShare, placement_cost, shard_cost, tier_bags
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import Manifest
from recshard_stats.typed_json import DecodeError, from_plain
from recshard_stats.units import MS_PER_S

EVALUATION_NAME = "evaluation.json"
PUBLISHED_EVALUATION_NAME = "published_evaluation.json"  # the published plan on the same logs


@dataclasses.dataclass(frozen=True)
class ReplayedPlan:
    max_cost_ms: float
    gpu_cost_ms: tuple[float, ...]
    imbalance: float
    uvm_access_fraction: float
    predicted_max_cost_ms: float
    predicted_uvm_access_fraction: float
    cost_vs_recshard: float


@dataclasses.dataclass(frozen=True)
class ReplayedTable:
    name: str
    gpu: int
    accesses: int
    hbm_access_fraction: float
    predicted_hbm_access_fraction: float
    unseen_access_fraction: float
    accesses_per_batch: float
    predicted_accesses_per_batch: float
    in_sample_hbm_access_fraction: float | None = None  # the manifest's, on its profiled day


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """``evaluation.json``: the held-out day replayed through RecShard's plan and each baseline."""

    num_samples: int
    plans: dict[str, ReplayedPlan]  # "recshard" first, then the baselines and TorchRec's plans
    tables: tuple[ReplayedTable, ...]
    manifest: str
    logs: tuple[str, ...]
    ds: str
    # RecShard's plan as predicted on the day that ranked its rows (the manifest's in-sample figures)
    in_sample_max_cost_ms: float | None = None
    in_sample_uvm_access_fraction: float | None = None


def load_evaluation(path: str | pathlib.Path) -> Evaluation:
    """``evaluation.json`` read back; a file that is not one is a clear error naming it."""
    try:
        return from_plain(Evaluation, json.loads(pathlib.Path(path).read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, DecodeError) as exc:
        raise RecShardError(
            Reason.INPUT_CORRUPT,
            f"{path} is not an evaluation written by `recshard evaluate` ({exc})",
            fixes=("run `recshard evaluate` again",),
        ) from None


RECSHARD = "recshard"


def placements(manifest: Manifest) -> list[tuple[str, str, int, int]]:
    """(plan, table, rows_hbm, unseen_below) of every table whose HBM share the replay must
    measure: RecShard's plan, and each TorchRec plan's cached tables. A cache of load factor c is
    taken to hold the hottest seen rows, at most ``c * hash_size`` of them (never-seen rows it
    would take in as they come are not counted: a lower bound on a dynamic cache)."""
    out = [(RECSHARD, t.name, t.rows_hbm, t.unseen_hbm_below_row) for t in manifest.tables]
    for plan in manifest.plan.torchrec:
        cached = {s.table: s.cache_load_factor for s in plan.shards if s.cache_load_factor is not None}
        out += [
            (plan.name, t.name, min(round(c * t.hash_size), t.unique_rows), 0)
            for t, c in ((manifest.table(name), c) for name, c in sorted(cached.items()))
        ]
    return out


def tier_hits(row_counts, remap, placement, batch_share: float):
    """Per plan and table: held-out accesses, those served from HBM under the plan, accesses
    to rows the profile never saw, and the distinct rows a batch touches (in all and in HBM): a
    row accessed c times is in a batch of ``batch_share`` of the samples with chance
    1 - (1 - batch_share)^c.

    row_counts: (table, row, access_count); remap: (table, row, index) of seen rows;
    placement: (plan, table, rows_hbm, unseen_below), see :func:`placements`. A seen row is in
    HBM iff index < rows_hbm, a never-seen one iff row < unseen_below (see recshard_stats.manifest).
    """
    from pyspark.sql import functions as F

    joined = row_counts.join(remap.select("table", "row", "index"), ["table", "row"], "left").join(
        F.broadcast(placement), "table"
    )
    in_hbm = F.when(F.col("index").isNull(), F.col("row") < F.col("unseen_below")).otherwise(
        F.col("index") < F.col("rows_hbm")
    )
    in_batch = (
        (F.lit(1.0) - F.pow(F.lit(1.0 - min(batch_share, 1.0)), F.col("access_count")))
        if batch_share < 1
        else F.lit(1.0)
    )
    return joined.groupBy("plan", "table").agg(
        F.sum("access_count").alias("accesses"),
        F.sum(F.when(in_hbm, F.col("access_count")).otherwise(0)).alias("hbm_accesses"),
        F.sum(F.when(F.col("index").isNull(), F.col("access_count")).otherwise(0)).alias("unseen_accesses"),
        F.sum(in_batch).alias("distinct"),
        F.sum(F.when(in_hbm, in_batch).otherwise(0.0)).alias("hbm_distinct"),
    )


def _replayed(
    cost: GpuCosts,
    predicted_max_cost_ms: float,
    predicted_uvm_access_fraction: float,
    recshard_ms: float | None,
) -> ReplayedPlan:
    max_ms = cost.max_cost * MS_PER_S
    return ReplayedPlan(
        max_cost_ms=max_ms,
        gpu_cost_ms=tuple(c * MS_PER_S for c in cost.gpu_cost),
        imbalance=cost.imbalance,
        uvm_access_fraction=cost.uvm_access_fraction,
        predicted_max_cost_ms=predicted_max_cost_ms,
        predicted_uvm_access_fraction=predicted_uvm_access_fraction,
        cost_vs_recshard=max_ms / recshard_ms if recshard_ms else 1.0,
    )


def summarize(
    manifest: Manifest, hits: dict[tuple[str, str], dict], num_samples: int, *, manifest_path: str, logs
) -> Evaluation:
    """hits: (plan, table) -> {accesses, hbm_accesses, unseen_accesses} on the held-out data."""
    batch, hw = manifest.hardware.batch_size, manifest.hardware
    model = hw.costs
    none = {"accesses": 0, "hbm_accesses": 0, "unseen_accesses": 0, "distinct": 0.0, "hbm_distinct": 0.0}

    def fraction(plan: str, table: str) -> float:
        h = hits.get((plan, table), none)
        return h["hbm_accesses"] / h["accesses"] if h["accesses"] else 1.0

    measured = [hits.get((RECSHARD, t.name), none) for t in manifest.tables]
    accesses = [batch * h["accesses"] / num_samples for h in measured]
    distinct = [h["distinct"] for h in measured]  # per batch, whatever the plan
    fractions = [fraction(RECSHARD, t.name) for t in manifest.tables]
    tables = tuple(
        ReplayedTable(
            name=t.name,
            gpu=t.gpu,
            accesses=h["accesses"],
            hbm_access_fraction=f,
            predicted_hbm_access_fraction=t.predicted_hbm_access_fraction,
            unseen_access_fraction=h["unseen_accesses"] / h["accesses"] if h["accesses"] else 0.0,
            accesses_per_batch=a,
            predicted_accesses_per_batch=t.accesses_per_batch,
            in_sample_hbm_access_fraction=t.in_sample_hbm_access_fraction,
        )
        for t, h, a, f in zip(manifest.tables, measured, accesses, fractions, strict=True)
    )

    def load(
        j: int,
        gpu: int,
        hbm_fraction: float,
        distinct_hbm: float,
        share: float = 1.0,
        rows_hbm: int | None = None,
    ) -> TableLoad:
        t = manifest.tables[j]  # share: of the table's columns (a column shard)
        rows = (t.hash_size if hbm_fraction >= 1 else 0) if rows_hbm is None else rows_hbm
        bags_hbm, bags_host = tier_bags(float(batch * len(t.features)), rows, t.hash_size)
        return TableLoad(
            gpu,
            accesses[j],
            hbm_fraction,
            distinct_hbm,
            distinct[j] - distinct_hbm,
            t.row_bytes * share,
            t.hash_size * t.row_bytes * share,
            hw.comm_bytes(accesses[j] / batch, len(t.features), t.dim * share),
            bags_hbm,
            bags_host,
            t.longest_bag,
            share,
        )

    # a table cut column-wise costs on each shard's GPU its share of the columns' bytes
    by_part = placement_cost(
        model,
        manifest.num_gpus,
        [
            load(j, p.gpu, fractions[j], measured[j]["hbm_distinct"], p.share, t.rows_hbm)
            for j, t in enumerate(manifest.tables)
            for p in t.gpu_parts
        ],
    )
    recshard = _replayed(
        by_part,
        manifest.plan.objective_ms,
        manifest.plan.uvm_access_fraction,
        None,
    )
    plans = {RECSHARD: recshard}
    for b in manifest.plan.baselines:
        # baselines keep whole tables in HBM or in UVM: their hit rate needs no remap
        whole = [
            1.0 if rows == t.hash_size else 0.0
            for rows, t in zip(b.rows_hbm, manifest.tables, strict=True)
            if rows in (0, t.hash_size)
        ]
        if len(whole) < len(manifest.tables):
            continue
        cost = placement_cost(
            model,
            manifest.num_gpus,
            [load(j, g, f, distinct[j] * f) for j, (g, f) in enumerate(zip(b.gpu, whole, strict=True))],
        )
        plans[b.name] = _replayed(cost, b.max_cost_ms, b.uvm_access_fraction, recshard.max_cost_ms)
    comm = [
        hw.comm_bytes(a / batch, len(t.features), t.dim)
        for a, t in zip(accesses, manifest.tables, strict=True)
    ]
    for tp in manifest.plan.torchrec:
        if tp.error is not None:
            continue

        def tier_share(j: int, rows: float, name: str = tp.name) -> TierShare:
            if rows >= manifest.tables[j].hash_size:
                return TierShare(1.0, distinct[j], distinct[j])
            h = hits.get((name, manifest.tables[j].name), none)
            return TierShare(fraction(name, manifest.tables[j].name), h["hbm_distinct"], distinct[j])

        shards = shard_cost(
            model,
            manifest.num_gpus,
            tp.shards,
            manifest.tables,
            accesses,
            tier_share,
            comm,
            [batch * len(t.features) for t in manifest.tables],
            [t.longest_bag for t in manifest.tables],
        )
        assert (
            tp.max_cost_ms is not None and tp.uvm_access_fraction is not None
        )  # a plan: the manifest checked
        plans[tp.name] = _replayed(shards, tp.max_cost_ms, tp.uvm_access_fraction, recshard.max_cost_ms)
    return Evaluation(
        num_samples=num_samples,
        plans=plans,
        tables=tables,
        manifest=manifest_path,
        logs=tuple(logs),
        ds=manifest.ds,
        in_sample_max_cost_ms=manifest.plan.in_sample_objective_ms,
        in_sample_uvm_access_fraction=manifest.plan.in_sample_uvm_access_fraction,
    )


def format_summary(evaluation: Evaluation) -> str:
    lines = [
        f"replayed {evaluation.num_samples} held-out samples",
        f"{'plan':<20} {'max GPU ms':>11} {'predicted':>10} {'UVM access':>11} {'predicted':>10} "
        f"{'imbalance':>10} {'vs recshard':>12}",
    ]
    for name, p in evaluation.plans.items():
        lines.append(
            f"{name:<20} {p.max_cost_ms:>11.4f} {p.predicted_max_cost_ms:>10.4f} "
            f"{p.uvm_access_fraction:>11.2%} {p.predicted_uvm_access_fraction:>10.2%} "
            f"{p.imbalance:>10.2f} {p.cost_vs_recshard:>11.2f}x"
        )
    if evaluation.in_sample_max_cost_ms is not None and evaluation.in_sample_uvm_access_fraction is not None:
        lines.append(
            f"{'recshard in-sample':<20} {'':>11} {evaluation.in_sample_max_cost_ms:>10.4f} "
            f"{'':>11} {evaluation.in_sample_uvm_access_fraction:>10.2%}   (predicted on the day that ranked its rows)"
        )
    return "\n".join(lines)
