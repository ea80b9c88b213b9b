"""RecShard's plan run in a real TorchRec model, on the trainer's side (the ``torchrec`` extra;
``scripts/setup.sh`` installs it on CPU). With :mod:`recshard_stats.torchrec_planner` and
:mod:`recshard_stats.torchrec_checkpoint` the only modules that import torchrec.

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
- :func:`distributed_model_parallel`: TorchRec's ``DistributedModelParallel`` over the plan, after
  checking what DMP would not: the module path names the collection, its tables are the
  manifest's (same rows and dims), and the process group has the manifest's number of ranks.
- :func:`apply_optimizer`: the manifest's embedding optimizer (the hardware config's
  ``optimizer``, whose state the plan counts in every row) fused into the collection's backward,
  as TorchRec's planner and sharders read it; :func:`distributed_model_parallel` refuses a
  collection trained with another one.
- :func:`split_state_dict` / :func:`unsplit_state_dict`: an unsplit table's weights (a
  checkpoint held in one process) into the split layout and back; sharded checkpoints, each
  rank reading and writing only its shards, are :mod:`recshard_stats.torchrec_checkpoint`.
- Applying a new plan to a trained model (a manifest's ``diff``): :func:`sharding_plan_delta`
  (the parts that only move, as ``DistributedModelParallel.reshard`` takes them, and the parts
  whose shape changed) and :func:`reshard_rows` / :func:`reshard_state_dict` (weights and
  row-wise optimizer state from the old row order and parts to the new);
  :func:`reshard_in_place` runs ``DistributedModelParallel.reshard`` with that delta on a live
  model when only moves are asked of it.

On CPU, TorchRec runs the ``fused`` kernel only: ``sharding_plan(..., device_type="cpu")`` maps
every kernel to it (the placement is the same); ``fused_uvm`` and the HBM/UVM split need GPUs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor, PoolingType
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding.dynamic_sharding import output_sharding_plan_delta_single
from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
from torchrec.distributed.types import CacheParams, CacheStatistics, EmbeddingModuleShardingPlan, ShardingPlan
from torchrec.modules.embedding_configs import DataType

from recshard_stats.config import optimizer_state_bytes
from recshard_stats.costmodel import ComputeKernel
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.export import (
    EMB_OPTIM_TYPES,
    HBM_SUFFIX,
    UVM_SUFFIX,
    data_type_name,
    parts_of,
    unsplit_kernel,
)
from recshard_stats.manifest import Manifest, TablePlacement
from recshard_stats.manifest_loader import ManifestFile
from recshard_stats.solver.problem import TableDemand


@dataclasses.dataclass(frozen=True)
class TablePart:
    """One TorchRec table of the split layout: all of a manifest table, or its HBM or UVM part."""

    name: str
    table: str  # the manifest table it comes from
    rows: int
    # a split table's part: the position of its row 0 in the table's remap order (HBM part 0,
    # UVM part rows_hbm); a table left whole keeps its hashed row order and has 0
    first_row: int
    ranks: tuple[int, ...]  # one rank (table_wise), or the table's column shards' ranks (column_wise)
    kernel: str
    features: tuple[str, ...]


def is_split(t: TablePlacement) -> bool:
    """Rows in both tiers: the table becomes an HBM part and a UVM part."""
    return t.rows_hbm > 0 and t.rows_uvm > 0


def table_parts(
    name: str, features: tuple[str, ...], hash_size: int, rows_hbm: int, ranks: tuple[int, ...]
) -> list[TablePart]:
    """One table in the split layout (:func:`recshard_stats.export.parts_of`, what
    ``torchrec_plan.json`` states): itself whole (``fused`` or ``fused_uvm``), or its HBM part
    then its UVM part when it has rows in both tiers; each part on the table's ranks (column
    shards of a table cut column-wise hold the same rows)."""
    parts = parts_of(name, hash_size, rows_hbm)
    return [
        TablePart(
            p["name"],
            name,
            p["num_embeddings"],
            p["first_row"],
            ranks,
            p["compute_kernel"],
            features if len(parts) == 1 else tuple(f + p["name"][len(name) :] for f in features),
        )
        for p in parts
    ]


def split_parts(manifest: Manifest) -> list[TablePart]:
    """The tables of the split layout, in manifest order (a table's HBM part before its UVM part)."""
    return [
        p for t in manifest.tables for p in table_parts(t.name, t.features, t.hash_size, t.rows_hbm, t.ranks)
    ]


def _parts_of(manifest: Manifest, split: bool) -> list[TablePart]:
    """The TorchRec tables the plan places: the split layout's parts, or the tables whole."""
    if split:
        return split_parts(manifest)
    return [TablePart(t.name, t.name, t.hash_size, 0, t.ranks, "", t.features) for t in manifest.tables]


def _table_of(part: str) -> str:
    """The table a split layout's part (or a whole table) comes from."""
    return part.removesuffix(HBM_SUFFIX).removesuffix(UVM_SUFFIX)


def check_collection(
    model: nn.Module, manifest: Manifest, module_path: str, *, split: bool = True
) -> EmbeddingBagCollection:
    """The EmbeddingBagCollection at ``module_path`` in ``model``, checked against the manifest:
    the path names one (a :class:`StaticSplitEmbeddingBagCollection` stands for its own
    ``collection``), and its tables are the plan's, with the same rows and dims. Errors are in
    the manifest's terms (tables, not the split layout's ``__hbm``/``__uvm`` parts)."""
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        found = [name for name, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"module_path {module_path!r} names no module of the model "
            f"(its EmbeddingBagCollections: {found or 'none'})",
            fixes=("pass the dotted path of the collection the plan is for",),
        ) from None
    if isinstance(module, StaticSplitEmbeddingBagCollection):
        module = module.collection
    if not isinstance(module, EmbeddingBagCollection):
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"module_path {module_path!r} names a {type(module).__name__}, not an EmbeddingBagCollection",
            fixes=("pass the dotted path of the collection the plan is for",),
        )
    configs = {c.name: c for c in module.embedding_bag_configs()}
    parts = _parts_of(manifest, split)
    dims = {t.name: t.dim for t in manifest.tables}
    missing = sorted({p.table for p in parts if p.name not in configs})
    if missing:
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"the collection at {module_path!r} lacks the manifest's table(s) {missing[:10]}"
            + (" (the split layout's parts)" if split else ""),
            fixes=(
                "build it with StaticSplitEmbeddingBagCollection(loaded)"
                if split
                else "build it with table_configs(manifest, split=False)",
            ),
        )
    extra = sorted({_table_of(n) for n in set(configs) - {p.name for p in parts}})
    if extra:
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"the collection at {module_path!r} has table(s) {extra[:10]} the manifest does not plan",
            fixes=("solve with a model config that has them, or leave them out of the collection",),
        )
    dtype = data_type(manifest.hardware.bytes_per_element)
    for p in parts:
        c = configs[p.name]
        if c.data_type != dtype:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"table {p.table!r}: the collection's {p.name!r} holds {c.data_type.name} weights, the "
                f"manifest was solved for {dtype.name} (bytes_per_element "
                f"{manifest.hardware.bytes_per_element})",
                fixes=(
                    "build the collection with table_configs(manifest)",
                    "solve for the data type you train in",
                ),
            )
        if (c.num_embeddings, c.embedding_dim) != (p.rows, dims[p.table]):
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"table {p.table!r}: the collection's {p.name!r} has {c.num_embeddings} rows x "
                f"{c.embedding_dim} columns, the manifest plans {p.rows} x {dims[p.table]}",
                fixes=("build the collection from the same manifest",),
            )
    return module


def optimizer_class(optimizer: str) -> type[torch.optim.Optimizer]:
    """The optimizer class TorchRec fuses as a hardware config's ``optimizer`` (and whose state
    its planner counts)."""
    from torchrec.distributed.utils import emb_opt_type_to_optimizer_class

    found = emb_opt_type_to_optimizer_class(_emb_optim_type(optimizer))
    assert found is not None, f"TorchRec maps every EmbOptimType of EMB_OPTIM_TYPES ({optimizer})"
    return found


def _emb_optim_type(optimizer: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return EmbOptimType[EMB_OPTIM_TYPES[optimizer]]


def apply_optimizer(model: nn.Module, loaded: ManifestFile, module_path: str, **optimizer_kwargs) -> None:
    """Fuse the manifest's embedding optimizer (``optimizer_kwargs``: its settings, e.g. ``lr``)
    into the backward of the collection at ``module_path``, as TorchRec's
    ``apply_optimizer_in_backward`` does: its sharders then run it, and its planner counts its state.
    Call before :func:`distributed_model_parallel`."""
    # what TorchRec's (deprecated) apply_optimizer_in_backward calls
    from torch.distributed.optim import _apply_optimizer_in_backward

    collection = check_collection(model, loaded.manifest, module_path)
    _apply_optimizer_in_backward(
        optimizer_class(loaded.manifest.hardware.optimizer), collection.parameters(), optimizer_kwargs
    )


def check_optimizer(collection: EmbeddingBagCollection, manifest: Manifest) -> None:
    """Every table of the collection trains with the manifest's embedding optimizer (its state is
    in the plan's rows): the one :func:`apply_optimizer` fused, or none fused when the manifest's
    is sgd (TorchRec's default)."""
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    expected = _emb_optim_type(manifest.hardware.optimizer)
    planned = f"{manifest.hardware.optimizer} ({expected.name})"
    for name, param in collection.named_parameters():
        classes = getattr(param, "_optimizer_classes", None)
        table = _table_of(name.split(".")[-2]) if "." in name else name
        if not classes:
            if expected.name == EMB_OPTIM_TYPES["sgd"]:
                continue
            found = "no optimizer fused (TorchRec's default: EXACT_SGD)"
        else:
            try:
                fused = optimizer_type_to_emb_opt_type(classes[0])
            except ValueError:
                fused = None
            if fused == expected:
                continue
            found = f"{classes[0].__name__} ({fused.name if fused else 'not one TorchRec fuses'})"
        dim = param.shape[-1] if param.dim() > 1 else 0
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"table {table!r} trains with {found}, the manifest was solved for {planned}, whose state "
            f"({optimizer_state_bytes(manifest.hardware.optimizer, dim)} bytes per row) the plan counts",
            fixes=(
                "apply_optimizer(model, loaded, module_path, lr=...) before distributed_model_parallel",
                "solve with the trainer's optimizer (optimizer in the hardware config)",
            ),
        )


def check_world_size(manifest: Manifest, world_size: int) -> None:
    """One rank per GPU of the plan: fewer cannot hold it, more would sit idle."""
    if world_size != manifest.num_gpus:
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"the manifest plans {manifest.num_gpus} ranks (GPUs 0..{manifest.num_gpus - 1}), "
            f"the process group has {world_size}",
            fixes=(
                f"launch {manifest.num_gpus} ranks (torchrun --nproc-per-node ...)",
                f"solve for {world_size} GPUs (num_gpus in the hardware config)",
            ),
        )


def distributed_model_parallel(
    model: nn.Module,
    loaded: ManifestFile,
    module_path: str,
    *,
    env=None,
    device: torch.device | None = None,
    split: bool = True,
    cache: bool = False,
    local_world_size: int | None = None,
    **dmp_kwargs,
):
    """``DistributedModelParallel(model, plan=sharding_plan(...))`` after :func:`check_collection`
    and :func:`check_world_size` (``env``: a TorchRec ``ShardingEnv``, default the world group).
    On a CPU ``device`` every kernel is ``fused``."""
    import torch.distributed as dist
    from torchrec.distributed.types import ShardingEnv

    manifest = loaded.manifest
    if env is None:
        if not dist.is_initialized():
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"no process group: the manifest plans {manifest.num_gpus} ranks",
                fixes=("call torch.distributed.init_process_group first (torchrun sets it up)",),
            )
        env = ShardingEnv.from_process_group(dist.group.WORLD)
    check_world_size(manifest, env.world_size)
    collection = check_collection(model, manifest, module_path, split=split)
    check_optimizer(collection, manifest)
    module_path = _collection_path(model, module_path)
    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    plan = sharding_plan(
        manifest,
        module_path,
        split=split,
        cache=cache,
        local_world_size=local_world_size,
        device_type=device.type,
        module=collection,
    )
    return DistributedModelParallel(model, env=env, plan=plan, device=device, **dmp_kwargs)


def _collection_path(model: nn.Module, module_path: str) -> str:
    """The path of the EmbeddingBagCollection TorchRec shards: a static split's ``collection``."""
    if isinstance(model.get_submodule(module_path), StaticSplitEmbeddingBagCollection):
        return f"{module_path}.collection" if module_path else "collection"
    return module_path


def _layout(ranks: tuple[int, ...], kernel: str):
    """``table_wise`` on one rank, ``column_wise`` (equal widths, in column order) on several."""
    if len(ranks) == 1:
        return table_wise(rank=ranks[0], compute_kernel=kernel)
    return column_wise(ranks=list(ranks), compute_kernel=kernel)


def data_type(bytes_per_element: int) -> DataType:
    """TorchRec's DataType of the weights (a hardware config's ``bytes_per_element``)."""
    return DataType.FP16 if data_type_name(bytes_per_element) == "fp16" else DataType.FP32


def table_configs(manifest: Manifest, *, split: bool = True) -> list[EmbeddingBagConfig]:
    """EmbeddingBagConfigs of the split layout (sum pooling: the split module pools itself),
    or of the unsplit tables, in the weights' data type (fp16 when the plan was solved with
    ``bytes_per_element: 2``)."""
    dtype = data_type(manifest.hardware.bytes_per_element)
    if split:
        dims = {t.name: t.dim for t in manifest.tables}
        return [
            EmbeddingBagConfig(
                name=p.name,
                embedding_dim=dims[p.table],
                num_embeddings=p.rows,
                feature_names=list(p.features),
                pooling=PoolingType.SUM,
                data_type=dtype,
            )
            for p in split_parts(manifest)
        ]
    return whole_table_configs(manifest.tables, dtype)


def whole_table_configs(tables, dtype: DataType = DataType.FP32) -> list[EmbeddingBagConfig]:
    """One sum-pooled EmbeddingBagConfig per table (manifest or solver tables: name, dim,
    hash_size, features)."""
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.dim,
            num_embeddings=t.hash_size,
            feature_names=list(t.features),
            pooling=PoolingType.SUM,
            data_type=dtype,
        )
        for t in tables
    ]


def sharding_plan(
    manifest: Manifest,
    module_path: str = "",
    *,
    split: bool = True,
    cache: bool = False,
    local_world_size: int | None = None,
    device_type: str = "cuda",
    module: EmbeddingBagCollection | None = None,
) -> ShardingPlan:
    """The manifest's placement as a TorchRec ``ShardingPlan`` for the EmbeddingBagCollection at
    ``module_path`` in the model (the split layout's collection by default: ``split=True``).

    ``local_world_size``: ranks per host (default: all on one host). ``device_type="cpu"``:
    every kernel becomes ``fused``, the one TorchRec runs on CPU."""
    if module is None:
        module = EmbeddingBagCollection(
            tables=table_configs(manifest, split=split), device=torch.device("meta")
        )
    per_table = {}
    if split:
        for p in split_parts(manifest):
            per_table[p.name] = _layout(p.ranks, ComputeKernel.FUSED if device_type == "cpu" else p.kernel)
    else:
        for t in manifest.tables:
            kernel, load_factor = unsplit_kernel(t.rows_hbm, t.hash_size)
            if load_factor is not None and not cache:
                raise ValueError(
                    f"table {t.name!r} has rows in both tiers: plan it with split=True or cache=True"
                )
            per_table[t.name] = _layout(t.ranks, ComputeKernel.FUSED if device_type == "cpu" else kernel)
            if load_factor is not None and device_type != "cpu":
                per_table[t.name] = _with_cache(per_table[t.name], CacheParams(load_factor=load_factor))
    plan = construct_module_sharding_plan(
        module,
        per_table,
        local_size=local_world_size or manifest.num_gpus,
        world_size=manifest.num_gpus,
        device_type=device_type,
    )
    return ShardingPlan({module_path: plan})


def _with_cache(generator, cache_params: CacheParams):
    def generate(*args, **kwargs):
        sharding = generator(*args, **kwargs)
        sharding.cache_params = cache_params
        return sharding

    return generate


def parameter_constraints(manifest: Manifest, *, cache: bool = True) -> dict[str, ParameterConstraints]:
    """For teams that keep TorchRec's planner: per table, the measured pooling factors (mean ids
    per sample of each feature) and, when ``cache``, for each table the plan splits, TorchRec's
    cache sized as the plan's HBM part: load factor = ``rows_hbm / hash_size``, the one meaning
    of a cache load factor in this package (``sharding_plan(..., cache=True)`` uses the same)."""
    out = {}
    for t in manifest.tables:
        _, load_factor = unsplit_kernel(t.rows_hbm, t.hash_size)
        params = CacheParams(load_factor=load_factor) if cache and load_factor is not None else None
        out[t.name] = ParameterConstraints(
            pooling_factors=list(t.feature_pooling), feature_names=list(t.features), cache_params=params
        )
    return out


class _Remap(nn.Module):
    """Hashed row -> its position in the table's remap order (hot rows first), in torch."""

    seen_rows: torch.Tensor
    seen_index: torch.Tensor

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


def _check_ids(t: TablePlacement, feature: str, ids: torch.Tensor) -> None:
    """Ids are the table's hashed rows: outside [0, hash_size) a split table's remap would alias
    them to other rows, so they are refused here, in the table's terms."""
    if ids.numel() == 0:
        return
    low, high = torch.aminmax(ids)
    if low < 0 or high >= t.hash_size:
        bad = ids[(ids < 0) | (ids >= t.hash_size)][0]
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"feature {feature!r}: id {int(bad)} is outside table {t.name!r} "
            f"(rows 0..{t.hash_size - 1}, hash_size {t.hash_size})",
            fixes=("ids are hashed rows: recshard_stats.hashing.rows_of(keys, hash_size)",),
        )


class StaticSplitEmbeddingBagCollection(nn.Module):
    """What an unsplit EmbeddingBagCollection of the manifest's tables computes, over the split
    layout: ``collection`` holds the HBM and UVM parts (shard it with :func:`sharding_plan`),
    ``forward`` takes and returns what the unsplit collection would (ids are hashed rows)."""

    def __init__(
        self,
        loaded: ManifestFile,
        pooling: PoolingType | dict[str, PoolingType] = PoolingType.SUM,
        device: torch.device | None = None,
    ):
        super().__init__()
        manifest = loaded.manifest
        self.tables = list(manifest.tables)
        self.pooling = {
            t.name: pooling.get(t.name, PoolingType.SUM) if isinstance(pooling, dict) else pooling
            for t in manifest.tables
        }
        self.features = [f for t in manifest.tables for f in t.features]
        self.remaps = nn.ModuleDict(
            {
                t.name: _Remap(*dataclasses.astuple(loaded.seen_remap(t.name)))
                for t in manifest.tables
                if is_split(t)
            }
        )
        self.collection = EmbeddingBagCollection(tables=table_configs(manifest), device=device)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        by_feature = features.to_dict()
        missing = [f for f in self.features if f not in by_feature]
        if missing:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"the batch lacks feature(s) {missing[:10]} of the manifest's tables "
                f"(it has {sorted(by_feature)[:10]})",
                fixes=("give every feature of the manifest's tables, with empty bags where it is absent",),
            )
        keys, values, lengths = [], [], []
        for t in self.tables:
            for f in t.features:
                ids, bag_lengths = by_feature[f].values(), by_feature[f].lengths()
                _check_ids(t, f, ids)
                if not is_split(t):
                    keys.append(f)
                    values.append(ids)
                    lengths.append(bag_lengths)
                    continue
                index = self.remaps[t.name](ids)
                hot = index < t.rows_hbm
                bag = torch.repeat_interleave(
                    torch.arange(bag_lengths.numel(), device=ids.device), bag_lengths
                )
                hot_lengths = torch.bincount(bag[hot], minlength=bag_lengths.numel())
                keys += [f + HBM_SUFFIX, f + UVM_SUFFIX]
                values += [index[hot], index[~hot] - t.rows_hbm]
                lengths += [hot_lengths, bag_lengths - hot_lengths]
        pooled = self.collection(
            KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
            )
        ).to_dict()
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


def _whole_rows(loaded: ManifestFile, t: TablePlacement, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """A table's row-indexed tensor (first dimension: rows) in hashed-row order, from its parts
    in ``loaded``'s layout (part name -> tensor)."""
    if not is_split(t):
        return parts[t.name]
    ordered = torch.cat([parts[t.name + HBM_SUFFIX], parts[t.name + UVM_SUFFIX]])
    return ordered[torch.as_tensor(_new_index(loaded, t))]


def _layout_parts(loaded: ManifestFile, t: TablePlacement, whole: torch.Tensor) -> dict[str, torch.Tensor]:
    """A table's row-indexed tensor in hashed-row order -> its parts in ``loaded``'s layout."""
    if not is_split(t):
        return {t.name: whole}
    ordered = torch.empty_like(whole)
    ordered[torch.as_tensor(_new_index(loaded, t))] = whole  # row r goes to its remap position
    return {
        t.name + HBM_SUFFIX: ordered[: t.rows_hbm].clone(),
        t.name + UVM_SUFFIX: ordered[t.rows_hbm :].clone(),
    }


def split_state_dict(loaded: ManifestFile, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Unsplit weights (table name -> [hash_size, dim]) -> the split collection's state dict."""
    return {
        f"embedding_bags.{part}.weight": w
        for t in loaded.manifest.tables
        for part, w in _layout_parts(loaded, t, weights[t.name]).items()
    }


def _parts_in(t: TablePlacement, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    parts = parts_of(t.name, t.hash_size, t.rows_hbm)
    return {p["name"]: state[f"embedding_bags.{p['name']}.weight"] for p in parts}


def unsplit_state_dict(loaded: ManifestFile, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The split collection's state dict -> unsplit weights (table name -> [hash_size, dim])."""
    return {t.name: _whole_rows(loaded, t, _parts_in(t, state)) for t in loaded.manifest.tables}


def reshard_rows(
    old: ManifestFile, new: ManifestFile, table: str, parts: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """One table's row-indexed tensors from the old plan's layout to the new one's: its weights,
    or a row-wise optimizer state (Adagrad's rows, row-wise Adagrad's one value per row). Each
    row keeps its values; it moves to its position in the new remap, and to the other part when
    it enters or leaves HBM. ``parts``: part name (``<table>``, or ``<table>__hbm`` and
    ``<table>__uvm``) -> tensor."""
    return _layout_parts(new, new.table(table), _whole_rows(old, old.table(table), parts))


def reshard_state_dict(
    old: ManifestFile, new: ManifestFile, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The split collection's state dict under the old plan -> under the new one (the same
    weights, in the new plan's row order and parts)."""
    return {
        f"embedding_bags.{part}.weight": w
        for t in new.manifest.tables
        for part, w in reshard_rows(old, new, t.name, _parts_in(old.table(t.name), state)).items()
    }


def sharding_plan_delta(
    old: Manifest, new: Manifest, module_path: str = "", device_type: str = "cuda"
) -> tuple[float, EmbeddingModuleShardingPlan, tuple[str, ...]]:
    """What applying the new plan asks of TorchRec. Parts of the split layout whose shape is the
    same under both plans and whose ranks changed: TorchRec's own delta of the two sharding
    plans (``output_sharding_plan_delta_single``, with its data volume in MB), the input of
    ``DistributedModelParallel.reshard``. Parts whose shape changed (HBM rows moved between the
    tiers): their names, to build anew with :func:`reshard_rows`' tensors."""
    plans = [sharding_plan(m, module_path, device_type=device_type).plan[module_path] for m in (old, new)]
    shapes = [{c.name: (c.num_embeddings, c.embedding_dim) for c in table_configs(m)} for m in (old, new)]
    same = [name for name in shapes[1] if shapes[0].get(name) == shapes[1][name]]
    volume, delta = output_sharding_plan_delta_single(
        EmbeddingModuleShardingPlan({n: plans[0][n] for n in same}),
        EmbeddingModuleShardingPlan({n: plans[1][n] for n in same}),
        return_data_volume=True,
    )
    return volume, delta, tuple(n for n in shapes[1] if n not in same)


# what each rank hashes to compare its Python hash seed with the others'
_HASH_PROBE = ("recshard", "p2p-tag")


def reshard_in_place(dmp: DistributedModelParallel, old: Manifest, new: Manifest, module_path: str) -> float:
    """Apply the new plan to a live ``DistributedModelParallel`` built from the old one (by
    :func:`distributed_model_parallel` with the same ``module_path``): TorchRec's
    ``DistributedModelParallel.reshard`` with :func:`sharding_plan_delta`'s delta, weights and
    fused optimizer state sent from rank to rank. Returns the MB TorchRec moved (0 when nothing
    moves). Every rank calls it. Refused, before anything is sent, when a part changes shape
    (HBM rows moved between the tiers: build the model anew with :func:`reshard_state_dict`),
    when the model has no dense parameters (TorchRec's reshard reads the DDP wrapper DMP adds
    around them), and on gloo when the ranks' Python hash seeds differ: TorchRec tags its
    point-to-point messages with ``hash()`` of a tuple holding the table's name, which gloo
    matches, so the ranks would wait for each other forever."""
    import os

    import torch.distributed as dist

    module_path = _collection_path(dmp.module, module_path)
    volume, delta, rebuilt = sharding_plan_delta(old, new, module_path, device_type=dmp.device.type)
    if rebuilt:
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"the new plan changes the shape of {len(rebuilt)} part(s) ({', '.join(rebuilt[:5])}"
            f"{', ...' if len(rebuilt) > 5 else ''}): HBM rows moved between the tiers, which "
            "resharding in place cannot do",
            fixes=(
                "carry the weights with reshard_state_dict and build the model from the new "
                "manifest with distributed_model_parallel",
                "restore a sharded checkpoint under the new plan (torchrec_checkpoint)",
            ),
        )
    if not delta:
        return 0.0
    if not hasattr(dmp._dmp_wrapped_module, "module"):  # TorchRec's reshard reads it
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            "TorchRec's DistributedModelParallel.reshard needs the DDP wrapper DMP puts around "
            "dense parameters, and this model has none",
            fixes=("reshard a model with its dense layers", "build the model anew from the new manifest"),
        )
    if dist.get_backend() == "gloo":
        seeds: list[int | None] = [None] * dist.get_world_size()
        dist.all_gather_object(seeds, hash(_HASH_PROBE))
        if len(set(seeds)) > 1:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                "the ranks hash strings differently (PYTHONHASHSEED "
                f"{os.environ.get('PYTHONHASHSEED', 'unset')!r} here): TorchRec's reshard tags its "
                "gloo messages with hash() of the table names, so no rank's message would match",
                fixes=(
                    "launch every rank with the same PYTHONHASHSEED (e.g. PYTHONHASHSEED=0 torchrun ...)",
                ),
            )
    return float(dmp.reshard({module_path: (volume, delta)}, module_path))


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
