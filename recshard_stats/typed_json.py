"""Frozen dataclasses <-> plain JSON values, driven by the type hints: the one (de)serializer of
every contract file (manifest, stats metadata). Decoding checks each value's type and names the
field that is wrong (``tables[3].gpu``); unknown keys are errors, so a misspelt field is never
silently dropped. A class with ``to_dict`` / ``from_dict`` (the configs) converts itself.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing


class DecodeError(ValueError):
    """A value that does not fit its declared type; ``where`` is its path in the document."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def to_plain(value):
    """A dataclass (recursively) as JSON-ready dicts, lists and scalars, in field order."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def required_fields(cls) -> list[str]:
    """Fields a document must give (those without a default)."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _require_object(data, where: str) -> None:
    if not isinstance(data, dict):
        raise DecodeError(where, f"must be an object, got {type(data).__name__}")


def from_plain(cls, data, where: str = ""):
    """``data`` (parsed JSON) as an instance of ``cls``; a :class:`DecodeError` names the bad field."""
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_plain(inner, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise DecodeError(where, f"must be a list, got {type(data).__name__}")
        return tuple(from_plain(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
    if cls is dict or origin is dict:
        _require_object(data, where)
        if not args:
            return dict(data)
        return {
            from_plain(args[0], k, where): from_plain(args[1], v, f"{where}[{k!r}]") for k, v in data.items()
        }
    if hasattr(cls, "from_dict"):
        _require_object(data, where)
        return cls.from_dict(data, where)
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        try:
            return cls(data)
        except ValueError:
            raise DecodeError(where, f"{data!r} is not one of {[m.value for m in cls]}") from None
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        _require_object(data, where)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise DecodeError(where, f"unknown field(s) {unknown}; {cls.__name__} has {sorted(names)}")
        missing = [n for n in required_fields(cls) if n not in data]
        if missing:
            raise DecodeError(where, f"lacks {missing}")
        hints = _hints(cls)
        prefix = f"{where}." if where else ""
        return cls(**{k: from_plain(hints[k], v, prefix + k) for k, v in data.items()})
    if cls is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise DecodeError(where, f"must be a number, got {data!r}")
        return float(data)
    if cls is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise DecodeError(where, f"must be an integer, got {data!r}")
        return data
    if cls in (str, bool):
        if not isinstance(data, cls):
            raise DecodeError(where, f"must be a {cls.__name__}, got {data!r}")
        return data
    raise TypeError(f"{where}: no decoder for {cls!r}")
