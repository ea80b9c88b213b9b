import pathlib
from typing import Any

import pyarrow.parquet as pq
import yaml

from recshard_stats.cli import build_parser
from recshard_stats.hashing import keys_of
from recshard_stats.options import ProfileOptions, from_args

SPEC: dict[str, Any] = {
    "name": "small",
    "input": {"format": "parquet"},
    "features": [
        {"name": "user", "type": "int64", "synthetic": {"coverage": 1.0, "cardinality": 5000, "zipf": 1.1}},
        {"name": "query", "type": "string", "synthetic": {"coverage": 0.6, "cardinality": 800, "zipf": 0.9}},
        {"name": "rare", "type": "int64", "synthetic": {"coverage": 0.004, "cardinality": 50, "zipf": 1.0}},
        {
            "name": "hist",
            "type": "array<int64>",
            "synthetic": {"coverage": 0.7, "pf_mean": 8, "pf_max": 60, "cardinality": 3000, "zipf": 1.2},
        },
        {
            "name": "clicks",
            "type": "array<int64>",
            "synthetic": {"coverage": 0.2, "pf_mean": 30, "pf_max": 200, "cardinality": 3000, "zipf": 1.0},
        },
        {
            "name": "views",
            "type": "array<int64>",
            "synthetic": {"coverage": 0.5, "pf_mean": 3, "pf_max": 20, "cardinality": 3000, "zipf": 1.0},
        },
        {
            "name": "tags",
            "type": "array<string>",
            "synthetic": {"coverage": 0.5, "pf_mean": 3, "pf_max": 12, "cardinality": 400, "zipf": 1.0},
        },
    ],
    "tables": [
        {"name": "t_user", "features": ["user"], "hash_size": 1000, "dim": 32},  # collisions
        {"name": "t_query", "features": ["query"], "hash_size": 100000, "dim": 16, "hash": "xxhash64"},
        {"name": "t_rare", "features": ["rare"], "hash_size": 1, "dim": 8},  # single row
        {"name": "t_hist", "features": ["hist"], "hash_size": 2048, "dim": 64, "hash": "xxhash64"},
        {"name": "t_items", "features": ["clicks", "views"], "hash_size": 700, "dim": 64},  # shared
        {
            "name": "t_tags",
            "features": ["tags"],
            "hash_size": 256,
            "dim": 16,
            "hash": "xxhash64",
        },  # multi-hot strings
    ],
}


def write_yaml(path: pathlib.Path, data: dict) -> pathlib.Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_profile(
    model: str | pathlib.Path, inputs, out: pathlib.Path, ds: str = "2026-12-01", *extra: str
) -> pathlib.Path:
    """The profile as ``recshard profile`` runs it, in this process's Spark session."""
    inputs = [str(p) for p in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs

    args = build_parser().parse_args(
        ["profile", "--model", str(model), "--input", *inputs, "--out", str(out), "--ds", ds, *extra]
    )
    return pathlib.Path(profile_logs(spark_session("recshard-tests"), from_args(ProfileOptions, args)))


def remap(manifest) -> pathlib.Path:
    from recshard_stats.options import RemapOptions
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import remap_manifest

    return remap_manifest(spark_session("recshard-tests"), RemapOptions(manifest=str(manifest)))


def replay(manifest, logs) -> pathlib.Path:
    from recshard_stats.options import ReplayOptions
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import replay_logs

    return replay_logs(
        spark_session("recshard-tests"), ReplayOptions(manifest=str(manifest), logs=(str(logs),))
    )


def parquet_keys(path, model) -> dict[str, list[list[int]]]:
    """Per feature, per sample: the keys, computed with pyarrow + the numpy hashing twin."""
    table = pq.read_table(path)
    out = {}
    for feature in model.features:
        table_conf = model.table_of(feature.name)
        values = table[feature.name].to_pylist()
        per_sample = []
        for v in values:
            if v is None or v == "":  # an empty string is absent, like a null
                ids = []
            elif isinstance(v, list):
                ids = [x for x in v if x is not None and x != ""]
            else:
                ids = [v]
            per_sample.append(keys_of(ids, feature.type, table_conf.hash).tolist() if ids else [])
        out[feature.name] = per_sample
    return out


def assert_one_line_error(rc: int, stderr: str, expected: str) -> None:
    assert rc == 2, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert expected in errors[0], errors[0]
