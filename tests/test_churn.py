"""Churn against the previous plan: the manifest's diff checked against plain numpy over both
manifests and remaps, the cap on moves, and a trained model carried to the new plan."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from recshard_stats.generate import generate
from recshard_stats.manifest_loader import load_manifest
from recshard_stats.options import SolveOptions, SyntheticDrift
from recshard_stats.solver.manifest_builder import solve_to_manifest
from tests.helpers import SPEC, remap, run_profile, write_yaml
from tests.test_pipeline import HARDWARE

OPTIONS = SolveOptions(time_limit_s=5, local_search_s=1, torchrec_baselines=False)


@pytest.fixture(scope="module")
def two_plans(spark, tmp_path_factory):
    """Day A planned and remapped, in service with its GPUs swapped; day B (hot ids rotated far,
    new ids) planned against it."""
    root = tmp_path_factory.mktemp("churn")
    spec = write_yaml(root / "spec.yaml", SPEC)
    hw = write_yaml(root / "hw.yaml", HARDWARE)
    days = {
        "2026-12-01": SyntheticDrift(),
        "2026-12-02": SyntheticDrift(day=3, hot_rotation=0.1, new_ids=0.2, coverage_trend=-0.05),
    }
    stats = {
        ds: run_profile(
            spec,
            generate(spec, root / "logs" / ds, 4000, seed=i, chunk_rows=4000, processes=1, drift=drift),
            root / "stats",
            ds,
            "--row-counts",
        )
        for i, (ds, drift) in enumerate(days.items())
    }
    planned = solve_to_manifest(stats["2026-12-01"], spec, hw, root / "manifests", options=OPTIONS).parent
    remap(planned)
    first = _mirrored(planned, root / "published" / "ds=2026-12-01")
    second = solve_to_manifest(
        stats["2026-12-02"], spec, hw, root / "manifests", options=OPTIONS, previous=first
    ).parent
    remap(second)
    return spec, hw, stats, first, second, root


def _mirrored(directory, target):
    """The plan with its two GPUs swapped (as good a plan on symmetric GPUs): the plan in service,
    so that day B's plan, which keeps day A's labels, moves its tables."""
    import dataclasses
    import shutil

    from recshard_stats.manifest_publisher import write_manifest

    manifest = load_manifest(directory).manifest
    last = manifest.num_gpus - 1
    tables = tuple(
        dataclasses.replace(
            t,
            gpu=last - t.gpu,
            column_shards=tuple(dataclasses.replace(c, gpu=last - c.gpu) for c in t.column_shards),
        )
        for t in manifest.tables
    )
    gpus = tuple(dataclasses.replace(manifest.gpus[last - r], rank=r) for r in range(manifest.num_gpus))
    shutil.copytree(directory, target)
    write_manifest(target / "manifest.json", dataclasses.replace(manifest, tables=tables, gpus=gpus))
    return target


def _hbm_rows(directory, t) -> set[int]:
    """A table's rows in HBM, from its remap file and the manifest's numbers (plain numpy)."""
    remap_table = pq.read_table(directory / t["remap"]["path"]).to_pandas()
    seen = set(remap_table.row.tolist())
    rows = set(remap_table.row[remap_table["index"] < t["rows_hbm"]].tolist())
    return rows | {r for r in range(t["unseen_hbm_below_row"]) if r not in seen}


def test_the_diff_matches_both_plans(two_plans):
    _, _, _, first, second, _ = two_plans
    old = {t["name"]: t for t in json.loads((first / "manifest.json").read_text())["tables"]}
    new = json.loads((second / "manifest.json").read_text())
    diff = new["diff"]
    assert diff["previous"] == str(first / "manifest.json") and diff["previous_ds"] == "2026-12-01"
    changes = {c["name"]: c for c in diff["tables"]}
    expected_moved = 0
    for t in new["tables"]:
        before = old[t["name"]]
        ranks = [s["gpu"] for s in t["column_shards"]] or [t["gpu"]]
        then = [s["gpu"] for s in before["column_shards"]] or [before["gpu"]]
        # column c of a table cut in k lies on ranks[c * k // dim]
        columns = [
            (ranks[c * len(ranks) // t["dim"]], then[c * len(then) // t["dim"]]) for c in range(t["dim"])
        ]
        moved = round(t["hash_size"] * t["row_bytes"] * sum(a != b for a, b in columns) / t["dim"])
        expected_moved += moved
        now_rows, old_rows = _hbm_rows(second, t), _hbm_rows(first, before)
        changed = moved or ranks != then or t["rows_hbm"] != before["rows_hbm"] or now_rows != old_rows
        assert (t["name"] in changes) == bool(changed), t["name"]
        if t["name"] in changes:
            c = changes[t["name"]]
            assert (c["ranks"], c["previous_ranks"], c["moved_bytes"]) == (ranks, then, moved)
            assert (c["rows_hbm"], c["previous_rows_hbm"]) == (t["rows_hbm"], before["rows_hbm"])
            assert (c["rows_entering_hbm"], c["rows_leaving_hbm"]) == (
                len(now_rows - old_rows),
                len(old_rows - now_rows),
            )
    assert diff["moved_bytes"] == expected_moved > 0  # the drift moved tables
    assert any(c["rows_entering_hbm"] for c in diff["tables"])


def test_the_cap_keeps_moves_within_it(two_plans):
    spec, hw, stats, first, second, root = two_plans
    unrestrained = load_manifest(second).manifest
    for cap_gib in (0.0, unrestrained.diff.moved_bytes / 2**30 / 2):
        capped = load_manifest(
            solve_to_manifest(
                stats["2026-12-02"],
                spec,
                hw,
                root / f"capped-{cap_gib}",
                options=SolveOptions(
                    time_limit_s=5, local_search_s=1, torchrec_baselines=False, max_moved_gib=cap_gib
                ),
                previous=first,
            ),
            require_remap=False,
        ).manifest
        assert capped.diff.moved_bytes <= cap_gib * 2**30
        assert capped.plan.source == "restrained" and capped.inputs.solver_settings.max_moved_gib == cap_gib
        # the price of staying: never faster than the plan free to move
        assert capped.plan.objective_ms >= unrestrained.plan.objective_ms * (1 - 1e-9)


torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh installs it)")
torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (scripts/setup.sh installs it)")


def test_a_trained_collection_carried_to_the_new_plan_computes_what_it_did(two_plans):
    """Weights laid out for plan A, carried to plan B with reshard_state_dict: B's collection
    gives the outputs of the unsplit tables with the same weights (and A's); TorchRec's delta
    names exactly the parts that keep their shape and change ranks."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    from recshard_stats.torchrec_trainer import (
        StaticSplitEmbeddingBagCollection,
        reshard_rows,
        reshard_state_dict,
        sharding_plan_delta,
        split_parts,
        split_state_dict,
    )

    _, _, _, first, second, _ = two_plans
    old, new = load_manifest(first), load_manifest(second)
    torch.manual_seed(3)
    unsplit = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name, embedding_dim=t.dim, num_embeddings=t.hash_size, feature_names=list(t.features)
            )
            for t in old.manifest.tables
        ]
    )
    weights = {t.name: unsplit.embedding_bags[t.name].weight.detach() for t in old.manifest.tables}
    before = StaticSplitEmbeddingBagCollection(old)
    before.collection.load_state_dict(split_state_dict(old, weights))
    after = StaticSplitEmbeddingBagCollection(new)
    after.collection.load_state_dict(reshard_state_dict(old, new, before.collection.state_dict()))
    rng = np.random.default_rng(4)
    keys, values, lengths = [], [], []
    for t in new.manifest.tables:
        for f in t.features:
            n = rng.integers(0, 5, 32)
            keys.append(f)
            lengths.append(torch.as_tensor(n))
            values.append(torch.as_tensor(rng.integers(0, t.hash_size, int(n.sum()))))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))
    expected = unsplit(kjt).values()
    torch.testing.assert_close(before(kjt).values(), expected)
    torch.testing.assert_close(after(kjt).values(), expected)
    # a row-wise optimizer state (one value per row) moves with its row
    split = next(t for t in new.manifest.tables if 0 < t.rows_hbm < t.hash_size)
    state = torch.arange(split.hash_size, dtype=torch.float32)  # state of hashed row r: r
    old_t = old.table(split.name)
    if 0 < old_t.rows_hbm < old_t.hash_size:
        index = torch.as_tensor(old.new_index(split.name, np.arange(split.hash_size)))
        ordered = torch.empty_like(state)
        ordered[index] = state
        parts = {
            f"{split.name}__hbm": ordered[: old_t.rows_hbm],
            f"{split.name}__uvm": ordered[old_t.rows_hbm :],
        }
    else:
        parts = {split.name: state}
    moved = reshard_rows(old, new, split.name, parts)
    hbm_rows = np.flatnonzero(new.new_index(split.name, np.arange(split.hash_size)) < split.rows_hbm)
    assert sorted(moved[f"{split.name}__hbm"].long().tolist()) == sorted(hbm_rows.tolist())
    # TorchRec's delta: the parts of equal shape whose ranks changed
    volume, delta, rebuilt = sharding_plan_delta(old.manifest, new.manifest, device_type="cpu")
    then = {p.name: p for p in split_parts(old.manifest)}
    now = {p.name: p for p in split_parts(new.manifest)}
    same = [n for n in now if n in then and then[n].rows == now[n].rows]
    assert sorted(delta) == sorted(n for n in same if then[n].ranks != now[n].ranks)
    assert sorted(rebuilt) == sorted(n for n in now if n not in same)
    assert all(delta[n].ranks == list(now[n].ranks) for n in delta)
    # its data volume: the moved parts' rows x columns, as float32, in MB (TorchRec's own unit)
    moved_elements = sum(now[n].rows * new.table(now[n].table).dim for n in delta)
    assert volume == pytest.approx(moved_elements * 4 / 2**20) and (volume > 0) == bool(delta)


def test_a_root_with_nothing_published_gives_no_diff(two_plans):
    """The daily DAG's first day: --previous names the manifests root before anything is
    published there (or before it exists)."""
    spec, hw, stats, _, _, root = two_plans
    for previous in (root / "never-made", root / "stats"):
        solved = solve_to_manifest(
            stats["2026-12-02"], spec, hw, root / "first-day", options=OPTIONS, previous=previous
        )
        assert load_manifest(solved, require_remap=False).manifest.diff is None
