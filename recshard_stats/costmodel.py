"""The one cost model (docs/design.md, "Cost model"), shared by the solver, the baselines, the
replay of held-out data, the report and the costing of TorchRec's shards.

A GPU runs a kernel group per tier and row size (its tables' HBM rows of one dim in one call,
their host rows in another; FBGEMM's TBE groups mixed dims too, plain PyTorch cannot), forward
and backward + update. Per batch, a tier costs

    fixed (once per group present)
  + lookups x (per lookup + per byte x row bytes)
  + distinct rows x (per distinct row + per byte x row bytes + per distinct host row x ramp(span))
  + bags x (per bag + per byte x row bytes)       (its pooled output rows, empty bags too)

and a call's forward takes at least ``chain x its longest bag`` (one bag's ids are summed in
series: at small batches a bag of hundreds of ids sets the time).

where ``ramp(span)`` rises from 0 to 1 (in log2) as the table's bytes in host memory grow from
``span_low_bytes`` to ``span_high_bytes``: a host row of a table larger than ~1 GiB costs a
fixed time per lookup whatever its size (measured on an H200, ``../shared/data/gpu``). Each term
is per table (the span is the table's whole size, a constant, so the MILP stays linear), and a
table's cost is linear in its HBM share of lookups (F) and of distinct rows (D). An optional
communication term charges each table's ids in and pooled outputs out at ``comm_bandwidth``.

The v1 model (``hbm_bandwidth`` and ``uvm_bandwidth``: seconds = bytes / bandwidth) is the
special case :meth:`CostModel.from_bandwidths`. :mod:`recshard_stats.calibrate` measures the
terms on a GPU.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

from recshard_stats.units import GIB, NS, PS, US


# TorchRec's compute kernels, as its plans name them: HBM, host memory, a cache in HBM
class ComputeKernel(enum.StrEnum):
    """TorchRec's compute kernels this model prices (``EmbeddingComputeKernel`` values)."""

    FUSED = "fused"  # the table in HBM
    FUSED_UVM = "fused_uvm"  # the table in host memory, read through UVM
    FUSED_UVM_CACHING = "fused_uvm_caching"  # host memory behind an HBM cache of its load factor


class ShardingType(enum.StrEnum):
    """TorchRec's sharding types (``ShardingType`` values) as its plans name them."""

    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"
    DATA_PARALLEL = "data_parallel"


# the shared H200 grid: host lookups cost per byte up to ~256 MiB tables, per lookup beyond ~8 GiB
SPAN_LOW_BYTES = float(2**28)
SPAN_HIGH_BYTES = float(2**33)


def span_ramp(span_bytes, low_bytes: float, high_bytes: float):
    """0 up to ``low_bytes``, 1 from ``high_bytes``, linear in log2 between."""
    low, high = math.log2(low_bytes), math.log2(high_bytes)
    if np.ndim(span_bytes) == 0:  # one table (the exact polish asks ~10^6 times): floats, not 0-d arrays
        return min(max((math.log2(max(float(span_bytes), 1.0)) - low) / (high - low), 0.0), 1.0)
    span = np.maximum(np.asarray(span_bytes, dtype=np.float64), 1.0)
    return np.clip((np.log2(span) - low) / (high - low), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class TierTerms:
    """One tier's kernel group, in seconds: per call, per lookup, per byte looked up, per
    distinct row of the batch, per byte of distinct rows, and per distinct row x span ramp."""

    fixed_s: float = 0.0
    lookup_s: float = 0.0
    byte_s: float = 0.0
    distinct_s: float = 0.0
    distinct_byte_s: float = 0.0
    span_distinct_s: float = 0.0
    bag_s: float = 0.0  # per bag (a sample's ids of one feature), empty or not
    bag_byte_s: float = 0.0  # per byte of a bag's pooled output row
    chain_s: float = 0.0  # per id of a call's longest bag: the floor one bag's serial sum sets

    def __add__(self, other: TierTerms) -> TierTerms:
        return TierTerms(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def per_lookup(self, row_bytes):
        return self.lookup_s + self.byte_s * row_bytes

    def per_distinct(self, row_bytes, ramp):
        return self.distinct_s + self.distinct_byte_s * row_bytes + self.span_distinct_s * ramp

    def per_bag(self, row_bytes):
        return self.bag_s + self.bag_byte_s * row_bytes


@dataclasses.dataclass(frozen=True)
class PassTerms:
    """One pass (forward, or backward + update): its HBM and host kernel groups."""

    hbm: TierTerms = TierTerms()
    host: TierTerms = TierTerms()


# a number, or one per candidate split (a table's costs at many splits at once)
Amount = float | np.ndarray


@dataclasses.dataclass(frozen=True)
class TableLoad:
    """One table (or column shard, or TorchRec shard) on a GPU, per batch. Array fields are
    allowed (costs of one table at many splits)."""

    gpu: int
    lookups: float  # ids looked up per batch
    hbm_fraction: Amount  # share of them served from HBM
    distinct_hbm: Amount  # distinct rows the batch touches in HBM
    distinct_host: Amount  # ... and in host memory
    row_bytes: float
    host_span_bytes: float  # the table's size, for the host per-row ramp
    comm_bytes: float = 0.0  # ids in + pooled outputs out over the GPUs' links
    bags_hbm: Amount = 0.0  # bags its HBM part runs (one per sample and feature)
    bags_host: Amount = 0.0  # ... and its host part (a split table runs both)
    longest_bag: float = 0.0  # ids in its longest bag of a batch (each tier runs its share of them)
    column_share: float = 1.0  # of the table's columns (a column shard looks up every id of the table:
    #                            the UVM access share counts each lookup once, split over its shards)


@dataclasses.dataclass(frozen=True)
class CostModel:
    forward: PassTerms
    backward: PassTerms = PassTerms()
    span_low_bytes: float = SPAN_LOW_BYTES
    span_high_bytes: float = SPAN_HIGH_BYTES
    comm_bandwidth: float = 0.0  # bytes/s between GPUs; 0 leaves communication out
    source: str = "bandwidths"  # "bandwidths" (v1) or the calibration it came from

    @classmethod
    def from_bandwidths(
        cls, hbm_bandwidth: float, uvm_bandwidth: float, comm_bandwidth: float = 0.0
    ) -> CostModel:
        """v1: bytes / bandwidth per tier, nothing else."""
        return cls(
            PassTerms(TierTerms(byte_s=1.0 / hbm_bandwidth), TierTerms(byte_s=1.0 / uvm_bandwidth)),
            comm_bandwidth=comm_bandwidth,
        )

    @functools.cached_property
    def hbm(self) -> TierTerms:
        """Both passes' HBM terms."""
        return self.forward.hbm + self.backward.hbm

    @functools.cached_property
    def host(self) -> TierTerms:
        """Both passes' host terms."""
        return self.forward.host + self.backward.host

    def span_ramp(self, span_bytes):
        return span_ramp(span_bytes, self.span_low_bytes, self.span_high_bytes)

    def unit_costs(self, row_bytes, host_span_bytes):
        """(per lookup in HBM, in host memory, per distinct row in HBM, in host memory): a row
        never costs more in HBM than in host memory (a fit may put a term the other way), so a
        table's cost only falls as rows move to HBM."""
        ramp = self.span_ramp(host_span_bytes)
        host_lookup, host_distinct = self.host.per_lookup(row_bytes), self.host.per_distinct(row_bytes, ramp)
        return (
            np.minimum(self.hbm.per_lookup(row_bytes), host_lookup),
            host_lookup,
            np.minimum(self.hbm.per_distinct(row_bytes, 0.0), host_distinct),
            host_distinct,
        )

    def table_seconds(self, load: TableLoad):
        """Seconds per batch of one table's lookups on its GPU (the groups' fixed costs apart)."""
        lookup_hbm, lookup_host, distinct_hbm, distinct_host = self.unit_costs(
            load.row_bytes, load.host_span_bytes
        )
        cost = _tier_work(
            load, "hbm", lookup_hbm, distinct_hbm, self.hbm.per_bag(load.row_bytes)
        ) + _tier_work(load, "host", lookup_host, distinct_host, self.host.per_bag(load.row_bytes))
        return cost + (load.comm_bytes / self.comm_bandwidth if self.comm_bandwidth > 0 else 0.0)

    def forward_seconds(self, load: TableLoad, tier: str):
        """The forward work of one tier's part of a table (its call's throughput, for the chain)."""
        t = getattr(self.forward, tier)
        ramp = self.span_ramp(load.host_span_bytes) if tier == "host" else 0.0
        return _tier_work(
            load,
            tier,
            t.per_lookup(load.row_bytes),
            t.per_distinct(load.row_bytes, ramp),
            t.per_bag(load.row_bytes),
        )

    @property
    def least_group_seconds(self) -> float:
        """What any GPU with tables pays at least."""
        return min(self.hbm.fixed_s, self.host.fixed_s)


def tier_bags(bags, rows_hbm, hash_size: int):
    """(bags in HBM, bags in host memory) of a table with rows_hbm of its rows in HBM: it runs
    its bags in each tier it has rows in."""
    rows = np.asarray(rows_hbm)
    return bags * (rows > 0), bags * (rows < hash_size)


def _tier_work(load: TableLoad, tier: str, per_lookup, per_distinct, per_bag):
    """One tier's part of a table at these unit costs: its lookups, distinct rows and bags."""
    if tier == "hbm":
        return (
            load.lookups * load.hbm_fraction * per_lookup
            + load.distinct_hbm * per_distinct
            + load.bags_hbm * per_bag
        )
    return (
        load.lookups * (1.0 - load.hbm_fraction) * per_lookup
        + load.distinct_host * per_distinct
        + load.bags_host * per_bag
    )


@dataclasses.dataclass(frozen=True)
class GpuCosts:
    """A placement's cost: per table and per GPU (seconds per batch), and the share of all
    accesses served from UVM."""

    table_cost: tuple[float, ...]
    gpu_cost: tuple[float, ...]
    uvm_access_fraction: float

    @property
    def max_cost(self) -> float:
        return max(self.gpu_cost)

    @property
    def imbalance(self) -> float:
        mean = sum(self.gpu_cost) / len(self.gpu_cost)
        return self.max_cost / mean if mean else 1.0


def placement_cost(model: CostModel, num_gpus: int, loads: Sequence[TableLoad]) -> GpuCosts:
    """Tables on GPUs -> their cost: each table's, plus each GPU's kernel groups."""
    gpu_cost = [0.0] * num_gpus
    # (GPU, tier, row bytes): one call each, with its forward work and its longest bag
    groups: dict[tuple[int, str, float], list[float]] = {}
    table_cost = []
    uvm = total = 0.0
    chained = model.hbm.chain_s > 0 or model.host.chain_s > 0
    for load in loads:
        cost = float(model.table_seconds(load))
        table_cost.append(cost)
        gpu_cost[load.gpu] += cost
        for tier, present, share in (
            ("hbm", load.hbm_fraction > 0, load.hbm_fraction),
            ("host", load.hbm_fraction < 1, 1.0 - load.hbm_fraction),
        ):
            if not present:
                continue
            group = groups.setdefault((load.gpu, tier, float(load.row_bytes)), [0.0, 0.0])
            if chained:  # the tier's share of the longest bag's ids
                group[0] += float(model.forward_seconds(load, tier))
                group[1] = max(group[1], float(load.longest_bag * share))
        uvm += float(load.lookups * load.column_share * (1 - load.hbm_fraction))
        total += load.lookups * load.column_share
    for (gpu, tier, _), (forward, longest) in groups.items():
        terms = getattr(model.forward, tier)
        # a call's forward takes at least its longest bag's serial sum
        gpu_cost[gpu] += getattr(model, tier).fixed_s + max(
            0.0, terms.chain_s * longest - forward - terms.fixed_s
        )
    return GpuCosts(tuple(table_cost), tuple(gpu_cost), uvm / total if total else 0.0)


@dataclasses.dataclass(frozen=True)
class TierShare:
    """A table's traffic with some of its rows in HBM: HBM share of lookups, distinct rows per
    batch in HBM and in all."""

    hbm_fraction: float
    distinct_hbm: float
    distinct: float


# TorchRec shards that split a table's rows: ids hash uniformly over rows, so such a shard serves
# its share of the rows' lookups (column shards serve every lookup, on their share of the bytes;
# a data-parallel table serves 1/G of the lookups on each rank)
_ROW_SPLITS = {ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD}


def shard_cost(
    model: CostModel,
    num_gpus: int,
    shards,
    tables,
    accesses_per_batch: Sequence[float],
    tier_share: Callable[[int, float], TierShare],
    comm_bytes: Sequence[float],
    bags: Sequence[float],
    longest_bag: Sequence[float],
) -> GpuCosts:
    """A TorchRec plan's shards (``recshard_stats.manifest.TorchRecShard``) costed in this model.
    ``tables``: name, hash_size, dim and row_bytes of each table; ``tier_share(j, rows)``: table j's
    traffic with its ``rows`` hottest rows in HBM. A ``fused`` shard is served from HBM,
    ``fused_uvm`` from UVM, ``fused_uvm_caching`` from a cache of its load factor taken to hold the
    hottest rows. ``bags``: per table, the bags of a batch (samples x features); ``longest_bag``:
    the ids in its longest."""
    index = {t.name: j for j, t in enumerate(tables)}
    loads = []
    for s in shards:
        j = index[s.table]
        t = tables[j]
        whole = tier_share(j, t.hash_size)
        if s.compute_kernel == ComputeKernel.FUSED_UVM:
            tiers = TierShare(0.0, 0.0, whole.distinct)
        elif s.compute_kernel == ComputeKernel.FUSED_UVM_CACHING:
            tiers = tier_share(j, s.cache_load_factor * t.hash_size)
        else:
            tiers = TierShare(1.0, whole.distinct, whole.distinct)
        data_parallel = s.sharding_type == ShardingType.DATA_PARALLEL
        share = (
            s.rows / t.hash_size
            if s.sharding_type in _ROW_SPLITS
            else 1.0 / num_gpus
            if data_parallel
            else 1.0
        )
        samples = 1.0 / num_gpus if data_parallel else 1.0  # a row shard runs every bag
        cols = s.cols / t.dim
        loads.append(
            TableLoad(
                gpu=s.rank,
                lookups=accesses_per_batch[j] * share,
                hbm_fraction=tiers.hbm_fraction,
                distinct_hbm=tiers.distinct_hbm * share,
                distinct_host=(tiers.distinct - tiers.distinct_hbm) * share,
                row_bytes=t.row_bytes * cols,
                host_span_bytes=t.hash_size * share * t.row_bytes * cols,
                comm_bytes=comm_bytes[j] * (share if share < 1 else cols),
                bags_hbm=bags[j] * samples if tiers.hbm_fraction > 0 else 0.0,
                bags_host=bags[j] * samples if tiers.hbm_fraction < 1 else 0.0,
                longest_bag=longest_bag[j],
                column_share=cols,
            )
        )
    return placement_cost(model, num_gpus, loads)


# the calibration file's units (readable numbers): seconds per unit of each term
_FILE_UNITS = {
    "fixed_s": ("fixed_us", US),
    "lookup_s": ("lookup_ns", NS),
    "byte_s": ("byte_ps", PS),
    "distinct_s": ("distinct_ns", NS),
    "distinct_byte_s": ("distinct_byte_ps", PS),
    "span_distinct_s": ("span_distinct_ns", NS),
    "bag_s": ("bag_ns", NS),
    "bag_byte_s": ("bag_byte_ps", PS),
    "chain_s": ("chain_ns", NS),
}
CALIBRATION_KIND = "recshard_calibration"


def terms_to_file(terms: TierTerms) -> dict:
    return {
        name: round(float(getattr(terms, field)) / unit, 6) for field, (name, unit) in _FILE_UNITS.items()
    }


def calibration_to_file(model: CostModel, **extra) -> dict:
    """A calibration file's contents (``recshard calibrate`` writes it, a hardware config's
    ``calibration:`` reads it)."""
    return {
        "kind": CALIBRATION_KIND,
        **extra,
        "span_low_gib": float(model.span_low_bytes) / GIB,
        "span_high_gib": float(model.span_high_bytes) / GIB,
        **{
            p: {tier: terms_to_file(getattr(getattr(model, p), tier)) for tier in ("hbm", "host")}
            for p in ("forward", "backward")
        },
    }


def calibration_from_file(data, source: str, comm_bandwidth: float = 0.0) -> CostModel:
    """The cost model of a calibration file; ValueError names the bad entry."""
    if not isinstance(data, dict) or data.get("kind") != CALIBRATION_KIND:
        raise ValueError(f"{source}: not a calibration file (kind: {CALIBRATION_KIND} missing)")

    def number(where: str, value) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(f"{source}: {where} must be a finite number >= 0, got {value!r}")
        return float(value)

    passes = {}
    for p in ("forward", "backward"):
        tiers = {}
        for tier in ("hbm", "host"):
            entry = (data.get(p) or {}).get(tier)
            if not isinstance(entry, dict):
                raise ValueError(f"{source}: {p}.{tier} is missing")
            unknown = set(entry) - {name for name, _ in _FILE_UNITS.values()}
            if unknown:
                raise ValueError(
                    f"{source}: {p}.{tier} has unknown keys {sorted(unknown)}; valid: "
                    f"{sorted(name for name, _ in _FILE_UNITS.values())}"
                )
            tiers[tier] = TierTerms(
                **{
                    field: number(f"{p}.{tier}.{name}", entry.get(name, 0.0)) * unit
                    for field, (name, unit) in _FILE_UNITS.items()
                }
            )
        passes[p] = PassTerms(**tiers)
    low = number("span_low_gib", data.get("span_low_gib", SPAN_LOW_BYTES / GIB)) * GIB
    high = number("span_high_gib", data.get("span_high_gib", SPAN_HIGH_BYTES / GIB)) * GIB
    if not 0 < low < high:
        raise ValueError(
            f"{source}: span_low_gib ({low / GIB:g}) must be positive and below span_high_gib "
            f"({high / GIB:g})"
        )
    return CostModel(
        passes["forward"],
        passes["backward"],
        low,
        high,
        comm_bandwidth,
        f"{data.get('device', 'unknown device')} ({pathlib.PurePath(source).name})",
    )
