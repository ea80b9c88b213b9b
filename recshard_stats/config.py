"""Model and hardware configs: YAML/TOML files loaded into validated dataclasses.

Model config::

    name: criteo_kaggle
    input: {format: criteo_tsv}        # or parquet, or csv (a header row names the columns)
    features:
      - {name: C1, type: hex}          # int64 | string | hex | array<int64> | array<string>
    tables:
      - {name: t_C1, features: [C1], hash_size: 100000, dim: 64, hash: mod}

Every problem is reported with the file, the entry and what would be valid.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import functools
import hashlib
import json
import math
import pathlib
import re
from typing import Any

import tomllib
import yaml

from recshard_stats.costmodel import CostModel, calibration_from_file
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.units import GIB

FEATURE_TYPES = ("int64", "string", "hex", "array<int64>", "array<string>")
STRING_TYPES = ("string", "array<string>")  # ids that are their own XXH64 keys
HASH_FUNCTIONS = ("mod", "xxhash64")
INPUT_FORMATS = ("parquet", "criteo_tsv", "csv")
CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))
MAX_HASH_SIZE = 2**63 - 1  # rows are int64 in Spark, the remap and the loader
MODEL_KEYS = ("name", "input", "features", "tables")
INPUT_KEYS = ("format", "separator", "list_separator", "quote", "escape", "multiline", "encoding")
# RFC 4180 by default: a field may be quoted, a quote inside it doubled, a line end inside it kept
CSV_DEFAULTS = {"separator": ",", "list_separator": "|", "quote": '"', "escape": '"'}
FEATURE_KEYS = ("name", "type", "synthetic")
TABLE_KEYS = ("name", "features", "feature", "hash_size", "dim", "hash")
HARDWARE_KEYS = (
    "num_gpus",
    "hbm_per_gpu_gib",
    "hbm_per_gpu_bytes",
    "hbm_reserved_fraction",
    "hbm_reserved_gib",
    "hbm_reserved_bytes",
    "host_gib",
    "host_bytes",
    "hbm_bandwidth_gbps",
    "uvm_bandwidth_gbps",
    "batch_size",
    "bytes_per_element",
    "optimizer",
    "optimizer_state_multiplier",
    "index_bytes",
    "output_bytes_per_element",
    "calibration",
    "comm_bandwidth_gbps",
)


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    name: str
    type: str


@dataclasses.dataclass(frozen=True)
class TableConfig:
    name: str
    features: tuple[str, ...]
    hash_size: int
    dim: int
    hash: str


@dataclasses.dataclass(frozen=True)
class CsvOptions:
    """``input: {format: csv}``: text logs whose first line names the columns."""

    separator: str = CSV_DEFAULTS["separator"]  # between fields ("\t" for TSV)
    list_separator: str = CSV_DEFAULTS["list_separator"]  # between the ids of a multi-hot field: a|b|c
    quote: str = CSV_DEFAULTS["quote"]  # around a field that holds separators, quotes or line ends
    escape: str = CSV_DEFAULTS["escape"]  # before a quote inside a quoted field (the quote itself: doubled)
    multiline: bool = True  # line ends inside quoted fields (false: faster, a file split across tasks)
    encoding: str = "UTF-8"  # of the files' bytes; a byte it cannot decode makes its value a reject


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str
    input_format: str
    features: tuple[FeatureConfig, ...]
    tables: tuple[TableConfig, ...]
    csv: CsvOptions | None = None  # with input_format "csv"

    def table_of(self, feature: str) -> TableConfig:
        for table in self.tables:
            if feature in table.features:
                return table
        raise KeyError(feature)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "input": {"format": self.input_format, **(dataclasses.asdict(self.csv) if self.csv else {})},
            "features": [dataclasses.asdict(f) for f in self.features],
            "tables": [{**dataclasses.asdict(t), "features": list(t.features)} for t in self.tables],
        }

    @classmethod
    def from_dict(cls, data: dict, source: str = "model config") -> ModelConfig:
        return parse_model_config(data, source)

    def digest(self) -> str:
        return digest_of(self.to_dict())


@dataclasses.dataclass(frozen=True)
class HardwareConfig:
    num_gpus: int
    hbm_bytes_per_gpu: int
    hbm_reserved_fraction: float
    host_bytes: int
    hbm_bandwidth: float  # bytes/s
    uvm_bandwidth: float  # bytes/s
    batch_size: int
    bytes_per_element: int
    # the trainer's embedding optimizer (FBGEMM's fused one, OPTIMIZERS): its state is part of a row
    optimizer: str = "sgd"
    # the trainer's buffers in HBM beside the rows (see trainer_bytes); 0 leaves them out
    index_bytes: int = 8  # one id of the trainer's input (TorchRec/FBGEMM: int64)
    output_bytes_per_element: int = 4  # the pooled outputs (fp32)
    # measured terms (a hardware config's ``calibration:``); None: the v1 model of the bandwidths
    cost_model: CostModel | None = None
    comm_bandwidth: float = 0.0  # bytes/s between GPUs for ids and outputs; 0: not costed

    @functools.cached_property
    def costs(self) -> CostModel:
        """The cost model every stage uses (docs/design.md, "Cost model"); built once, the solver
        prices tables with it in its inner loops."""
        if self.cost_model is not None:
            return dataclasses.replace(self.cost_model, comm_bandwidth=self.comm_bandwidth)
        return CostModel.from_bandwidths(self.hbm_bandwidth, self.uvm_bandwidth, self.comm_bandwidth)

    def comm_bytes(self, ids_per_sample: float, num_features: int, dim: float) -> float:
        """Bytes a table's GPU exchanges per batch in table-wise sharding: the batch's ids come in
        and its pooled outputs go out, all but a G-th of them over the links."""
        moved = self.batch_size * (
            ids_per_sample * self.index_bytes + num_features * dim * self.output_bytes_per_element
        )
        return moved * (self.num_gpus - 1) / self.num_gpus

    @property
    def usable_hbm_bytes(self) -> int:
        return int(self.hbm_bytes_per_gpu * (1.0 - self.hbm_reserved_fraction))

    def row_bytes(self, dim: int) -> float:
        """One row's bytes: its weights and its optimizer state (in the same tier)."""
        return dim * self.bytes_per_element + optimizer_state_bytes(self.optimizer, dim)

    def trainer_bytes(self, ids_per_sample: float, num_features: int, dim: int) -> int:
        """HBM a table's GPU needs beside the table's rows when TorchRec/FBGEMM trains it table-wise
        at this batch size: the whole batch's ids for the table (with one length per sample and
        feature), and one pooled output ``[batch, dim]`` per feature for each part of RecShard's
        static split (HBM part and UVM part). Reserved for every table, split or not: the MILP
        then stays linear, at the price of one output tensor for a table left whole."""
        parts = 2
        ids = self.batch_size * (ids_per_sample + parts * num_features) * self.index_bytes
        outputs = parts * self.batch_size * num_features * dim * self.output_bytes_per_element
        return math.ceil(ids + outputs)

    def to_dict(self) -> dict:
        # without a calibration or a link bandwidth, as before they existed: a v1 config keeps its digest
        out = dataclasses.asdict(self)
        if self.cost_model is None:
            del out["cost_model"]
        if not self.comm_bandwidth:
            del out["comm_bandwidth"]
        return out

    def digest(self) -> str:
        return digest_of(self.to_dict())


def digest_of(obj: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last would win silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | pathlib.Path) -> dict:
    path = pathlib.Path(path)
    if not path.is_file():
        raise RecShardError(Reason.CONFIG_INVALID, f"config file {path} does not exist")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.load(text, Loader=_UniqueKeyLoader)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise RecShardError(Reason.CONFIG_INVALID, f"{path} is not valid YAML/TOML: {exc}") from None
    if not isinstance(data, dict):
        raise RecShardError(Reason.CONFIG_INVALID, f"{path}: top level must be a mapping")
    return data


# one rule for table and feature names: they name files (a table's remap), TorchRec modules (no
# dots) and input columns; the split layout's part suffixes are reserved
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
RESERVED_SUFFIXES = ("__hbm", "__uvm")


def check_name(where: str, kind: str, name: object) -> str:
    """A table or feature name: 1-128 letters, digits, '_' or '-', not starting with '-', not
    ending in a reserved suffix."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name.endswith(RESERVED_SUFFIXES):
        raise _fail(
            where,
            f"{kind} name {name!r} is not allowed",
            "names are 1-128 letters, digits, '_' or '-' (not first), without the suffixes "
            f"{' or '.join(RESERVED_SUFFIXES)}: they name files and TorchRec modules",
        )
    return name


def _fail(where: str, message: str, *fixes: str) -> RecShardError:
    return RecShardError(Reason.CONFIG_INVALID, f"{where}: {message}", fixes=fixes)


def _check_keys(where: str, entry: dict, allowed: tuple[str, ...]) -> None:
    """An unknown key is an error naming it and the closest valid one (a typo must not fall back
    to a default silently)."""
    for key in entry:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            raise _fail(
                where,
                f"unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                f"valid keys: {', '.join(allowed)}",
            )


def _positive_int(where: str, entry: dict, key: str, maximum: int | None = None) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(where, f"{key} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise _fail(where, f"{key} {value} is above the largest supported, {maximum} (2^63 - 1)")
    return value


def _non_negative_int(where: str, entry: dict, key: str, default: int) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(where, f"{key} must be a non-negative integer, got {value!r}")
    return value


def _positive_number(where: str, entry: dict, key: str, default: float | None = None) -> float:
    value = entry.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _fail(where, f"{key} must be a positive finite number, got {value!r}")
    return float(value)


def parse_model_config(data: dict, source: str = "model config") -> ModelConfig:
    _check_keys(source, data, MODEL_KEYS)
    if not isinstance(data.get("input") or {}, dict):
        raise _fail(source, "'input' must be a mapping such as {format: criteo_tsv}")
    _check_keys(f"{source}: input", data.get("input") or {}, INPUT_KEYS)
    fmt = (data.get("input") or {}).get("format", "parquet")
    if fmt not in INPUT_FORMATS:
        raise _fail(source, f"input.format {fmt!r} is not supported", f"use one of {INPUT_FORMATS}")
    csv = _csv_options(source, data.get("input") or {}) if fmt == "csv" else None
    misplaced = sorted(set(data.get("input") or {}) & set(CSV_DEFAULTS)) if fmt != "csv" else []
    if misplaced:
        raise _fail(f"{source}: input", f"{misplaced} apply to format csv only, the format is {fmt}")
    raw_features = data.get("features")
    if not isinstance(raw_features, list) or not raw_features:
        raise _fail(source, "'features' must be a non-empty list of {name, type}")
    features = []
    for i, entry in enumerate(raw_features):
        where = f"{source}: features[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise _fail(where, "each feature needs a string 'name'")
        check_name(where, "feature", entry["name"])
        _check_keys(f"{source}: feature {entry['name']!r}", entry, FEATURE_KEYS)
        if entry.get("type") not in FEATURE_TYPES:
            raise _fail(
                where,
                f"feature {entry['name']!r} has type {entry.get('type')!r}",
                f"use one of {FEATURE_TYPES}",
            )
        features.append(FeatureConfig(entry["name"], entry["type"]))
    names = [f.name for f in features]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _fail(source, f"features listed twice: {dupes}")
    if fmt == "criteo_tsv":
        not_criteo = [f.name for f in features if f.name not in CRITEO_SPARSE]
        if not_criteo:
            raise _fail(source, f"criteo_tsv input has sparse columns C1..C26 only, not {not_criteo}")

    raw_tables = data.get("tables")
    if not isinstance(raw_tables, list) or not raw_tables:
        raise _fail(source, "'tables' must be a non-empty list")
    tables: list[TableConfig] = []
    owner: dict[str, str] = {}
    ftype = {f.name: f.type for f in features}
    for i, entry in enumerate(raw_tables):
        where = f"{source}: tables[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _fail(where, "each table needs a string 'name'")
        check_name(where, "table", entry["name"])
        where = f"{source}: table {entry['name']!r}"
        _check_keys(where, entry, TABLE_KEYS)
        feats = entry.get("features", entry.get("feature"))
        feats = [feats] if isinstance(feats, str) else feats
        if not isinstance(feats, list) or not feats:
            raise _fail(where, "needs 'features' (a feature name or a list of them)")
        for feat in feats:
            if feat not in ftype:
                raise _fail(
                    where, f"unknown feature {feat!r}", f"declare it under 'features' ({names[:5]}...)"
                )
            if feat in owner:
                raise _fail(where, f"feature {feat!r} already feeds table {owner[feat]!r}")
            owner[feat] = entry["name"]
        hash_fn = entry.get("hash", "mod")
        if hash_fn not in HASH_FUNCTIONS:
            raise _fail(where, f"hash {hash_fn!r} is not supported", f"use one of {HASH_FUNCTIONS}")
        strings = [f for f in feats if ftype[f] in STRING_TYPES]
        if strings and hash_fn != "xxhash64":
            raise _fail(where, f"string features {strings} need hash: xxhash64")
        tables.append(
            TableConfig(
                entry["name"],
                tuple(feats),
                _positive_int(where, entry, "hash_size", MAX_HASH_SIZE),
                _positive_int(where, entry, "dim"),
                hash_fn,
            )
        )
    tnames = [t.name for t in tables]
    if len(set(tnames)) != len(tnames):
        raise _fail(
            source, f"table names must be unique: {sorted({n for n in tnames if tnames.count(n) > 1})}"
        )
    orphans = [n for n in names if n not in owner]
    if orphans:
        raise _fail(source, f"features {orphans} feed no table", "add them to a table or remove them")
    return ModelConfig(str(data.get("name", "model")), fmt, tuple(features), tuple(tables), csv)


def _csv_options(source: str, entry: dict) -> CsvOptions:
    values = {key: entry.get(key, default) for key, default in CSV_DEFAULTS.items()}
    for key, value in values.items():
        quoting = key in ("quote", "escape")
        if (
            not isinstance(value, str)
            or len(value) != 1
            or value in "\r\n"
            or (not quoting and value == values["quote"])
        ):
            raise _fail(
                f"{source}: input",
                f"{key} must be one character (not the quote or a line end), got {value!r}",
            )
    multiline = entry.get("multiline", True)
    if not isinstance(multiline, bool):
        raise _fail(f"{source}: input", f"multiline must be true or false, got {multiline!r}")
    encoding = entry.get("encoding", CsvOptions.encoding)
    try:
        codecs.lookup(encoding)
    except (LookupError, TypeError):
        raise _fail(
            f"{source}: input",
            f"encoding {encoding!r} is not a known text encoding",
            "e.g. UTF-8, ISO-8859-1",
        ) from None
    if values["separator"] == values["list_separator"]:
        raise _fail(
            f"{source}: input",
            f"separator and list_separator are both {values['separator']!r}",
            "the ids of a multi-hot field need their own separator, e.g. list_separator: '|'",
        )
    return CsvOptions(**values, multiline=multiline, encoding=encoding)


def load_model_config(path: str | pathlib.Path) -> ModelConfig:
    return parse_model_config(read_config_file(path), source=str(path))


# bytes_per_element -> the weights' data type (TorchRec's DataType names): what the trainer's
# TorchRec tables are built as
WEIGHT_DATA_TYPES = {4: "fp32", 2: "fp16"}
# the trainer's embedding optimizers (FBGEMM's fused ones) -> fp32 values of state per row of dim d
# (FBGEMM keeps them in fp32 whatever the weights' type)
OPTIMIZERS = {"sgd": (0, 0), "rowwise_adagrad": (0, 1), "adagrad": (1, 0), "adam": (2, 0)}
STATE_BYTES = 4


def optimizer_state_bytes(optimizer: str, dim: int) -> int:
    """Bytes of optimizer state one row of width ``dim`` carries: per element and per row."""
    per_element, per_row = OPTIMIZERS[optimizer]
    return STATE_BYTES * (per_element * dim + per_row)


def _optimizer(source: str, data: dict) -> str:
    """``optimizer`` (default sgd); the older ``optimizer_state_multiplier`` only as 1.0 (no state)."""
    names = ", ".join(OPTIMIZERS)
    optimizer = data.get("optimizer", "sgd")
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise _fail(
            source, f"optimizer {optimizer!r}: one of {names}", "name the trainer's embedding optimizer"
        )
    if "optimizer_state_multiplier" in data:
        multiplier = _positive_number(source, data, "optimizer_state_multiplier")
        if multiplier != 1.0 or optimizer != "sgd":
            raise _fail(
                source,
                f"optimizer_state_multiplier {multiplier} (with optimizer {optimizer}): the state's size now "
                f"follows from the optimizer ({names})",
                "drop optimizer_state_multiplier and set optimizer",
            )
    return optimizer


def parse_hardware_config(data: dict, source: str = "hardware config") -> HardwareConfig:
    """Sizes in GiB (``*_gib``) or bytes; bandwidths in GB/s (``*_gbps``, 1e9 bytes/s)."""
    _check_keys(source, data, HARDWARE_KEYS)

    def size(key: str) -> int:
        if f"{key}_gib" in data:
            return int(_positive_number(source, data, f"{key}_gib") * GIB)
        return _positive_int(source, data, f"{key}_bytes")

    hbm = size("hbm_per_gpu")
    if "hbm_reserved_gib" in data or "hbm_reserved_bytes" in data:
        # an absolute reserve (TorchRec's style) becomes the same fraction of HBM
        reserved_bytes = size("hbm_reserved")
        if reserved_bytes >= hbm:
            raise _fail(
                source,
                f"HBM per GPU ({hbm / GIB:g} GiB) is not larger than the reserve kept for "
                f"activations ({reserved_bytes / GIB:g} GiB), which leaves no HBM for embeddings",
                "raise hbm_per_gpu_gib",
                "lower hbm_reserved_gib",
            )
        reserved = reserved_bytes / hbm
    else:
        reserved = data.get("hbm_reserved_fraction", 0.1)
    if isinstance(reserved, bool) or not isinstance(reserved, (int, float)) or not 0 <= reserved < 1:
        raise _fail(
            source,
            f"hbm_reserved_fraction must be in [0, 1), got {reserved!r}",
            "the reserve is the share of HBM kept for activations; HBM must be larger than it",
        )
    hbm_bw = _positive_number(source, data, "hbm_bandwidth_gbps", 897.0) * 1e9
    uvm_bw = _positive_number(source, data, "uvm_bandwidth_gbps", 32.0) * 1e9
    if uvm_bw >= hbm_bw:
        raise _fail(
            source,
            f"uvm_bandwidth_gbps ({uvm_bw / 1e9:g}) must be below hbm_bandwidth_gbps ({hbm_bw / 1e9:g})",
        )
    cost_model = None
    if "calibration" in data:
        where = data["calibration"]
        if not isinstance(where, str) or not where:
            raise _fail(
                source, f"calibration must be the path of a file `recshard calibrate` wrote, got {where!r}"
            )
        path = pathlib.Path(where)
        if not path.is_absolute() and pathlib.Path(source).parent.joinpath(path).is_file():
            path = pathlib.Path(source).parent / path  # relative to the hardware config
        try:
            cost_model = calibration_from_file(read_config_file(path), str(path))
        except ValueError as exc:
            raise _fail(source, f"calibration {where!r}: {exc}", "run `recshard calibrate` again") from None
    comm_bw = (
        _positive_number(source, data, "comm_bandwidth_gbps") * 1e9 if "comm_bandwidth_gbps" in data else 0.0
    )
    element = _positive_int(
        source, {"bytes_per_element": data.get("bytes_per_element", 4)}, "bytes_per_element"
    )
    if element not in WEIGHT_DATA_TYPES:
        raise _fail(
            source,
            f"bytes_per_element {element}: the weights are fp32 (4) or fp16 (2), as the trainer's TorchRec "
            "tables are built",
            "set bytes_per_element to 4 or 2",
        )
    return HardwareConfig(
        cost_model=cost_model,
        comm_bandwidth=comm_bw,
        num_gpus=_positive_int(source, data, "num_gpus"),
        hbm_bytes_per_gpu=hbm,
        hbm_reserved_fraction=float(reserved),
        host_bytes=size("host"),
        hbm_bandwidth=hbm_bw,
        uvm_bandwidth=uvm_bw,
        batch_size=_positive_int(source, {"batch_size": data.get("batch_size", 65536)}, "batch_size"),
        bytes_per_element=element,
        optimizer=_optimizer(source, data),
        index_bytes=_non_negative_int(source, data, "index_bytes", HardwareConfig.index_bytes),
        output_bytes_per_element=_non_negative_int(
            source, data, "output_bytes_per_element", HardwareConfig.output_bytes_per_element
        ),
    )


def load_hardware_config(path: str | pathlib.Path) -> HardwareConfig:
    return parse_hardware_config(read_config_file(path), source=str(path))
