"""The trainer's side of the manifest: a manifest on disk read and validated
(:func:`load_manifest`), its files' checksums, and the remap lookups a trainer needs. Needs numpy
and pyarrow only::

    from recshard_stats.manifest import HBM
    from recshard_stats.manifest_loader import load_manifest

    loaded = load_manifest("manifests/ds=2026-12-01/manifest.json", model="conf/model.yaml")
    placement = loaded.table("t_user")            # gpu, rows_hbm, rows_uvm, ...
    tier, index = loaded.remap("t_user", rows)    # rows: hashed rows of an id batch
    hbm_rows = index[tier == HBM]                 # positions in the GPU's HBM part
    loaded.manifest.plan.objective_ms             # the typed contract itself
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib

import numpy as np

from recshard_stats.config import ModelConfig
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import (
    HBM,
    UVM,
    Manifest,
    PlanDiff,
    TableChange,
    TablePlacement,
    invalid_manifest,
)

MANIFEST_NAME = "manifest.json"
MAX_COUNTED_ROWS = 2**25  # a table whose never-seen rows are in HBM is looked through up to this size
CHECKSUM_SUFFIX = ".sha256"  # manifest.json.sha256 beside it: its own SHA-256, checked on load
log = logging.getLogger(__name__)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def data_files(path: pathlib.Path) -> list[pathlib.Path]:
    """A Parquet "file" as Spark writes it may be a directory of parts; hidden and ``_`` files
    (checksums, markers) are not data."""
    if path.is_symlink():
        raise invalid_manifest(f"{path} is a link: a manifest's files are its own, not links to others")
    if path.is_file():
        return [path]
    entries = sorted(path.rglob("*"))
    links = [p for p in entries if p.is_symlink()]
    if links:  # what a link points to can change under a published, checksummed plan
        raise invalid_manifest(f"{links[0]} is a link: a manifest's files are its own, not links to others")
    return [p for p in entries if p.is_file() and not p.name.startswith((".", "_"))]


def sha256_data(path: str | os.PathLike) -> str:
    """Checksum of a file, or of a directory's data files (names and contents, in name order)."""
    path = pathlib.Path(path)
    if path.is_file() and not path.is_symlink():
        return sha256_file(path)
    digest = hashlib.sha256()
    for part in data_files(path):
        digest.update(part.relative_to(path).as_posix().encode() + b"\0")
        digest.update(sha256_file(part).encode() + b"\0")
    return "sha256:" + digest.hexdigest()


def safe_relative(base: pathlib.Path, relative: str) -> pathlib.Path:
    """``base / relative``, refusing absolute paths and any escape from ``base``."""
    if not isinstance(relative, str) or not relative:
        raise invalid_manifest(f"file path {relative!r} is not a non-empty string", path=base)
    posix = pathlib.PurePosixPath(relative)
    if posix.is_absolute() or pathlib.PureWindowsPath(relative).is_absolute() or ".." in posix.parts:
        raise invalid_manifest(
            f"file path {relative!r} must be relative to the manifest's directory, without '..'",
            "regenerate the manifest with `recshard solve` / `recshard remap`",
            path=base,
        )
    full = (base / posix).resolve()
    if base.resolve() not in (full, *full.parents):
        raise invalid_manifest(
            f"file path {relative!r} leaves the manifest's directory (through a link)", path=base
        )
    return full


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

    @property
    def stats_path(self) -> str:
        """The stats partition it was solved from: ``inputs.stats`` as written, a relative path
        taken from the manifest's directory (so a copied run keeps finding its stats)."""
        stats = self.manifest.inputs.stats
        if "://" in stats or os.path.isabs(stats):
            return stats
        return os.path.normpath(self.path.parent / stats)

    def restricted(self, names) -> ManifestFile:
        """The same manifest file, planning some tables only (see :meth:`Manifest.restricted`)."""
        return ManifestFile(self.path, self.manifest.restricted(names))

    def table(self, name: str) -> TablePlacement:
        if name not in self.tables:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"{self.path}: no table {name!r}",
                fixes=(f"tables: {sorted(self.tables)[:10]}",),
            )
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
                raise RecShardError(
                    Reason.MANIFEST_INVALID,
                    f"{self.path}: table {name!r} has no remap file yet",
                    fixes=("run `recshard remap` on this manifest",),
                )
            import pyarrow.dataset as ds

            remap = ds.dataset(file, format="parquet")
            count = remap.count_rows()  # from the footers: a wrong file is refused before it is read
            if count != placement.unique_rows:
                raise invalid_manifest(
                    f"remap of {name!r} has {count} rows, manifest says {placement.unique_rows}",
                    path=self.path,
                )
            t = remap.to_table(columns=["row", "index"])
            rows, index = t["row"].to_numpy(), t["index"].to_numpy()
            order = np.argsort(rows, kind="stable")
            self._remaps[name] = SeenRemap(rows[order], index[order])
        return self._remaps[name]

    def new_index(self, table: str, rows) -> np.ndarray:
        """Each hashed row's position in the remapped table (hot rows first)."""
        placement = self.table(table)
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= placement.hash_size):
            bad = rows[(rows < 0) | (rows >= placement.hash_size)][0]
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"row {int(bad)} is outside table {table!r} (hash_size {placement.hash_size})",
                fixes=("hash ids with recshard_stats.hashing.rows_of(keys, hash_size)",),
            )
        remap = self.seen_remap(table)
        seen = len(remap.seen_rows)
        pos = np.searchsorted(remap.seen_rows, rows)
        found = pos < seen
        found[found] = remap.seen_rows[pos[found]] == rows[found]
        index = seen + rows - pos  # a never-seen row: after the seen ones, in row order
        index[found] = remap.seen_index[pos[found]]
        return index

    def hbm_rows(self, table: str) -> np.ndarray | None:
        """The table's rows in HBM, ascending (None: never-seen rows are in HBM too and the table
        has more than :data:`MAX_COUNTED_ROWS` rows to look through)."""
        t = self.table(table)
        remap = self.seen_remap(table)
        if t.unseen_hbm_below_row == 0:
            return remap.seen_rows[remap.seen_index < t.rows_hbm]
        if t.hash_size > MAX_COUNTED_ROWS:
            return None
        return np.flatnonzero(self.new_index(table, np.arange(t.hash_size)) < t.rows_hbm)

    def remap(self, table: str, rows) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised lookup for an id batch: ``(tier, index)``, tier ``HBM`` (0) or ``UVM`` (1),
        index the row's position within that tier of the table's GPU."""
        rows_hbm = self.table(table).rows_hbm
        index = self.new_index(table, rows)
        tier = np.where(index < rows_hbm, HBM, UVM).astype(np.uint8)
        return tier, np.where(tier == HBM, index, index - rows_hbm)


def with_hbm_changes(diff: PlanDiff, new: ManifestFile, old: ManifestFile) -> PlanDiff:
    """The diff with each table's rows entering and leaving HBM counted from both remaps; a table
    whose HBM rows changed only in which rows they are joins the diff."""
    changes = {c.name: c for c in diff.tables}
    out = []
    for t in new.manifest.tables:
        change = changes.get(t.name)
        now_rows = new.hbm_rows(t.name)
        then_rows = old.hbm_rows(t.name) if t.name in old.tables else None
        entering = leaving = None
        if now_rows is not None and then_rows is not None:
            entering = int(np.setdiff1d(now_rows, then_rows, assume_unique=True).size)
            leaving = int(np.setdiff1d(then_rows, now_rows, assume_unique=True).size)
        if change is None:
            if not entering and not leaving:
                continue
            change = TableChange(t.name, t.ranks, t.ranks, 0, t.rows_hbm, t.rows_hbm)
        out.append(dataclasses.replace(change, rows_entering_hbm=entering, rows_leaving_hbm=leaving))
    return dataclasses.replace(diff, tables=tuple(out))


def _check_model(loaded: ManifestFile, model) -> None:
    from recshard_stats.config import load_model_config

    if not isinstance(model, ModelConfig):
        model = load_model_config(model)
    problems = []
    expected = {t.name for t in model.tables}
    if set(loaded.tables) != expected:
        problems.append(
            f"tables differ: only in manifest {sorted(set(loaded.tables) - expected)}, "
            f"only in model {sorted(expected - set(loaded.tables))}"
        )
    for table in model.tables:
        placed = loaded.tables.get(table.name)
        if placed is None:
            continue
        for key in ("hash_size", "dim", "hash"):
            if getattr(placed, key) != getattr(table, key):
                problems.append(
                    f"table {table.name!r}: {key} is {getattr(placed, key)!r} in the manifest, "
                    f"{getattr(table, key)!r} in the model"
                )
        if placed.features != table.features:
            problems.append(
                f"table {table.name!r}: features {list(placed.features)} vs {list(table.features)}"
            )
    if problems:
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"{loaded.path} was planned for another model: "
            + "; ".join(problems[:5])
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
            fixes=("re-run the solver with this model config", "load the matching manifest"),
        )


def checksum_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _check_own_checksum(path: pathlib.Path, required: bool) -> None:
    sidecar = checksum_path(path)
    if not sidecar.is_file():
        if required:
            raise invalid_manifest(
                f"{sidecar.name} is missing, so edits to the manifest cannot be detected",
                "regenerate the manifest with `recshard solve` / `recshard remap`",
                path=path,
            )
        log.warning("%s has no %s beside it: edits cannot be detected", path, sidecar.name)
        return
    recorded, actual = sidecar.read_text().strip(), sha256_file(path)
    if recorded != actual:
        raise RecShardError(
            Reason.MANIFEST_INVALID,
            f"{path} changed after it was written (its SHA-256 is {actual[:19]}..., "
            f"{sidecar.name} says {recorded[:19]}...)",
            fixes=("do not edit a manifest by hand: re-run `recshard solve` (and `recshard remap`)",),
        )


def load_manifest(
    path: str | os.PathLike,
    model=None,
    *,
    verify_checksums: bool = True,
    require_remap: bool = False,
    require_checksum: bool = False,
) -> ManifestFile:
    """Read and validate a manifest (a ``manifest.json`` or the directory holding it): its types,
    the consistency of its numbers, its own SHA-256 (``manifest.json.sha256``, required with
    ``require_checksum``) and, with ``verify_checksums``, every remap file's.

    ``model``: a :class:`~recshard_stats.config.ModelConfig` or a config path; when given, its
    tables must match the manifest's (names, features, hash sizes, dims, hash functions).
    """
    path = pathlib.Path(path)
    if path.name == MANIFEST_NAME and not path.exists():
        path = path.parent  # look for the directory, which a swap may have left aside
    if not path.exists():
        from recshard_stats.atomic import readable_dir

        aside = readable_dir(path)
        if aside != path:
            log.warning(
                "%s is missing: a swap died between its renames; reading its old version %s", path, aside
            )
            path = aside
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"manifest {path} does not exist",
            fixes=("run `recshard solve` first", "check the path"),
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_manifest(f"not valid UTF-8 ({exc})", path=path) from None
    loaded = ManifestFile(path, Manifest.from_json(text, source=str(path)))
    _check_own_checksum(path, require_checksum)
    if require_remap:
        lacking = [t.name for t in loaded.manifest.tables if t.remap is None]
        if lacking:
            raise invalid_manifest(
                f"tables without a remap file: {lacking[:5]}", "run `recshard remap`", path=path
            )
    for t in loaded.manifest.tables:
        file = loaded.remap_path(t.name)  # checks the path stays inside the manifest's directory
        if not verify_checksums or file is None or t.remap is None:
            continue
        if not file.exists():
            raise invalid_manifest(f"remap file {t.remap.path} of table {t.name!r} is missing", path=path)
        actual = sha256_data(file)
        if actual != t.remap.sha256:
            raise RecShardError(
                Reason.MANIFEST_INVALID,
                f"{path}: checksum mismatch for {t.remap.path} "
                f"(manifest {t.remap.sha256[:19]}..., file {actual[:19]}...)",
                fixes=("the file changed after the manifest was written; re-run `recshard remap`",),
            )
    if model is not None:
        _check_model(loaded, model)
    return loaded
