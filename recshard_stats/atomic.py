"""Atomic publication on a local (or mounted) filesystem: a reader sees the old version or the
new one, never a half-written file or directory; a failed run leaves at most a ``_tmp-*``
entry, which every reader ignores."""

from __future__ import annotations

import contextlib
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


def replace_dir(tmp: str | os.PathLike, target: str | os.PathLike) -> pathlib.Path:
    """Move the finished directory ``tmp`` to ``target``, replacing an earlier one: the old
    directory is moved aside first, so ``target`` is always absent or complete."""
    tmp, target = pathlib.Path(tmp), pathlib.Path(target)
    old = None
    if target.exists():
        old = temp_sibling(target)
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
