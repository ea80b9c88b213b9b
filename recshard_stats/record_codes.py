"""The codes the normalized frame (:mod:`recshard_stats.readers`) and the profile share, in plain
Python: rejected values are ``column << REASON_BITS | reason``; columns index
:func:`reject_columns`, reasons :data:`REJECT_REASONS`."""

from __future__ import annotations

import enum
import re

from recshard_stats.config import CRITEO_DENSE, STRING_TYPES, ModelConfig


class RecordKind(enum.IntEnum):
    """A profile record's kind: its code is kind << FEATURE_BITS | feature index (TABLE: a shared
    table's index, for its ids counted at the table's level)."""

    ID = 0  # key: a hashed row; count: its accesses
    POOLING = 1  # key: a pooling factor; count: samples with it
    REJECT = 2  # key: a reject code (column, reason); count: values rejected so
    ROW = 3  # key: a RowOutcome; count: rows with it
    TABLE = 4  # as ID, for a table several features feed


class RowOutcome(enum.IntEnum):
    """The key of a ROW record."""

    MALFORMED = 0  # a row the reader could not parse (counted, not profiled)
    PARSED = 1


FEATURE_BITS = 16
HEX_PATTERN = "^[0-9a-fA-F]{1,15}$"  # a hex id: at most 15 digits, so it fits a signed 64-bit key
INT_PATTERN = "^-?[0-9]{1,18}$"  # a Criteo label or dense value
REJECT_REASONS = ("null_id", "not_hex", "not_integer", "wrong_field_count", "undecodable")
REASON_BITS = 8


def record_code(kind: RecordKind, feature: int = 0) -> int:
    return (kind << FEATURE_BITS) | feature


def decode_record(code: int) -> tuple[RecordKind, int]:
    """A record's code -> (kind, feature or table index)."""
    return RecordKind(code >> FEATURE_BITS), code & ((1 << FEATURE_BITS) - 1)


def reject_code(column: int, reason: str) -> int:
    return (column << REASON_BITS) | REJECT_REASONS.index(reason)


def decode_reject(code: int) -> tuple[int, str]:
    return code >> REASON_BITS, REJECT_REASONS[code & ((1 << REASON_BITS) - 1)]


# A Spark task that cannot read a file fails with this message; the driver finds the file's name in
# the task's error text (Spark gives no structured cause) to name it in one line.
_UNREADABLE = "reading file {uri} failed: {error}"
_UNREADABLE_PATTERNS = (
    # ours, and Spark's "Encountered error while reading file <uri>. Details: ..." (braces: not
    # the f-string in a Python worker's traceback, the name it formatted)
    re.compile(r"reading file ([^\s{}]+?)\.?\s"),
    re.compile(r"(\S+) is not a Parquet file"),  # Spark's own Parquet reader
)


def unreadable_file_message(uri: str, exc: BaseException) -> str:
    return _UNREADABLE.format(uri=uri, error=f"{type(exc).__name__}: {exc}")


def unreadable_file_in(text: str) -> str | None:
    """The file a failed task's error text names as unreadable (None: it names none)."""
    for pattern in _UNREADABLE_PATTERNS:
        match = pattern.search(text)
        if match is not None:
            return match.group(1)
    return None


def reject_columns(model: ModelConfig) -> list[str]:
    """Names of the columns that ``_rejects`` refers to: the features, then (for Criteo TSV)
    the label and the dense columns, whose values are validated too."""
    names = [f.name for f in model.features]
    if model.input_format == "criteo_tsv":
        names += ["label", *CRITEO_DENSE]
    return names


def criteo_integer_checks(model: ModelConfig) -> tuple[tuple[int, int], ...]:
    """(field position, ``not_integer`` reject code) of a Criteo line's label and dense values,
    which must be empty or integers: the columns :func:`reject_columns` names after the features."""
    return tuple(
        (i, reject_code(len(model.features) + i, "not_integer")) for i in range(1 + len(CRITEO_DENSE))
    )


def needs_key_hash(feature_type: str, hash_fn: str) -> bool:
    """True where ``k{i}`` holds raw integer ids that still need ``xxhash64`` to become keys."""
    return hash_fn == "xxhash64" and feature_type not in STRING_TYPES


def is_multi_hot(feature_type: str) -> bool:
    return feature_type.startswith("array<")
