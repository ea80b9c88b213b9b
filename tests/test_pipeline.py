"""Stats -> manifest -> remap -> loader -> replay -> report, checked against pandas/numpy
computations of the same quantities from the raw logs."""

import base64
import dataclasses
import html.parser
import json
import shutil

import jsonschema
import numpy as np
import pandas as pd
import pytest

from recshard_stats.config import load_model_config
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.generate import generate
from recshard_stats.hashing import rows_of
from recshard_stats.manifest import HBM, SCHEMA_PATH, UVM
from recshard_stats.manifest_loader import load_manifest
from recshard_stats.manifest_publisher import load_latest, publish_latest
from recshard_stats.options import SolveOptions
from recshard_stats.report import FIGURES, write_report
from recshard_stats.solver.manifest_builder import solve_to_manifest
from tests.helpers import SPEC, parquet_keys, remap, replay, run_profile, write_yaml

HARDWARE = {
    "num_gpus": 2,
    "hbm_per_gpu_bytes": 600_000,
    "hbm_reserved_fraction": 0.0,
    "host_gib": 1,
    "batch_size": 64,
    "bytes_per_element": 4,
}


def independent_index(train_rows: np.ndarray, hash_size: int) -> np.ndarray:
    """New index of every row: seen rows by count desc then row asc, then unseen rows by row."""
    counts = pd.Series(train_rows).value_counts().rename_axis("row").reset_index(name="count")
    counts = counts.sort_values(["count", "row"], ascending=[False, True])
    index = np.full(hash_size, -1, dtype=np.int64)
    index[counts.row.to_numpy()] = np.arange(len(counts))
    unseen = index < 0  # in row order
    index[unseen] = len(counts) + np.arange(int(unseen.sum()))
    return index


def table_rows(keys: dict, model, table) -> np.ndarray:
    flat = [k for f in table.features for sample in keys[f] for k in sample]
    return rows_of(np.array(flat, dtype=np.int64), table.hash_size)


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    spec = write_yaml(root / "spec.yaml", SPEC)
    hw = write_yaml(root / "hw.yaml", HARDWARE)
    day1 = generate(spec, root / "logs" / "ds=2026-12-01", 4000, seed=21, chunk_rows=2000, processes=1)
    day2 = generate(spec, root / "logs" / "ds=2026-12-02", 4000, seed=22, chunk_rows=2000, processes=1)
    stats = run_profile(spec, day1, root / "stats", "2026-12-01", "--row-counts")
    manifest = solve_to_manifest(
        stats, spec, hw, root / "manifests", options=SolveOptions(solver="cbc", time_limit_s=20)
    )
    remap(manifest)
    evaluation = replay(manifest, day2)
    return {
        "root": root,
        "spec": spec,
        "hw": hw,
        "day1": day1,
        "day2": day2,
        "stats": stats,
        "manifest": manifest,
        "evaluation": evaluation,
        "model": load_model_config(spec),
    }


def test_manifest_matches_json_schema_and_capacities(pipeline):
    jsonschema.validate(json.loads(pipeline["manifest"].read_text()), json.loads(SCHEMA_PATH.read_text()))
    manifest = load_manifest(pipeline["manifest"]).manifest
    assert manifest.plan.solver == "cbc" and manifest.plan.gap >= -1e-9
    # each GPU's HBM bytes from the configs: its tables' rows_hbm x dim x 4 bytes (fp32), a column
    # shard its share of the columns, within HARDWARE's 600,000 bytes with the trainer's buffers
    dims = {t["name"]: t["dim"] for t in SPEC["tables"]}
    for gpu in manifest.gpus:
        rows_bytes = sum(
            t.rows_hbm * (s.columns if t.column_shards else dims[t.name]) * 4
            for t in manifest.tables
            for s in (t.column_shards or (None,))
            if (s.gpu if s is not None else t.gpu) == gpu.rank
        )
        assert gpu.hbm_bytes_used == rows_bytes
        assert gpu.hbm_bytes_capacity == HARDWARE["hbm_per_gpu_bytes"]
        assert rows_bytes + gpu.trainer_buffer_bytes <= HARDWARE["hbm_per_gpu_bytes"]
    for t in manifest.tables:
        assert t.remap.path == f"remap/{t.name}.parquet" and t.remap.rows == t.unique_rows
    assert {b.name for b in manifest.plan.baselines} == {"greedy_size", "greedy_lookup", "greedy_size_lookup"}
    assert all(b.max_cost_ms >= manifest.plan.objective_ms * (1 - 1e-9) for b in manifest.plan.baselines)
    # capacity-constrained: not everything fits
    assert sum(t.rows_uvm for t in manifest.tables) > 0


@pytest.mark.parametrize("solver", ["glpk", "cbc"])
def test_solve_with_each_required_solver(pipeline, solver, tmp_path):
    path = solve_to_manifest(
        pipeline["stats"],
        pipeline["spec"],
        pipeline["hw"],
        tmp_path,
        options=SolveOptions(solver=solver, time_limit_s=20),
    )
    jsonschema.validate(json.loads(path.read_text()), json.loads(SCHEMA_PATH.read_text()))
    manifest = load_manifest(path).manifest
    # proven optimal; the bound pools HBM over GPUs, so on 5 tables it stays a few % below
    assert manifest.plan.solver == solver and manifest.plan.status == "optimal" and manifest.plan.gap < 0.1
    torchrec = json.loads((path.parent / "torchrec_plan.json").read_text())
    for t in manifest.tables:
        exported = torchrec["tables"][t.name]
        # a table cut into column shards is column-wise on its shards' GPUs (in column order)
        assert exported["ranks"] == ([s.gpu for s in t.column_shards] or [t.gpu])
        assert exported["sharding_type"] == ("column_wise" if t.column_shards else "table_wise")
        # the static split that runs: whole tables fused or fused_uvm, split ones as two parts
        if t.rows_hbm in (0, t.hash_size):
            kernel = "fused" if t.rows_hbm == t.hash_size else "fused_uvm"
            assert exported["parts"] == [
                {"name": t.name, "compute_kernel": kernel, "num_embeddings": t.hash_size, "first_row": 0}
            ]
        else:
            assert [
                (p["compute_kernel"], p["num_embeddings"], p["first_row"]) for p in exported["parts"]
            ] == [
                ("fused", t.rows_hbm, 0),
                ("fused_uvm", t.hash_size - t.rows_hbm, t.rows_hbm),
            ]
    assert torchrec["layout"] == "static_split" and torchrec["data_type"] == "fp32"


def test_loader_maps_ids_like_an_independent_computation(pipeline):
    model = pipeline["model"]
    manifest = load_manifest(pipeline["manifest"], model=pipeline["spec"])
    train, held_out = parquet_keys(pipeline["day1"], model), parquet_keys(pipeline["day2"], model)
    checked_unseen = 0
    for table in model.tables:
        placement = manifest.table(table.name)
        expected_index = independent_index(table_rows(train, model, table), table.hash_size)
        batch = np.concatenate(
            [
                table_rows(held_out, model, table)[:500],
                np.random.default_rng(0).integers(0, table.hash_size, 200),
            ]
        )
        tier, index = manifest.remap(table.name, batch)
        new = expected_index[batch]
        assert np.array_equal(tier, np.where(new < placement.rows_hbm, HBM, UVM))
        assert np.array_equal(index, np.where(new < placement.rows_hbm, new, new - placement.rows_hbm))
        checked_unseen += int((new >= placement.unique_rows).sum())
    assert checked_unseen > 100  # rows the profile never saw were part of the batches
    # what a trainer on each rank asks for
    by_gpu = {g: {t.name for t in manifest.tables_on(g)} for g in range(manifest.num_gpus)}
    assert set().union(*by_gpu.values()) == {t.name for t in model.tables}
    # a table on one GPU, or each of its column shards on its own (hot tables are cut on this run)
    ranks = {t.name: [s.gpu for s in manifest.table(t.name).column_shards] for t in model.tables}
    assert any(ranks.values())
    for name, gpus in ranks.items():
        assert sorted(g for g, names in by_gpu.items() if name in names) == sorted(
            gpus or [manifest.table(name).gpu]
        )


def test_replay_matches_independent_computation_and_prediction(pipeline):
    model = pipeline["model"]
    evaluation = json.loads(pipeline["evaluation"].read_text())
    manifest = load_manifest(pipeline["manifest"])
    train, held_out = parquet_keys(pipeline["day1"], model), parquet_keys(pipeline["day2"], model)
    by_name = {t["name"]: t for t in evaluation["tables"]}
    total = uvm = 0
    for table in model.tables:
        rows = table_rows(held_out, model, table)
        new = independent_index(table_rows(train, model, table), table.hash_size)[rows]
        hbm = int((new < manifest.table(table.name).rows_hbm).sum())
        got = by_name[table.name]
        assert got["accesses"] == len(rows)
        assert got["hbm_access_fraction"] == pytest.approx(hbm / len(rows) if len(rows) else 1.0, abs=1e-12)
        total, uvm = total + len(rows), uvm + len(rows) - hbm
    recshard = evaluation["plans"]["recshard"]
    assert recshard["uvm_access_fraction"] == pytest.approx(uvm / total, abs=1e-12)
    # the held-out day behaves as the solver predicted, within a few points
    assert abs(recshard["uvm_access_fraction"] - recshard["predicted_uvm_access_fraction"]) < 0.05
    for name, plan in evaluation["plans"].items():
        assert plan["max_cost_ms"] >= recshard["max_cost_ms"] * 0.999, name


def test_torchrecs_plans_are_replayed_shard_by_shard(pipeline):
    """With torchrec installed, the manifest carries TorchRec's plans, and the replay costs them
    shard by shard on the held-out day: recomputed here from the logs and the remap order."""
    pytest.importorskip(
        "torchrec", reason="the torchrec extra is not installed (scripts/setup.sh installs it)"
    )
    model = pipeline["model"]
    manifest = load_manifest(pipeline["manifest"]).manifest
    evaluation = json.loads(pipeline["evaluation"].read_text())
    assert [t.name for t in manifest.plan.torchrec] == ["torchrec_default", "torchrec_stats"]
    assert manifest.plan.torchrec_rating_ms > 0 and all(
        b.torchrec_rating_ms > 0 for b in manifest.plan.baselines
    )
    train, held_out = parquet_keys(pipeline["day1"], model), parquet_keys(pipeline["day2"], model)
    hw, batch = manifest.hardware, manifest.hardware.batch_size
    for plan in manifest.plan.torchrec:
        assert plan.error is None and plan.shards
        tables = {t.name for t in manifest.tables}
        assert {s.table for s in plan.shards} == tables
        gpu_ms = np.zeros(manifest.num_gpus)
        for shard in plan.shards:
            t = manifest.table(shard.table)
            table = model.tables[[c.name for c in model.tables].index(t.name)]
            rows = table_rows(held_out, model, table)
            if shard.compute_kernel == "fused_uvm":
                f = 0.0
            elif shard.compute_kernel == "fused_uvm_caching":
                new = independent_index(table_rows(train, model, table), table.hash_size)[rows]
                cached = min(round(shard.cache_load_factor * t.hash_size), t.unique_rows)
                f = float((new < cached).mean()) if len(rows) else 1.0
            else:
                f = 1.0
            by_rows = shard.rows / t.hash_size
            share = {
                "row_wise": by_rows,
                "table_row_wise": by_rows,
                "grid_shard": by_rows,
                "data_parallel": 1 / manifest.num_gpus,
            }.get(shard.sharding_type, 1.0)
            moved = batch * len(rows) / evaluation["num_samples"] * share * t.row_bytes * shard.cols / t.dim
            gpu_ms[shard.rank] += 1e3 * moved * (f / hw.hbm_bandwidth + (1 - f) / hw.uvm_bandwidth)
        replayed = evaluation["plans"][plan.name]
        assert replayed["gpu_cost_ms"] == pytest.approx(list(gpu_ms), rel=1e-9)
        assert replayed["predicted_max_cost_ms"] == plan.max_cost_ms


def _copy(pipeline, tmp_path):
    target = tmp_path / "ds=2026-12-01"
    shutil.copytree(pipeline["manifest"].parent, target)
    return target


def test_loader_rejects_tampering_and_mismatches(pipeline, tmp_path):
    target = _copy(pipeline, tmp_path)
    path = target / "manifest.json"
    text = path.read_text()
    data = json.loads(text)

    part = next((target / "remap" / "t_user.parquet").glob("*.parquet"))
    original = part.read_bytes()
    part.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(RecShardError, match=r"checksum mismatch for remap/t_user\.parquet"):
        load_manifest(path)
    part.write_bytes(original)
    load_manifest(path)

    for bad, message in (
        ("../outside.parquet", "its remap file is '../outside.parquet', not remap/t_user.parquet"),
        ("/etc/passwd", "its remap file is '/etc/passwd'"),
    ):
        tampered = json.loads(json.dumps(data))
        tampered["tables"][0]["remap"]["path"] = bad
        path.write_text(json.dumps(tampered))
        with pytest.raises(RecShardError, match=message):
            load_manifest(path)

    tampered = json.loads(json.dumps(data))
    tampered["schema_version"] = "7"
    path.write_text(json.dumps(tampered))
    with pytest.raises(
        RecShardError, match="schema_version '7': this recshard-stats reads versions 1, 2, 3, 4, 5, 6"
    ):
        load_manifest(path)

    path.write_text(text)  # as written, so its checksum beside it matches again
    other = dict(SPEC, tables=[dict(t) for t in SPEC["tables"]])
    other["tables"][0]["hash_size"] = 999
    with pytest.raises(RecShardError) as err:
        load_manifest(path, model=write_yaml(tmp_path / "other.yaml", other))
    assert err.value.reason is Reason.MANIFEST_MISMATCH
    assert "table 't_user': hash_size is 1000 in the manifest, 999 in the model" in str(err.value)

    path.write_text("{not json")
    with pytest.raises(RecShardError, match="not valid JSON"):
        load_manifest(path)


def test_latest_pointer_moves_only_to_a_valid_manifest(pipeline, tmp_path):
    target = _copy(pipeline, tmp_path)
    publish_latest(tmp_path, target / "manifest.json")
    published = load_latest(tmp_path)
    # a snapshot of the day's directory: what later runs of the day rebuild is not what is published
    assert published.path.parent.parent == (tmp_path / "published").resolve()
    assert published.path.parent.name.startswith("ds=2026-12-01-")
    assert published.path.read_bytes() == (target / "manifest.json").read_bytes()
    pointed = json.loads((tmp_path / "latest.json").read_text())["manifest"]
    shutil.rmtree(target / "remap" / "t_hist.parquet")
    with pytest.raises(RecShardError, match=r"t_hist\.parquet of table 't_hist' is missing"):
        publish_latest(tmp_path, target / "manifest.json")
    # the pointer still names the manifest it pointed to, which still loads whole
    assert json.loads((tmp_path / "latest.json").read_text())["manifest"] == pointed
    shutil.rmtree(target)  # the day rebuilt (or lost) does not take the published plan with it
    assert load_latest(tmp_path).manifest == published.manifest


def test_rollback_returns_to_the_manifest_published_before(pipeline, tmp_path, capsys):
    from recshard_stats import cli
    from recshard_stats.manifest_publisher import write_manifest

    first = _copy(pipeline, tmp_path)
    second = tmp_path / "ds=2026-12-02"
    shutil.copytree(first, second)
    loaded = load_manifest(first)
    # the same plan written again for another day: another manifest, with its own checksum
    write_manifest(second / "manifest.json", dataclasses.replace(loaded.manifest, ds="2026-12-02"))
    root = tmp_path / "root"
    assert cli.main(["rollback", "--root", str(root)]) == 2
    assert "[input_missing]" in capsys.readouterr().err
    publish_latest(root, first / "manifest.json")
    assert cli.main(["rollback", "--root", str(root)]) == 2
    assert "no manifest was published before published/ds=2026-12-01-" in capsys.readouterr().err
    publish_latest(root, second / "manifest.json")
    publish_latest(root, second / "manifest.json")  # published again: not a second history entry
    assert load_latest(root).manifest.ds == "2026-12-02"
    assert cli.main(["rollback", "--root", str(root)]) == 0
    assert "latest.json -> published/ds=2026-12-01-" in capsys.readouterr().out
    back = load_latest(root)
    assert back.manifest == loaded.manifest
    history = json.loads((root / "published" / "history.json").read_text())["published"]
    assert [h["ds"] for h in history] == ["2026-12-01"]
    assert cli.main(["rollback", "--root", str(root)]) == 2  # nothing before the first
    capsys.readouterr()
    # a snapshot edited after it was published is never rolled back to
    publish_latest(root, second / "manifest.json")
    snapshot = root / history[0]["manifest"]
    snapshot.write_text(snapshot.read_text().replace('"2026-12-01"', '"2026-11-30"', 1))
    assert cli.main(["rollback", "--root", str(root)]) == 2
    assert f"{history[0]['manifest']} changed after it was published" in capsys.readouterr().err
    assert load_latest(root).manifest.ds == "2026-12-02"


def test_publish_replaces_the_published_plan_only_when_the_candidate_is_faster(pipeline, tmp_path, capsys):
    """Two manifests (the same plan, for two days) replayed on the same held-out day: equal
    replayed times, so the candidate is not 2% faster and the published plan stays; with
    margin 0 (at least as fast) or --force it is published. decision.json holds both figures."""
    from recshard_stats import cli
    from recshard_stats.manifest_publisher import write_manifest
    from recshard_stats.options import ReplayOptions
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import replay_logs

    first = _copy(pipeline, tmp_path)
    second = tmp_path / "ds=2026-12-02"
    shutil.copytree(first, second)
    write_manifest(
        second / "manifest.json", dataclasses.replace(load_manifest(first).manifest, ds="2026-12-02")
    )
    root = tmp_path / "root"
    publish = ["publish", "--root", str(root), "--manifest"]
    assert cli.main([*publish, str(first)]) == 0
    assert (
        "published:" in capsys.readouterr().out
        and "nothing is published yet" in (first / "decision.json").read_text()
    )
    snapshot = load_latest(root).path.parent
    spark = spark_session("recshard-tests")
    day2 = str(pipeline["day2"])
    candidate_eval = replay_logs(spark, ReplayOptions(str(second), (day2,), out=str(tmp_path / "cand.json")))
    published_eval = replay_logs(spark, ReplayOptions(str(snapshot), (day2,), out=str(tmp_path / "pub.json")))
    replayed = [
        json.loads(p.read_text())["plans"]["recshard"]["max_cost_ms"]
        for p in (candidate_eval, published_eval)
    ]
    assert replayed[0] == pytest.approx(replayed[1], rel=1e-12)
    # one replay of the logs through the candidate and the plan published under the root
    both = replay_logs(
        spark, ReplayOptions(str(second), (day2,), out=str(tmp_path / "both.json"), published_root=str(root))
    )
    beside = json.loads((both.parent / "published_evaluation.json").read_text())
    assert beside["manifest"] == str(snapshot / "manifest.json")
    assert beside["plans"]["recshard"]["max_cost_ms"] == pytest.approx(replayed[1], rel=1e-12)
    capsys.readouterr()  # the replays' summaries
    compare = [
        str(second),
        "--evaluation",
        str(candidate_eval),
        "--published-evaluation",
        str(published_eval),
    ]

    assert cli.main([*publish, *compare]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"kept the published {snapshot / 'manifest.json'}: not faster by the margin 2% (+0.0%)"
    )
    decision = json.loads((second / "decision.json").read_text())
    assert decision["publish"] is False and decision["margin"] == 0.02
    assert decision["candidate_ms"] == pytest.approx(replayed[0]) and decision[
        "published_ms"
    ] == pytest.approx(replayed[1])
    assert decision["logs"] == [day2] and load_latest(root).manifest.ds == "2026-12-01"

    assert cli.main([*publish, *compare, "--margin", "0"]) == 0
    assert "faster by 0.0% (margin 0%)" in capsys.readouterr().out
    assert load_latest(root).manifest.ds == "2026-12-02"
    assert cli.main(["rollback", "--root", str(root)]) == 0 and load_latest(root).manifest.ds == "2026-12-01"
    capsys.readouterr()
    assert cli.main([*publish, str(second), "--force"]) == 0
    assert "forced (--force)" in capsys.readouterr().out and load_latest(root).manifest.ds == "2026-12-02"

    # --compare takes the evaluations beside the candidate, never beside files given
    assert cli.main([*publish, str(second), "--compare", "--evaluation", str(candidate_eval)]) == 2
    assert "--compare reads the evaluations beside the candidate" in capsys.readouterr().err
    assert load_latest(root).manifest.ds == "2026-12-02"
    # the evaluations must be of these two manifests, on the same logs, both or neither
    assert cli.main([*publish, str(second), "--evaluation", str(candidate_eval)]) == 2
    assert "--published-evaluation is missing" in capsys.readouterr().err
    absent = ["--published-evaluation", str(tmp_path / "none.json")]
    assert cli.main([*publish, str(second), "--evaluation", str(candidate_eval), *absent]) == 2
    assert "--published-evaluation is missing" in capsys.readouterr().err
    swapped = [
        str(second),
        "--evaluation",
        str(published_eval),
        "--published-evaluation",
        str(candidate_eval),
    ]
    assert cli.main([*publish, *swapped]) == 2
    assert "--evaluation replays" in capsys.readouterr().err


class _Figures(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.figures, self.images = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure":
            self.figures.append(attrs["id"])
        if tag == "img":
            self.images.append(attrs["src"])


def test_report_has_every_figure(pipeline, tmp_path):
    out = write_report(pipeline["manifest"], tmp_path / "report.html")
    parser = _Figures()
    text = out.read_text()
    parser.feed(text)
    assert parser.figures == [f"fig-{name}" for name in (*FIGURES, "replay")]
    for src in parser.images:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "gap" in text and "greedy_size_lookup" in text
    # the placement lists each table once, a table cut column-wise with its shards' GPUs
    manifest = load_manifest(pipeline["manifest"]).manifest
    cut = [t for t in manifest.tables if t.column_shards]
    assert cut and f"{len(cut)} table(s) cut into column\nshards" in text
    for t in cut:
        assert (
            f"<tr><td>{t.name}</td><td>{', '.join(str(s.gpu) for s in t.column_shards)}</td>"
            f"<td>column-wise x{len(t.column_shards)}</td>"
        ) in text
    if load_manifest(pipeline["manifest"]).manifest.plan.torchrec:
        assert "torchrec_default" in text and "TorchRec's rating ms" in text


@pytest.mark.slow
def test_criteo_split_in_two_replays_as_predicted(spark, criteo_tsv, tmp_path):
    from tests.conftest import ROOT

    lines = criteo_tsv.read_text().splitlines(keepends=True)
    half = len(lines) // 2
    (tmp_path / "a.tsv").write_text("".join(lines[:half]))
    (tmp_path / "b.tsv").write_text("".join(lines[half:]))
    model_path = ROOT / "conf" / "criteo_kaggle.yaml"
    hw = write_yaml(
        tmp_path / "hw.yaml",
        {
            "num_gpus": 2,
            "hbm_per_gpu_bytes": 3_000_000,
            "hbm_reserved_fraction": 0,
            "host_gib": 64,
            "batch_size": 256,
        },
    )
    stats = run_profile(model_path, tmp_path / "a.tsv", tmp_path / "stats", "2026-12-01", "--row-counts")
    # the replay is checked against the plan, whatever its quality: a short solve will do
    manifest = solve_to_manifest(
        stats, model_path, hw, tmp_path / "manifests", options=SolveOptions(solver="highs", time_limit_s=5)
    )
    remap(manifest)
    evaluation = json.loads(replay(manifest, tmp_path / "b.tsv").read_text())
    loaded = load_manifest(manifest, model=model_path)
    raw = [
        pd.read_csv(tmp_path / f, sep="\t", header=None, dtype=str, keep_default_na=False)
        for f in ("a.tsv", "b.tsv")
    ]
    total = uvm = 0
    by_name = {t["name"]: t for t in evaluation["tables"]}
    for i, table in enumerate(load_model_config(model_path).tables):
        train, test = ([int(v, 16) % table.hash_size for v in df[14 + i] if v] for df in raw)
        new = independent_index(np.array(train, dtype=np.int64), table.hash_size)[
            np.array(test, dtype=np.int64)
        ]
        tier, _ = loaded.remap(table.name, np.array(test, dtype=np.int64))
        rows_hbm = loaded.table(table.name).rows_hbm
        assert np.array_equal(tier == HBM, new < rows_hbm)
        assert by_name[table.name]["hbm_access_fraction"] == pytest.approx(
            (new < rows_hbm).mean() if len(new) else 1.0, abs=1e-12
        )
        total, uvm = total + len(new), uvm + int((new >= rows_hbm).sum())
    recshard = evaluation["plans"]["recshard"]
    assert recshard["uvm_access_fraction"] == pytest.approx(uvm / total, abs=1e-12)
    assert 0.05 < recshard["uvm_access_fraction"] < 0.95  # the HBM given is really short
    assert abs(recshard["uvm_access_fraction"] - recshard["predicted_uvm_access_fraction"]) < 0.05


def _edited(data: dict, edit: str) -> dict:
    data = json.loads(json.dumps(data))
    tables = data["tables"]
    if edit == "unique_rows":
        tables[0]["unique_rows"] += 1
    elif edit == "objective":
        data["plan"]["objective_ms"] = -1
    elif edit == "swapped remaps":
        tables[0]["remap"], tables[1]["remap"] = tables[1]["remap"], tables[0]["remap"]
    elif edit == "hbm over capacity":
        t = next(t for t in tables if t["rows_uvm"] > 0)
        t["rows_hbm"], t["rows_uvm"] = t["hash_size"], 0
    elif edit == "gpu contradicts gpus":
        tables[0]["gpu"] = 1 - tables[0]["gpu"]
    return data


EDITS = {
    "unique_rows": "do not add up to hash_size",
    "objective": "'objective_ms': -1",
    "swapped remaps": "its remap file is 'remap/t_query.parquet', not remap/t_user.parquet",
    "hbm over capacity": "hbm_bytes_used",
    "gpu contradicts gpus": "lists tables|column shards on GPUs",
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_manifest_is_refused_by_the_loader_validate_and_publish(pipeline, edit, tmp_path, capsys):
    from recshard_stats import cli
    from recshard_stats.manifest_loader import checksum_path, sha256_file

    target = _copy(pipeline, tmp_path)
    path = target / "manifest.json"
    path.write_text(json.dumps(_edited(json.loads(path.read_text()), edit), indent=2))
    for forged in (False, True):  # the checksum beside it left as it was, then forged to match
        if forged:
            checksum_path(path).write_text(sha256_file(path) + "\n")
        expected = EDITS[edit] if forged else "changed after it was written|" + EDITS[edit]
        with pytest.raises(RecShardError, match=expected.replace("(", r"\(").replace("[", r"\[")):
            load_manifest(path)
        for command in (
            ["validate", "--manifest", str(target)],
            ["publish", "--manifest", str(target), "--root", str(tmp_path)],
        ):
            assert cli.main(command) == 2
            assert "[manifest_invalid]" in capsys.readouterr().err
    assert not (tmp_path / "latest.json").exists()


def test_publish_needs_the_manifests_own_checksum(pipeline, tmp_path):
    from recshard_stats.manifest_loader import checksum_path

    target = _copy(pipeline, tmp_path)
    checksum_path(target / "manifest.json").unlink()
    load_manifest(target)  # a trainer may still read it (with a warning)
    with pytest.raises(RecShardError, match=r"manifest\.json\.sha256 is missing"):
        publish_latest(tmp_path, target / "manifest.json")


def test_the_report_refuses_another_models_stats_and_a_missing_evaluation(pipeline, tmp_path, capsys):
    from recshard_stats import cli

    stats = tmp_path / "stats"
    shutil.copytree(pipeline["stats"], stats)
    meta = json.loads((stats / "metadata.json").read_text())
    table = meta["model"]["tables"][0]
    table["hash"] = "mod" if table.get("hash", "xxhash64") == "xxhash64" else "xxhash64"
    (stats / "metadata.json").write_text(json.dumps(meta))
    args = ["report", "--manifest", str(pipeline["manifest"]), "--out", str(tmp_path / "r.html")]
    assert cli.main([*args, "--stats", str(stats)]) == 2
    err = capsys.readouterr().err
    assert "[stats_invalid]" in err and "were profiled with another model config" in err
    assert f"table {table['name']!r}" in err

    assert cli.main([*args, "--evaluation", str(tmp_path / "nowhere.json")]) == 2
    err = capsys.readouterr().err
    assert "[input_missing]" in err and f"--evaluation {tmp_path / 'nowhere.json'} does not exist" in err
    assert not (tmp_path / "r.html").exists()


def test_a_remap_part_replaced_by_a_link_is_refused_even_with_the_same_bytes(pipeline, tmp_path):
    target = _copy(pipeline, tmp_path)
    part = next((target / "remap" / "t_user.parquet").glob("*.parquet"))
    outside = tmp_path / "elsewhere.parquet"
    shutil.copyfile(part, outside)
    part.unlink()
    part.symlink_to(outside)  # same bytes, so the checksum matches: what it points to may change later
    with pytest.raises(RecShardError, match=rf"{part} is a link: a manifest's files are its own") as err:
        load_manifest(target)
    assert err.value.reason is Reason.MANIFEST_INVALID


def test_a_broken_evaluation_file_is_one_clear_error_in_the_report(pipeline, tmp_path, capsys):
    from recshard_stats import cli

    bad = tmp_path / "evaluation.json"
    bad.write_text('{"num_samples": "many"}')
    rc = cli.main(
        [
            "report",
            "--manifest",
            str(pipeline["manifest"]),
            "--evaluation",
            str(bad),
            "--out",
            str(tmp_path / "r.html"),
        ]
    )
    err = capsys.readouterr().err
    assert (
        rc == 2 and "[input_corrupt]" in err and "is not an evaluation written by `recshard evaluate`" in err
    )
    assert "lacks ['plans', 'tables', 'manifest', 'logs', 'ds']" in err and not (tmp_path / "r.html").exists()


def test_the_gpu_step_bench_runs_each_share_on_cpu_with_the_traffic_the_plan_gives(pipeline, tmp_path):
    """benchmarks/gpu_step_bench.py end to end on CPU: prepare the held-out day through every plan,
    time every GPU share, report. Each RecShard share's HBM and host lookups are the held-out ids
    split by an independent remap (pandas) at the table's rows_hbm."""
    import importlib.util
    import sys

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("gpu_step_bench", ROOT / "benchmarks" / "gpu_step_bench.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["gpu_step_bench"] = bench
    spec.loader.exec_module(bench)
    inputs = tmp_path / "inputs"
    bench.prepare(str(pipeline["manifest"].parent), str(pipeline["day2"]), 512, str(inputs / "small_b512"))
    scenario = bench.Scenario(inputs / "small_b512")
    loaded = load_manifest(pipeline["manifest"])
    model = pipeline["model"]
    day1, day2 = parquet_keys(pipeline["day1"], model), parquet_keys(pipeline["day2"], model)
    first = {f: v[:512] for f, v in day2.items()}  # the batch: the held-out day's first 512 samples
    recshard = {p["name"]: p for p in scenario.meta["plans"]}["recshard"]
    for t in loaded.manifest.tables:
        index = independent_index(table_rows(day1, model, t), t.hash_size)[table_rows(first, model, t)]
        got = dict.fromkeys(("hbm", "host"), 0)
        for part in recshard["parts"]:
            if part["table"] == t.name and part["gpu"] == t.gpu:
                for tier, (_size, ids, offsets) in scenario.lookups(part).items():
                    got[tier] += len(ids)
                    assert len(offsets) == 512 * len(t.features)  # one bag per sample and feature
        assert got == {"hbm": int((index < t.rows_hbm).sum()), "host": int((index >= t.rows_hbm).sum())}, (
            t.name
        )
    results = tmp_path / "results.jsonl"
    bench.measure(str(inputs), str(results), "cpu", 2, 300.0)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    plans = {p["name"] for p in scenario.meta["plans"]}
    assert {(r["plan"], r["gpu"]) for r in records} == {(p, g) for p in plans for g in range(2)}
    assert all(r["step_ms"] > 0 for r in records if r["plan"] == "recshard")
    summary = bench.report(str(inputs), str(results), str(pipeline["hw"]))
    entry = summary["scenarios"]["small_b512"]
    assert set(entry["plans"]) == plans and entry["plans"]["recshard"]["gain_measured"] == 1.0
