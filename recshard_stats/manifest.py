"""The manifest contract: what the solver hands to training.

One definition: the frozen dataclasses below (:class:`Manifest` and its entries), serialized by
:meth:`Manifest.to_json` and read by :meth:`Manifest.from_json`; ``manifest.schema.json`` is
tested field by field against them. Needs numpy and pyarrow only (no Spark, no Pyomo). A trainer
reads a manifest on disk with :func:`recshard_stats.manifest_loader.load_manifest`; the solve and
remap stages write and publish it with :mod:`recshard_stats.manifest_publisher`.

The remap of a table orders its rows hottest first: the ``n_seen`` rows accessed while
profiling get indices ``[0, n_seen)`` (access count descending, row ascending), the rows
never seen follow in row order. Indices ``[0, rows_hbm)`` live in HBM, the rest in UVM, so
``index`` returned for the UVM tier is ``new_index - rows_hbm``. When ``rows_hbm > n_seen``
the never-seen rows below ``unseen_hbm_below_row`` are the ones in HBM (new ids hash
uniformly, so which unseen rows does not matter; row order makes it reproducible).

Every referenced file is a path relative to the manifest's directory (never absolute, never
escaping it) with a SHA-256 the loader checks.

Versions (``schema_version``, docs/design.md "Manifest versions"): any change a reader of the
previous version could not decode as meant (a field added, renamed or removed, a new category
value, a changed unit or meaning) bumps :data:`SCHEMA_VERSION` by one; a writer writes only the
current version. A reader reads its own version and every older one (each upgraded on load by
:data:`_UPGRADES`) and refuses a newer one before reading any field, saying which versions it reads.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import pathlib
from collections.abc import Callable

from recshard_stats.config import NAME_PATTERN, RESERVED_SUFFIXES, HardwareConfig, ModelConfig
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.typed_json import DecodeError, from_plain, to_plain

SCHEMA_VERSION = "6"
MAX_HASH_SIZE = 2**63 - 1  # rows are addressed by int64 ids (TorchRec, FBGEMM)
HBM, UVM = 0, 1  # a row's tier, as ManifestFile.remap returns it
KIND = "recshard-manifest"
SCHEMA_PATH = pathlib.Path(__file__).with_name("manifest.schema.json")


def invalid_manifest(message: str, *fixes: str, path=None) -> RecShardError:
    where = f"{path}: " if path else ""
    return RecShardError(Reason.MANIFEST_INVALID, where + message, fixes=fixes)


class MilpStatus(enum.StrEnum):
    """How the MILP ended."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"  # stopped at its time limit with a plan of its own
    NO_INCUMBENT = "no_incumbent"  # no plan of its own in time: the start stands
    SKIPPED = "skipped"  # not run (the start is within the MIP gap of the bound, or the model is too
    #                      big to build in its time): the start stands


class PlanSource(enum.StrEnum):
    """Which stage gave the shipped plan (the cheapest of them)."""

    MILP = "milp"
    LOCAL_SEARCH = "local_search"  # moves and swaps from the best plan so far
    KERNEL_GROUPS = "kernel_groups"  # rearranged with the kernel calls' costs counted
    START = "start"  # the cheapest start: the balanced plan, LPT or a baseline's assignment, split exactly
    BASELINE = "baseline"  # a whole-table baseline as it is
    RESTRAINED = "restrained"  # the best plan with table moves taken back to stay within max_moved_gib
    ALIGNED_BLOCKS = "aligned_blocks"  # each table's shards on an aligned block of GPUs (a MILP, HiGHS)


@dataclasses.dataclass(frozen=True)
class SolverSettings:
    """What the solve ran with (their digest is part of the plan's)."""

    solver: str  # glpk, cbc or highs
    time_limit_s: float
    mip_gap: float
    cdf_segments: int
    symmetry_breaking: bool
    local_search_s: float
    max_column_shards: int
    torchrec_baselines: bool
    torchrec_timeout_s: int
    hit_estimate: str  # held_out or in_sample: what the plan was chosen with
    max_moved_gib: float | None = None  # most GiB of tables that may change GPU against the previous plan

    def __post_init__(self):
        if not self.time_limit_s > 0 or not 0 <= self.mip_gap < 1 or self.cdf_segments < 1:
            raise invalid_manifest(
                f"solver settings out of range: time_limit_s {self.time_limit_s}, mip_gap "
                f"{self.mip_gap}, cdf_segments {self.cdf_segments}"
            )


@dataclasses.dataclass(frozen=True)
class RemapFile:
    """A table's remap (Parquet ``row, index, access_count`` of its seen rows, hottest first)."""

    path: str  # relative to the manifest's directory
    sha256: str
    rows: int  # seen rows it holds (= the table's unique_rows)


@dataclasses.dataclass(frozen=True)
class ColumnShard:
    """One column shard of a table cut column-wise (TorchRec's ``column_wise``): its GPU and its
    columns. Every shard of a table keeps the table's ``rows_hbm`` hottest rows in HBM (the same
    remap order, of its own columns)."""

    gpu: int
    first_column: int
    columns: int
    predicted_cost_ms: float
    trainer_buffer_bytes: int


@dataclasses.dataclass(frozen=True)
class GpuPart:
    """What a table puts on one GPU: all of it, or one column shard (``share`` of its columns)."""

    gpu: int
    share: float
    predicted_cost_ms: float
    trainer_buffer_bytes: int


@dataclasses.dataclass(frozen=True)
class TablePlacement:
    """One table: where it lives, how it is split, and what the solver predicted for it."""

    name: str
    features: tuple[str, ...]
    gpu: int
    hash_size: int
    dim: int
    hash: str
    rows_hbm: int
    rows_uvm: int
    unique_rows: int
    unused_rows: int
    predicted_hbm_access_fraction: float  # of new data (the plan's hit estimate, held-out by default)
    in_sample_hbm_access_fraction: float  # of the profiled data itself, which ranked the rows
    predicted_cost_ms: float
    accesses_per_batch: float
    pooling_factor: float
    feature_pooling: tuple[float, ...]  # mean ids per sample, per feature (TorchRec's pooling_factors)
    coverage: float
    row_bytes: float
    remap: RemapFile | None  # None until `recshard remap` has run
    unseen_hbm_below_row: int = 0  # never-seen rows below this row are in HBM (set by remap)
    trainer_buffer_bytes: int = 0  # HBM its GPU keeps for the trainer's ids and pooled outputs
    column_shards: tuple[ColumnShard, ...] = ()  # a hot table cut column-wise (gpu: the first shard's);
    #                                               empty: the whole table is on gpu
    longest_bag: float = 0.0  # ids in the longest bag a batch holds (the profile's 1 - 1/B quantile)

    @property
    def fully_in_hbm(self) -> bool:
        return self.rows_hbm == self.hash_size

    @property
    def ranks(self) -> tuple[int, ...]:
        """The GPUs holding it: its column shards', in column order, or its one GPU."""
        return tuple(s.gpu for s in self.column_shards) or (self.gpu,)

    @property
    def gpu_parts(self) -> tuple[GpuPart, ...]:
        if not self.column_shards:
            return (GpuPart(self.gpu, 1.0, self.predicted_cost_ms, self.trainer_buffer_bytes),)
        return tuple(
            GpuPart(s.gpu, s.columns / self.dim, s.predicted_cost_ms, s.trainer_buffer_bytes)
            for s in self.column_shards
        )


@dataclasses.dataclass(frozen=True)
class GpuPlacement:
    rank: int
    tables: tuple[str, ...]
    hbm_bytes_used: int  # rows in HBM
    hbm_bytes_capacity: int
    predicted_cost_ms: float
    trainer_buffer_bytes: int = 0  # its tables' trainer buffers, beside the rows
    kernel_groups_ms: float = 0.0  # the fixed cost of its kernel calls (in predicted_cost_ms)


@dataclasses.dataclass(frozen=True)
class BaselinePlan:
    """Another planner's plan of the same tables, costed in the same model."""

    name: str
    max_cost_ms: float
    imbalance: float
    uvm_access_fraction: float
    cost_vs_recshard: float
    gpu: tuple[int, ...]  # per table, in the manifest's table order
    rows_hbm: tuple[int, ...]
    gpu_cost_ms: tuple[float, ...]
    torchrec_rating_ms: float | None = None  # in TorchRec's perf model (when torchrec is installed)


@dataclasses.dataclass(frozen=True)
class TorchRecShard:
    """One shard of a TorchRec plan: its table, layout, rank and size."""

    table: str
    sharding_type: str  # table_wise, row_wise, column_wise, data_parallel, ...
    compute_kernel: str  # fused, fused_uvm, fused_uvm_caching, ...
    rank: int
    rows: int
    cols: int
    cache_load_factor: float | None = None  # fused_uvm_caching: the share of the table's rows cached


@dataclasses.dataclass(frozen=True)
class TorchRecPlan:
    """A plan of TorchRec's own planner for the same tables and hardware, costed in our model
    shard by shard and rated by TorchRec's perf model; ``error``: TorchRec found no plan."""

    name: str
    planning_seconds: float
    error: str | None
    shards: tuple[TorchRecShard, ...]
    max_cost_ms: float | None
    imbalance: float | None
    uvm_access_fraction: float | None
    cost_vs_recshard: float | None
    gpu_cost_ms: tuple[float, ...]
    torchrec_rating_ms: float | None  # TorchRec's estimate of its slowest rank


@dataclasses.dataclass(frozen=True)
class PlanSummary:
    solver: str
    status: MilpStatus
    source: PlanSource
    objective_ms: float  # the shipped plan's slowest GPU, exact cost model
    lower_bound_ms: float
    gap: float
    milp_objective_ms: float | None  # None: no incumbent
    milp_bound_ms: float | None
    solve_seconds: float
    imbalance: float
    uvm_access_fraction: float
    in_sample_objective_ms: float | None  # the plan's slowest GPU scored on the profiled data (None:
    #                                       a restricted manifest, not re-costed)
    in_sample_uvm_access_fraction: float
    baselines: tuple[BaselinePlan, ...]
    torchrec: tuple[TorchRecPlan, ...] = ()  # TorchRec's planner (when torchrec is installed)
    torchrec_rating_ms: float | None = None  # this plan in TorchRec's perf model, split as it runs


@dataclasses.dataclass(frozen=True)
class TableChange:
    """How one table's placement changed against the previous plan."""

    name: str
    previous_ranks: tuple[int, ...]  # (): the previous plan had no such table
    ranks: tuple[int, ...]
    moved_bytes: int  # of its parameters, those that change GPU (a column shard moved: its columns)
    previous_rows_hbm: int
    rows_hbm: int
    # set by remap: its rows in HBM now and in host memory before, and the other way round
    # (None: not counted yet, or the table too large to count)
    rows_entering_hbm: int | None = None
    rows_leaving_hbm: int | None = None


@dataclasses.dataclass(frozen=True)
class PlanDiff:
    """The plan against the one published when it was solved (``recshard solve --previous``):
    what a trainer moves to apply it. ``tables``: those whose ranks or HBM rows changed."""

    previous: str  # the previous manifest.json, where it was read
    previous_sha256: str
    previous_ds: str
    moved_bytes: int  # tables' parameters that change GPU, in all
    tables: tuple[TableChange, ...]


@dataclasses.dataclass(frozen=True)
class ManifestInputs:
    """What the plan was computed from; ``digest`` covers all but the stats path."""

    stats: str
    stats_digest: str
    stats_ds: str | None
    model_digest: str
    hardware_digest: str
    solver_settings: SolverSettings
    digest: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The plan handed to training. Constructing one checks that it is consistent."""

    ds: str
    created_at: str
    producer: str
    inputs: ManifestInputs
    model: ModelConfig
    hardware: HardwareConfig
    plan: PlanSummary
    gpus: tuple[GpuPlacement, ...]
    tables: tuple[TablePlacement, ...]
    diff: PlanDiff | None = None  # against the previous plan, when solved with one
    schema_version: str = SCHEMA_VERSION
    kind: str = KIND

    def __post_init__(self):
        _check_consistency(self)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def table(self, name: str) -> TablePlacement:
        for t in self.tables:
            if t.name == name:
                return t
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"no table {name!r} in the manifest",
            fixes=(f"tables: {sorted(t.name for t in self.tables)[:10]}",),
        )

    def tables_on(self, gpu: int) -> list[TablePlacement]:
        """Tables with rows on the GPU: whole, or one of their column shards."""
        return [t for t in self.tables if gpu in t.ranks]

    def restricted(self, names) -> Manifest:
        """The plan of some tables only, on the same GPUs (for tests and debugging): each GPU's
        rows, buffers and cost are those of the tables kept (its kernel-call cost kept while it
        holds any), the model config keeps their tables and features, and the summary keeps no
        baselines, TorchRec plans or bound (they were for every table)."""
        keep = list(dict.fromkeys(names))
        unknown = sorted(set(keep) - {t.name for t in self.tables})
        if unknown or not keep:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"cannot restrict the manifest to {unknown or 'no tables'}: not its tables",
                fixes=(f"tables: {sorted(t.name for t in self.tables)[:10]}",),
            )
        tables = tuple(t for t in self.tables if t.name in keep)
        gpus = []
        for g in self.gpus:
            parts = [(t, p) for t in tables for p in t.gpu_parts if p.gpu == g.rank]
            gpus.append(
                dataclasses.replace(
                    g,
                    tables=tuple(t.name for t, _ in parts),
                    hbm_bytes_used=round(sum(t.rows_hbm * t.row_bytes * p.share for t, p in parts)),
                    trainer_buffer_bytes=sum(p.trainer_buffer_bytes for _, p in parts),
                    kernel_groups_ms=g.kernel_groups_ms if parts else 0.0,
                    predicted_cost_ms=sum(p.predicted_cost_ms for _, p in parts)
                    + (g.kernel_groups_ms if parts else 0.0),
                )
            )
        costs = [g.predicted_cost_ms for g in gpus]
        slowest, mean = max(costs), sum(costs) / len(costs)
        accesses = sum(t.accesses_per_batch for t in tables)
        uvm = sum(t.accesses_per_batch * (1 - t.predicted_hbm_access_fraction) for t in tables)
        uvm_in_sample = sum(t.accesses_per_batch * (1 - t.in_sample_hbm_access_fraction) for t in tables)
        features = {f for t in tables for f in t.features}
        model = dataclasses.replace(
            self.model,
            tables=tuple(t for t in self.model.tables if t.name in keep),
            features=tuple(f for f in self.model.features if f.name in features),
        )
        plan = dataclasses.replace(
            self.plan,
            objective_ms=slowest,
            lower_bound_ms=0.0,
            gap=1.0,
            milp_objective_ms=None,
            milp_bound_ms=None,
            imbalance=slowest / mean if mean > 0 else 1.0,
            uvm_access_fraction=uvm / accesses if accesses > 0 else 0.0,
            in_sample_objective_ms=None,
            in_sample_uvm_access_fraction=uvm_in_sample / accesses if accesses > 0 else 0.0,
            baselines=(),
            torchrec=(),
            torchrec_rating_ms=None,
        )
        return dataclasses.replace(self, model=model, tables=tables, gpus=tuple(gpus), plan=plan)

    def to_json(self) -> str:
        data = to_plain(self)
        ordered = {"schema_version": data.pop("schema_version"), "kind": data.pop("kind"), **data}
        try:
            return json.dumps(ordered, indent=2, allow_nan=False) + "\n"
        except ValueError:  # NaN or infinity: not JSON, and no number a manifest may hold
            raise invalid_manifest("a number is NaN or infinite: a manifest holds finite numbers") from None

    @classmethod
    def from_json(cls, data: str | dict, source: str = "manifest") -> Manifest:
        """Parse and check a manifest document (text or parsed JSON); errors name the field."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise invalid_manifest(f"not valid JSON ({exc})", path=source) from None
        if not isinstance(data, dict):
            raise invalid_manifest("top level is not a JSON object", path=source)
        try:
            return from_plain(cls, upgraded(data, source))
        except DecodeError as exc:
            raise invalid_manifest(str(exc), path=source) from None
        except RecShardError as exc:
            raise RecShardError(
                exc.reason, f"{source}: {exc.message}", fixes=exc.fixes, context=exc.context
            ) from None


_EPS = 1e-9


def _check_diff(m: Manifest, diff: PlanDiff) -> None:
    """A diff names tables of this plan, at their ranks and HBM rows, and its moves add up."""
    names = {t.name: t for t in m.tables}
    for change in diff.tables:
        t = names.get(change.name)
        if t is None or change.ranks != t.ranks or change.rows_hbm != t.rows_hbm:
            raise invalid_manifest(
                f"diff: table {change.name!r} at ranks {change.ranks} with {change.rows_hbm} HBM rows, the plan "
                + (f"at {t.ranks} with {t.rows_hbm}" if t else "has no such table")
            )
        if change.moved_bytes < 0:
            raise invalid_manifest(f"diff: table {change.name!r} moves {change.moved_bytes} bytes")
    if diff.moved_bytes != sum(c.moved_bytes for c in diff.tables):
        raise invalid_manifest(
            f"diff: moved_bytes {diff.moved_bytes}, its tables' sum to {sum(c.moved_bytes for c in diff.tables)}"
        )


def _check_consistency(m: Manifest) -> None:
    """Everything a manifest's numbers must agree on; the first disagreement is the error."""
    if m.kind != KIND or m.schema_version != SCHEMA_VERSION:
        raise invalid_manifest(
            f"kind/schema_version {m.kind!r}/{m.schema_version!r}, expected {KIND!r}/{SCHEMA_VERSION!r}"
        )
    if not m.tables or not m.gpus:
        raise invalid_manifest("a manifest needs at least one table and one GPU")
    if m.diff is not None:
        _check_diff(m, m.diff)
    names = [t.name for t in m.tables]
    if len(set(names)) != len(names):
        raise invalid_manifest(
            f"table names must be unique: {sorted({n for n in names if names.count(n) > 1})}"
        )
    for t in m.tables:
        _check_table(t, m.num_gpus)
        if t.row_bytes < t.dim * m.hardware.bytes_per_element:
            raise invalid_manifest(
                f"table {t.name!r}: row_bytes {t.row_bytes} is less than its {t.dim} weights of "
                f"{m.hardware.bytes_per_element} bytes"
            )
    host = sum(t.rows_uvm * t.row_bytes for t in m.tables)
    if host > m.hardware.host_bytes:
        raise invalid_manifest(
            f"the tables' UVM rows take {host:.0f} bytes, the hardware's host memory is {m.hardware.host_bytes}"
        )
    _check_gpus(m)
    _check_plan(m)


def _fraction(where: str, name: str, value: float) -> None:
    if not -_EPS <= value <= 1 + _EPS:
        raise invalid_manifest(f"{where}: {name} {value} is not a fraction in [0, 1]")


def _non_negative(where: str, **values: float) -> None:
    negative = {k: v for k, v in values.items() if (isinstance(v, float) and not math.isfinite(v)) or v < 0}
    if negative:
        raise invalid_manifest(f"{where}: {negative} must be finite and non-negative")


def _check_table(t: TablePlacement, num_gpus: int) -> None:
    where = f"table {t.name!r}"
    for kind, name in (("table", t.name), *(("feature", f) for f in t.features)):
        if not NAME_PATTERN.fullmatch(name) or name.endswith(RESERVED_SUFFIXES):
            raise invalid_manifest(f"{where}: {kind} name {name!r} breaks the naming rule of model configs")
    _non_negative(
        where,
        gpu=t.gpu,
        hash_size=t.hash_size,
        dim=t.dim,
        rows_hbm=t.rows_hbm,
        rows_uvm=t.rows_uvm,
        unique_rows=t.unique_rows,
        unused_rows=t.unused_rows,
        unseen_hbm_below_row=t.unseen_hbm_below_row,
        predicted_cost_ms=t.predicted_cost_ms,
        accesses_per_batch=t.accesses_per_batch,
        pooling_factor=t.pooling_factor,
        row_bytes=t.row_bytes,
        trainer_buffer_bytes=t.trainer_buffer_bytes,
    )
    _fraction(where, "predicted_hbm_access_fraction", t.predicted_hbm_access_fraction)
    _fraction(where, "in_sample_hbm_access_fraction", t.in_sample_hbm_access_fraction)
    _fraction(where, "coverage", t.coverage)
    if not t.features or len(t.feature_pooling) != len(t.features):
        raise invalid_manifest(f"{where}: needs features and one pooling factor per feature")
    if t.gpu >= num_gpus:
        raise invalid_manifest(f"{where} is on GPU {t.gpu}, the plan has {num_gpus}")
    if t.hash_size > MAX_HASH_SIZE:
        raise invalid_manifest(f"{where}: hash_size {t.hash_size} is beyond int64 ids ({MAX_HASH_SIZE})")
    if t.rows_hbm + t.rows_uvm != t.hash_size:
        raise invalid_manifest(
            f"{where}: rows_hbm {t.rows_hbm} + rows_uvm {t.rows_uvm} != hash_size {t.hash_size}"
        )
    if t.unique_rows > t.hash_size or t.unused_rows != t.hash_size - t.unique_rows:
        raise invalid_manifest(
            f"{where}: unique_rows {t.unique_rows} and unused_rows {t.unused_rows} do not add up to "
            f"hash_size {t.hash_size}"
        )
    if t.column_shards:
        _check_column_shards(t, num_gpus)
    if t.remap is not None:
        if t.remap.path != f"remap/{t.name}.parquet":
            raise invalid_manifest(f"{where}: its remap file is {t.remap.path!r}, not remap/{t.name}.parquet")
        if t.remap.rows != t.unique_rows:
            raise invalid_manifest(
                f"{where}: its remap holds {t.remap.rows} rows, unique_rows is {t.unique_rows}"
            )


def _check_column_shards(t: TablePlacement, num_gpus: int) -> None:
    where = f"table {t.name!r}"
    shards = t.column_shards
    gpus = [s.gpu for s in shards]
    if (
        len(shards) < 2
        or len(set(gpus)) != len(gpus)
        or not all(0 <= g < num_gpus for g in gpus)
        or gpus[0] != t.gpu
    ):
        raise invalid_manifest(
            f"{where}: column shards on GPUs {gpus} must be two or more, on distinct GPUs below "
            f"{num_gpus}, the first on its gpu {t.gpu}"
        )
    first = 0
    for s in shards:
        _non_negative(
            where, predicted_cost_ms=s.predicted_cost_ms, trainer_buffer_bytes=s.trainer_buffer_bytes
        )
        if s.first_column != first or s.columns < 1:
            raise invalid_manifest(
                f"{where}: column shard {s} does not start at column {first} or holds no column"
            )
        first += s.columns
    if first != t.dim:
        raise invalid_manifest(f"{where}: its column shards hold {first} columns, its dim is {t.dim}")
    cost = sum(s.predicted_cost_ms for s in shards)
    if abs(t.predicted_cost_ms - cost) > _EPS * max(cost, 1e-12) + 1e-12 or t.trainer_buffer_bytes != sum(
        s.trainer_buffer_bytes for s in shards
    ):
        raise invalid_manifest(
            f"{where}: predicted_cost_ms and trainer_buffer_bytes must add up its column shards'"
        )


def _check_gpus(m: Manifest) -> None:
    for rank, g in enumerate(m.gpus):
        where = f"GPU {g.rank}"
        if g.rank != rank:
            raise invalid_manifest(
                f"gpus[{rank}] has rank {g.rank}: ranks must be 0..{m.num_gpus - 1} in order"
            )
        _non_negative(
            where,
            hbm_bytes_used=g.hbm_bytes_used,
            hbm_bytes_capacity=g.hbm_bytes_capacity,
            predicted_cost_ms=g.predicted_cost_ms,
            trainer_buffer_bytes=g.trainer_buffer_bytes,
        )
        mine = m.tables_on(rank)
        if sorted(g.tables) != sorted(t.name for t in mine):
            raise invalid_manifest(
                f"{where} lists tables {sorted(g.tables)}, the tables placed on it are "
                f"{sorted(t.name for t in mine)}"
            )
        parts = [(t, p) for t in mine for p in t.gpu_parts if p.gpu == rank]
        used = sum(t.rows_hbm * t.row_bytes * p.share for t, p in parts)
        if abs(g.hbm_bytes_used - used) > 1 + _EPS * used:
            raise invalid_manifest(
                f"{where}: hbm_bytes_used {g.hbm_bytes_used}, its tables' HBM rows take {used:.0f}"
            )
        buffers = sum(p.trainer_buffer_bytes for _, p in parts)
        if g.trainer_buffer_bytes != buffers:
            raise invalid_manifest(
                f"{where}: trainer_buffer_bytes {g.trainer_buffer_bytes}, its tables' add up to {buffers}"
            )
        if g.hbm_bytes_capacity > m.hardware.usable_hbm_bytes:
            raise invalid_manifest(
                f"{where}: hbm_bytes_capacity {g.hbm_bytes_capacity}, more than the usable HBM of the "
                f"manifest's hardware ({m.hardware.usable_hbm_bytes})"
            )
        if g.hbm_bytes_used + buffers > g.hbm_bytes_capacity:
            raise invalid_manifest(
                f"{where} uses {g.hbm_bytes_used} bytes of HBM for rows and {buffers} for the trainer's "
                f"buffers, more than its {g.hbm_bytes_capacity}"
            )
        cost = sum(p.predicted_cost_ms for _, p in parts) + g.kernel_groups_ms
        if g.kernel_groups_ms < 0 or abs(g.predicted_cost_ms - cost) > _EPS * max(cost, 1e-12) + 1e-12:
            raise invalid_manifest(
                f"{where}: predicted_cost_ms {g.predicted_cost_ms}, its tables and kernel calls "
                f"({g.kernel_groups_ms} ms) add up to {cost}"
            )


def _check_plan(m: Manifest) -> None:
    plan = m.plan
    _non_negative(
        "plan",
        objective_ms=plan.objective_ms,
        lower_bound_ms=plan.lower_bound_ms,
        solve_seconds=plan.solve_seconds,
        **(
            {}
            if plan.in_sample_objective_ms is None
            else {"in_sample_objective_ms": plan.in_sample_objective_ms}
        ),
    )
    _fraction("plan", "uvm_access_fraction", plan.uvm_access_fraction)
    _fraction("plan", "in_sample_uvm_access_fraction", plan.in_sample_uvm_access_fraction)
    slowest = max(g.predicted_cost_ms for g in m.gpus)
    if abs(plan.objective_ms - slowest) > _EPS * max(slowest, 1e-12) + 1e-12:
        raise invalid_manifest(
            f"plan: objective_ms {plan.objective_ms} is not the slowest GPU's cost {slowest}"
        )
    if plan.imbalance < 1 - _EPS:
        raise invalid_manifest(f"plan: imbalance {plan.imbalance} is below 1")
    names = {t.name for t in m.tables}
    for tp in plan.torchrec:
        where = f"TorchRec plan {tp.name!r}"
        if (tp.error is None) == (tp.max_cost_ms is None) or (tp.error is None and not tp.shards):
            raise invalid_manifest(f"{where}: needs either an error or shards with a cost")
        if tp.error is None:
            if tp.max_cost_ms is None or tp.uvm_access_fraction is None or tp.imbalance is None:
                raise invalid_manifest(f"{where}: a plan without an error needs its costs")
            _non_negative(where, max_cost_ms=tp.max_cost_ms, planning_seconds=tp.planning_seconds)
            _fraction(where, "uvm_access_fraction", tp.uvm_access_fraction)
            if len(tp.gpu_cost_ms) != m.num_gpus:
                raise invalid_manifest(f"{where}: needs a cost for each of the {m.num_gpus} GPUs")
        for s in tp.shards:
            if s.table not in names or not 0 <= s.rank < m.num_gpus or s.rows < 0 or s.cols < 0:
                raise invalid_manifest(
                    f"{where}: shard {s} names no table of the manifest or no GPU below {m.num_gpus}"
                )
            if s.cache_load_factor is not None:
                _fraction(where, "cache_load_factor", s.cache_load_factor)
    for b in plan.baselines:
        where = f"baseline {b.name!r}"
        _non_negative(where, max_cost_ms=b.max_cost_ms)
        _fraction(where, "uvm_access_fraction", b.uvm_access_fraction)
        if (
            not len(b.gpu) == len(b.rows_hbm) == len(m.tables)
            or len(b.gpu_cost_ms) != m.num_gpus
            or any(not 0 <= g < m.num_gpus for g in b.gpu)
        ):
            raise invalid_manifest(
                f"{where}: needs a GPU below {m.num_gpus} and HBM rows for each of the "
                f"{len(m.tables)} tables, and a cost per GPU"
            )


def complete_with_remaps(manifest: Manifest, remaps: dict[str, tuple[RemapFile, int]]) -> Manifest:
    """The manifest with each table's remap file and ``unseen_hbm_below_row`` filled in
    (``remaps``: table -> (file, below row)); every table must be given."""
    missing = [t.name for t in manifest.tables if t.name not in remaps]
    if missing:
        raise invalid_manifest(f"no remap given for tables {missing[:5]}")
    return dataclasses.replace(
        manifest,
        tables=tuple(
            dataclasses.replace(t, remap=remaps[t.name][0], unseen_hbm_below_row=remaps[t.name][1])
            for t in manifest.tables
        ),
    )


# what a version-1 reader assumed for the solver options an early version-1 manifest left out
_V1_OPTION_DEFAULTS = {
    "solver": "cbc",
    "time_limit_s": 60.0,
    "mip_gap": 0.01,
    "cdf_segments": 16,
    "symmetry_breaking": True,
    "local_search_s": 20.0,
    "max_column_shards": 8,
    "torchrec_baselines": True,
    "torchrec_timeout_s": 120,
}


def _from_v1(data: dict) -> dict:
    """Version 1 -> 2: the solver settings got their own record (``inputs.solver_options`` ->
    ``inputs.solver_settings``, every field given) and the start's source is ``start``, not
    ``warm_start``."""
    out = {**data, "schema_version": "2"}  # what is malformed stays so, for the decoder to name
    inputs, plan = data.get("inputs"), data.get("plan")
    if isinstance(inputs, dict) and isinstance(inputs.get("solver_options"), dict):
        settings = _V1_OPTION_DEFAULTS | inputs["solver_options"]
        out["inputs"] = {k: v for k, v in inputs.items() if k != "solver_options"} | {
            "solver_settings": settings
        }
    if isinstance(plan, dict) and plan.get("source") == "warm_start":
        out["plan"] = {**plan, "source": PlanSource.START.value}
    return out


def _from_v2(data: dict) -> dict:
    """Version 2 -> 3: the hardware names the trainer's optimizer instead of a state multiplier
    (1.0, the only value a hardware config then gave a meaning to, was no state: sgd)."""
    out = {**data, "schema_version": "3"}
    hardware = data.get("hardware")
    if isinstance(hardware, dict) and "optimizer_state_multiplier" in hardware:
        multiplier = hardware["optimizer_state_multiplier"]
        if multiplier != 1.0:
            raise invalid_manifest(
                f"hardware.optimizer_state_multiplier {multiplier!r}: version 3 names the optimizer, and "
                "a multiplier other than 1.0 names none",
                "solve again with optimizer set in the hardware config",
            )
        out["hardware"] = {k: v for k, v in hardware.items() if k != "optimizer_state_multiplier"} | {
            "optimizer": "sgd"
        }
    return out


def _from_v3(data: dict) -> dict:
    """Version 3 -> 4: predictions on new data and on the profiled data side by side. A version-3
    plan was chosen and predicted with the profiled counts (only the seen-once rows' share moved
    to never-seen rows): its predictions are its in-sample ones, its hit estimate in_sample."""
    out = {**data, "schema_version": "4"}
    inputs, plan, tables = data.get("inputs"), data.get("plan"), data.get("tables")
    if isinstance(inputs, dict) and isinstance(inputs.get("solver_settings"), dict):
        out["inputs"] = {
            **inputs,
            "solver_settings": {"hit_estimate": "in_sample", **inputs["solver_settings"]},
        }
    if isinstance(plan, dict):
        out["plan"] = {
            "in_sample_objective_ms": plan.get("objective_ms"),
            "in_sample_uvm_access_fraction": plan.get("uvm_access_fraction"),
            **plan,
        }
    if isinstance(tables, list):
        out["tables"] = [
            {"in_sample_hbm_access_fraction": t.get("predicted_hbm_access_fraction"), **t}
            if isinstance(t, dict)
            else t
            for t in tables
        ]
    return out


def _from_v4(data: dict) -> dict:
    """Version 4 -> 5: a plan may carry its diff against the previous plan and the cap on moves
    it was solved under; a version-4 plan has neither."""
    out = {**data, "schema_version": "5"}
    inputs = data.get("inputs")
    if isinstance(inputs, dict) and isinstance(inputs.get("solver_settings"), dict):
        out["inputs"] = {**inputs, "solver_settings": {"max_moved_gib": None, **inputs["solver_settings"]}}
    return {"diff": None, **out}


def _from_v5(data: dict) -> dict:
    """Version 5 -> 6: a plan may come from the MILP of aligned blocks (source ``aligned_blocks``);
    a version-5 plan never does, and reads as it is."""
    return {**data, "schema_version": "6"}


# version -> the function that brings a document of that version one version up
_UPGRADES: dict[str, Callable[[dict], dict]] = {
    "1": _from_v1,
    "2": _from_v2,
    "3": _from_v3,
    "4": _from_v4,
    "5": _from_v5,
}
READABLE_VERSIONS = (*_UPGRADES, SCHEMA_VERSION)


def upgraded(data: dict, source: str = "manifest") -> dict:
    """A parsed manifest of any version this reader reads, as the current version; a newer or an
    unknown version is refused before any field is read."""
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        newer = isinstance(version, str) and version.isdigit() and int(version) > int(SCHEMA_VERSION)
        raise invalid_manifest(
            f"schema_version {version!r}: this recshard-stats reads versions "
            f"{', '.join(READABLE_VERSIONS)}"
            + (" (the manifest was written by a newer recshard-stats)" if newer else ""),
            "upgrade recshard-stats where the manifest is read" if newer else "regenerate the manifest",
            path=source,
        )
    while version != SCHEMA_VERSION:
        data = _UPGRADES[version](data)
        version = data["schema_version"]
    return data
