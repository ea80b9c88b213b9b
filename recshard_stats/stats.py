"""Reading a published stats partition back (pyarrow only: no Spark needed by solver or trainer)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.schemas import SCHEMA_VERSION, SMALL_TABLES, arrow_schema
from recshard_stats.statistics import CountOfCounts


@dataclasses.dataclass(frozen=True)
class StatsPartition:
    path: pathlib.Path
    metadata: dict
    tables: dict[str, pa.Table]

    def rows(self, name: str) -> list[dict]:
        return self.tables[name].to_pylist()

    def count_of_counts(self, level: str, name: str) -> CountOfCounts:
        t = self.tables["count_of_counts"]
        mask = [lv == level and n == name for lv, n in zip(t["level"].to_pylist(), t["name"].to_pylist())]
        sub = t.filter(pa.array(mask))
        return CountOfCounts.of(sub["access_count"].to_numpy(), sub["rows"].to_numpy())


def load_stats(path) -> StatsPartition:
    """A partition ``<out>/ds=<date>``: complete (``_SUCCESS``), of this schema version."""
    path = pathlib.Path(path)
    if not (path / "_SUCCESS").is_file():
        raise RecShardError(Reason.INPUT_MISSING, f"{path} is not a complete stats partition (no _SUCCESS)",
                            fixes=("run `recshard profile` for that day first", "check --stats"))
    metadata = json.loads((path / "metadata.json").read_text())
    if metadata.get("schema_version") != SCHEMA_VERSION:
        raise RecShardError(Reason.STATS_INVALID,
                            f"{path}: stats schema version {metadata.get('schema_version')!r}, "
                            f"this version reads {SCHEMA_VERSION!r}", fixes=("re-run the profile",))
    tables = {}
    for name in SMALL_TABLES:
        try:
            table = pq.read_table(path / name)
        except (OSError, pa.ArrowInvalid) as exc:
            raise RecShardError(Reason.INPUT_CORRUPT, f"{path / name}: cannot read ({exc})") from None
        expected = arrow_schema(name)
        if table.schema.names != expected.names:
            raise RecShardError(Reason.STATS_INVALID, f"{path / name}: columns {table.schema.names}, "
                                f"expected {expected.names}")
        tables[name] = table.cast(expected)
    return StatsPartition(path, metadata, tables)
