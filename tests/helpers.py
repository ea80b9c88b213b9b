import pathlib

import pyarrow.parquet as pq
import yaml

from jobs import profile as profile_job
from recshard_stats.hashing import keys_of


def write_yaml(path: pathlib.Path, data: dict) -> pathlib.Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_profile(model: pathlib.Path, inputs, out: pathlib.Path, ds: str = "2026-12-01", *extra: str) -> pathlib.Path:
    inputs = [str(p) for p in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
    args = profile_job.build_parser().parse_args(
        ["--model", str(model), "--input", *inputs, "--out", str(out), "--ds", ds, *extra])
    return pathlib.Path(profile_job.run(args))


def parquet_keys(path, model) -> dict[str, list[list[int]]]:
    """Per feature, per sample: the keys, computed with pyarrow + the numpy hashing twin."""
    table = pq.read_table(path)
    out = {}
    for feature in model.features:
        table_conf = model.table_of(feature.name)
        values = table[feature.name].to_pylist()
        per_sample = []
        for v in values:
            if v is None:
                ids = []
            elif isinstance(v, list):
                ids = [x for x in v if x is not None]
            else:
                ids = [v]
            per_sample.append(keys_of(ids, feature.type, table_conf.hash).tolist() if ids else [])
        out[feature.name] = per_sample
    return out
