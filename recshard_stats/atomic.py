"""Atomic publication on a local (or mounted) filesystem: a reader sees the old version or the
new one, never a half-written file or directory; a failed run leaves at most a ``_tmp-*``
entry, which every reader ignores.

A directory is replaced by two renames (the old one aside as ``_old-<name>-*``, the new one in).
A death between them leaves no ``<name>``: :func:`readable_dir` then gives readers the old
version, and the next writer puts it back (:func:`recover_dir`) before its own swap."""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import shutil
import uuid


def temp_sibling(target: str | os.PathLike) -> pathlib.Path:
    """A unique temporary path next to ``target`` (same filesystem, so rename is atomic)."""
    target = pathlib.Path(target)
    return target.parent / f"_tmp-{target.name}-{uuid.uuid4().hex}"


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _asides(target: pathlib.Path) -> list[pathlib.Path]:
    """Old versions of ``target`` moved aside by swaps, newest first."""
    found = target.parent.glob(f"_old-{glob.escape(target.name)}-*")
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def readable_dir(target: str | os.PathLike) -> pathlib.Path:
    """``target``, or the version a swap that died between its renames left aside."""
    target = pathlib.Path(target)
    if target.exists():
        return target
    asides = _asides(target)
    return asides[0] if asides else target


def recover_dir(target: str | os.PathLike) -> None:
    """Undo what a swap that died left: no ``target`` but its old version aside (put back), or
    old versions aside of a ``target`` that was swapped in (removed)."""
    target = pathlib.Path(target)
    asides = _asides(target)
    if asides and not target.exists():
        asides.pop(0).rename(target)
    for stale in asides:
        shutil.rmtree(stale, ignore_errors=True)


def replace_dir(tmp: str | os.PathLike, target: str | os.PathLike) -> pathlib.Path:
    """Move the finished directory ``tmp`` to ``target``, replacing an earlier one: the old
    directory is moved aside first (recoverable, see :func:`recover_dir`), so ``target`` is
    always complete, or absent with its old version aside."""
    tmp, target = pathlib.Path(tmp), pathlib.Path(target)
    recover_dir(target)
    old = None
    if target.exists():
        old = target.parent / f"_old-{target.name}-{uuid.uuid4().hex}"
        target.rename(old)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


@contextlib.contextmanager
def building_dir(target: str | os.PathLike):
    """``with building_dir(out) as tmp:`` fill ``tmp``; on success it replaces ``out``, on any
    failure it is removed and ``out`` is left as it was."""
    target = pathlib.Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
