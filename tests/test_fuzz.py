"""Fuzzing the manifest loader and the config parser with hypothesis: whatever the input, the
only exception is the documented RecShardError."""

import contextlib
import json
import pathlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recshard_stats.config import parse_hardware_config, parse_model_config
from recshard_stats.errors import RecShardError
from recshard_stats.manifest_loader import load_manifest

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

# a real manifest (written by an earlier version), without its remap files
VALID = json.loads((pathlib.Path(__file__).parent / "data" / "manifest_v1_2b2c487.json").read_text())
VALID["tables"] = [{**t, "remap": None, "unseen_hbm_below_row": 0} for t in VALID["tables"]]
VALID_TABLE = VALID["tables"][0]


def _load(tmp_path, data) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data) if not isinstance(data, bytes) else data.decode("latin-1"))
    with contextlib.suppress(RecShardError):
        load_manifest(path)


def test_valid_skeleton_loads(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(VALID))
    assert load_manifest(tmp_path).table("t_f00").rows_hbm == 14


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(VALID)), value=JSON)
def test_manifest_top_level_fields(tmp_path, key, value):
    _load(tmp_path, {**VALID, key: value})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(VALID_TABLE)), value=JSON)
def test_manifest_table_fields(tmp_path, key, value):
    _load(tmp_path, {**VALID, "tables": [{**VALID_TABLE, key: value}, *VALID["tables"][1:]]})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_manifest_garbage_bytes(tmp_path, raw):
    _load(tmp_path, raw)


@settings(max_examples=300, deadline=None)
@given(data=JSON)
def test_model_and_hardware_configs(data):
    for parse in (parse_model_config, parse_hardware_config):
        with contextlib.suppress(RecShardError):
            parse(data if isinstance(data, dict) else {"features": data, "num_gpus": data})
