"""Atomic publication on a local (or mounted) filesystem: a reader sees the old version or the
new one, never a half-written file or directory; a failed run leaves at most a ``_tmp-*``
entry, which every reader ignores.

A temporary entry's name carries its writer (``_tmp-<name>-<host>.<pid>-<uuid>``): the next
writer of the same target removes those whose process is gone (a ``kill -9``), and any older
than :data:`STALE_TMP_S`. :func:`output_lock` keeps two runs from writing one output at once.

A directory is replaced by two renames (the old one aside as ``_old-<name>-*``, the new one in).
A death between them leaves no ``<name>``: :func:`readable_dir` then gives readers the old
version, and the next writer puts it back (:func:`recover_dir`) before its own swap."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import pathlib
import re
import shutil
import socket
import time
import uuid

from recshard_stats.errors import Reason, RecShardError

log = logging.getLogger(__name__)


STALE_TMP_S = 6 * 3600  # a temporary entry untouched this long is a killed run's, whoever wrote it


def _writer() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


def temp_sibling(target: str | os.PathLike) -> pathlib.Path:
    """A unique temporary path next to ``target`` (same filesystem, so rename is atomic), named
    with its writer."""
    target = pathlib.Path(target)
    return target.parent / f"_tmp-{target.name}-{_writer()}-{uuid.uuid4().hex}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(target: str | os.PathLike) -> None:
    """Remove the temporary entries killed writers of ``target`` left: on this host, those whose
    process is gone; anywhere, those untouched for :data:`STALE_TMP_S`."""
    target = pathlib.Path(target)
    pattern = re.compile(rf"_tmp-{re.escape(target.name)}-(?P<host>.+)\.(?P<pid>\d+)-[0-9a-f]{{32}}")
    host, now = socket.gethostname(), time.time()
    for entry in target.parent.glob(f"_tmp-{glob.escape(target.name)}-*"):
        found = pattern.fullmatch(entry.name)
        try:
            age = now - entry.lstat().st_mtime
        except FileNotFoundError:
            continue  # its writer finished meanwhile
        dead = found is not None and found["host"] == host and not _alive(int(found["pid"]))
        if dead or age > STALE_TMP_S:
            log.warning("removing %s, left by a killed run", entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def check_output_root(root: str | os.PathLike, flag: str) -> None:
    """An output root is a directory or absent: refused before any work, not after it."""
    root = pathlib.Path(root)
    if root.exists() and not root.is_dir():
        raise RecShardError(
            Reason.CONFIG_INVALID,
            f"{flag} {root} is a file, not a directory",
            fixes=(f"pass {flag} a directory (it is created as needed)",),
        )


@contextlib.contextmanager
def output_lock(lock: str | os.PathLike, what: str, wait_s: float = 0.0):
    """Hold ``lock`` (a file, created as needed) while writing an output: a second holder waits up
    to ``wait_s`` and then fails naming the run that holds it. The operating system drops the
    lock when its process dies, so a killed run never leaves it held."""
    lock = pathlib.Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + wait_s
    with open(lock, "a+", encoding="utf-8") as handle:  # closing it releases the lock
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "another process"
                    raise RecShardError(
                        Reason.OUTPUT_BUSY,
                        f"{lock.parent} is being written by {holder} (lock {lock})",
                        fixes=("wait for that run to finish", "write to another output"),
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(
            f"{what} (pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')})"
        )
        handle.flush()
        yield


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
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
    remove_stale_temps(target)
    tmp = temp_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
