"""Writing and publishing a manifest: written atomically with its own SHA-256 beside it, and
``<root>/latest.json`` moved to it only once it loads and validates in full.

Publishing snapshots the manifest's directory into ``<root>/published/ds=<day>-<sha256 12>/``
(hard links where the filesystem allows, files are never modified in place) and points
``latest.json`` there: re-running solve or remap for a published day rebuilds ``ds=<day>`` and
never touches the published plan. The newest PUBLISHED_KEPT snapshots are kept, and
``published/history.json`` lists what was published, in order: ``recshard rollback`` moves
``latest.json`` back to the one before."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import TYPE_CHECKING

from recshard_stats.atomic import check_output_root, output_lock, write_text_atomic
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import Manifest, invalid_manifest
from recshard_stats.manifest_loader import (
    ManifestFile,
    checksum_path,
    load_manifest,
    safe_relative,
    sha256_file,
)
from recshard_stats.typed_json import DecodeError, from_plain, to_plain

if TYPE_CHECKING:
    from recshard_stats.publish_decision import PublishDecision

LATEST_NAME = "latest.json"
PUBLISHED_DIR = "published"
HISTORY_NAME = "history.json"  # in PUBLISHED_DIR
PUBLISHED_KEPT = 7  # snapshots kept (the published one always among them)


def write_manifest(path: str | os.PathLike, manifest: Manifest) -> pathlib.Path:
    """Write atomically (temp file + rename), then its SHA-256 beside it; the manifest was checked
    when it was built."""
    text = manifest.to_json()
    path = write_text_atomic(path, text)
    write_text_atomic(
        checksum_path(path), "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest() + "\n"
    )
    return path


@dataclasses.dataclass(frozen=True)
class LatestPointer:
    """``<root>/latest.json``: the published manifest, relative to the root, and its checksum."""

    manifest: str
    ds: str
    digest: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class PublishHistory:
    """``<root>/published/history.json``: the pointers ``latest.json`` held, oldest first (only
    those whose snapshot is still kept)."""

    published: tuple[LatestPointer, ...]


def _read_json(path: pathlib.Path, cls, what: str):
    try:
        return from_plain(cls, json.loads(path.read_text()))
    except (json.JSONDecodeError, DecodeError) as exc:
        raise invalid_manifest(f"not {what} ({exc})", "publish a manifest again", path=path) from None


def _history(root: pathlib.Path) -> list[LatestPointer]:
    """What was published, oldest first; before the first history, the pointer itself."""
    path = root / PUBLISHED_DIR / HISTORY_NAME
    if path.is_file():
        return list(_read_json(path, PublishHistory, "a publish history").published)
    latest = root / LATEST_NAME
    return [_read_json(latest, LatestPointer, "a latest pointer")] if latest.is_file() else []


def _write_history(root: pathlib.Path, pointers: list[LatestPointer]) -> None:
    kept = [p for p in pointers if (root / p.manifest).is_file()]
    write_text_atomic(
        root / PUBLISHED_DIR / HISTORY_NAME,
        json.dumps(to_plain(PublishHistory(tuple(kept))), indent=2) + "\n",
    )


def _snapshot(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """An immutable copy of a manifest's directory (hard links, or copies across filesystems)."""
    import shutil

    from recshard_stats.atomic import building_dir

    if target.is_dir():
        return target  # the same manifest published before
    with building_dir(target) as tmp:
        for file in sorted(source.rglob("*")):
            if file.is_symlink():
                raise invalid_manifest(
                    f"{file} is a symbolic link: a manifest's files are its own", path=source
                )
            dest = tmp / file.relative_to(source)
            if file.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(file, dest)
            except OSError:
                shutil.copy2(file, dest)
    return target


def publish_latest(root: str | os.PathLike, manifest_path: str | os.PathLike, model=None) -> pathlib.Path:
    """Snapshot a manifest into ``<root>/published/`` and move ``<root>/latest.json`` to it, only
    once it loads and validates in full."""
    root = pathlib.Path(root)
    check_output_root(root, "--root")
    loaded = load_manifest(manifest_path, model, require_remap=True, require_checksum=True)
    # publishers of several days take turns: each moves the one pointer and prunes snapshots
    with output_lock(root / "_lock-publish", f"recshard publish of {loaded.manifest.ds}", wait_s=60):
        return _publish(root, loaded, model)


def beside_candidate(manifest_path: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path]:
    """The evaluations ``recshard evaluate --published-root`` leaves beside a candidate: its own
    (which must exist) and the published plan's (absent when nothing comparable is published)."""
    from recshard_stats.replay import EVALUATION_NAME, PUBLISHED_EVALUATION_NAME

    path = pathlib.Path(manifest_path)
    directory = path if path.is_dir() else path.parent
    evaluation = directory / EVALUATION_NAME
    if not evaluation.is_file():
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"--compare: {evaluation} does not exist",
            fixes=(f"recshard evaluate --manifest {directory} --logs <newest logs> --published-root <root>",),
        )
    return evaluation, directory / PUBLISHED_EVALUATION_NAME


def publish_if_better(
    root: str | os.PathLike,
    manifest_path: str | os.PathLike,
    model=None,
    evaluation: str | os.PathLike | None = None,
    published_evaluation: str | os.PathLike | None = None,
    margin: float | None = None,
    force: bool = False,
) -> PublishDecision:
    """``recshard publish``: decide (:mod:`~recshard_stats.publish_decision`) whether the candidate
    replaces the published manifest, write ``decision.json`` beside it, and publish it if so."""
    from recshard_stats.publish_decision import DEFAULT_MARGIN, decide, write_decision
    from recshard_stats.replay import load_evaluation

    root = pathlib.Path(root)
    check_output_root(root, "--root")
    loaded = load_manifest(manifest_path, model, require_remap=True, require_checksum=True)
    candidate_evaluation = load_evaluation(pathlib.Path(evaluation)) if evaluation is not None else None
    # absent when nothing comparable was published (nothing, or for another config): the
    # decision then needs no figures, and says so when it does
    earlier_evaluation = (
        load_evaluation(pathlib.Path(published_evaluation))
        if published_evaluation is not None and pathlib.Path(published_evaluation).is_file()
        else None
    )
    with output_lock(root / "_lock-publish", f"recshard publish of {loaded.manifest.ds}", wait_s=60):
        published, broken = None, None
        try:
            published = load_published(root)
        except RecShardError as exc:  # a published plan that no longer loads is replaced
            broken = exc.message
        decision = decide(
            loaded,
            published,
            candidate_evaluation,
            earlier_evaluation,
            DEFAULT_MARGIN if margin is None else margin,
            force,
        )
        if broken is not None and not force:
            decision = dataclasses.replace(decision, reason=f"the published plan no longer loads: {broken}")
        write_decision(decision)
        if decision.publish:
            _publish(root, loaded, model)
    return decision


def _publish(root: pathlib.Path, loaded: ManifestFile, model) -> pathlib.Path:
    import shutil

    sha = sha256_file(loaded.path)
    snapshot = _snapshot(
        loaded.path.parent,
        root / PUBLISHED_DIR / f"ds={loaded.manifest.ds}-{sha.removeprefix('sha256:')[:12]}",
    )
    published = load_manifest(snapshot, model, require_remap=True, require_checksum=True)
    relative = os.path.relpath(published.path.resolve(), root.resolve())
    safe_relative(root, relative)
    pointer = LatestPointer(
        manifest=pathlib.PurePath(relative).as_posix(),
        ds=published.manifest.ds,
        digest=published.manifest.inputs.digest,
        sha256=sha256_file(published.path),
    )
    history = _history(root)
    written = write_text_atomic(root / LATEST_NAME, json.dumps(to_plain(pointer), indent=2) + "\n")
    kept = sorted((root / PUBLISHED_DIR).glob("ds=*"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in kept[PUBLISHED_KEPT:]:
        if old != snapshot:
            shutil.rmtree(old, ignore_errors=True)
    _write_history(root, history if history and history[-1] == pointer else [*history, pointer])
    return written


def rollback_latest(root: str | os.PathLike, model=None) -> LatestPointer:
    """Move ``<root>/latest.json`` back to the manifest published before the current one (it
    must still load and validate in full); the current one leaves the history."""
    root = pathlib.Path(root)
    with output_lock(root / "_lock-publish", "recshard rollback", wait_s=60):
        history = _history(root)
        if len(history) < 2:
            raise RecShardError(
                Reason.INPUT_MISSING,
                f"{root}: no manifest was published before "
                + (f"{history[-1].manifest}" if history else "(nothing is published)"),
                fixes=(f"the {PUBLISHED_KEPT} newest snapshots are kept under {root / PUBLISHED_DIR}",),
            )
        previous = history[-2]
        _load_pointed(root, previous, model, root / PUBLISHED_DIR / HISTORY_NAME)
        write_text_atomic(root / LATEST_NAME, json.dumps(to_plain(previous), indent=2) + "\n")
        _write_history(root, history[:-1])
    return previous


def load_latest(root: str | os.PathLike, model=None) -> ManifestFile:
    """The manifest ``<root>/latest.json`` points to, checked against the pointer's checksum."""
    root = pathlib.Path(root)
    pointer_path = root / LATEST_NAME
    if not pointer_path.is_file():
        raise RecShardError(
            Reason.INPUT_MISSING, f"{pointer_path} does not exist", fixes=("publish a manifest",)
        )
    return _load_pointed(
        root, _read_json(pointer_path, LatestPointer, "a latest pointer"), model, pointer_path
    )


def load_published(root: str | os.PathLike, model=None) -> ManifestFile | None:
    """The manifest published under ``root`` (:func:`load_latest`), or None when nothing is
    published there yet (no ``latest.json``)."""
    return load_latest(root, model) if (pathlib.Path(root) / LATEST_NAME).is_file() else None


def _load_pointed(root: pathlib.Path, pointer: LatestPointer, model, where: pathlib.Path) -> ManifestFile:
    """The published manifest ``pointer`` names (read from ``where``), unchanged since it was
    published and loading in full."""
    path = safe_relative(root, pointer.manifest)
    if not path.is_file() or sha256_file(path) != pointer.sha256:
        raise invalid_manifest(f"{pointer.manifest} changed after it was published", path=where)
    return load_manifest(path, model, require_remap=True, require_checksum=True)
