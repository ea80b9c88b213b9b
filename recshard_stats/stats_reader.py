"""Reading a published stats partition back (pyarrow only: no Spark needed by solver or trainer)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

from recshard_stats.config import ModelConfig, digest_of
from recshard_stats.distributions import CountOfCounts
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest_loader import sha256_data
from recshard_stats.schemas import SCHEMA_VERSION, SMALL_TABLES, StatsMetadata, arrow_schema
from recshard_stats.typed_json import DecodeError, from_plain


@dataclasses.dataclass(frozen=True)
class StatsPartition:
    path: pathlib.Path
    metadata: StatsMetadata
    tables: dict[str, pa.Table]

    def rows(self, name: str) -> list[dict]:
        return self.tables[name].to_pylist()

    def count_of_counts(self, level: str, name: str) -> CountOfCounts:
        t = self.tables["count_of_counts"]
        mask = [
            lv == level and n == name
            for lv, n in zip(t["level"].to_pylist(), t["name"].to_pylist(), strict=True)
        ]
        sub = t.filter(pa.array(mask))
        return CountOfCounts.of(sub["access_count"].to_numpy(), sub["rows"].to_numpy())


def load_stats(path) -> StatsPartition:
    """A partition ``<out>/ds=<date>``: complete (``_SUCCESS``), of this schema version."""
    path = pathlib.Path(path)
    if not (path / "_SUCCESS").is_file():
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"{path} is not a complete stats partition (no _SUCCESS)",
            fixes=("run `recshard profile` for that day first", "check --stats"),
        )
    try:
        raw = json.loads((path / "metadata.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RecShardError(Reason.INPUT_CORRUPT, f"{path / 'metadata.json'}: cannot read ({exc})") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise RecShardError(
            Reason.STATS_INVALID,
            f"{path}: stats schema version {version!r}, this version reads {SCHEMA_VERSION!r}",
            fixes=("re-run the profile",),
        )
    try:
        metadata = from_plain(StatsMetadata, raw)
    except DecodeError as exc:
        raise RecShardError(
            Reason.STATS_INVALID, f"{path / 'metadata.json'}: {exc}", fixes=("re-run the profile",)
        ) from None
    tables = {}
    for name in SMALL_TABLES:
        try:
            table = pq.read_table(path / name)
        except (OSError, pa.ArrowInvalid) as exc:
            raise RecShardError(Reason.INPUT_CORRUPT, f"{path / name}: cannot read ({exc})") from None
        expected = arrow_schema(name)
        if table.schema.names != expected.names:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"{path / name}: columns {table.schema.names}, expected {expected.names}",
            )
        tables[name] = table.cast(expected)
    return StatsPartition(path, metadata, tables)


def stats_digest(stats: StatsPartition) -> str:
    """What a manifest records of the partition it was solved from (its small tables and metadata)."""
    return digest_of({name: sha256_data(stats.path / name) for name in (*SMALL_TABLES, "metadata.json")})


def check_profiled_with(stats: StatsPartition, model: ModelConfig) -> None:
    """The stats were profiled with this model's tables as far as profiling sees them: input
    format, each table's features and hash function, each feature's type (dims, which profiling
    does not use, may differ; hash sizes are checked with the table's rows). Tables and hash sizes
    alone matching is not enough: the same names under another hash or feature count other rows."""
    profiled = ModelConfig.from_dict(stats.metadata.model, f"{stats.path}: metadata.json model")

    def seen(m: ModelConfig) -> dict:
        types = {f.name: f.type for f in m.features}
        return {t.name: (t.features, t.hash, tuple(types[f] for f in t.features)) for t in m.tables}

    then, now = seen(profiled), seen(model)
    differs = [name for name in now if name in then and then[name] != now[name]]
    if profiled.input_format != model.input_format or differs:
        what = (
            f"input format {profiled.input_format!r}, the model config {model.input_format!r}"
            if profiled.input_format != model.input_format
            else f"table {differs[0]!r} as (features, hash, feature types) "
            f"{then[differs[0]]}, the model config as {now[differs[0]]}"
        )
        raise RecShardError(
            Reason.STATS_INVALID,
            f"stats at {stats.path} were profiled with another model config: {what}",
            fixes=(
                "profile again with this model config",
                "solve with the model config the stats were profiled with",
            ),
        )
