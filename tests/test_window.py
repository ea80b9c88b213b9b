"""`recshard window` against an independent pandas/numpy computation over all the days' logs."""

import collections
import json
import math

import pyarrow.parquet as pq
import pytest

from recshard_stats.config import load_model_config
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.generate import generate
from recshard_stats.options import WindowOptions
from recshard_stats.stats_reader import load_stats
from tests.helpers import SPEC, parquet_keys, run_profile, write_yaml
from tests.reference import feature_reference
from tests.test_profile import _check_feature

DAYS = ("2026-12-01", "2026-12-02", "2026-12-03")


def merge(spec, stats_root, out, ds, **options):
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import merge_window

    return load_stats(
        merge_window(
            spark_session("recshard-tests"),
            WindowOptions(model=str(spec), stats=str(stats_root), out=str(out), ds=ds, **options),
        )
    )


@pytest.fixture(scope="module")
def days(spark, tmp_path_factory):
    """Three days of logs (different seeds), each profiled with per-id counts; one more day
    (12-04) profiled without them."""
    root = tmp_path_factory.mktemp("window")
    spec = write_yaml(root / "spec.yaml", SPEC)
    logs = {
        ds: generate(spec, root / "logs" / f"ds={ds}", 2000, seed=11 + i, chunk_rows=1000, processes=1)
        for i, ds in enumerate((*DAYS, "2026-12-04"))
    }
    for ds in DAYS:
        run_profile(spec, logs[ds], root / "stats", ds, "--id-counts", "--cdf-points", "40")
    run_profile(spec, logs["2026-12-04"], root / "stats", "2026-12-04")
    return spec, logs, root


def test_window_equals_the_statistics_of_all_days_logs(days):
    spec, logs, root = days
    model = load_model_config(spec)
    window = merge(spec, root / "stats", root / "windows", "2026-12-03", days=3, cdf_points=40)
    keys = [parquet_keys(logs[ds], model) for ds in DAYS]
    merged = {f.name: [s for day in keys for s in day[f.name]] for f in model.features}
    features = {r["feature"]: r for r in window.rows("features")}
    hist = window.tables["pooling_histogram"].to_pandas()
    for feature in model.features:
        ref = feature_reference(merged[feature.name], model.table_of(feature.name).hash_size)
        _check_feature(features[feature.name], ref)  # unique ids across days are one id
        coc = window.count_of_counts("feature", feature.name)
        assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]
        got = hist[hist.feature == feature.name].set_index("pooling_factor")["samples"].to_dict()
        assert got == ref["pooling_histogram"]
    # the shared table: both features' keys in one row space, over all days
    items = feature_reference([a + b for a, b in zip(merged["clicks"], merged["views"], strict=True)], 700)
    t_items = {r["table"]: r for r in window.rows("tables")}["t_items"]
    assert (t_items["unique_keys"], t_items["unique_rows"], t_items["total_accesses"]) == (
        items["unique_raw_ids"],
        items["unique_rows"],
        items["total_accesses"],
    )
    rc = pq.read_table(window.path / "row_counts" / "table=t_items").to_pandas()
    assert dict(zip(rc.row.tolist(), rc.access_count.tolist(), strict=True)) == items["row_counts"]
    meta = window.metadata
    assert meta.num_samples == 6000 and meta.window is not None
    assert meta.window.days == DAYS and meta.window.missing_days == () and meta.row_counts


def test_decayed_window_weights_each_days_counts(days):
    """A 1-day half-life: day d's accesses of an id weigh 0.5 ** (days before the last), summed
    per id and rounded half up (an id under half an access is forgotten), then per row (plain
    Python over the raw logs)."""
    spec, logs, root = days
    model = load_model_config(spec)
    window = merge(spec, root / "stats", root / "decayed", "2026-12-03", days=3, half_life_days=1.0)
    per_id: dict[int, float] = collections.defaultdict(float)
    for age, ds in enumerate(reversed(DAYS)):
        for sample in parquet_keys(logs[ds], model)["hist"]:
            for k in sample:
                per_id[int(k)] += 0.5**age
    expected: collections.Counter = collections.Counter()
    for k, w in per_id.items():
        if math.floor(w + 0.5):
            expected[k % 2048] += math.floor(w + 0.5)
    assert len(expected) < len({k % 2048 for k in per_id})  # some rows are forgotten
    rc = pq.read_table(window.path / "row_counts" / "table=t_hist").to_pandas()
    assert dict(zip(rc.row.tolist(), rc.access_count.tolist(), strict=True)) == dict(expected)
    assert window.metadata.num_samples == round(2000 * (1 + 0.5 + 0.25))
    assert window.metadata.window.half_life_days == 1.0


def test_missing_days_are_named_and_min_days_decides(days):
    spec, _, root = days
    with pytest.raises(RecShardError, match=r"has 3 of its days .* missing: 2026-11-29, 2026-11-30") as exc:
        merge(spec, root / "stats", root / "w5", "2026-12-03", days=5)
    assert exc.value.reason is Reason.INPUT_MISSING
    window = merge(spec, root / "stats", root / "w5", "2026-12-03", days=5, min_days=3)
    assert window.metadata.window.missing_days == ("2026-11-29", "2026-11-30")
    assert window.metadata.num_samples == 6000


def test_days_that_cannot_be_merged_are_named(days, tmp_path):
    spec, _, root = days
    with pytest.raises(RecShardError, match=r"day 2026-12-04 .* has no per-id counts"):
        merge(spec, root / "stats", tmp_path / "w", "2026-12-04", days=2)
    resized = json.loads(json.dumps(SPEC))
    resized["tables"][0]["hash_size"] = 999
    other = write_yaml(tmp_path / "resized.yaml", resized)
    with pytest.raises(RecShardError, match=r"day 2026-12-01 .* table 't_user' of 1000 rows, .* has 999"):
        merge(other, root / "stats", tmp_path / "w", "2026-12-03", days=3)
    rehashed = json.loads(json.dumps(SPEC))
    rehashed["tables"][0]["hash"] = "xxhash64"
    other = write_yaml(tmp_path / "rehashed.yaml", rehashed)
    with pytest.raises(RecShardError, match=r"day 2026-12-01 .* another model config: table 't_user'"):
        merge(other, root / "stats", tmp_path / "w", "2026-12-03", days=3)


@pytest.fixture(scope="module")
def approximate_days(days):
    """The three days profiled approximately, with what a window merges (sampled rows, sketches)."""
    spec, logs, root = days
    for ds in DAYS:
        run_profile(spec, logs[ds], root / "approx", ds, "--approximate", "--id-counts", "--cdf-points", "40")
    return spec, logs, root


def test_a_window_of_approximate_days_unions_their_sketches(approximate_days):
    """Counts, coverage and pooling exact (the small tables keep every row); distinct ids across
    days (the days' HLL sketches unioned) within the HLL bound of plain Python's count over all
    days."""
    spec, logs, root = approximate_days
    model = load_model_config(spec)
    window = merge(spec, root / "approx", root / "approx-windows", "2026-12-03", days=3, cdf_points=40)
    assert window.metadata.approximate is not None and not window.metadata.row_counts
    keys = [parquet_keys(logs[ds], model) for ds in DAYS]
    merged = {f.name: [s for day in keys for s in day[f.name]] for f in model.features}
    whole = load_stats(
        run_profile(
            spec,
            [logs[ds] for ds in DAYS],
            root / "approx-all",
            "2026-12-03",
            "--approximate",
            "--cdf-points",
            "40",
        )
    )
    bound = window.metadata.approximate.distinct_count_error_bound_99_7
    features = {r["feature"]: r for r in window.rows("features")}
    at_once = {r["feature"]: r for r in whole.rows("features")}
    for feature in model.features:
        ref = feature_reference(merged[feature.name], model.table_of(feature.name).hash_size)
        row = features[feature.name]
        for key in ("num_samples", "present_samples", "pf_max", "pf_p99", "total_accesses"):
            assert row[key] == ref[key], (feature.name, key)
        assert abs(row["unique_raw_ids"] - ref["unique_raw_ids"]) <= bound * ref["unique_raw_ids"]
        # close to one approximate profile of all the logs (a union estimates as a merged sketch
        # does, not always to the id)
        assert (
            abs(row["unique_raw_ids"] - at_once[feature.name]["unique_raw_ids"])
            <= bound * ref["unique_raw_ids"]
        )
        coc = window.count_of_counts("feature", feature.name)
        assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]
    with pytest.raises(RecShardError, match=r"--half-life needs exactly profiled days"):
        merge(spec, root / "approx", root / "approx-windows", "2026-12-03", days=3, half_life_days=2.0)


def test_exact_and_approximate_days_do_not_mix(approximate_days, tmp_path):
    import shutil

    spec, _, root = approximate_days
    shutil.copytree(root / "approx" / "ds=2026-12-01", tmp_path / "mixed" / "ds=2026-12-01")
    shutil.copytree(root / "stats" / "ds=2026-12-02", tmp_path / "mixed" / "ds=2026-12-02")
    with pytest.raises(
        RecShardError, match=r"day 2026-12-02 .* was profiled exactly, day 2026-12-01 approximately"
    ):
        merge(spec, tmp_path / "mixed", tmp_path / "w", "2026-12-02", days=2)
