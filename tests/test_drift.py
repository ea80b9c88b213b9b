"""`recshard drift` against plain Python over the raw logs of a reference day and a drifted day."""

import collections
import json

import pyarrow.parquet as pq
import pytest

from recshard_stats.config import load_model_config
from recshard_stats.drift import load_drift, load_thresholds
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.generate import generate
from recshard_stats.options import DriftOptions, SolveOptions, SyntheticDrift
from recshard_stats.solver.manifest_builder import solve_to_manifest
from tests.helpers import SPEC, parquet_keys, remap, run_profile, write_yaml
from tests.test_pipeline import HARDWARE


def check(day, reference, out, **options):
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import check_drift

    return load_drift(
        check_drift(
            spark_session("recshard-tests"),
            DriftOptions(day=str(day), reference=str(reference), out=str(out), **options),
        )
    )


@pytest.fixture(scope="module")
def drifted(spark, tmp_path_factory):
    """Day 0 profiled, planned and remapped; day 2 of a drifting series (new ids, coverage down
    0.2, pooling up 44%) profiled."""
    root = tmp_path_factory.mktemp("drift")
    spec = write_yaml(root / "spec.yaml", SPEC)
    series = {"new_ids": 0.1, "coverage_trend": -0.1, "pooling_shift": 0.2, "hot_rotation": 0.01}
    logs = {
        day: generate(
            spec,
            root / "logs" / f"d{day}",
            4000,
            seed=day,
            chunk_rows=4000,
            processes=1,
            drift=SyntheticDrift(day=day, **series),
        )
        for day in (0, 2)
    }
    reference = run_profile(spec, logs[0], root / "stats", "2026-12-01", "--id-counts", "--row-counts")
    newest = run_profile(spec, logs[2], root / "stats", "2026-12-03", "--id-counts")
    manifest = solve_to_manifest(
        reference,
        spec,
        write_yaml(root / "hw.yaml", HARDWARE),
        root / "manifests",
        options=SolveOptions(time_limit_s=5, local_search_s=1, torchrec_baselines=False),
    )
    remap(manifest)
    return spec, logs, reference, newest, manifest.parent, root


def test_drift_matches_the_raw_logs(drifted):
    spec, logs, reference, newest, manifest, root = drifted
    model = load_model_config(spec)
    report = check(newest, reference, root / "drift.json", manifest=str(manifest))
    before, after = parquet_keys(logs[0], model), parquet_keys(logs[2], model)
    features = {f.feature: f for f in report.features}
    for feature in model.features:
        old, new = before[feature.name], after[feature.name]
        got = features[feature.name]
        assert got.coverage == pytest.approx(sum(map(bool, new)) / len(new), abs=1e-12)
        assert got.reference_coverage == pytest.approx(sum(map(bool, old)) / len(old), abs=1e-12)
        p, q = collections.Counter(map(len, new)), collections.Counter(map(len, old))
        tv = 0.5 * sum(abs(p[k] / len(new) - q[k] / len(old)) for k in set(p) | set(q))
        assert got.pooling_total_variation == pytest.approx(tv, abs=1e-12)
        seen = {k for s in old for k in s}
        ids = collections.Counter(k for s in new for k in s)
        assert (got.ids, got.accesses) == (len(ids), sum(ids.values()))
        assert got.new_ids == sum(1 for k in ids if k not in seen)
        assert got.new_id_accesses == sum(n for k, n in ids.items() if k not in seen)
    assert 0.05 < features["hist"].new_id_access_share < 0.2  # the 10% of draws to new ids
    # the published plan's HBM rows: seen rows remapped below rows_hbm, unseen rows below the cut
    plan = json.loads((manifest / "manifest.json").read_text())
    tables = {t.table: t for t in report.tables}
    for t in plan["tables"]:
        index = dict(pq.read_table(manifest / t["remap"]["path"]).select(["row", "index"]).to_pandas().values)
        rows = collections.Counter(k % t["hash_size"] for f in t["features"] for s in after[f] for k in s)
        in_hbm = sum(
            n
            for row, n in rows.items()
            if (index[row] < t["rows_hbm"] if row in index else row < t["unseen_hbm_below_row"])
        )
        assert (tables[t["name"]].accesses, tables[t["name"]].hbm_accesses) == (sum(rows.values()), in_hbm)
        assert tables[t["name"]].predicted_hbm_share == t["predicted_hbm_access_fraction"]
    # query's coverage fell from 0.6 to about 0.4: an alert with its numbers
    query = features["query"]
    assert 0.15 < query.reference_coverage - query.coverage < 0.25
    expected = f"feature query: coverage {query.reference_coverage:.4f} -> {query.coverage:.4f}"
    assert any(a.startswith(expected) for a in report.alerts), report.alerts
    assert any(a.startswith("feature hist: pooling-factor distribution") for a in report.alerts)
    assert report.reference_days == ("2026-12-01",) and report.ds == "2026-12-03"


def test_thresholds_come_from_the_config(drifted, tmp_path):
    _, _, reference, newest, _, _ = drifted
    loose = write_yaml(
        tmp_path / "loose.yaml",
        {"coverage_change": 1, "pooling_total_variation": 1, "new_id_access_share": 1, "hbm_share_drop": 1},
    )
    assert check(newest, reference, tmp_path / "d.json", thresholds=str(loose)).alerts == ()
    # without a plan: no table shares, and the alerts of the shipped thresholds
    report = check(newest, reference, tmp_path / "d.json")
    assert report.alerts and all(t.hbm_accesses is None for t in report.tables)
    bad = write_yaml(tmp_path / "bad.yaml", {"coverage_change": 2, "pooling_tv": 0.1})
    with pytest.raises(RecShardError, match=r"unknown keys \['pooling_tv'\]; missing keys") as exc:
        load_thresholds(bad)
    assert exc.value.reason is Reason.CONFIG_INVALID


def test_a_day_without_id_counts_is_named(drifted, tmp_path):
    spec, logs, reference, _, _, _ = drifted
    plain = run_profile(spec, logs[2], tmp_path / "stats", "2026-12-03")
    with pytest.raises(RecShardError, match=r"ds=2026-12-03 has no per-id counts to compare"):
        check(plain, reference, tmp_path / "d.json")


def test_the_report_shows_the_drift(drifted, tmp_path):
    from recshard_stats.report import write_report

    _, _, reference, newest, manifest, _ = drifted
    report = check(newest, reference, tmp_path / "drift.json", manifest=str(manifest))
    page = write_report(manifest, tmp_path / "r.html", reference, None, tmp_path / "drift.json").read_text()
    assert 'id="fig-drift_features"' in page and 'id="fig-drift_tables"' in page
    assert page.count("<li>feature ") + page.count("<li>table ") == len(report.alerts) > 0
    with pytest.raises(RecShardError, match=r"--drift .* does not exist"):
        write_report(manifest, tmp_path / "r.html", reference, None, tmp_path / "none.json")


def test_the_published_plan_and_a_first_day(drifted, tmp_path):
    """--published-root: the plan latest.json points to (as --manifest gives it); a first day
    (no reference yet) with --missing-reference-ok: a report that says nothing was compared."""
    from recshard_stats.manifest_publisher import publish_latest

    _, _, reference, newest, manifest, _ = drifted
    root = tmp_path / "published"
    none_yet = check(newest, reference, tmp_path / "a.json", published_root=str(root))
    assert none_yet.published_manifest is None and all(t.hbm_accesses is None for t in none_yet.tables)
    publish_latest(root, manifest)
    by_root = check(newest, reference, tmp_path / "b.json", published_root=str(root))
    by_path = check(newest, reference, tmp_path / "c.json", manifest=str(manifest))
    assert by_root.tables == by_path.tables and by_root.published_manifest.startswith(str(root))
    first = check(newest, tmp_path / "nowhere", tmp_path / "d.json", missing_reference_ok=True)
    assert first.reference is None and first.features == () and first.alerts == ()
    with pytest.raises(RecShardError, match=r"nowhere is not a complete stats partition"):
        check(newest, tmp_path / "nowhere", tmp_path / "d.json")
