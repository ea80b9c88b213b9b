"""Id -> row hashing that a trainer reproduces exactly, with numpy only.

Every feature value becomes a 64-bit *key*, and every key a row ``pmod(key, hash_size)``
(always in ``[0, hash_size)``, negative keys included):

- ``mod``: the key is the integer id itself (``hex`` features are parsed base 16 first,
  as in the Criteo DLRM preprocessing).
- ``xxhash64``: the key is XXH64 with seed 42 (Spark's ``xxhash64``) of the id: of its
  8 little-endian bytes for integers, of its UTF-8 bytes for strings.

Spark computes the same keys with ``xxhash64(col)`` and ``pmod``; the tests compare both
on the same values.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_MASK = (1 << 64) - 1


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def xxhash64_int64(values: Iterable[int] | np.ndarray, seed: int = SEED) -> np.ndarray:
    """XXH64 of each int64's 8 little-endian bytes, as signed int64 (Spark's ``xxhash64(bigint)``)."""
    x = np.asarray(values, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.uint64((seed + int(_P5) + 8) & _MASK) + np.zeros_like(x)
        k = _rotl(x * _P2, 31) * _P1
        h = _rotl(h ^ k, 27) * _P1 + _P4
        return _fmix(h).view(np.int64)


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * int(_P2)) & _MASK
    acc = ((acc << 31) | (acc >> 33)) & _MASK
    return (acc * int(_P1)) & _MASK


def _rotl_int(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def xxhash64_bytes(data: bytes, seed: int = SEED) -> int:
    """Reference XXH64 of a byte string (pure Python), as a signed 64-bit integer."""
    p1, p2, p3, p4, p5 = (int(p) for p in (_P1, _P2, _P3, _P4, _P5))
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + p1 + p2) & _MASK, (seed + p2) & _MASK, seed & _MASK, (seed - p1) & _MASK]
        while i + 32 <= n:
            for lane in range(4):
                v[lane] = _round(v[lane], int.from_bytes(data[i + 8 * lane : i + 8 * lane + 8], "little"))
            i += 32
        h = (_rotl_int(v[0], 1) + _rotl_int(v[1], 7) + _rotl_int(v[2], 12) + _rotl_int(v[3], 18)) & _MASK
        for lane in v:
            h = ((h ^ _round(0, lane)) * p1 + p4) & _MASK
    else:
        h = (seed + p5) & _MASK
    h = (h + n) & _MASK
    while i + 8 <= n:
        k = _round(0, int.from_bytes(data[i : i + 8], "little"))
        h = (_rotl_int(h ^ k, 27) * p1 + p4) & _MASK
        i += 8
    if i + 4 <= n:
        h = (_rotl_int(h ^ (int.from_bytes(data[i : i + 4], "little") * p1 & _MASK), 23) * p2 + p3) & _MASK
        i += 4
    while i < n:
        h = (_rotl_int(h ^ (data[i] * p5 & _MASK), 11) * p1) & _MASK
        i += 1
    h ^= h >> 33
    h = (h * p2) & _MASK
    h ^= h >> 29
    h = (h * p3) & _MASK
    h ^= h >> 32
    return h - (1 << 64) if h >= (1 << 63) else h


def xxhash64_strings(values: Iterable[str], seed: int = SEED) -> np.ndarray:
    """XXH64 of each string's UTF-8 bytes (Spark's ``xxhash64(string)``)."""
    return np.fromiter((xxhash64_bytes(v.encode("utf-8"), seed) for v in values), dtype=np.int64)


def parse_hex(values: Iterable[str]) -> np.ndarray:
    """Criteo-style categorical values (hex strings) to integer ids."""
    return np.fromiter((int(v, 16) for v in values), dtype=np.int64)


def keys_of(values, feature_type: str, hash_fn: str) -> np.ndarray:
    """Feature values (as the logs hold them; the ids of a multi-hot feature flattened) -> 64-bit
    keys. Nulls and empty strings are absent values: leave them out before."""
    if feature_type in ("string", "array<string>"):
        return xxhash64_strings(values)
    ids = parse_hex(values) if feature_type == "hex" else np.asarray(values, dtype=np.int64)
    return xxhash64_int64(ids) if hash_fn == "xxhash64" else ids


def rows_of(keys: np.ndarray, hash_size: int) -> np.ndarray:
    """``pmod(key, hash_size)``: numpy's ``%`` has the sign of the divisor, like Spark's pmod."""
    return np.asarray(keys, dtype=np.int64) % np.int64(hash_size)
