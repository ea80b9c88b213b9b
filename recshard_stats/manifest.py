"""The manifest contract: what the solver hands to training, and the loader trainers use.

One definition: the frozen dataclasses below (:class:`Manifest` and its entries), serialized by
:meth:`Manifest.to_json` and read by :meth:`Manifest.from_json`; ``manifest.schema.json`` is
tested field by field against them. Needs numpy and pyarrow only (no Spark, no Pyomo)::

    from recshard_stats.manifest import load_manifest, HBM

    loaded = load_manifest("manifests/ds=2026-12-01/manifest.json", model="conf/model.yaml")
    placement = loaded.table("t_user")            # gpu, rows_hbm, rows_uvm, ...
    tier, index = loaded.remap("t_user", rows)    # rows: hashed rows of an id batch
    hbm_rows = index[tier == HBM]                 # positions in the GPU's HBM part
    loaded.manifest.plan.objective_ms             # the typed contract itself

The remap of a table orders its rows hottest first: the ``n_seen`` rows accessed while
profiling get indices ``[0, n_seen)`` (access count descending, row ascending), the rows
never seen follow in row order. Indices ``[0, rows_hbm)`` live in HBM, the rest in UVM, so
``index`` returned for the UVM tier is ``new_index - rows_hbm``. When ``rows_hbm > n_seen``
the never-seen rows below ``unseen_hbm_below_row`` are the ones in HBM (new ids hash
uniformly, so which unseen rows does not matter; row order makes it reproducible).

Every referenced file is a path relative to the manifest's directory (never absolute, never
escaping it) with a SHA-256 the loader checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib

import numpy as np

from recshard_stats.config import HardwareConfig, ModelConfig
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import SolveOptions
from recshard_stats.typed_json import DecodeError, from_plain, to_plain

SCHEMA_VERSION = "1"
MANIFEST_NAME = "manifest.json"
CHECKSUM_SUFFIX = ".sha256"  # manifest.json.sha256 beside it: its own SHA-256, checked on load
LATEST_NAME = "latest.json"
HBM, UVM = 0, 1
KIND = "recshard-manifest"
log = logging.getLogger(__name__)
SCHEMA_PATH = pathlib.Path(__file__).with_name("manifest.schema.json")


def _invalid(message: str, *fixes: str, path=None) -> RecShardError:
    where = f"{path}: " if path else ""
    return RecShardError(Reason.MANIFEST_INVALID, where + message, fixes=fixes)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def data_files(path: pathlib.Path) -> list[pathlib.Path]:
    """A Parquet "file" as Spark writes it may be a directory of parts; hidden and ``_`` files
    (checksums, markers) are not data."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


def sha256_data(path: str | os.PathLike) -> str:
    """Checksum of a file, or of a directory's data files (names and contents, in name order)."""
    path = pathlib.Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for part in data_files(path):
        digest.update(part.relative_to(path).as_posix().encode() + b"\0")
        digest.update(sha256_file(part).encode() + b"\0")
    return "sha256:" + digest.hexdigest()


def safe_relative(base: pathlib.Path, relative: str) -> pathlib.Path:
    """``base / relative``, refusing absolute paths and any escape from ``base``."""
    if not isinstance(relative, str) or not relative:
        raise _invalid(f"file path {relative!r} is not a non-empty string", path=base)
    posix = pathlib.PurePosixPath(relative)
    if posix.is_absolute() or pathlib.PureWindowsPath(relative).is_absolute() or ".." in posix.parts:
        raise _invalid(f"file path {relative!r} must be relative to the manifest's directory, without '..'",
                       "regenerate the manifest with `recshard solve` / `recshard remap`", path=base)
    full = (base / posix).resolve()
    if base.resolve() not in (full, *full.parents):
        raise _invalid(f"file path {relative!r} leaves the manifest's directory (through a link)", path=base)
    return full


@dataclasses.dataclass(frozen=True)
class RemapFile:
    """A table's remap (Parquet ``row, index, access_count`` of its seen rows, hottest first)."""
    path: str          # relative to the manifest's directory
    sha256: str
    rows: int          # seen rows it holds (= the table's unique_rows)


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
    predicted_hbm_access_fraction: float
    predicted_cost_ms: float
    accesses_per_batch: float
    pooling_factor: float
    feature_pooling: tuple[float, ...]   # mean ids per sample, per feature (TorchRec's pooling_factors)
    coverage: float
    row_bytes: float
    remap: RemapFile | None              # None until `recshard remap` has run
    unseen_hbm_below_row: int = 0        # never-seen rows below this row are in HBM (set by remap)
    trainer_buffer_bytes: int = 0        # HBM its GPU keeps for the trainer's ids and pooled outputs
    column_shards: tuple[ColumnShard, ...] = ()   # a hot table cut column-wise (gpu: the first shard's);
    #                                               empty: the whole table is on gpu
    longest_bag: float = 0.0             # ids in the longest bag a batch holds (the profile's 1 - 1/B quantile)

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
        return tuple(GpuPart(s.gpu, s.columns / self.dim, s.predicted_cost_ms, s.trainer_buffer_bytes)
                     for s in self.column_shards)


@dataclasses.dataclass(frozen=True)
class GpuPlacement:
    rank: int
    tables: tuple[str, ...]
    hbm_bytes_used: int                  # rows in HBM
    hbm_bytes_capacity: int
    predicted_cost_ms: float
    trainer_buffer_bytes: int = 0        # its tables' trainer buffers, beside the rows
    kernel_groups_ms: float = 0.0        # the fixed cost of its kernel calls (in predicted_cost_ms)


@dataclasses.dataclass(frozen=True)
class BaselinePlan:
    """Another planner's plan of the same tables, costed in the same model."""
    name: str
    max_cost_ms: float
    imbalance: float
    uvm_access_fraction: float
    cost_vs_recshard: float
    gpu: tuple[int, ...]          # per table, in the manifest's table order
    rows_hbm: tuple[int, ...]
    gpu_cost_ms: tuple[float, ...]
    torchrec_rating_ms: float | None = None   # in TorchRec's perf model (when torchrec is installed)


@dataclasses.dataclass(frozen=True)
class TorchRecShard:
    """One shard of a TorchRec plan: its table, layout, rank and size."""
    table: str
    sharding_type: str                   # table_wise, row_wise, column_wise, data_parallel, ...
    compute_kernel: str                  # fused, fused_uvm, fused_uvm_caching, ...
    rank: int
    rows: int
    cols: int
    cache_load_factor: float | None = None   # fused_uvm_caching: the share of the table's rows cached


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
    torchrec_rating_ms: float | None     # TorchRec's estimate of its slowest rank


@dataclasses.dataclass(frozen=True)
class PlanSummary:
    solver: str
    status: str                   # "optimal", "time_limit", "no_incumbent" (the MILP found no plan in time) or
    #                               "skipped" (the MILP too big to build in its time)
    source: str                   # "milp", "local_search", "kernel_groups" or "warm_start": what gave the plan
    objective_ms: float           # the shipped plan's slowest GPU, exact cost model
    lower_bound_ms: float
    gap: float
    milp_objective_ms: float | None  # None: no incumbent
    milp_bound_ms: float | None
    solve_seconds: float
    imbalance: float
    uvm_access_fraction: float
    baselines: tuple[BaselinePlan, ...]
    torchrec: tuple[TorchRecPlan, ...] = ()     # TorchRec's planner (when torchrec is installed)
    torchrec_rating_ms: float | None = None     # this plan in TorchRec's perf model, split as it runs


@dataclasses.dataclass(frozen=True)
class ManifestInputs:
    """What the plan was computed from; ``digest`` covers all but the stats path."""
    stats: str
    stats_digest: str
    stats_ds: str | None
    model_digest: str
    hardware_digest: str
    solver_options: SolveOptions
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
        raise RecShardError(Reason.MANIFEST_MISMATCH, f"no table {name!r} in the manifest",
                            fixes=(f"tables: {sorted(t.name for t in self.tables)[:10]}",))

    def tables_on(self, gpu: int) -> list[TablePlacement]:
        """Tables with rows on the GPU: whole, or one of their column shards."""
        return [t for t in self.tables if gpu in t.ranks]

    def to_json(self) -> str:
        data = to_plain(self)
        ordered = {"schema_version": data.pop("schema_version"), "kind": data.pop("kind"), **data}
        return json.dumps(ordered, indent=2) + "\n"

    @classmethod
    def from_json(cls, data: str | dict, source: str = "manifest") -> "Manifest":
        """Parse and check a manifest document (text or parsed JSON); errors name the field."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise _invalid(f"not valid JSON ({exc})", path=source) from None
        if not isinstance(data, dict):
            raise _invalid("top level is not a JSON object", path=source)
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise _invalid(f"schema_version {version!r}; this loader reads {SCHEMA_VERSION!r}",
                           "upgrade recshard-stats" if str(version) > SCHEMA_VERSION else "regenerate the manifest",
                           path=source)
        try:
            return from_plain(cls, data)
        except DecodeError as exc:
            raise _invalid(str(exc), path=source) from None
        except RecShardError as exc:
            raise RecShardError(exc.reason, f"{source}: {exc.message}", fixes=exc.fixes,
                                context=exc.context) from None


_EPS = 1e-9


def _check_consistency(m: Manifest) -> None:
    """Everything a manifest's numbers must agree on; the first disagreement is the error."""
    if m.kind != KIND or m.schema_version != SCHEMA_VERSION:
        raise _invalid(f"kind/schema_version {m.kind!r}/{m.schema_version!r}, expected {KIND!r}/{SCHEMA_VERSION!r}")
    if not m.tables or not m.gpus:
        raise _invalid("a manifest needs at least one table and one GPU")
    names = [t.name for t in m.tables]
    if len(set(names)) != len(names):
        raise _invalid(f"table names must be unique: {sorted({n for n in names if names.count(n) > 1})}")
    for t in m.tables:
        _check_table(t, m.num_gpus)
    _check_gpus(m)
    _check_plan(m)


def _fraction(where: str, name: str, value: float) -> None:
    if not -_EPS <= value <= 1 + _EPS:
        raise _invalid(f"{where}: {name} {value} is not a fraction in [0, 1]")


def _non_negative(where: str, **values: float) -> None:
    negative = {k: v for k, v in values.items() if v < 0}
    if negative:
        raise _invalid(f"{where}: {negative} must be non-negative")


def _check_table(t: TablePlacement, num_gpus: int) -> None:
    where = f"table {t.name!r}"
    _non_negative(where, gpu=t.gpu, hash_size=t.hash_size, dim=t.dim, rows_hbm=t.rows_hbm, rows_uvm=t.rows_uvm,
                  unique_rows=t.unique_rows, unused_rows=t.unused_rows, unseen_hbm_below_row=t.unseen_hbm_below_row,
                  predicted_cost_ms=t.predicted_cost_ms, accesses_per_batch=t.accesses_per_batch,
                  pooling_factor=t.pooling_factor, row_bytes=t.row_bytes, trainer_buffer_bytes=t.trainer_buffer_bytes)
    _fraction(where, "predicted_hbm_access_fraction", t.predicted_hbm_access_fraction)
    _fraction(where, "coverage", t.coverage)
    if not t.features or len(t.feature_pooling) != len(t.features):
        raise _invalid(f"{where}: needs features and one pooling factor per feature")
    if t.gpu >= num_gpus:
        raise _invalid(f"{where} is on GPU {t.gpu}, the plan has {num_gpus}")
    if t.rows_hbm + t.rows_uvm != t.hash_size:
        raise _invalid(f"{where}: rows_hbm {t.rows_hbm} + rows_uvm {t.rows_uvm} != hash_size {t.hash_size}")
    if t.unique_rows > t.hash_size or t.unused_rows != t.hash_size - t.unique_rows:
        raise _invalid(f"{where}: unique_rows {t.unique_rows} and unused_rows {t.unused_rows} do not add up to "
                       f"hash_size {t.hash_size}")
    if t.column_shards:
        _check_column_shards(t, num_gpus)
    if t.remap is not None:
        if t.remap.path != f"remap/{t.name}.parquet":
            raise _invalid(f"{where}: its remap file is {t.remap.path!r}, not remap/{t.name}.parquet")
        if t.remap.rows != t.unique_rows:
            raise _invalid(f"{where}: its remap holds {t.remap.rows} rows, unique_rows is {t.unique_rows}")


def _check_column_shards(t: TablePlacement, num_gpus: int) -> None:
    where = f"table {t.name!r}"
    shards = t.column_shards
    gpus = [s.gpu for s in shards]
    if len(shards) < 2 or len(set(gpus)) != len(gpus) or not all(0 <= g < num_gpus for g in gpus) \
            or gpus[0] != t.gpu:
        raise _invalid(f"{where}: column shards on GPUs {gpus} must be two or more, on distinct GPUs below "
                       f"{num_gpus}, the first on its gpu {t.gpu}")
    first = 0
    for s in shards:
        _non_negative(where, predicted_cost_ms=s.predicted_cost_ms, trainer_buffer_bytes=s.trainer_buffer_bytes)
        if s.first_column != first or s.columns < 1:
            raise _invalid(f"{where}: column shard {s} does not start at column {first} or holds no column")
        first += s.columns
    if first != t.dim:
        raise _invalid(f"{where}: its column shards hold {first} columns, its dim is {t.dim}")
    cost = sum(s.predicted_cost_ms for s in shards)
    if abs(t.predicted_cost_ms - cost) > _EPS * max(cost, 1e-12) + 1e-12 \
            or t.trainer_buffer_bytes != sum(s.trainer_buffer_bytes for s in shards):
        raise _invalid(f"{where}: predicted_cost_ms and trainer_buffer_bytes must add up its column shards'")


def _check_gpus(m: Manifest) -> None:
    for rank, g in enumerate(m.gpus):
        where = f"GPU {g.rank}"
        if g.rank != rank:
            raise _invalid(f"gpus[{rank}] has rank {g.rank}: ranks must be 0..{m.num_gpus - 1} in order")
        _non_negative(where, hbm_bytes_used=g.hbm_bytes_used, hbm_bytes_capacity=g.hbm_bytes_capacity,
                      predicted_cost_ms=g.predicted_cost_ms, trainer_buffer_bytes=g.trainer_buffer_bytes)
        mine = m.tables_on(rank)
        if sorted(g.tables) != sorted(t.name for t in mine):
            raise _invalid(f"{where} lists tables {sorted(g.tables)}, the tables placed on it are "
                           f"{sorted(t.name for t in mine)}")
        parts = [(t, p) for t in mine for p in t.gpu_parts if p.gpu == rank]
        used = sum(t.rows_hbm * t.row_bytes * p.share for t, p in parts)
        if abs(g.hbm_bytes_used - used) > 1 + _EPS * used:
            raise _invalid(f"{where}: hbm_bytes_used {g.hbm_bytes_used}, its tables' HBM rows take {used:.0f}")
        buffers = sum(p.trainer_buffer_bytes for _, p in parts)
        if g.trainer_buffer_bytes != buffers:
            raise _invalid(f"{where}: trainer_buffer_bytes {g.trainer_buffer_bytes}, its tables' add up to {buffers}")
        if g.hbm_bytes_used + buffers > g.hbm_bytes_capacity:
            raise _invalid(f"{where} uses {g.hbm_bytes_used} bytes of HBM for rows and {buffers} for the trainer's "
                           f"buffers, more than its {g.hbm_bytes_capacity}")
        cost = sum(p.predicted_cost_ms for _, p in parts) + g.kernel_groups_ms
        if g.kernel_groups_ms < 0 or abs(g.predicted_cost_ms - cost) > _EPS * max(cost, 1e-12) + 1e-12:
            raise _invalid(f"{where}: predicted_cost_ms {g.predicted_cost_ms}, its tables and kernel calls "
                           f"({g.kernel_groups_ms} ms) add up to {cost}")


def _check_plan(m: Manifest) -> None:
    plan = m.plan
    _non_negative("plan", objective_ms=plan.objective_ms, lower_bound_ms=plan.lower_bound_ms,
                  solve_seconds=plan.solve_seconds)
    _fraction("plan", "uvm_access_fraction", plan.uvm_access_fraction)
    slowest = max(g.predicted_cost_ms for g in m.gpus)
    if abs(plan.objective_ms - slowest) > _EPS * max(slowest, 1e-12) + 1e-12:
        raise _invalid(f"plan: objective_ms {plan.objective_ms} is not the slowest GPU's cost {slowest}")
    if plan.imbalance < 1 - _EPS:
        raise _invalid(f"plan: imbalance {plan.imbalance} is below 1")
    names = {t.name for t in m.tables}
    for tp in plan.torchrec:
        where = f"TorchRec plan {tp.name!r}"
        if (tp.error is None) == (tp.max_cost_ms is None) or (tp.error is None and not tp.shards):
            raise _invalid(f"{where}: needs either an error or shards with a cost")
        if tp.error is None:
            _non_negative(where, max_cost_ms=tp.max_cost_ms, planning_seconds=tp.planning_seconds)
            _fraction(where, "uvm_access_fraction", tp.uvm_access_fraction)
            if len(tp.gpu_cost_ms) != m.num_gpus:
                raise _invalid(f"{where}: needs a cost for each of the {m.num_gpus} GPUs")
        for s in tp.shards:
            if s.table not in names or not 0 <= s.rank < m.num_gpus or s.rows < 0 or s.cols < 0:
                raise _invalid(f"{where}: shard {s} names no table of the manifest or no GPU below {m.num_gpus}")
            if s.cache_load_factor is not None:
                _fraction(where, "cache_load_factor", s.cache_load_factor)
    for b in plan.baselines:
        where = f"baseline {b.name!r}"
        _non_negative(where, max_cost_ms=b.max_cost_ms)
        _fraction(where, "uvm_access_fraction", b.uvm_access_fraction)
        if not len(b.gpu) == len(b.rows_hbm) == len(m.tables) or len(b.gpu_cost_ms) != m.num_gpus \
                or any(not 0 <= g < m.num_gpus for g in b.gpu):
            raise _invalid(f"{where}: needs a GPU below {m.num_gpus} and HBM rows for each of the "
                           f"{len(m.tables)} tables, and a cost per GPU")


def complete_with_remaps(manifest: Manifest, remaps: dict[str, tuple[RemapFile, int]]) -> Manifest:
    """The manifest with each table's remap file and ``unseen_hbm_below_row`` filled in
    (``remaps``: table -> (file, below row)); every table must be given."""
    missing = [t.name for t in manifest.tables if t.name not in remaps]
    if missing:
        raise _invalid(f"no remap given for tables {missing[:5]}")
    return dataclasses.replace(manifest, tables=tuple(
        dataclasses.replace(t, remap=remaps[t.name][0], unseen_hbm_below_row=remaps[t.name][1])
        for t in manifest.tables))


@dataclasses.dataclass(frozen=True)
class SeenRemap:
    """A table's remap as arrays: its seen rows (ascending) and each one's new index."""
    seen_rows: np.ndarray
    seen_index: np.ndarray


class ManifestFile:
    """A validated manifest on disk: the :class:`Manifest`, its path, and the remap lookups a
    trainer needs. Build it with :func:`load_manifest`."""

    def __init__(self, path: pathlib.Path, manifest: Manifest):
        self.path = path
        self.manifest = manifest
        self.tables = {t.name: t for t in manifest.tables}
        self._remaps: dict[str, SeenRemap] = {}

    @property
    def num_gpus(self) -> int:
        return self.manifest.num_gpus

    def table(self, name: str) -> TablePlacement:
        if name not in self.tables:
            raise RecShardError(Reason.MANIFEST_MISMATCH, f"{self.path}: no table {name!r}",
                                fixes=(f"tables: {sorted(self.tables)[:10]}",))
        return self.tables[name]

    def tables_on(self, gpu: int) -> list[TablePlacement]:
        return self.manifest.tables_on(gpu)

    def remap_path(self, name: str) -> pathlib.Path | None:
        """The table's remap file (checked to stay inside the manifest's directory), if written."""
        remap = self.table(name).remap
        return None if remap is None else safe_relative(self.path.parent, remap.path)

    def seen_remap(self, name: str) -> SeenRemap:
        if name not in self._remaps:
            placement, file = self.table(name), self.remap_path(name)
            if file is None:
                raise RecShardError(Reason.MANIFEST_INVALID, f"{self.path}: table {name!r} has no remap file yet",
                                    fixes=("run `recshard remap` on this manifest",))
            import pyarrow.parquet as pq

            t = pq.read_table(file, columns=["row", "index"])
            rows, index = t["row"].to_numpy(), t["index"].to_numpy()
            if len(rows) != placement.unique_rows:
                raise _invalid(f"remap of {name!r} has {len(rows)} rows, manifest says {placement.unique_rows}",
                               path=self.path)
            order = np.argsort(rows, kind="stable")
            self._remaps[name] = SeenRemap(rows[order], index[order])
        return self._remaps[name]

    def new_index(self, table: str, rows) -> np.ndarray:
        """Each hashed row's position in the remapped table (hot rows first)."""
        placement = self.table(table)
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= placement.hash_size):
            bad = rows[(rows < 0) | (rows >= placement.hash_size)][0]
            raise RecShardError(Reason.MANIFEST_MISMATCH,
                                f"row {int(bad)} is outside table {table!r} (hash_size {placement.hash_size})",
                                fixes=("hash ids with recshard_stats.hashing.rows_of(keys, hash_size)",))
        remap = self.seen_remap(table)
        seen = len(remap.seen_rows)
        pos = np.searchsorted(remap.seen_rows, rows)
        found = pos < seen
        found[found] = remap.seen_rows[pos[found]] == rows[found]
        index = seen + rows - pos  # a never-seen row: after the seen ones, in row order
        index[found] = remap.seen_index[pos[found]]
        return index

    def remap(self, table: str, rows) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised lookup for an id batch: ``(tier, index)``, tier ``HBM`` (0) or ``UVM`` (1),
        index the row's position within that tier of the table's GPU."""
        rows_hbm = self.table(table).rows_hbm
        index = self.new_index(table, rows)
        tier = np.where(index < rows_hbm, HBM, UVM).astype(np.uint8)
        return tier, np.where(tier == HBM, index, index - rows_hbm)


def _check_model(loaded: ManifestFile, model) -> None:
    from recshard_stats.config import load_model_config

    if not isinstance(model, ModelConfig):
        model = load_model_config(model)
    problems = []
    expected = {t.name for t in model.tables}
    if set(loaded.tables) != expected:
        problems.append(f"tables differ: only in manifest {sorted(set(loaded.tables) - expected)}, "
                        f"only in model {sorted(expected - set(loaded.tables))}")
    for table in model.tables:
        placed = loaded.tables.get(table.name)
        if placed is None:
            continue
        for key in ("hash_size", "dim", "hash"):
            if getattr(placed, key) != getattr(table, key):
                problems.append(f"table {table.name!r}: {key} is {getattr(placed, key)!r} in the manifest, "
                                f"{getattr(table, key)!r} in the model")
        if placed.features != table.features:
            problems.append(f"table {table.name!r}: features {list(placed.features)} vs {list(table.features)}")
    if problems:
        raise RecShardError(Reason.MANIFEST_MISMATCH,
                            f"{loaded.path} was planned for another model: " + "; ".join(problems[:5])
                            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
                            fixes=("re-run the solver with this model config", "load the matching manifest"))


def checksum_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _check_own_checksum(path: pathlib.Path, required: bool) -> None:
    sidecar = checksum_path(path)
    if not sidecar.is_file():
        if required:
            raise _invalid(f"{sidecar.name} is missing, so edits to the manifest cannot be detected",
                           "regenerate the manifest with `recshard solve` / `recshard remap`", path=path)
        log.warning("%s has no %s beside it: edits cannot be detected", path, sidecar.name)
        return
    recorded, actual = sidecar.read_text().strip(), sha256_file(path)
    if recorded != actual:
        raise RecShardError(Reason.MANIFEST_INVALID,
                            f"{path} changed after it was written (its SHA-256 is {actual[:19]}..., "
                            f"{sidecar.name} says {recorded[:19]}...)",
                            fixes=("do not edit a manifest by hand: re-run `recshard solve` (and `recshard remap`)",))


def load_manifest(path: str | os.PathLike, model=None, *, verify_checksums: bool = True,
                  require_remap: bool = False, require_checksum: bool = False) -> ManifestFile:
    """Read and validate a manifest (a ``manifest.json`` or the directory holding it): its types,
    the consistency of its numbers, its own SHA-256 (``manifest.json.sha256``, required with
    ``require_checksum``) and, with ``verify_checksums``, every remap file's.

    ``model``: a :class:`~recshard_stats.config.ModelConfig` or a config path; when given, its
    tables must match the manifest's (names, features, hash sizes, dims, hash functions).
    """
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise RecShardError(Reason.INPUT_MISSING, f"manifest {path} does not exist",
                            fixes=("run `recshard solve` first", "check the path"))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"not valid UTF-8 ({exc})", path=path) from None
    loaded = ManifestFile(path, Manifest.from_json(text, source=str(path)))
    _check_own_checksum(path, require_checksum)
    if require_remap:
        lacking = [t.name for t in loaded.manifest.tables if t.remap is None]
        if lacking:
            raise _invalid(f"tables without a remap file: {lacking[:5]}", "run `recshard remap`", path=path)
    for t in loaded.manifest.tables:
        file = loaded.remap_path(t.name)  # checks the path stays inside the manifest's directory
        if not verify_checksums or file is None:
            continue
        if not file.exists():
            raise _invalid(f"remap file {t.remap.path} of table {t.name!r} is missing", path=path)
        actual = sha256_data(file)
        if actual != t.remap.sha256:
            raise RecShardError(Reason.MANIFEST_INVALID,
                                f"{path}: checksum mismatch for {t.remap.path} "
                                f"(manifest {t.remap.sha256[:19]}..., file {actual[:19]}...)",
                                fixes=("the file changed after the manifest was written; re-run "
                                       "`recshard remap`",))
    if model is not None:
        _check_model(loaded, model)
    return loaded


def write_manifest(path: str | os.PathLike, manifest: Manifest) -> pathlib.Path:
    """Write atomically (temp file + rename), then its SHA-256 beside it; the manifest was checked
    when it was built."""
    from recshard_stats.atomic import write_text_atomic

    text = manifest.to_json()
    path = write_text_atomic(path, text)
    write_text_atomic(checksum_path(path), "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest() + "\n")
    return path


@dataclasses.dataclass(frozen=True)
class LatestPointer:
    """``<root>/latest.json``: the published manifest, relative to the root, and its checksum."""
    manifest: str
    ds: str
    digest: str
    sha256: str


def publish_latest(root: str | os.PathLike, manifest_path: str | os.PathLike, model=None) -> pathlib.Path:
    """Move ``<root>/latest.json`` to a manifest, only once it loads and validates in full."""
    from recshard_stats.atomic import write_text_atomic

    root = pathlib.Path(root)
    loaded = load_manifest(manifest_path, model, require_remap=True, require_checksum=True)
    relative = os.path.relpath(loaded.path.resolve(), root.resolve())
    safe_relative(root, relative)
    pointer = LatestPointer(manifest=pathlib.PurePath(relative).as_posix(), ds=loaded.manifest.ds,
                            digest=loaded.manifest.inputs.digest, sha256=sha256_file(loaded.path))
    return write_text_atomic(root / LATEST_NAME, json.dumps(to_plain(pointer), indent=2) + "\n")


def load_latest(root: str | os.PathLike, model=None) -> ManifestFile:
    """The manifest ``<root>/latest.json`` points to, checked against the pointer's checksum."""
    root = pathlib.Path(root)
    pointer_path = root / LATEST_NAME
    if not pointer_path.is_file():
        raise RecShardError(Reason.INPUT_MISSING, f"{pointer_path} does not exist", fixes=("publish a manifest",))
    try:
        pointer = from_plain(LatestPointer, json.loads(pointer_path.read_text()))
    except (json.JSONDecodeError, DecodeError) as exc:
        raise _invalid(f"not a latest pointer ({exc})", "publish a manifest again", path=pointer_path) from None
    path = safe_relative(root, pointer.manifest)
    if not path.is_file() or sha256_file(path) != pointer.sha256:
        raise _invalid(f"{pointer.manifest} changed after it was published", path=pointer_path)
    return load_manifest(path, model, require_remap=True, require_checksum=True)
