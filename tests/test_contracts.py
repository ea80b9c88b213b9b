"""The typed contracts: the manifest's dataclasses against its JSON Schema (field by field), a
manifest written before the dataclasses existed, remap completion, and the latest pointer.
No Spark: a manifest that an earlier version wrote (tests/data) is the input."""

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import types

import jsonschema
import pytest

from recshard_stats.config import HardwareConfig
from recshard_stats.costmodel import CostModel, PassTerms, TierTerms
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    BaselinePlan,
    GpuPlacement,
    Manifest,
    ManifestInputs,
    MilpStatus,
    PlanSource,
    PlanSummary,
    RemapFile,
    SolverSettings,
    TablePlacement,
    TorchRecPlan,
    TorchRecShard,
    complete_with_remaps,
)
from recshard_stats.manifest_loader import load_manifest
from recshard_stats.options import SolveOptions
from recshard_stats.solver.manifest_builder import solver_settings
from recshard_stats.typed_json import required_fields

OLD = pathlib.Path(__file__).parent / "data" / "manifest_v1_2b2c487.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())


def _node(path: str) -> dict:
    node = SCHEMA
    for part in path.split("/"):
        if not part:
            continue
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


# (schema location, dataclass it must describe exactly)
LOCATIONS = [
    ("", Manifest),
    ("inputs", ManifestInputs),
    ("inputs/solver_settings", SolverSettings),
    ("hardware", HardwareConfig),
    ("plan", PlanSummary),
    ("plan/baselines/[]", BaselinePlan),
    ("gpus/[]", GpuPlacement),
    ("tables/[]", TablePlacement),
    ("plan/torchrec/[]", TorchRecPlan),
    ("plan/torchrec/[]/shards/[]", TorchRecShard),
]


@pytest.mark.parametrize("where, cls", LOCATIONS, ids=[c.__name__ for _, c in LOCATIONS])
def test_json_schema_describes_each_dataclass_field_by_field(where, cls):
    node = _node(where)
    fields = [f.name for f in dataclasses.fields(cls)]
    assert set(node["properties"]) == set(fields)
    assert node["additionalProperties"] is False
    # a document must give what has no default; the manifest's own kind and version are always
    # written and always required
    always = {"schema_version", "kind"} if cls is Manifest else set()
    assert set(node["required"]) == set(required_fields(cls)) | always


@pytest.mark.parametrize(
    "name, cls", [("tier_terms", TierTerms), ("pass_terms", PassTerms), ("cost_model", CostModel)]
)
def test_json_schema_describes_the_cost_model_field_by_field(name, cls):
    node = SCHEMA["$defs"][name]
    assert set(node["properties"]) == {f.name for f in dataclasses.fields(cls)}
    assert node["additionalProperties"] is False


def test_a_manifest_with_a_calibrated_cost_model_matches_the_schema_and_round_trips():
    from recshard_stats.config import load_hardware_config

    hardware = load_hardware_config(pathlib.Path(__file__).parents[1] / "conf" / "hardware_h200.yaml")
    manifest = dataclasses.replace(Manifest.from_json(OLD.read_text()), hardware=hardware)
    document = json.loads(manifest.to_json())
    jsonschema.validate(document, SCHEMA)
    assert Manifest.from_json(manifest.to_json()).hardware == hardware
    assert document["hardware"]["cost_model"]["forward"]["host"]["chain_s"] > 0


def test_remap_entry_schema_matches_remap_file():
    remap = _node("tables/[]")["properties"]["remap"]["oneOf"][1]
    assert (
        set(remap["properties"]) == set(remap["required"]) == {f.name for f in dataclasses.fields(RemapFile)}
    )


def test_a_manifest_written_before_the_dataclasses_loads_and_round_trips():
    """A version-1 manifest (from before the dataclasses) reads as version 6: the same document
    but for the fields added since, at their defaults, version 2's renames, version 3's
    optimizer, version 4's in-sample predictions (its own) and version 5's absent diff."""
    text = OLD.read_text()
    manifest = Manifest.from_json(text)
    expected = json.loads(text)
    expected["schema_version"] = "6"
    expected["diff"] = None
    expected["inputs"]["solver_settings"] = expected["inputs"].pop("solver_options")
    expected["hardware"].update(index_bytes=8, output_bytes_per_element=4, optimizer="sgd")
    del expected["hardware"]["optimizer_state_multiplier"]
    expected["plan"].update(
        torchrec=[],
        torchrec_rating_ms=None,
        in_sample_objective_ms=expected["plan"]["objective_ms"],
        in_sample_uvm_access_fraction=expected["plan"]["uvm_access_fraction"],
    )
    for baseline in expected["plan"]["baselines"]:
        baseline["torchrec_rating_ms"] = None
    expected["inputs"]["solver_settings"].update(
        local_search_s=20.0,
        torchrec_baselines=True,
        torchrec_timeout_s=120,
        max_column_shards=8,
        hit_estimate="in_sample",
        max_moved_gib=None,
    )
    for entry in expected["gpus"] + expected["tables"]:
        entry["trainer_buffer_bytes"] = 0
    for entry in expected["tables"]:
        entry["in_sample_hbm_access_fraction"] = entry["predicted_hbm_access_fraction"]
        entry["column_shards"] = []
        entry["longest_bag"] = 0.0
    for entry in expected["gpus"]:
        entry["kernel_groups_ms"] = 0.0
    assert json.loads(manifest.to_json()) == expected
    jsonschema.validate(json.loads(manifest.to_json()), SCHEMA)
    assert manifest.ds == "2026-12-01" and manifest.num_gpus == 4 and len(manifest.tables) == 25
    assert manifest.inputs.solver_settings == solver_settings(
        SolveOptions(time_limit_s=20.0, hit_estimate="in_sample")
    )
    t = manifest.table("t_f00")
    assert t.remap is not None
    assert (t.gpu, t.rows_hbm, t.rows_uvm, t.remap.rows, t.unseen_hbm_below_row) == (2, 14, 2, 10, 8)
    assert manifest.plan.baselines[0].name == "greedy_size"


def test_errors_name_the_field(tmp_path):
    data = json.loads(OLD.read_text())
    cases = [
        (("tables", 3, "gpu"), "2", "tables[3].gpu: must be an integer, got '2'"),
        (("tables", 3, "gpu"), 9, "table 't_f03' is on GPU 9, the plan has 4"),
        (("plan", "objective_ms"), None, "plan.objective_ms: must be a number, got None"),
        (("tables", 0, "rows_hbm"), 15, "rows_hbm 15 + rows_uvm 2 != hash_size 16"),
        (("tables", 0, "hash_fn"), "xxhash64", "tables[0]: unknown field(s) ['hash_fn']"),
        (("inputs", "solver_options", "mip_gap"), 1.5, "solver settings out of range"),
        (("plan", "status"), "done", "plan.status: 'done' is not one of ['optimal', 'time_limit'"),
    ]
    for path, value, message in cases:
        bad = json.loads(json.dumps(data))
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        (tmp_path / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(RecShardError, match=re.escape(message)) as err:
            load_manifest(tmp_path, verify_checksums=False)
        assert err.value.reason in (Reason.MANIFEST_INVALID, Reason.CONFIG_INVALID), message
        assert str(tmp_path / "manifest.json") in str(err.value)
    del data["tables"][0]["coverage"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(RecShardError, match=r"tables\[0\]: lacks \['coverage'\]"):
        load_manifest(tmp_path, verify_checksums=False)


def test_remap_completion_returns_a_new_manifest():
    manifest = Manifest.from_json(OLD.read_text())
    bare = dataclasses.replace(
        manifest,
        tables=tuple(dataclasses.replace(t, remap=None, unseen_hbm_below_row=0) for t in manifest.tables),
    )
    remaps = {
        t.name: (RemapFile(f"remap/{t.name}.parquet", "sha256:" + "0" * 64, t.unique_rows), 7)
        for t in bare.tables
    }
    done = complete_with_remaps(bare, remaps)
    assert all(t.remap is None for t in bare.tables)  # the input is untouched
    assert [t.remap for t in done.tables] == [remaps[t.name][0] for t in bare.tables]
    assert {t.unseen_hbm_below_row for t in done.tables} == {7}
    assert dataclasses.replace(done, tables=bare.tables) == bare
    with pytest.raises(RecShardError, match="no remap given for tables"):
        complete_with_remaps(bare, dict(list(remaps.items())[:3]))


def _manifest_dir(tmp_path) -> pathlib.Path:
    target = tmp_path / "manifests" / "ds=2026-12-01"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(OLD.read_text())
    return target


def test_loader_refuses_rows_outside_the_table(tmp_path):
    loaded = load_manifest(_manifest_dir(tmp_path), verify_checksums=False)
    for bad in (16, -1):  # t_f00 has 16 rows
        with pytest.raises(
            RecShardError, match=f"row {bad} is outside table 't_f00' \\(hash_size 16\\)"
        ) as err:
            loaded.remap("t_f00", [0, 3, bad])
        assert err.value.reason is Reason.MANIFEST_MISMATCH


def test_loader_refuses_a_remap_reached_through_a_link_that_leaves_the_directory(tmp_path):
    target = _manifest_dir(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (target / "remap").symlink_to(outside, target_is_directory=True)
    with pytest.raises(
        RecShardError, match=r"remap/t_f00.parquet' leaves the manifest's directory \(through a link\)"
    ):
        load_manifest(target, verify_checksums=False)
    (target / "remap").unlink()
    (target / "remap").mkdir()  # the same path, inside: accepted (files are checked later, with checksums)
    assert load_manifest(target, verify_checksums=False).remap_path("t_f00") == (
        target / "remap" / "t_f00.parquet"
    )


# the last version-1 manifest: written by `recshard run` at commit 34e76d1, the release before version 2
LAST_V1 = pathlib.Path(__file__).parent / "data" / "manifest_v1_34e76d1.json"


def test_this_reader_reads_the_last_version_1_manifest_as_version_6():
    data = json.loads(LAST_V1.read_text())
    assert data["schema_version"] == "1" and "solver_options" in data["inputs"]
    manifest = Manifest.from_json(data)
    assert manifest.schema_version == SCHEMA_VERSION == "6"
    assert dataclasses.asdict(manifest.inputs.solver_settings) == {
        **data["inputs"]["solver_options"],
        "hit_estimate": "in_sample",
        "max_moved_gib": None,
    }
    assert manifest.plan.source is PlanSource.KERNEL_GROUPS and manifest.plan.status is MilpStatus.OPTIMAL
    assert [t.name for t in manifest.tables] == [t["name"] for t in data["tables"]]
    # version 1's "warm_start" is version 2's "start"
    data["plan"]["source"] = "warm_start"
    assert Manifest.from_json(data).plan.source is PlanSource.START
    # written again, it is a version-6 document the schema accepts
    jsonschema.validate(json.loads(manifest.to_json()), SCHEMA)
    assert json.loads(manifest.to_json())["schema_version"] == "6"


# the last version-2 manifest: written by `recshard run` at commit 9a1e6cf, the release before version 3
LAST_V2 = pathlib.Path(__file__).parent / "data" / "manifest_v2_9a1e6cf.json"


def test_this_reader_reads_the_last_version_2_manifest_as_version_6():
    """Version 3 names the trainer's optimizer: a version-2 multiplier of 1.0 (no state) reads as
    sgd, the rest of the document unchanged; any other multiplier names no optimizer and is
    refused with the fix."""
    data = json.loads(LAST_V2.read_text())
    assert data["schema_version"] == "2" and data["hardware"]["optimizer_state_multiplier"] == 1.0
    manifest = Manifest.from_json(data)
    assert manifest.schema_version == "6" and manifest.hardware.optimizer == "sgd"
    written = json.loads(manifest.to_json())
    jsonschema.validate(written, SCHEMA)
    expected = _as_version_6(_as_version_5(_as_version_4(json.loads(LAST_V2.read_text()))))
    del expected["hardware"]["optimizer_state_multiplier"]
    expected["hardware"]["optimizer"] = "sgd"
    assert written == expected
    data["hardware"]["optimizer_state_multiplier"] = 2.0
    with pytest.raises(
        RecShardError, match=r"optimizer_state_multiplier 2.0: version 3 names the optimizer"
    ) as err:
        Manifest.from_json(data)
    assert "solve again with optimizer set in the hardware config" in err.value.render()


def _as_version_6(expected: dict) -> dict:
    """Version 6 adds a plan source (``aligned_blocks``) and no field: only the version changes."""
    expected["schema_version"] = "6"
    return expected


def _as_version_5(expected: dict) -> dict:
    """What version 5 adds to a version-4 document: no diff, no cap on moves."""
    expected["schema_version"] = "5"
    expected["inputs"]["solver_settings"]["max_moved_gib"] = None
    return {"diff": None, **expected}


def _as_version_4(expected: dict) -> dict:
    """What version 4 adds to a version-3 document: its predictions again, as in-sample ones."""
    expected["schema_version"] = "4"
    expected["inputs"]["solver_settings"]["hit_estimate"] = "in_sample"
    expected["plan"]["in_sample_objective_ms"] = expected["plan"]["objective_ms"]
    expected["plan"]["in_sample_uvm_access_fraction"] = expected["plan"]["uvm_access_fraction"]
    for t in expected["tables"]:
        t["in_sample_hbm_access_fraction"] = t["predicted_hbm_access_fraction"]
    return expected


# the last version-3 manifest: written by `recshard solve` at commit 4241fa8, the release before version 4
LAST_V3 = pathlib.Path(__file__).parent / "data" / "manifest_v3_4241fa8.json"


def test_this_reader_reads_the_last_version_3_manifest_as_version_6():
    """Version 4 records predictions on new data and on the profiled data side by side; a
    version-3 plan was chosen with the profiled counts, so its predictions are its in-sample ones
    and its hit estimate in_sample; the rest of the document is unchanged."""
    data = json.loads(LAST_V3.read_text())
    assert data["schema_version"] == "3" and "hit_estimate" not in data["inputs"]["solver_settings"]
    manifest = Manifest.from_json(data)
    assert manifest.schema_version == "6" and manifest.inputs.solver_settings.hit_estimate == "in_sample"
    written = json.loads(manifest.to_json())
    jsonschema.validate(written, SCHEMA)
    assert written == _as_version_6(_as_version_5(_as_version_4(json.loads(LAST_V3.read_text()))))
    t = manifest.tables[0]
    assert t.in_sample_hbm_access_fraction == t.predicted_hbm_access_fraction
    assert manifest.plan.in_sample_objective_ms == manifest.plan.objective_ms


# the last version-4 manifest: written by `recshard run` at commit d188e0c, the release before version 5
LAST_V4 = pathlib.Path(__file__).parent / "data" / "manifest_v4_d188e0c.json"


def test_this_reader_reads_the_last_version_4_manifest_as_version_6():
    """Version 5 adds the diff against the previous plan and the cap on moves: a version-4 plan
    has neither; the rest of the document is unchanged."""
    data = json.loads(LAST_V4.read_text())
    assert data["schema_version"] == "4" and "diff" not in data
    manifest = Manifest.from_json(data)
    assert manifest.diff is None and manifest.inputs.solver_settings.max_moved_gib is None
    written = json.loads(manifest.to_json())
    jsonschema.validate(written, SCHEMA)
    assert written == _as_version_6(_as_version_5(json.loads(LAST_V4.read_text())))


# the last version-5 manifest: written by `recshard run` at commit 5a818db, the release before version 6
LAST_V5 = pathlib.Path(__file__).parent / "data" / "manifest_v5_5a818db.json"


def test_this_reader_reads_the_last_version_5_manifest_as_version_6():
    """Version 6 adds the plan source ``aligned_blocks``, which no version-5 plan has: the document
    reads as it is, at the new version."""
    data = json.loads(LAST_V5.read_text())
    assert data["schema_version"] == "5" and data["plan"]["source"] != "aligned_blocks"
    manifest = Manifest.from_json(data)
    written = json.loads(manifest.to_json())
    jsonschema.validate(written, SCHEMA)
    assert written == _as_version_6(json.loads(LAST_V5.read_text()))
    data["plan"]["source"] = "aligned_blocks"
    assert Manifest.from_json({**data, "schema_version": "6"}).plan.source is PlanSource.ALIGNED_BLOCKS


def test_the_diffs_schema_describes_its_dataclasses():
    from recshard_stats.manifest import PlanDiff, TableChange

    node = SCHEMA["properties"]["diff"]["oneOf"][1]
    for cls, where in ((PlanDiff, node), (TableChange, node["properties"]["tables"]["items"])):
        assert set(where["properties"]) == {f.name for f in dataclasses.fields(cls)}
        assert set(where["required"]) == set(required_fields(cls)) and where["additionalProperties"] is False


def test_a_newer_manifest_is_refused_by_its_version_not_by_its_fields(tmp_path):
    """What an older trainer meets when the solver was upgraded first: a manifest of a version it
    does not read, with a field it does not know. It names the versions, not the field."""
    data = json.loads(Manifest.from_json(LAST_V1.read_text()).to_json())
    data["schema_version"] = "7"
    data["plan"]["solver_seconds_by_stage"] = {"milp": 1.0}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(RecShardError) as err:
        load_manifest(tmp_path, verify_checksums=False)
    message = str(err.value)
    assert "schema_version '7': this recshard-stats reads versions 1, 2, 3, 4, 5, 6" in message
    assert "written by a newer recshard-stats" in message and "upgrade recshard-stats" in message
    assert "unknown field" not in message and "solver_seconds_by_stage" not in message
    data["schema_version"] = "draft"
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(RecShardError, match=r"schema_version 'draft'.*regenerate the manifest"):
        load_manifest(tmp_path, verify_checksums=False)


def test_the_released_version_1_reader_refuses_a_newer_manifest_by_its_version():
    """The version-1 loader as released (recshard_stats/manifest.py at commit 34e76d1, from git)
    on this release's document: it names the version and says to upgrade; it never reaches the
    fields it does not know."""
    try:
        source = subprocess.run(
            ["git", "show", "34e76d1:recshard_stats/manifest.py"],
            cwd=pathlib.Path(__file__).parents[1],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the repository's history (commit 34e76d1) is not available")
    released = types.ModuleType("recshard_stats_manifest_v1")
    released.__file__ = str(SCHEMA_PATH)  # the module finds its schema file beside it
    sys.modules[released.__name__] = released  # dataclasses resolve their module's names
    try:
        exec(compile(source, "manifest_v1.py", "exec"), released.__dict__)
        document = Manifest.from_json(LAST_V1.read_text()).to_json()
        with pytest.raises(RecShardError) as err:
            released.Manifest.from_json(document)
    finally:
        del sys.modules[released.__name__]
    assert "schema_version '6'; this loader reads '1'" in str(err.value)
    assert err.value.fixes == ("upgrade recshard-stats",)


def _crafted(edit) -> dict:
    data = json.loads(Manifest.from_json(LAST_V2.read_text()).to_json())
    edit(data)
    return data


def _set(path: tuple, value):
    def edit(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _huge_table(data):
    t = data["tables"][0]  # t_f00, wholly in UVM
    t.update(hash_size=10**30, rows_uvm=10**30, unused_rows=10**30 - t["unique_rows"])


SEMANTIC_NONSENSE = {
    "NaN cost": (_set(("tables", 0, "predicted_cost_ms"), float("nan")), "must be finite and non-negative"),
    "infinite accesses": (_set(("tables", 1, "accesses_per_batch"), float("inf")), "must be finite"),
    "hash_size beyond int64": (_huge_table, "hash_size 1000000000000000000000000000000 is beyond int64 ids"),
    "a GPU above the hardware": (
        _set(("gpus", 0, "hbm_bytes_capacity"), 10**15),
        "hbm_bytes_capacity 1000000000000000, more than the usable HBM of the manifest's hardware",
    ),
    "a row smaller than its weights": (
        _set(("tables", 0, "dim"), 2**40),
        "row_bytes 64.0 is less than its 1099511627776 weights of 4 bytes",
    ),
    "UVM beyond the host": (
        _set(("hardware", "host_bytes"), 1000),
        "the tables' UVM rows take",
    ),
}


@pytest.mark.parametrize("case", SEMANTIC_NONSENSE)
def test_semantic_nonsense_is_refused_without_any_checksum(case, tmp_path):
    """A manifest re-summed or without its sidecar is still checked for sense: every number
    finite, ids that fit int64, GPUs no larger than its own hardware, rows at least their
    weights, UVM rows within host memory."""
    edit, expected = SEMANTIC_NONSENSE[case]
    data = _crafted(edit)
    with pytest.raises(RecShardError, match=re.escape(expected)):
        Manifest.from_json(json.dumps(data))
    (tmp_path / "manifest.json").write_text(json.dumps(data))  # no manifest.json.sha256 beside it
    with pytest.raises(RecShardError, match=re.escape(expected)):
        load_manifest(tmp_path, verify_checksums=False)
