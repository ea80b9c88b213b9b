"""The plan in a real TorchRec model: the only module that imports torch and torchrec (the
``torchrec`` extra; ``scripts/setup.sh`` installs it on CPU).

- :func:`sharding_plan`: a manifest -> TorchRec ``ShardingPlan``, ``table_wise`` on each
  table's rank. With the static split (the default) a table with rows in both tiers becomes two
  tables: ``<table>__hbm`` (its ``rows_hbm`` hottest rows, kernel ``fused``, in HBM) and
  ``<table>__uvm`` (the rest, ``fused_uvm``); a table wholly in HBM is ``fused``, wholly in UVM
  ``fused_uvm``. ``cache=True`` plans the unsplit tables with TorchRec's own LRU/LFU cache
  instead (``fused_uvm_caching``, load factor = the HBM share of rows).
- :class:`StaticSplitEmbeddingBagCollection`: RecShard's static hot/cold split, executable. It
  rewrites a ``KeyedJaggedTensor``'s ids through the remap into the two parts and adds their
  pooled outputs back, so the model sees exactly what the unsplit table gives (sum pooling;
  mean pooling divides by the original lengths).
- :func:`split_state_dict` / :func:`unsplit_state_dict`: an unsplit table's weights (a
  checkpoint) into the split layout and back.
- :func:`torchrec_baselines`: TorchRec's own planner on the same tables and hardware, its plans
  costed in our model (:func:`cost_torchrec_plan`) and rated by TorchRec's perf model.

On CPU, TorchRec runs the ``fused`` kernel only: ``sharding_plan(..., device_type="cpu")`` maps
every kernel to it (the placement is the same); ``fused_uvm`` and the HBM/UVM split need GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor, PoolingType
from torchrec.distributed.planner.constants import UVM_CACHING_RATIO
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
from torchrec.distributed.types import CacheParams, CacheStatistics, ShardingPlan

from recshard_stats.costmodel import GpuCosts, TierShare, shard_cost
from recshard_stats.export import FUSED, FUSED_UVM, FUSED_UVM_CACHING, unsplit_kernel
from recshard_stats.manifest import Manifest, ManifestFile, TablePlacement, TorchRecShard
from recshard_stats.solver.problem import Problem, TableDemand

HBM_SUFFIX, UVM_SUFFIX = "__hbm", "__uvm"
MS_PER_S = 1000.0  # TorchRec's Topology takes bandwidths in bytes/ms, our configs give bytes/s


@dataclasses.dataclass(frozen=True)
class TablePart:
    """One TorchRec table of the split layout: all of a manifest table, or its HBM or UVM part."""
    name: str
    table: str              # the manifest table it comes from
    rows: int
    first_row: int          # its row 0 is this position of the table's remap order
    ranks: tuple[int, ...]  # one rank (table_wise), or the table's column shards' ranks (column_wise)
    kernel: str
    features: tuple[str, ...]


def is_split(t: TablePlacement) -> bool:
    """Rows in both tiers: the table becomes an HBM part and a UVM part."""
    return t.rows_hbm > 0 and t.rows_uvm > 0


def table_parts(name: str, features: tuple[str, ...], hash_size: int, rows_hbm: int,
                ranks: tuple[int, ...]) -> list[TablePart]:
    """One table in the split layout: itself whole (``fused`` or ``fused_uvm``), or its HBM part
    then its UVM part when it has rows in both tiers; each part on the table's ranks (column
    shards of a table cut column-wise hold the same rows)."""
    if rows_hbm in (0, hash_size):
        return [TablePart(name, name, hash_size, 0, ranks, unsplit_kernel(rows_hbm, hash_size)[0], features)]
    return [TablePart(name + HBM_SUFFIX, name, rows_hbm, 0, ranks, FUSED, tuple(f + HBM_SUFFIX for f in features)),
            TablePart(name + UVM_SUFFIX, name, hash_size - rows_hbm, rows_hbm, ranks, FUSED_UVM,
                      tuple(f + UVM_SUFFIX for f in features))]


def split_parts(manifest: Manifest) -> list[TablePart]:
    """The tables of the split layout, in manifest order (a table's HBM part before its UVM part)."""
    return [p for t in manifest.tables for p in table_parts(t.name, t.features, t.hash_size, t.rows_hbm, t.ranks)]


def _layout(ranks: tuple[int, ...], kernel: str):
    """``table_wise`` on one rank, ``column_wise`` (equal widths, in column order) on several."""
    if len(ranks) == 1:
        return table_wise(rank=ranks[0], compute_kernel=kernel)
    return column_wise(ranks=list(ranks), compute_kernel=kernel)


def table_configs(manifest: Manifest, *, split: bool = True) -> list[EmbeddingBagConfig]:
    """EmbeddingBagConfigs of the split layout (sum pooling: the split module pools itself),
    or of the unsplit tables."""
    if split:
        dims = {t.name: t.dim for t in manifest.tables}
        return [EmbeddingBagConfig(name=p.name, embedding_dim=dims[p.table], num_embeddings=p.rows,
                                   feature_names=list(p.features), pooling=PoolingType.SUM)
                for p in split_parts(manifest)]
    return _whole_table_configs(manifest.tables)


def _whole_table_configs(tables) -> list[EmbeddingBagConfig]:
    """One sum-pooled EmbeddingBagConfig per table (manifest or solver tables: name, dim,
    hash_size, features)."""
    return [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.hash_size,
                               feature_names=list(t.features), pooling=PoolingType.SUM) for t in tables]


def sharding_plan(manifest: Manifest, module_path: str = "", *, split: bool = True, cache: bool = False,
                  local_world_size: int | None = None, device_type: str = "cuda",
                  module: EmbeddingBagCollection | None = None) -> ShardingPlan:
    """The manifest's placement as a TorchRec ``ShardingPlan`` for the EmbeddingBagCollection at
    ``module_path`` in the model (the split layout's collection by default: ``split=True``).

    ``local_world_size``: ranks per host (default: all on one host). ``device_type="cpu"``:
    every kernel becomes ``fused``, the one TorchRec runs on CPU."""
    if module is None:
        module = EmbeddingBagCollection(tables=table_configs(manifest, split=split), device=torch.device("meta"))
    per_table = {}
    if split:
        for p in split_parts(manifest):
            per_table[p.name] = _layout(p.ranks, FUSED if device_type == "cpu" else p.kernel)
    else:
        for t in manifest.tables:
            kernel, load_factor = unsplit_kernel(t.rows_hbm, t.hash_size)
            if load_factor is not None and not cache:
                raise ValueError(f"table {t.name!r} has rows in both tiers: plan it with split=True or cache=True")
            per_table[t.name] = _layout(t.ranks, FUSED if device_type == "cpu" else kernel)
            if load_factor is not None and device_type != "cpu":
                per_table[t.name] = _with_cache(per_table[t.name], CacheParams(load_factor=load_factor))
    plan = construct_module_sharding_plan(module, per_table, local_size=local_world_size or manifest.num_gpus,
                                          world_size=manifest.num_gpus, device_type=device_type)
    return ShardingPlan({module_path: plan})


def _with_cache(generator, cache_params: CacheParams):
    def generate(*args, **kwargs):
        sharding = generator(*args, **kwargs)
        sharding.cache_params = cache_params
        return sharding
    return generate


def seen_share(unique_rows: int, hash_size: int) -> float:
    """The cache load factor that holds every row the profile saw (TorchRec refuses 0)."""
    return max(unique_rows / hash_size, 1e-6)


def parameter_constraints(manifest: Manifest, *, cache: bool = True) -> dict[str, ParameterConstraints]:
    """For teams that keep TorchRec's planner: per table, the measured pooling factors (mean ids
    per sample of each feature) and, when ``cache``, cache statistics from the profile (load
    factor = the share of rows the profile saw, which a cache holding them would need)."""
    out = {}
    for t in manifest.tables:
        params = CacheParams(load_factor=seen_share(t.unique_rows, t.hash_size)) if cache else None
        out[t.name] = ParameterConstraints(pooling_factors=list(t.feature_pooling), feature_names=list(t.features),
                                           cache_params=params)
    return out


class _Remap(nn.Module):
    """Hashed row -> its position in the table's remap order (hot rows first), in torch."""

    def __init__(self, seen_rows: np.ndarray, seen_index: np.ndarray):
        super().__init__()
        self.register_buffer("seen_rows", torch.as_tensor(seen_rows, dtype=torch.int64), persistent=False)
        self.register_buffer("seen_index", torch.as_tensor(seen_index, dtype=torch.int64), persistent=False)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        seen = self.seen_rows.numel()
        if seen == 0:
            return rows
        pos = torch.searchsorted(self.seen_rows, rows)
        found = self.seen_rows[pos.clamp(max=seen - 1)] == rows
        # a never-seen row comes after the seen ones, in row order
        return torch.where(found, self.seen_index[pos.clamp(max=seen - 1)], seen + rows - pos)


class StaticSplitEmbeddingBagCollection(nn.Module):
    """What an unsplit EmbeddingBagCollection of the manifest's tables computes, over the split
    layout: ``collection`` holds the HBM and UVM parts (shard it with :func:`sharding_plan`),
    ``forward`` takes and returns what the unsplit collection would (ids are hashed rows)."""

    def __init__(self, loaded: ManifestFile, pooling: PoolingType | dict[str, PoolingType] = PoolingType.SUM,
                 device: torch.device | None = None):
        super().__init__()
        manifest = loaded.manifest
        self.tables = [t for t in manifest.tables]
        self.pooling = {t.name: pooling.get(t.name, PoolingType.SUM) if isinstance(pooling, dict) else pooling
                        for t in manifest.tables}
        self.features = [f for t in manifest.tables for f in t.features]
        self.remaps = nn.ModuleDict({t.name: _Remap(*dataclasses.astuple(loaded.seen_remap(t.name)))
                                     for t in manifest.tables if is_split(t)})
        self.collection = EmbeddingBagCollection(tables=table_configs(manifest), device=device)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        by_feature = features.to_dict()
        keys, values, lengths = [], [], []
        for t in self.tables:
            for f in t.features:
                ids, bag_lengths = by_feature[f].values(), by_feature[f].lengths()
                if not is_split(t):
                    keys.append(f)
                    values.append(ids)
                    lengths.append(bag_lengths)
                    continue
                index = self.remaps[t.name](ids)
                hot = index < t.rows_hbm
                bag = torch.repeat_interleave(torch.arange(bag_lengths.numel(), device=ids.device), bag_lengths)
                hot_lengths = torch.bincount(bag[hot], minlength=bag_lengths.numel())
                keys += [f + HBM_SUFFIX, f + UVM_SUFFIX]
                values += [index[hot], index[~hot] - t.rows_hbm]
                lengths += [hot_lengths, bag_lengths - hot_lengths]
        pooled = self.collection(KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))).to_dict()
        out = []
        for t in self.tables:
            for f in t.features:
                total = pooled[f + HBM_SUFFIX] + pooled[f + UVM_SUFFIX] if is_split(t) else pooled[f]
                if self.pooling[t.name] == PoolingType.MEAN:
                    total = total / by_feature[f].lengths().clamp(min=1).unsqueeze(1).to(total.dtype)
                out.append(total)
        return KeyedTensor.from_tensor_list(keys=self.features, tensors=out)


def _new_index(loaded: ManifestFile, t: TablePlacement) -> np.ndarray:
    return loaded.new_index(t.name, np.arange(t.hash_size, dtype=np.int64))


def split_state_dict(loaded: ManifestFile, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Unsplit weights (table name -> [hash_size, dim]) -> the split collection's state dict."""
    out = {}
    for t in loaded.manifest.tables:
        w = weights[t.name]
        if not is_split(t):
            out[f"embedding_bags.{t.name}.weight"] = w
            continue
        ordered = torch.empty_like(w)
        ordered[torch.as_tensor(_new_index(loaded, t))] = w  # row r goes to its remap position
        out[f"embedding_bags.{t.name}{HBM_SUFFIX}.weight"] = ordered[:t.rows_hbm].clone()
        out[f"embedding_bags.{t.name}{UVM_SUFFIX}.weight"] = ordered[t.rows_hbm:].clone()
    return out


def unsplit_state_dict(loaded: ManifestFile, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The split collection's state dict -> unsplit weights (table name -> [hash_size, dim])."""
    out = {}
    for t in loaded.manifest.tables:
        if not is_split(t):
            out[t.name] = state[f"embedding_bags.{t.name}.weight"]
            continue
        ordered = torch.cat([state[f"embedding_bags.{t.name}{HBM_SUFFIX}.weight"],
                             state[f"embedding_bags.{t.name}{UVM_SUFFIX}.weight"]])
        out[t.name] = ordered[torch.as_tensor(_new_index(loaded, t))]
    return out


class ProfiledCacheStatistics(CacheStatistics):
    """TorchRec's cache statistics from the profile: a cache holding a share ``clf`` of a table's
    rows is taken to hold its hottest rows, so it misses ``1 - F(clf * hash_size)`` of lookups
    (the access CDF, with the unseen-row estimate of docs/design.md)."""

    def __init__(self, table: TableDemand):
        self.table = table

    @property
    def expected_lookups(self) -> float:
        """Expected distinct rows in a batch: each row of access share p is looked up at least
        once with probability ``1 - (1 - p)^a`` (a: lookups per batch)."""
        coc, a = self.table.coc, self.table.accesses_per_batch
        if coc.total_accesses == 0:
            return 0.0
        p = coc.counts / coc.total_accesses
        return float((coc.rows * -np.expm1(a * np.log1p(-np.minimum(p, 1 - 1e-12)))).sum())

    def expected_miss_rate(self, clf: float) -> float:
        return 1.0 - float(self.table.hbm_fraction(clf * self.table.hash_size))

    @property
    def cacheability(self) -> float:
        """The miss rate of a cache of a tenth of the rows the profile saw (0: very cacheable)."""
        return self.expected_miss_rate(0.1 * self.table.unique_rows / self.table.hash_size)


@dataclasses.dataclass(frozen=True)
class TorchRecBaseline:
    """A plan of TorchRec's own planner for the same tables and hardware, in both cost models."""
    name: str
    planning_seconds: float
    shards: tuple[TorchRecShard, ...]     # empty when TorchRec found no plan
    cost: GpuCosts | None                 # in our cost model; None when TorchRec found no plan
    torchrec_rating_ms: float | None      # TorchRec's perf model: its slowest rank's estimate
    error: str | None                     # TorchRec's PlannerError, when it found no plan

    @property
    def layouts(self) -> dict[str, int]:
        """"sharding_type/kernel" -> tables planned so."""
        layouts = {f"{s.sharding_type}/{s.compute_kernel}": set() for s in self.shards}
        for s in self.shards:
            layouts[f"{s.sharding_type}/{s.compute_kernel}"].add(s.table)
        return {layout: len(tables) for layout, tables in layouts.items()}


def torchrec_shards(options) -> tuple[TorchRecShard, ...]:
    """TorchRec's chosen ShardingOptions as plain shards (a cache without a load factor gets
    TorchRec's default)."""
    return tuple(TorchRecShard(
        table=option.name, sharding_type=option.sharding_type, compute_kernel=option.compute_kernel,
        rank=shard.rank, rows=shard.size[0], cols=shard.size[1],
        cache_load_factor=(option.cache_load_factor or UVM_CACHING_RATIO)
        if option.compute_kernel == FUSED_UVM_CACHING else None)
        for option in options for shard in option.shards)


def cost_torchrec_plan(problem: Problem, shards) -> GpuCosts:
    """A TorchRec plan costed in our model, shard by shard (:func:`recshard_stats.costmodel.shard_cost`):
    a cache of load factor c is taken to hold the hottest rows, so it serves F(c * rows)."""
    def tier_share(j: int, rows: float) -> TierShare:
        t = problem.tables[j]
        return TierShare(float(t.hbm_fraction(rows)), float(t.distinct_rows(rows)), t.distinct_per_batch)

    return shard_cost(problem.hardware.costs, problem.num_gpus, shards, problem.tables,
                      [t.accesses_per_batch for t in problem.tables], tier_share, problem.comm_bytes,
                      [problem.hardware.batch_size * len(t.features) for t in problem.tables],
                      [t.longest_bag for t in problem.tables])


def _collection(problem: Problem) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(tables=_whole_table_configs(problem.tables), device=torch.device("meta"))


def _topology(problem: Problem):
    """The problem's hardware as TorchRec sees it: G CUDA ranks on one host, each with its HBM and a
    G-th of the host memory, our HBM and UVM bandwidths in TorchRec's unit, bytes per millisecond
    (its default HBM bandwidth is ``897 * 1024**3 / 1000``)."""
    from torchrec.distributed.planner import Topology

    hw, g = problem.hardware, problem.num_gpus
    return Topology(world_size=g, compute_device="cuda", hbm_cap=hw.hbm_bytes_per_gpu, ddr_cap=hw.host_bytes // g,
                    local_world_size=g, hbm_mem_bw=hw.hbm_bandwidth / MS_PER_S,
                    hbm_to_ddr_mem_bw=hw.uvm_bandwidth / MS_PER_S)


def _pooling_factors(problem: Problem, t: TableDemand) -> list[float]:
    """Ids per sample of each feature (a table without per-feature numbers: its whole traffic)."""
    return list(t.feature_pooling) or [t.accesses_per_batch / problem.hardware.batch_size]


def _local_batch(problem: Problem) -> int:
    """TorchRec's batch size is per rank; ours is the global batch every table's GPU serves."""
    return max(1, problem.hardware.batch_size // problem.num_gpus)


@dataclasses.dataclass(frozen=True)
class TorchRecRating:
    """A plan pinned to its ranks and kernels, in TorchRec's perf and storage models."""
    rating_ms: float                       # the slowest rank's estimated time
    hbm_needed: tuple[int, ...]            # per rank: TorchRec's HBM estimate of its shards
    hbm_usable: int                        # HBM per rank after the fixed reservation

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
def rate_in_torchrec(problem: Problem, gpu: Sequence[int | tuple[int, ...]], rows_hbm: tuple[int, ...], *,
                     cache: bool = False) -> TorchRecRating:
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
        ranks = (gpu[j],) if isinstance(gpu[j], int) else tuple(gpu[j])
        kernel, load_factor = unsplit_kernel(rows_hbm[j], t.hash_size)
        pooling = _pooling_factors(problem, t)
        if cache and load_factor is not None:
            parts = [(TablePart(t.name, t.name, t.hash_size, 0, ranks, kernel, t.features), 1.0)]
        else:
            split = table_parts(t.name, t.features, t.hash_size, rows_hbm[j], ranks)
            hot = float(t.hbm_fraction(rows_hbm[j])) if len(split) == 2 else 1.0
            parts = list(zip(split, (hot, 1.0 - hot)))  # the HBM part, then the UVM part
        for part, share in parts:
            configs.append(EmbeddingBagConfig(name=part.name, embedding_dim=t.dim, num_embeddings=part.rows,
                                              feature_names=list(part.features), pooling=PoolingType.SUM))
            constraints[part.name] = ParameterConstraints(
                sharding_types=["table_wise" if len(ranks) == 1 else "column_wise"], compute_kernels=[part.kernel],
                feature_names=list(part.features), pooling_factors=[p * share for p in pooling],
                min_partition=t.dim // len(ranks) if len(ranks) > 1 else None,
                cache_params=CacheParams(load_factor=load_factor) if part.kernel == FUSED_UVM_CACHING else None)
            ranks_of[part.name] = ranks
    collection = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    options = EmbeddingEnumerator(_topology(problem), _local_batch(problem), constraints).enumerate(
        collection, [EmbeddingBagCollectionSharder()])
    perf, hbm = [0.0] * problem.num_gpus, [0] * problem.num_gpus
    for option in options:
        ranks = ranks_of[option.name]
        assert len(option.shards) == len(ranks), (option.name, len(option.shards), ranks)
        for rank, shard in zip(ranks, option.shards):
            perf[rank] += shard.perf.total
            hbm[rank] += shard.storage.hbm
    usable = int(problem.hardware.hbm_bytes_per_gpu * (1 - problem.hardware.hbm_reserved_fraction))
    return TorchRecRating(max(perf), tuple(hbm), usable)


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
    from torchrec.distributed.planner.proposers import (EmbeddingOffloadScaleupProposer, GreedyProposer,
                                                        UniformProposer)
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerError

    hw, g = problem.hardware, problem.num_gpus
    collection = _collection(problem)
    results = []
    for name in ("torchrec_default", "torchrec_stats"):
        stats = name == "torchrec_stats"
        constraints = {t.name: ParameterConstraints(
            pooling_factors=_pooling_factors(problem, t), feature_names=list(t.features),
            cache_params=CacheParams(load_factor=seen_share(t.unique_rows, t.hash_size),
                                     stats=ProfiledCacheStatistics(t)) if stats else None)
            for t in problem.tables}
        proposers = [GreedyProposer(), GreedyProposer(use_depth=False), UniformProposer()]
        planner = EmbeddingShardingPlanner(
            topology=_topology(problem), batch_size=_local_batch(problem), constraints=constraints,
            storage_reservation=FixedPercentageStorageReservation(hw.hbm_reserved_fraction),
            proposer=[*proposers, EmbeddingOffloadScaleupProposer()] if stats else proposers, debug=False,
            timeout_seconds=timeout_s)
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
        results.append(TorchRecBaseline(name, seconds, shards, cost_torchrec_plan(problem, shards), max(rank_perf),
                                        None))
    return results
