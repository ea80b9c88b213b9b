"""The manifest contract: what the solver hands to training, and the loader trainers use.

Needs numpy and pyarrow only (no Spark, no Pyomo)::

    from recshard_stats.manifest import load_manifest, HBM

    manifest = load_manifest("manifests/ds=2026-12-01/manifest.json", model="conf/model.yaml")
    placement = manifest.table("t_user")          # gpu, rows_hbm, rows_uvm, ...
    tier, index = manifest.remap("t_user", rows)  # rows: hashed rows of an id batch
    hbm_rows = index[tier == HBM]                 # positions in the GPU's HBM part

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
import os
import pathlib
from typing import Any

import numpy as np

from recshard_stats.errors import Reason, RecShardError

SCHEMA_VERSION = "1"
MANIFEST_NAME = "manifest.json"
LATEST_NAME = "latest.json"
HBM, UVM = 0, 1
SCHEMA_PATH = pathlib.Path(__file__).with_name("manifest.schema.json")

_TABLE_KEYS = ("name", "features", "gpu", "hash_size", "dim", "hash", "rows_hbm", "rows_uvm", "unique_rows",
               "unused_rows", "predicted_hbm_access_fraction", "remap")


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
class TablePlacement:
    name: str
    features: tuple[str, ...]
    gpu: int
    hash_size: int
    dim: int
    hash: str
    rows_hbm: int
    rows_uvm: int
    unique_rows: int
    predicted_hbm_access_fraction: float
    remap_path: pathlib.Path | None

    @property
    def fully_in_hbm(self) -> bool:
        return self.rows_hbm == self.hash_size


@dataclasses.dataclass
class _Remap:
    seen_rows: np.ndarray      # sorted ascending
    seen_index: np.ndarray     # new index of seen_rows[i]


class Manifest:
    """A validated manifest. Build it with :func:`load_manifest`."""

    def __init__(self, path: pathlib.Path, data: dict):
        self.path = path
        self.data = data
        self.tables = {t["name"]: TablePlacement(
            name=t["name"], features=tuple(t["features"]), gpu=t["gpu"], hash_size=t["hash_size"], dim=t["dim"],
            hash=t["hash"], rows_hbm=t["rows_hbm"], rows_uvm=t["rows_uvm"], unique_rows=t["unique_rows"],
            predicted_hbm_access_fraction=t["predicted_hbm_access_fraction"],
            remap_path=safe_relative(path.parent, t["remap"]["path"]) if t.get("remap") else None)
            for t in data["tables"]}
        self._remaps: dict[str, _Remap] = {}

    @property
    def plan(self) -> dict:
        return self.data["plan"]

    @property
    def num_gpus(self) -> int:
        return len(self.data["gpus"])

    def table(self, name: str) -> TablePlacement:
        if name not in self.tables:
            raise RecShardError(Reason.MANIFEST_MISMATCH, f"{self.path}: no table {name!r}",
                                fixes=(f"tables: {sorted(self.tables)[:10]}",))
        return self.tables[name]

    def tables_on(self, gpu: int) -> list[TablePlacement]:
        return [t for t in self.tables.values() if t.gpu == gpu]

    def _remap_of(self, name: str) -> _Remap:
        if name not in self._remaps:
            placement = self.table(name)
            if placement.remap_path is None:
                raise RecShardError(Reason.MANIFEST_INVALID, f"{self.path}: table {name!r} has no remap file yet",
                                    fixes=("run `recshard remap` on this manifest",))
            import pyarrow.parquet as pq

            t = pq.read_table(placement.remap_path, columns=["row", "index"])
            rows, index = t["row"].to_numpy(), t["index"].to_numpy()
            if len(rows) != placement.unique_rows:
                raise _invalid(f"remap of {name!r} has {len(rows)} rows, manifest says {placement.unique_rows}",
                               path=self.path)
            order = np.argsort(rows, kind="stable")
            self._remaps[name] = _Remap(rows[order], index[order])
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
        remap = self._remap_of(table)
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


def _check_structure(data: Any, path: pathlib.Path) -> None:
    if not isinstance(data, dict):
        raise _invalid("top level is not a JSON object", path=path)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _invalid(f"schema_version {version!r}; this loader reads {SCHEMA_VERSION!r}",
                       "upgrade recshard-stats" if str(version) > SCHEMA_VERSION else "regenerate the manifest",
                       path=path)
    for key, kind in (("tables", list), ("gpus", list), ("plan", dict), ("inputs", dict)):
        if not isinstance(data.get(key), kind):
            raise _invalid(f"'{key}' is missing or not a {kind.__name__}", path=path)
    num_gpus = len(data["gpus"])
    names = set()
    for i, t in enumerate(data["tables"]):
        if not isinstance(t, dict):
            raise _invalid(f"tables[{i}] is not an object", path=path)
        missing = [k for k in _TABLE_KEYS if k not in t]
        if missing:
            raise _invalid(f"tables[{i}] lacks {missing}", path=path)
        where = f"table {t['name']!r}"
        ints = ("gpu", "hash_size", "dim", "rows_hbm", "rows_uvm", "unique_rows", "unused_rows")
        if any(isinstance(t[k], bool) or not isinstance(t[k], int) or t[k] < 0 for k in ints):
            raise _invalid(f"{where}: {list(ints)} must be non-negative integers", path=path)
        if not isinstance(t["name"], str) or t["name"] in names:
            raise _invalid(f"{where}: names must be unique strings", path=path)
        if not isinstance(t["features"], list) or not t["features"] or \
                not all(isinstance(f, str) for f in t["features"]) or not isinstance(t["hash"], str):
            raise _invalid(f"{where}: features must be a non-empty list of names and hash a string", path=path)
        fraction = t["predicted_hbm_access_fraction"]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise _invalid(f"{where}: predicted_hbm_access_fraction must be a number", path=path)
        names.add(t["name"])
        if t["gpu"] >= num_gpus:
            raise _invalid(f"{where} is on GPU {t['gpu']}, the plan has {num_gpus}", path=path)
        if t["rows_hbm"] + t["rows_uvm"] != t["hash_size"]:
            raise _invalid(f"{where}: rows_hbm {t['rows_hbm']} + rows_uvm {t['rows_uvm']} != hash_size "
                           f"{t['hash_size']}", path=path)
        if t["unique_rows"] > t["hash_size"]:
            raise _invalid(f"{where}: unique_rows {t['unique_rows']} exceeds hash_size {t['hash_size']}", path=path)
        remap = t["remap"]
        if remap is not None and not (isinstance(remap, dict) and {"path", "sha256"} <= set(remap)):
            raise _invalid(f"{where}: remap must be null or {{path, sha256}}", path=path)


def _check_model(manifest: Manifest, model) -> None:
    from recshard_stats.config import ModelConfig, load_model_config

    if not isinstance(model, ModelConfig):
        model = load_model_config(model)
    problems = []
    expected = {t.name for t in model.tables}
    if set(manifest.tables) != expected:
        problems.append(f"tables differ: only in manifest {sorted(set(manifest.tables) - expected)}, "
                        f"only in model {sorted(expected - set(manifest.tables))}")
    for table in model.tables:
        placed = manifest.tables.get(table.name)
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
                            f"{manifest.path} was planned for another model: " + "; ".join(problems[:5])
                            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
                            fixes=("re-run the solver with this model config", "load the matching manifest"))


def load_manifest(path: str | os.PathLike, model=None, *, verify_checksums: bool = True,
                  require_remap: bool = False) -> Manifest:
    """Read and validate a manifest (a ``manifest.json`` or the directory holding it).

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
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _invalid(f"not valid JSON ({exc})", path=path) from None
    _check_structure(data, path)
    manifest = Manifest(path, data)
    if require_remap:
        lacking = [t.name for t in manifest.tables.values() if t.remap_path is None]
        if lacking:
            raise _invalid(f"tables without a remap file: {lacking[:5]}", "run `recshard remap`", path=path)
    if verify_checksums:
        for entry in data["tables"]:
            if entry["remap"] is None:
                continue
            file = manifest.tables[entry["name"]].remap_path
            if not file.exists():
                raise _invalid(f"remap file {entry['remap']['path']} of table {entry['name']!r} is missing",
                               path=path)
            actual = sha256_data(file)
            if actual != entry["remap"]["sha256"]:
                raise RecShardError(Reason.MANIFEST_INVALID,
                                    f"{path}: checksum mismatch for {entry['remap']['path']} "
                                    f"(manifest {entry['remap']['sha256'][:19]}..., file {actual[:19]}...)",
                                    fixes=("the file changed after the manifest was written; re-run "
                                           "`recshard remap`",))
    if model is not None:
        _check_model(manifest, model)
    return manifest


def write_manifest(path: str | os.PathLike, data: dict) -> pathlib.Path:
    """Validate and write atomically (temp file + rename)."""
    from recshard_stats.atomic import write_text_atomic

    path = pathlib.Path(path)
    _check_structure(data, path)
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def publish_latest(root: str | os.PathLike, manifest_path: str | os.PathLike, model=None) -> pathlib.Path:
    """Move ``<root>/latest.json`` to a manifest, only once it loads and validates in full."""
    from recshard_stats.atomic import write_text_atomic

    root = pathlib.Path(root)
    manifest = load_manifest(manifest_path, model, require_remap=True)
    relative = os.path.relpath(manifest.path.resolve(), root.resolve())
    safe_relative(root, relative)
    pointer = {"manifest": pathlib.PurePath(relative).as_posix(), "ds": manifest.data.get("ds"),
               "digest": manifest.data["inputs"].get("digest"), "sha256": sha256_file(manifest.path)}
    return write_text_atomic(root / LATEST_NAME, json.dumps(pointer, indent=2) + "\n")


def load_latest(root: str | os.PathLike, model=None) -> Manifest:
    """The manifest ``<root>/latest.json`` points to, checked against the pointer's checksum."""
    root = pathlib.Path(root)
    pointer_path = root / LATEST_NAME
    if not pointer_path.is_file():
        raise RecShardError(Reason.INPUT_MISSING, f"{pointer_path} does not exist", fixes=("publish a manifest",))
    pointer = json.loads(pointer_path.read_text())
    path = safe_relative(root, pointer.get("manifest"))
    if sha256_file(path) != pointer.get("sha256"):
        raise _invalid(f"{pointer['manifest']} changed after it was published", path=pointer_path)
    return load_manifest(path, model, require_remap=True)
