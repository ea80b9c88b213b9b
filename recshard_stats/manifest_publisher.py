"""Writing and publishing a manifest: written atomically with its own SHA-256 beside it, and
``<root>/latest.json`` moved to it only once it loads and validates in full."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib

from recshard_stats.atomic import write_text_atomic
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

LATEST_NAME = "latest.json"


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


def publish_latest(root: str | os.PathLike, manifest_path: str | os.PathLike, model=None) -> pathlib.Path:
    """Move ``<root>/latest.json`` to a manifest, only once it loads and validates in full."""
    root = pathlib.Path(root)
    loaded = load_manifest(manifest_path, model, require_remap=True, require_checksum=True)
    relative = os.path.relpath(loaded.path.resolve(), root.resolve())
    safe_relative(root, relative)
    pointer = LatestPointer(
        manifest=pathlib.PurePath(relative).as_posix(),
        ds=loaded.manifest.ds,
        digest=loaded.manifest.inputs.digest,
        sha256=sha256_file(loaded.path),
    )
    return write_text_atomic(root / LATEST_NAME, json.dumps(to_plain(pointer), indent=2) + "\n")


def load_latest(root: str | os.PathLike, model=None) -> ManifestFile:
    """The manifest ``<root>/latest.json`` points to, checked against the pointer's checksum."""
    root = pathlib.Path(root)
    pointer_path = root / LATEST_NAME
    if not pointer_path.is_file():
        raise RecShardError(
            Reason.INPUT_MISSING, f"{pointer_path} does not exist", fixes=("publish a manifest",)
        )
    try:
        pointer = from_plain(LatestPointer, json.loads(pointer_path.read_text()))
    except (json.JSONDecodeError, DecodeError) as exc:
        raise invalid_manifest(
            f"not a latest pointer ({exc})", "publish a manifest again", path=pointer_path
        ) from None
    path = safe_relative(root, pointer.manifest)
    if not path.is_file() or sha256_file(path) != pointer.sha256:
        raise invalid_manifest(f"{pointer.manifest} changed after it was published", path=pointer_path)
    return load_manifest(path, model, require_remap=True, require_checksum=True)
