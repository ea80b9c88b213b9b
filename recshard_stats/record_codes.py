"""The codes the normalized frame (:mod:`recshard_stats.readers`) and the profile share, in plain
Python: rejected values are ``column << REASON_BITS | reason``; columns index
:func:`reject_columns`, reasons :data:`REJECT_REASONS`."""

from __future__ import annotations

from recshard_stats.config import CRITEO_DENSE, STRING_TYPES, ModelConfig

# a profile record's code is kind << FEATURE_BITS | feature index (TABLE: a shared table's index,
# for its ids counted at the table's level)
ID, POOLING, REJECT, ROW, TABLE = 0, 1, 2, 3, 4
FEATURE_BITS = 16
HEX_PATTERN = "^[0-9a-fA-F]{1,15}$"  # a hex id: at most 15 digits, so it fits a signed 64-bit key
REJECT_REASONS = ("null_id", "not_hex", "not_integer", "wrong_field_count")
REASON_BITS = 8


def record_code(kind: int, feature: int = 0) -> int:
    return (kind << FEATURE_BITS) | feature


def decode_record(code: int) -> tuple[int, int]:
    """A record's code -> (kind, feature or table index)."""
    return code >> FEATURE_BITS, code & ((1 << FEATURE_BITS) - 1)


def reject_code(column: int, reason: str) -> int:
    return (column << REASON_BITS) | REJECT_REASONS.index(reason)


def decode_reject(code: int) -> tuple[int, str]:
    return code >> REASON_BITS, REJECT_REASONS[code & ((1 << REASON_BITS) - 1)]


def reject_columns(model: ModelConfig) -> list[str]:
    """Names of the columns that ``_rejects`` refers to: the features, then (for Criteo TSV)
    the label and the dense columns, whose values are validated too."""
    names = [f.name for f in model.features]
    if model.input_format == "criteo_tsv":
        names += ["label", *CRITEO_DENSE]
    return names


def needs_key_hash(feature_type: str, hash_fn: str) -> bool:
    """True where ``k{i}`` holds raw integer ids that still need ``xxhash64`` to become keys."""
    return hash_fn == "xxhash64" and feature_type not in STRING_TYPES


def is_multi_hot(feature_type: str) -> bool:
    return feature_type.startswith("array<")
