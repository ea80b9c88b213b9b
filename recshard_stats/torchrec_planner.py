"""TorchRec's planner beside ours, on the solver's side: :func:`torchrec_baselines` runs
TorchRec's own planner on the same tables and hardware, its plans costed in our model
(:func:`cost_torchrec_plan`); :func:`rate_in_torchrec` rates a placement in TorchRec's perf and
storage models, laid out as :func:`recshard_stats.torchrec_trainer.sharding_plan` runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Sequence

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.distributed.planner.constants import UVM_CACHING_RATIO
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import DataType

from recshard_stats.costmodel import ComputeKernel, GpuCosts, ShardingType, TierShare, shard_cost
from recshard_stats.export import unsplit_kernel
from recshard_stats.manifest import TorchRecShard
from recshard_stats.solver.problem import Problem, TableDemand
from recshard_stats.torchrec_trainer import (
    ProfiledCacheStatistics,
    TablePart,
    optimizer_class,
    table_parts,
    whole_table_configs,
)
from recshard_stats.units import MS_PER_S

log = logging.getLogger(__name__)


def seen_share(unique_rows: int, hash_size: int) -> float:
    """The cache load factor that holds every row the profile saw (TorchRec refuses 0): what the
    planner fed the profile's statistics gets, with no RecShard plan to size its cache."""
    return max(unique_rows / hash_size, 1e-6)


@dataclasses.dataclass(frozen=True)
class TorchRecBaseline:
    """A plan of TorchRec's own planner for the same tables and hardware, in both cost models."""

    name: str
    planning_seconds: float
    shards: tuple[TorchRecShard, ...]  # empty when TorchRec found no plan
    cost: GpuCosts | None  # in our cost model; None when TorchRec found no plan
    torchrec_rating_ms: float | None  # TorchRec's perf model: its slowest rank's estimate
    error: str | None  # TorchRec's PlannerError, when it found no plan

    @property
    def layouts(self) -> dict[str, int]:
        """ "sharding_type/kernel" -> tables planned so."""
        layouts: dict[str, set[str]] = {f"{s.sharding_type}/{s.compute_kernel}": set() for s in self.shards}
        for s in self.shards:
            layouts[f"{s.sharding_type}/{s.compute_kernel}"].add(s.table)
        return {layout: len(tables) for layout, tables in layouts.items()}


def torchrec_shards(options) -> tuple[TorchRecShard, ...]:
    """TorchRec's chosen ShardingOptions as plain shards (a cache without a load factor gets
    TorchRec's default)."""
    return tuple(
        TorchRecShard(
            table=option.name,
            sharding_type=option.sharding_type,
            compute_kernel=option.compute_kernel,
            rank=shard.rank,
            rows=shard.size[0],
            cols=shard.size[1],
            cache_load_factor=(option.cache_load_factor or UVM_CACHING_RATIO)
            if option.compute_kernel == ComputeKernel.FUSED_UVM_CACHING
            else None,
        )
        for option in options
        for shard in option.shards
    )


def cost_torchrec_plan(problem: Problem, shards) -> GpuCosts:
    """A TorchRec plan costed in our model, shard by shard (:func:`recshard_stats.costmodel.shard_cost`):
    a cache of load factor c is taken to hold the hottest rows, so it serves F(c * rows)."""

    def tier_share(j: int, rows: float) -> TierShare:
        t = problem.tables[j]
        return TierShare(float(t.hbm_fraction(rows)), float(t.distinct_rows(rows)), t.distinct_per_batch)

    return shard_cost(
        problem.hardware.costs,
        problem.num_gpus,
        shards,
        problem.tables,
        [t.accesses_per_batch for t in problem.tables],
        tier_share,
        problem.comm_bytes,
        [problem.hardware.batch_size * len(t.features) for t in problem.tables],
        [t.longest_bag for t in problem.tables],
    )


def _data_type(problem: Problem) -> DataType:
    """The weights' data type: TorchRec's storage estimate takes the element size from it."""
    # a hardware config admits fp32 and fp16 (what the trainer builds), hand-made problems other
    # sizes too
    return {1: DataType.INT8, 2: DataType.FP16}.get(problem.hardware.bytes_per_element, DataType.FP32)


def _collection(problem: Problem, configs: list[EmbeddingBagConfig] | None = None) -> EmbeddingBagCollection:
    """The problem's tables whole (or ``configs``), in the weights' data type, trained with its
    optimizer: TorchRec's storage estimate counts the optimizer's state from the class
    ``apply_optimizer_in_backward`` leaves on each weight."""
    collection = EmbeddingBagCollection(
        tables=configs or whole_table_configs(problem.tables, _data_type(problem)),
        device=torch.device("meta"),
    )
    optimizer = optimizer_class(problem.hardware.optimizer)
    for weight in collection.parameters():
        weight._optimizer_classes = [optimizer]
    return collection


def _topology(problem: Problem):
    """The problem's hardware as TorchRec sees it: G CUDA ranks on one host, each with its HBM and a
    G-th of the host memory, our HBM and UVM bandwidths in TorchRec's unit, bytes per millisecond
    (its default HBM bandwidth is ``897 * 1024**3 / 1000``)."""
    from torchrec.distributed.planner import Topology

    hw, g = problem.hardware, problem.num_gpus
    return Topology(
        world_size=g,
        compute_device="cuda",
        hbm_cap=hw.hbm_bytes_per_gpu,
        ddr_cap=hw.host_bytes // g,
        local_world_size=g,
        hbm_mem_bw=hw.hbm_bandwidth / MS_PER_S,
        hbm_to_ddr_mem_bw=hw.uvm_bandwidth / MS_PER_S,
    )


def _pooling_factors(problem: Problem, t: TableDemand) -> list[float]:
    """Ids per sample of each feature (a table without per-feature numbers: its whole traffic)."""
    return list(t.feature_pooling) or [t.accesses_per_batch / problem.hardware.batch_size]


def _local_batch(problem: Problem) -> int:
    """TorchRec's batch size is per rank; ours is the global batch every table's GPU serves."""
    return max(1, problem.hardware.batch_size // problem.num_gpus)


@dataclasses.dataclass(frozen=True)
class TorchRecRating:
    """A plan pinned to its ranks and kernels, in TorchRec's perf and storage models."""

    rating_ms: float  # the slowest rank's estimated time
    hbm_needed: tuple[int, ...]  # per rank: TorchRec's HBM estimate of its shards
    hbm_usable: int  # HBM per rank after the fixed reservation

    @property
    def fits(self) -> bool:
        return max(self.hbm_needed) <= self.hbm_usable


@contextlib.contextmanager
def _quiet_planner():
    """TorchRec's planner logs a page of tables per plan (and warns about our made-up topology):
    keep it to errors while we plan."""
    logger = logging.getLogger("torchrec")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@_quiet_planner()
def rate_in_torchrec(
    problem: Problem, gpu: Sequence[int | tuple[int, ...]], rows_hbm: tuple[int, ...], *, cache: bool = False
) -> TorchRecRating:
    """Our placement (per table: its rank, or its column shards' ranks, and its ``rows_hbm``) in
    TorchRec's perf and storage models, laid out as :func:`sharding_plan` runs it: table-wise on
    its rank (column-wise on its shards' ranks), ``fused`` wholly in HBM, ``fused_uvm`` wholly in
    UVM, and a table with rows in both tiers as the static split's two parts (``fused`` HBM part,
    ``fused_uvm`` UVM part; each looks up its predicted share of the ids). ``cache=True``: such a
    table is one ``fused_uvm_caching`` table instead, the HBM share of rows as load factor."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    configs, constraints, ranks_of = [], {}, {}
    for j, t in enumerate(problem.tables):
        placed = gpu[j]
        ranks = (placed,) if isinstance(placed, int) else tuple(placed)
        kernel, load_factor = unsplit_kernel(rows_hbm[j], t.hash_size)
        pooling = _pooling_factors(problem, t)
        if cache and load_factor is not None:
            parts = [(TablePart(t.name, t.name, t.hash_size, 0, ranks, kernel, t.features), 1.0)]
        else:
            split = table_parts(t.name, t.features, t.hash_size, rows_hbm[j], ranks)
            hot = float(t.hbm_fraction(rows_hbm[j])) if len(split) == 2 else 1.0
            parts = list(
                zip(split, (hot, 1.0 - hot)[: len(split)], strict=True)
            )  # the HBM part, then the UVM part
        for part, share in parts:
            configs.append(
                EmbeddingBagConfig(
                    name=part.name,
                    embedding_dim=t.dim,
                    num_embeddings=part.rows,
                    feature_names=list(part.features),
                    pooling=PoolingType.SUM,
                    data_type=_data_type(problem),
                )
            )
            constraints[part.name] = ParameterConstraints(
                sharding_types=[ShardingType.TABLE_WISE if len(ranks) == 1 else ShardingType.COLUMN_WISE],
                compute_kernels=[part.kernel],
                feature_names=list(part.features),
                pooling_factors=[p * share for p in pooling],
                min_partition=t.dim // len(ranks) if len(ranks) > 1 else None,
                cache_params=CacheParams(load_factor=load_factor)
                if part.kernel == ComputeKernel.FUSED_UVM_CACHING
                else None,
            )
            ranks_of[part.name] = ranks
    collection = _collection(problem, configs)
    options = EmbeddingEnumerator(_topology(problem), _local_batch(problem), constraints).enumerate(
        collection, [EmbeddingBagCollectionSharder()]
    )
    perf, hbm = [0.0] * problem.num_gpus, [0] * problem.num_gpus
    for option in options:
        ranks = ranks_of[option.name]
        assert len(option.shards) == len(ranks), (option.name, len(option.shards), ranks)
        for rank, shard in zip(ranks, option.shards, strict=True):
            perf[rank] += shard.perf.total
            hbm[rank] += shard.storage.hbm
    return TorchRecRating(max(perf), tuple(hbm), problem.hardware.usable_hbm_bytes)


PROBE_RANKS = 64  # the enumeration is timed on this many ranks and scaled to the problem's


def _enumeration_seconds(problem: Problem) -> float:
    """TorchRec's enumeration of the problem's shardings, timed on at most PROBE_RANKS ranks and
    scaled linearly (its work is one option per table, sharding and rank)."""
    import time

    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    probe = min(problem.num_gpus, PROBE_RANKS)
    small = dataclasses.replace(problem, hardware=dataclasses.replace(problem.hardware, num_gpus=probe))
    started = time.perf_counter()
    EmbeddingEnumerator(_topology(small), _local_batch(small)).enumerate(
        _collection(small), [EmbeddingBagCollectionSharder()]
    )
    return (time.perf_counter() - started) * problem.num_gpus / probe


@_quiet_planner()
def torchrec_baselines(problem: Problem, timeout_s: int | None = None) -> list[TorchRecBaseline]:
    """TorchRec's planner on the problem's tables, hardware (usable HBM by a fixed reservation,
    host memory split over the ranks, both bandwidths) and global batch (``batch_size / G`` per
    rank), with the measured pooling factors: ``torchrec_default`` as it comes, and
    ``torchrec_stats`` also fed the profile's cache statistics (load factor = the share of rows
    the profile saw, :class:`ProfiledCacheStatistics`) and its scale-up proposer. ``timeout_s``:
    TorchRec's own planning time limit (it then keeps the best plan found so far)."""
    import time

    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.proposers import (
        EmbeddingOffloadScaleupProposer,
        GreedyProposer,
        UniformProposer,
    )
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerError

    hw, g = problem.hardware, problem.num_gpus
    names = ("torchrec_default", "torchrec_stats")
    if timeout_s is not None:
        # TorchRec checks its time limit only once it proposes; before that it enumerates every
        # sharding of every table over every rank, unbounded (100,000 ranks: hours)
        expected = _enumeration_seconds(problem) * len(names)
        if expected > timeout_s:
            why = (
                f"not run: enumerating {len(problem.tables)} tables over {g} ranks would take about "
                f"{expected:.0f}s, before its {timeout_s}s time limit applies"
            )
            log.warning("TorchRec's planner %s", why)
            return [TorchRecBaseline(name, 0.0, (), None, None, why) for name in names]
    collection = _collection(problem)
    results = []
    for name in names:
        stats = name == "torchrec_stats"
        constraints = {
            t.name: ParameterConstraints(
                pooling_factors=_pooling_factors(problem, t),
                feature_names=list(t.features),
                cache_params=CacheParams(
                    load_factor=seen_share(t.unique_rows, t.hash_size), stats=ProfiledCacheStatistics(t)
                )
                if stats
                else None,
            )
            for t in problem.tables
        }
        proposers = [GreedyProposer(), GreedyProposer(use_depth=False), UniformProposer()]
        planner = EmbeddingShardingPlanner(
            topology=_topology(problem),
            batch_size=_local_batch(problem),
            constraints=constraints,
            storage_reservation=FixedPercentageStorageReservation(hw.hbm_reserved_fraction),
            proposer=[*proposers, EmbeddingOffloadScaleupProposer()] if stats else proposers,
            debug=False,
            timeout_seconds=timeout_s,
        )
        started = time.time()
        try:
            planner.plan(collection, [EmbeddingBagCollectionSharder()])
        except PlannerError as exc:
            results.append(TorchRecBaseline(name, time.time() - started, (), None, None, str(exc).strip()))
            continue
        seconds = time.time() - started
        options = planner._best_plan  # the chosen ShardingOptions, with TorchRec's per-shard estimates
        rank_perf = [0.0] * g
        for option in options:
            for shard in option.shards:
                rank_perf[shard.rank] += shard.perf.total
        shards = torchrec_shards(options)
        results.append(
            TorchRecBaseline(name, seconds, shards, cost_torchrec_plan(problem, shards), max(rank_perf), None)
        )
    return results
