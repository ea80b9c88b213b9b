"""Fuzzing the manifest loader and the config parser with hypothesis: whatever the input, the
only exception is the documented RecShardError."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recshard_stats.config import parse_hardware_config, parse_model_config
from recshard_stats.errors import RecShardError
from recshard_stats.manifest import load_manifest

JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                       max_size=4), max_leaves=12)

VALID_TABLE = {"name": "t", "features": ["f"], "gpu": 0, "hash_size": 10, "dim": 4, "hash": "mod", "rows_hbm": 3,
               "rows_uvm": 7, "unique_rows": 5, "unused_rows": 5, "predicted_hbm_access_fraction": 0.5,
               "remap": None}
VALID = {"schema_version": "1", "inputs": {"digest": "sha256:0"}, "plan": {}, "gpus": [{"rank": 0}],
         "tables": [VALID_TABLE]}


def _load(tmp_path, data) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data) if not isinstance(data, bytes) else data.decode("latin-1"))
    try:
        load_manifest(path)
    except RecShardError:
        pass


def test_valid_skeleton_loads(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(VALID))
    assert load_manifest(tmp_path).table("t").rows_hbm == 3


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(VALID)), value=JSON)
def test_manifest_top_level_fields(tmp_path, key, value):
    _load(tmp_path, {**VALID, key: value})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(VALID_TABLE)), value=JSON)
def test_manifest_table_fields(tmp_path, key, value):
    _load(tmp_path, {**VALID, "tables": [{**VALID_TABLE, key: value}]})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_manifest_garbage_bytes(tmp_path, raw):
    _load(tmp_path, raw)


@settings(max_examples=300, deadline=None)
@given(data=JSON)
def test_model_and_hardware_configs(data):
    for parse in (parse_model_config, parse_hardware_config):
        try:
            parse(data if isinstance(data, dict) else {"features": data, "num_gpus": data})
        except RecShardError:
            pass
