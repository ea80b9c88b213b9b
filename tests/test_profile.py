"""The Spark profile against an independent pandas/numpy computation of the same statistics."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recshard_stats.config import load_model_config
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.generate import generate
from recshard_stats.schemas import SCHEMA_VERSION, SMALL_TABLES, arrow_schema
from recshard_stats.spark_io import READ_SETTINGS, with_spark_settings
from recshard_stats.stats_reader import load_stats
from tests.helpers import SPEC, parquet_keys, run_profile, write_yaml
from tests.reference import cdf_at, feature_reference


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    spec = write_yaml(root / "spec.yaml", SPEC)
    logs = generate(spec, root / "logs", 3000, seed=7, chunk_rows=1000, processes=1)
    return spec, logs, root


@pytest.fixture(scope="module", params=["arrow", "spark"])
def synthetic_stats(spark, synthetic, request):
    """The synthetic logs profiled with either Parquet reader (pyarrow in the tasks, or Spark's)."""
    spec, logs, root = synthetic
    return run_profile(
        spec,
        logs,
        root / f"stats-{request.param}",
        "2026-12-01",
        "--row-counts",
        "--cdf-points",
        "40",
        "--parquet-reader",
        request.param,
    )


def _by(stats, table, key):
    return {r[key]: r for r in stats.rows(table)}


def _shared_table(stats, keys):
    """The stats row of t_items, and the reference of its two features' keys in one row space."""
    merged = [a + b for a, b in zip(keys["clicks"], keys["views"], strict=True)]
    return _by(stats, "tables", "table")["t_items"], feature_reference(merged, 700)


def _check_feature(row, ref):
    for key in (
        "num_samples",
        "present_samples",
        "pf_min",
        "pf_max",
        "pf_p50",
        "pf_p90",
        "pf_p99",
        "total_accesses",
        "unique_raw_ids",
        "unique_rows",
        "unused_rows",
    ):
        assert row[key] == ref[key], key
    for key in ("coverage", "pf_mean", "pf_mean_present"):
        assert row[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-12), key
    # the reference's naive (1 - 1/H)^n loses ~1e-11 to cancellation; the job uses expm1/log1p
    assert row["expected_unique_rows"] == pytest.approx(ref["expected_unique_rows"], rel=1e-9)


def test_multi_hot_parquet_matches_independent_computation(synthetic, synthetic_stats):
    spec, logs, _ = synthetic
    model = load_model_config(spec)
    stats = load_stats(synthetic_stats)
    keys = parquet_keys(logs, model)
    features = _by(stats, "features", "feature")
    hist = stats.tables["pooling_histogram"].to_pandas()
    for feature in model.features:
        table = model.table_of(feature.name)
        ref = feature_reference(keys[feature.name], table.hash_size)
        _check_feature(features[feature.name], ref)
        got = hist[hist.feature == feature.name].set_index("pooling_factor")["samples"].to_dict()
        assert got == ref["pooling_histogram"]
        coc = stats.count_of_counts("feature", feature.name)
        assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]
    # the shared table: both features' keys land in one row space
    t_items, ref = _shared_table(stats, keys)
    assert t_items["total_accesses"] == ref["total_accesses"]
    assert t_items["unique_rows"] == ref["unique_rows"]
    assert t_items["unique_keys"] == ref["unique_raw_ids"]
    assert t_items["max_row_accesses"] == max(ref["row_counts"].values())
    coc = stats.count_of_counts("table", "t_items")
    assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]
    # access CDF at every stored breakpoint equals sorting all rows
    cdf = stats.tables["access_cdf"].to_pandas()
    points = cdf[(cdf.level == "table") & (cdf.name == "t_items")]
    assert len(points) > 10 and points.rows.iloc[-1] == ref["unique_rows"]
    for k, f in zip(points.rows, points.access_fraction, strict=True):
        assert f == pytest.approx(cdf_at(ref["row_counts"], int(k)), abs=1e-12)
    assert np.all(np.diff(points.access_fraction.to_numpy()) >= 0)


def test_row_counts_match(synthetic, synthetic_stats):
    spec, logs, _ = synthetic
    model = load_model_config(spec)
    keys = parquet_keys(logs, model)
    got = pq.read_table(synthetic_stats / "row_counts" / "table=t_hist").to_pandas()
    ref = feature_reference(keys["hist"], 2048)["row_counts"]
    assert dict(zip(got.row.tolist(), got.access_count.tolist(), strict=True)) == ref


def test_outputs_have_declared_schemas_and_metadata(synthetic_stats):
    for name in SMALL_TABLES:
        assert pq.read_table(synthetic_stats / name).schema.remove_metadata() == arrow_schema(name), name
    rc = pq.read_table(synthetic_stats / "row_counts")
    assert set(rc.schema.names) == {"row", "access_count", "table"}
    meta = json.loads((synthetic_stats / "metadata.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION
    assert meta["sample_fraction"] == 1.0 and meta["num_samples"] == 3000
    assert meta["hash_functions"]["t_query"] == "xxhash64" and meta["spark_version"].startswith("4.")
    assert (synthetic_stats / "_SUCCESS").exists()
    assert not [p for p in synthetic_stats.parent.iterdir() if p.name.startswith("_tmp")]


def test_sample_fraction_is_recorded(spark, synthetic, tmp_path):
    spec, logs, _ = synthetic
    part = run_profile(spec, logs, tmp_path, "2026-12-01", "--sample-fraction", "0.25", "--seed", "3")
    meta = json.loads((part / "metadata.json").read_text())
    assert meta["sample_fraction"] == 0.25
    assert 500 < meta["num_samples"] < 1000


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["arrow", "arrow in ranges of 100 kB", "spark"])
def test_criteo_tsv_matches_independent_computation(spark, criteo_tsv, tmp_path, reader, monkeypatch):
    """Through pyarrow in the tasks (the file whole, or cut into 18 byte ranges whose lines are
    read in 20 kB chunks) and through Spark's text reader."""
    from recshard_stats import partition_counts, spark_io
    from tests.conftest import ROOT

    if reader.endswith("100 kB"):
        monkeypatch.setattr(spark_io, "TASK_BYTES", 100_000)
        monkeypatch.setattr(partition_counts, "TSV_CHUNK_BYTES", 20_000)  # read on the driver
    model = load_model_config(ROOT / "conf" / "criteo_kaggle.yaml")
    part = run_profile(
        ROOT / "conf" / "criteo_kaggle.yaml",
        criteo_tsv,
        tmp_path,
        "2026-12-01",
        "--parquet-reader",
        reader.split()[0],
    )
    stats = load_stats(part)
    raw = pd.read_csv(criteo_tsv, sep="\t", header=None, dtype=str, keep_default_na=False)
    assert raw.shape == (7200, 40)
    features = _by(stats, "features", "feature")
    for i, feature in enumerate(model.features):
        column = raw[14 + i]
        samples = [[int(v, 16)] if v else [] for v in column]
        ref = feature_reference(samples, model.table_of(feature.name).hash_size)
        _check_feature(features[feature.name], ref)
        coc = stats.count_of_counts("feature", feature.name)
        assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]
    assert stats.rows("rejects") == [] and stats.metadata.rejected_rows == 0


def _criteo_model(feature_type: str) -> dict:
    columns = [f"C{i}" for i in range(1, 6)]
    return {
        "name": "criteo5",
        "input": {"format": "criteo_tsv"},
        "features": [{"name": c, "type": feature_type} for c in columns],
        "tables": [
            {
                "name": f"t_{c}",
                "features": [c],
                "hash_size": 1000,
                "dim": 8,
                **({"hash": "xxhash64"} if feature_type == "string" else {}),
            }
            for c in columns
        ],
    }


@pytest.mark.slow
def test_crlf_gzip_and_string_ids_of_criteo_give_the_same_statistics(spark, criteo_tsv, tmp_path):
    """CRLF line ends and gzip give the statistics of the plain file; the same columns declared
    ``string`` have the coverage and pooling of ``hex`` (an empty field is absent for every type),
    and their distinct ids match pandas."""
    import gzip

    lines = criteo_tsv.read_text().splitlines()[:2000]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "day.tsv").write_text("\n".join(lines) + "\n")
    (tmp_path / "crlf").mkdir()
    (tmp_path / "crlf" / "day.tsv").write_bytes(("\r\n".join(lines) + "\r\n").encode())
    (tmp_path / "gzip").mkdir()
    (tmp_path / "gzip" / "day.tsv.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    hex_model = write_yaml(tmp_path / "hex.yaml", _criteo_model("hex"))
    runs = {
        name: load_stats(run_profile(hex_model, tmp_path / name, tmp_path / f"stats-{name}"))
        for name in ("plain", "crlf", "gzip")
    }
    for name in ("crlf", "gzip"):
        for table in ("features", "tables", "count_of_counts", "pooling_histogram", "rejects"):
            assert runs[name].rows(table) == runs["plain"].rows(table), (name, table)
    strings = load_stats(
        run_profile(
            write_yaml(tmp_path / "str.yaml", _criteo_model("string")),
            tmp_path / "plain",
            tmp_path / "stats-string",
        )
    )
    raw = pd.read_csv(tmp_path / "plain" / "day.tsv", sep="\t", header=None, dtype=str, keep_default_na=False)
    hexes, texts = _by(runs["plain"], "features", "feature"), _by(strings, "features", "feature")
    for i, column in enumerate(f"C{i}" for i in range(1, 6)):
        values = raw[14 + i]
        present = values != ""
        assert (
            texts[column]["coverage"] == hexes[column]["coverage"] == pytest.approx(present.mean(), abs=1e-12)
        )
        assert texts[column]["total_accesses"] == hexes[column]["total_accesses"] == int(present.sum())
        assert texts[column]["unique_raw_ids"] == values[present].nunique()


EDGE_MODEL = {
    "name": "edges",
    "input": {"format": "parquet"},
    "features": [
        {"name": "never", "type": "array<int64>"},
        {"name": "neg", "type": "int64"},
        {"name": "big", "type": "array<int64>"},
        {"name": "s", "type": "string"},
    ],
    "tables": [
        {"name": "t_never", "features": ["never"], "hash_size": 5, "dim": 4},
        {"name": "t_neg", "features": ["neg"], "hash_size": 10, "dim": 4},
        {"name": "t_big", "features": ["big"], "hash_size": 10, "dim": 4},
        {"name": "t_s", "features": ["s"], "hash_size": 1, "dim": 4, "hash": "xxhash64"},
    ],
}


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_edge_cases(spark, tmp_path, reader):
    never: list[list[int] | None] = [None, [], None, [], []]
    neg = [-1, -11, 9, None, -(2**63)]  # pmod: 9, 9, 9, -, 2
    big = [
        [3, 13, 23],
        [10**15, None],
        None,
        [],
        [2**63 - 1, -3],
    ]  # collisions, ids >= hash_size, null element
    s = ["a", None, "a", "b", ""]
    table = pa.table(
        {
            "never": pa.array(never, pa.list_(pa.int64())),
            "neg": pa.array(neg, pa.int64()),
            "big": pa.array(big, pa.list_(pa.int64())),
            "s": pa.array(s, pa.string()),
        }
    )
    (tmp_path / "logs").mkdir()
    pq.write_table(table, tmp_path / "logs" / "part-0.parquet")
    model_path = write_yaml(tmp_path / "m.yaml", EDGE_MODEL)
    stats = load_stats(
        run_profile(
            model_path,
            tmp_path / "logs",
            tmp_path / "stats",
            "2026-12-01",
            "--max-reject-fraction",
            "1",
            "--parquet-reader",
            reader,
        )
    )
    f = _by(stats, "features", "feature")
    assert f["never"]["present_samples"] == 0 and f["never"]["unique_rows"] == 0
    assert f["never"]["unused_rows"] == 5 and f["never"]["pf_max"] == 0 and f["never"]["coverage"] == 0
    assert (
        f["neg"]["unique_rows"] == 2 and f["neg"]["unique_raw_ids"] == 4 and f["neg"]["total_accesses"] == 4
    )
    assert dict(zip(*[a.tolist() for a in _coc(stats, "neg")], strict=True)) == {3: 1, 1: 1}
    assert f["big"]["null_ids"] == 1 and f["big"]["total_accesses"] == 6 and f["big"]["pf_max"] == 3
    # rows: 3,3,3 | 0 | 7 (2^63-1 mod 10), 7 (-3 pmod 10)
    assert f["big"]["unique_rows"] == 3 and f["big"]["unique_raw_ids"] == 6
    # an empty string is absent, like a null
    assert f["s"]["unique_raw_ids"] == 2 and f["s"]["unique_rows"] == 1 and f["s"]["coverage"] == 0.6
    assert stats.rows("rejects") == [{"column": "big", "reason": "null_id", "count": 1}]


def _coc(stats, feature):
    coc = stats.count_of_counts("feature", feature)
    return coc.counts, coc.rows


@pytest.mark.slow
def test_rerun_replaces_partition_and_failure_leaves_none(spark, synthetic, tmp_path):
    spec, logs, _ = synthetic
    first = run_profile(spec, logs, tmp_path)
    created = json.loads((first / "metadata.json").read_text())["created_at"]
    second = run_profile(spec, logs, tmp_path)
    assert json.loads((second / "metadata.json").read_text())["created_at"] != created
    with pytest.raises(RecShardError, match=r"no usable samples|not found"):
        run_profile(spec, tmp_path / "missing", tmp_path, "2026-12-02")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds=2026-12-01"]


@pytest.mark.slow
def test_approximate_mode_against_independent_computation(synthetic, spark, tmp_path):
    """Small tables keep every row, so count-of-counts stay exact; distinct counts are HLL
    estimates within the error bound the metadata records; totals and pooling stay exact."""
    spec, logs, _ = synthetic
    model = load_model_config(spec)
    stats = load_stats(run_profile(spec, logs, tmp_path / "stats", "2026-12-01", "--approximate"))
    meta = stats.metadata.approximate
    assert meta.hll_lg_config_k == 14 and meta.distinct_count_error_bound_99_7 == pytest.approx(
        3 * 1.04 / 128
    )
    assert set(meta.row_sample_rate.values()) == {1.0}
    bound = meta.distinct_count_error_bound_99_7
    keys = parquet_keys(logs, model)
    features = _by(stats, "features", "feature")
    for feature in model.features:
        ref = feature_reference(keys[feature.name], model.table_of(feature.name).hash_size)
        row = features[feature.name]
        for key in (
            "num_samples",
            "present_samples",
            "pf_min",
            "pf_max",
            "pf_p50",
            "pf_p90",
            "pf_p99",
            "total_accesses",
        ):
            assert row[key] == ref[key], key
        for key in ("unique_raw_ids", "unique_rows"):
            assert abs(row[key] - ref[key]) <= bound * ref[key], (feature.name, key, row[key], ref[key])
        coc = stats.count_of_counts("feature", feature.name)
        assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]
    t_items, ref = _shared_table(stats, keys)
    assert t_items["total_accesses"] == ref["total_accesses"]
    assert abs(t_items["unique_keys"] - ref["unique_raw_ids"]) <= bound * ref["unique_raw_ids"]
    coc = stats.count_of_counts("table", "t_items")
    assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == ref["count_of_counts"]

    with pytest.raises(RecShardError, match=r"per-row access counts .* need the exact profile"):
        run_profile(spec, logs, tmp_path / "stats2", "2026-12-01", "--approximate", "--row-counts")


@pytest.mark.slow
def test_approximate_mode_samples_rows_of_a_large_table(spark, tmp_path):
    """A 2**22-row table is profiled from one row in 16, picked by Spark's xxhash64(table index,
    row): its count-of-counts equal those of exactly those rows, recomputed here, times 16."""
    import collections
    import struct

    from recshard_stats.hashing import SEED, xxhash64_bytes

    rng = np.random.default_rng(5)
    ids = rng.zipf(1.2, size=40_000) % 3_000_000
    (tmp_path / "logs").mkdir()
    pq.write_table(pa.table({"u": pa.array(ids, pa.int64())}), tmp_path / "logs" / "p.parquet")
    spec = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [{"name": "u", "type": "int64"}],
            "tables": [{"name": "t", "features": ["u"], "hash_size": 1 << 22, "dim": 8}],
        },
    )
    stats = load_stats(
        run_profile(
            spec,
            tmp_path / "logs",
            tmp_path / "stats",
            "2026-12-01",
            "--approximate",
            "--row-sample-bits",
            "4",
        )
    )
    assert stats.metadata.approximate.row_sample_rate == {"t": 1 / 16}
    ref = feature_reference([[int(i)] for i in ids], 1 << 22)
    table_seed = xxhash64_bytes(struct.pack("<i", 0), SEED)  # Spark hashes column by column, int then long

    def sampled(row: int) -> bool:
        h = xxhash64_bytes(struct.pack("<q", row), table_seed)
        return (h - (1 << 64) if h >= 1 << 63 else h) % (1 << 20) < (1 << 16)  # pmod

    kept = {row: c for row, c in ref["row_counts"].items() if sampled(row)}
    assert 0 < len(kept) < len(ref["row_counts"]) / 8
    expected = {c: 16 * n for c, n in collections.Counter(kept.values()).items()}
    coc = stats.count_of_counts("table", "t")
    assert dict(zip(coc.counts.tolist(), coc.rows.tolist(), strict=True)) == expected
    table = _by(stats, "tables", "table")["t"]
    assert table["total_accesses"] == 40_000
    bound = stats.metadata.approximate.distinct_count_error_bound_99_7
    assert abs(table["unique_rows"] - ref["unique_rows"]) <= bound * ref["unique_rows"]


def test_publish_lock_is_taken_over_when_stale_and_waited_for_when_fresh(spark, tmp_path):
    import os
    import time

    from recshard_stats.spark_io import HadoopFS, local_uri
    from recshard_stats.stats_output import publish_lock

    out = local_uri(tmp_path)
    fs = HadoopFS(spark, out)
    lock = tmp_path / "_lock-ds=2026-12-01"
    lock.write_text("a killed run's")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with publish_lock(fs, out, "2026-12-01", wait_s=5, stale_s=600):
        assert lock.exists() and lock.read_text() != "a killed run's"  # ours now
    assert not lock.exists()

    lock.write_text("a live run's")
    started = time.time()
    with pytest.raises(RecShardError) as err, publish_lock(fs, out, "2026-12-01", wait_s=1, stale_s=600):
        pass
    assert err.value.reason is Reason.OUTPUT_BUSY and time.time() - started >= 1
    assert "lock" in str(err.value) and "held for over 1s" in str(err.value)
    assert lock.read_text() == "a live run's"  # a live run's lock is never removed


def _csv_field(value, sep: str) -> str:
    if value is None:
        return ""
    return sep.join(str(v) for v in value) if isinstance(value, list) else str(value)


@pytest.mark.parametrize("escape, quoting", [('"', "QUOTE_MINIMAL"), ('"', "QUOTE_ALL"), ("\\", "QUOTE_ALL")])
def test_quoted_csv_values_get_the_ids_pythons_csv_module_reads(spark, tmp_path, escape, quoting):
    """A CSV written by Python's csv module (RFC 4180: quoted fields holding separators, list
    separators, quotes and line ends; or every field quoted, quotes escaped with a backslash):
    every value's row is the row of the value csv.reader reads back, hashed in numpy."""
    import collections
    import csv
    import io

    from recshard_stats.config import CsvOptions
    from recshard_stats.hashing import keys_of, rows_of
    from recshard_stats.spark_io import python_csv_dialect

    values = ['Say "hi"', "a,b", "plain", "two\nlines", '"quoted"', "x|y", "", "plain", 'back\\slash "q"']
    lists = [["a", 'b"c'], ["d,e"], [], ["f\ng", "a"], ["a"], ["x"], ["z"], ["a", "a"], ["q"]]
    options = CsvOptions(escape=escape)
    buffer = io.StringIO(newline="")
    writer = csv.writer(
        buffer, quoting=getattr(csv, quoting), lineterminator="\n", **python_csv_dialect(options)
    )
    writer.writerow(["s", "m"])
    for v, lst in zip(values, lists, strict=True):
        writer.writerow([v, "|".join(lst)])
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "part-0.csv").write_text(buffer.getvalue())
    read_back = list(csv.reader(io.StringIO(buffer.getvalue(), newline=""), **python_csv_dialect(options)))[
        1:
    ]
    assert [r[0] for r in read_back] == values  # what a trainer parsing the same file gets
    hash_size = 1 << 40
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "input": {"format": "csv", "escape": escape},
            "features": [{"name": "s", "type": "string"}, {"name": "m", "type": "array<string>"}],
            "tables": [
                {"name": "ts", "features": ["s"], "hash_size": hash_size, "dim": 4, "hash": "xxhash64"},
                {"name": "tm", "features": ["m"], "hash_size": hash_size, "dim": 4, "hash": "xxhash64"},
            ],
        },
    )
    stats = run_profile(model, tmp_path / "logs", tmp_path / "stats", "2026-12-01", "--row-counts")
    assert load_stats(stats).metadata.num_samples == len(values)
    for table, ids in (
        ("ts", [r[0] for r in read_back if r[0]]),
        ("tm", [i for r in read_back if r[1] for i in r[1].split("|")]),
    ):
        expected = collections.Counter(rows_of(keys_of(ids, "string", "xxhash64"), hash_size).tolist())
        got = pq.read_table(stats / "row_counts" / f"table={table}").to_pandas()
        assert dict(zip(got["row"], got["access_count"], strict=True)) == expected, table


def test_a_latin1_csv_is_read_in_its_encoding_and_undecodable_bytes_are_rejects(spark, tmp_path):
    """MovieLens' item file is Latin-1. Read as Latin-1, accented titles get the ids of the
    decoded text; read as UTF-8 (the default), their bytes do not decode: each such value is an
    ``undecodable`` reject, counted, and not hashed as U+FFFD."""
    import collections

    from recshard_stats.hashing import keys_of, rows_of

    titles = ["Café society", "plain", "Naïve|Ünïcode", "plain"]
    text = "title,tags\n" + "".join(f"{t.split('|')[0]},{t.split('|')[-1]}\n" for t in titles)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "items.csv").write_bytes(text.encode("latin-1"))
    hash_size = 1 << 40
    spec = {
        "features": [{"name": "title", "type": "string"}, {"name": "tags", "type": "array<string>"}],
        "tables": [
            {"name": "tt", "features": ["title"], "hash_size": hash_size, "dim": 4, "hash": "xxhash64"},
            {"name": "tg", "features": ["tags"], "hash_size": hash_size, "dim": 4, "hash": "xxhash64"},
        ],
    }
    titles_read = [t.split("|")[0] for t in titles]
    tags_read = [t.split("|")[-1] for t in titles]
    latin = write_yaml(
        tmp_path / "latin.yaml", {**spec, "input": {"format": "csv", "encoding": "ISO-8859-1"}}
    )
    stats = run_profile(latin, tmp_path / "logs", tmp_path / "latin", "2026-12-01", "--row-counts")
    for table, ids in (("tt", titles_read), ("tg", tags_read)):
        expected = collections.Counter(rows_of(keys_of(ids, "string", "xxhash64"), hash_size).tolist())
        got = pq.read_table(stats / "row_counts" / f"table={table}").to_pandas()
        assert dict(zip(got["row"], got["access_count"], strict=True)) == expected, table
    assert load_stats(stats).rows("rejects") == []

    utf8 = write_yaml(tmp_path / "utf8.yaml", {**spec, "input": {"format": "csv"}})
    as_utf8 = load_stats(
        run_profile(utf8, tmp_path / "logs", tmp_path / "utf8", "2026-12-01", "--max-reject-fraction", "1")
    )
    rejects = {(r["column"], r["reason"]): r["count"] for r in as_utf8.rows("rejects")}
    assert rejects == {("title", "undecodable"): 2, ("tags", "undecodable"): 2}
    rows = _by(as_utf8, "features", "feature")
    assert (rows["title"]["total_accesses"], rows["title"]["unique_raw_ids"]) == (2, 1)  # "plain" twice
    assert rows["tags"]["total_accesses"] == 2


@pytest.mark.slow
def test_csv_with_delimited_lists_profiles_like_the_parquet_it_was_written_from(
    spark, synthetic, synthetic_stats, tmp_path
):
    """The synthetic logs written as TSV with a header, multi-hot fields as ``a|b|c``: the same
    statistics as the Parquet (which match pandas, above); malformed lines and non-integer ids
    are counted, not used."""
    _spec, logs, _ = synthetic
    table = pq.read_table(logs)
    columns = table.column_names
    rows = table.to_pylist()
    lines = ["\t".join(columns)] + ["\t".join(_csv_field(r[c], "|") for c in columns) for r in rows]
    (tmp_path / "tsv").mkdir()
    (tmp_path / "tsv" / "day.tsv").write_text("\n".join(lines) + "\n")
    model = {**SPEC, "input": {"format": "csv", "separator": "\t", "list_separator": "|"}}
    session_settings = {key: spark.conf.get(key, None) for key in READ_SETTINGS}
    got = load_stats(
        run_profile(
            write_yaml(tmp_path / "m.yaml", model),
            tmp_path / "tsv",
            tmp_path / "s1",
            "2026-12-01",
            "--cdf-points",
            "40",
        )
    )
    # the stage gave the shared session its own settings back
    assert {key: spark.conf.get(key, None) for key in READ_SETTINGS} == session_settings
    expected = load_stats(synthetic_stats)
    for name in ("features", "tables", "count_of_counts", "pooling_histogram", "access_cdf"):
        assert got.rows(name) == expected.rows(name), name

    # the same day with two malformed lines (a field short, a field too many) and bad ids
    short = "\t".join(_csv_field(rows[0][c], "|") for c in columns[:-1])
    bad_ids = dict(rows[1], user="u17", hist=[5, "x", 6])
    lines += [short, lines[1] + "\textra", "\t".join(_csv_field(bad_ids[c], "|") for c in columns)]
    (tmp_path / "tsv" / "day.tsv").write_text("\n".join(lines) + "\n")
    messy = load_stats(run_profile(write_yaml(tmp_path / "m.yaml", model), tmp_path / "tsv", tmp_path / "s2"))
    assert messy.metadata.input_rows == len(rows) + 3 and messy.metadata.rejected_rows == 2
    rejects = {(r["column"], r["reason"]): r["count"] for r in messy.rows("rejects")}
    assert rejects[("user", "not_integer")] == 1 and rejects[("hist", "not_integer")] == 1
    features = _by(messy, "features", "feature")
    clean = _by(expected, "features", "feature")
    assert features["hist"]["total_accesses"] == clean["hist"]["total_accesses"] + 2  # 5 and 6 are kept
    assert features["user"]["total_accesses"] == clean["user"]["total_accesses"]


def test_an_outlying_pooling_factor_is_named_and_an_empty_parquet_file_listed(spark, tmp_path):
    """One sample with 5,000 ids where the rest have 1-3: named in the metadata as an outlier;
    a zero-byte Parquet file beside the logs: left out and listed in ``skipped_files``."""
    rng = np.random.default_rng(3)
    ids = [rng.integers(0, 50, rng.integers(1, 4)).tolist() for _ in range(400)] + [list(range(5000))]
    (tmp_path / "logs").mkdir()
    pq.write_table(pa.table({"h": pa.array(ids, pa.list_(pa.int64()))}), tmp_path / "logs" / "part-0.parquet")
    (tmp_path / "logs" / "part-1.parquet").write_bytes(b"")
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [{"name": "h", "type": "array<int64>"}],
            "tables": [{"name": "t", "features": ["h"], "hash_size": 64, "dim": 4}],
        },
    )
    stats = load_stats(run_profile(model, tmp_path / "logs", tmp_path / "stats"))
    assert stats.metadata.pooling_outliers == {"h": 5000}
    assert [p.rsplit("/", 1)[-1] for p in stats.metadata.skipped_files] == ["part-1.parquet"]
    assert _by(stats, "features", "feature")["h"]["pf_p99"] <= 3


@pytest.mark.slow
def test_both_parquet_readers_count_messy_files_alike_and_right(spark, tmp_path):
    """Two files with other integer widths (int32 ids), hex ids (bad, empty, upper case, leading
    zeros), string lists with empty and null ids, and a file without one of the columns: the
    pyarrow reader and Spark's give the same statistics, which match a count by hand."""
    (tmp_path / "logs").mkdir()
    pq.write_table(
        pa.table(
            {
                "i": pa.array([1, 2, None, 2], pa.int32()),
                "h": pa.array(["0a", "A", "zz", ""], pa.string()),
                "tags": pa.array([["x", "", None], None, ["y", "x"], []], pa.list_(pa.string())),
            }
        ),
        tmp_path / "logs" / "part-0.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "i": pa.array([7], pa.int32()),
                "h": pa.array(["00a"], pa.string()),
                "tags": pa.array([["y"]], pa.list_(pa.string())),
            }
        ),
        tmp_path / "logs" / "part-1.parquet",
    )
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [
                {"name": "i", "type": "int64"},
                {"name": "h", "type": "hex"},
                {"name": "tags", "type": "array<string>"},
            ],
            "tables": [
                {"name": "ti", "features": ["i"], "hash_size": 100, "dim": 4},
                {"name": "th", "features": ["h"], "hash_size": 100, "dim": 4},
                {"name": "tt", "features": ["tags"], "hash_size": 1 << 30, "dim": 4, "hash": "xxhash64"},
            ],
        },
    )
    runs = {
        reader: load_stats(
            run_profile(
                model,
                tmp_path / "logs",
                tmp_path / reader,
                "2026-12-01",
                "--max-reject-fraction",
                "1",
                "--parquet-reader",
                reader,
            )
        )
        for reader in ("arrow", "spark")
    }
    for name in ("features", "tables", "count_of_counts", "pooling_histogram", "rejects"):
        assert runs["arrow"].rows(name) == runs["spark"].rows(name), name
    f = _by(runs["arrow"], "features", "feature")
    assert (f["i"]["total_accesses"], f["i"]["unique_raw_ids"]) == (4, 3)
    # 0a, 00a (both 10) and A (10 as well): one id seen three times; zz rejected, "" absent
    assert (f["h"]["total_accesses"], f["h"]["unique_raw_ids"], f["h"]["rejected_values"]) == (3, 1, 1)
    assert (f["tags"]["total_accesses"], f["tags"]["unique_raw_ids"], f["tags"]["null_ids"]) == (4, 2, 2)
    pooling = {
        r["pooling_factor"]: r["samples"]
        for r in runs["arrow"].rows("pooling_histogram")
        if r["feature"] == "tags"
    }
    assert pooling == {0: 2, 1: 2, 2: 1}


def test_valid_parquet_of_every_arrow_spelling_is_counted_by_both_readers(spark, tmp_path):
    """What pandas and pyarrow write for the same values: a category column (dictionary), string
    as large_string or string_view, lists as large_list or fixed_size_list, a column of Arrow type
    null; files of different spellings in one read (one task may hold several). Both readers give
    the statistics of a count by hand; none calls a file corrupt."""
    logs = tmp_path / "logs"
    logs.mkdir()
    pd.DataFrame(
        {
            "s": pd.Categorical(["a", "b", "a", None]),
            "i": [1, 2, 3, 4],
            "m": [[1, 2], [3], [], [1]],
            "t": [["x"], [], None, ["w"]],
        }
    ).to_parquet(logs / "part-0.parquet")
    pq.write_table(
        pa.table(
            {
                "s": pa.array(["b", "c"], pa.large_string()),
                "i": pa.array([5, 5], pa.int32()),
                "m": pa.array([[7, 8], [1, 1]], pa.list_(pa.int64(), 2)),
                "t": pa.array([["x"], ["y", "x"]], pa.large_list(pa.large_string())),
            }
        ),
        logs / "part-1.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "s": pa.array(["c", None, "a"], pa.string_view()),
                "i": pa.nulls(3),
                "m": pa.array([[2], None, [3, 3, 3]], pa.large_list(pa.int32())),
                "t": pa.array([["z"], [], None], pa.list_(pa.string_view())),
            }
        ),
        logs / "part-2.parquet",
    )
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [
                {"name": "s", "type": "string"},
                {"name": "i", "type": "int64"},
                {"name": "m", "type": "array<int64>"},
                {"name": "t", "type": "array<string>"},
            ],
            "tables": [
                {"name": "ts", "features": ["s"], "hash_size": 1 << 20, "dim": 4, "hash": "xxhash64"},
                {"name": "ti", "features": ["i"], "hash_size": 100, "dim": 4},
                {"name": "tm", "features": ["m"], "hash_size": 100, "dim": 4},
                {"name": "tt", "features": ["t"], "hash_size": 1 << 20, "dim": 4, "hash": "xxhash64"},
            ],
        },
    )
    # by hand, 9 samples: s a b a - | b c | c - a ; i 1 2 3 4 | 5 5 | - - - ;
    # m [1 2] [3] [] [1] | [7 8] [1 1] | [2] - [3 3 3] ; t [x] [] - [w] | [x] [y x] | [z] [] -
    # feature -> (present samples, ids, distinct ids), and the multi-hot ones' pooling histograms
    expected = {"s": (7, 7, 3), "i": (6, 6, 5), "m": (7, 12, 5), "t": (5, 6, 4)}
    histograms = {"m": {0: 2, 1: 3, 2: 3, 3: 1}, "t": {0: 4, 1: 4, 2: 1}}
    for reader in ("arrow", "spark"):
        stats = load_stats(
            run_profile(model, logs, tmp_path / reader, "2026-12-01", "--parquet-reader", reader)
        )
        assert stats.metadata.num_samples == 9 and stats.metadata.skipped_files == (), reader
        rows = _by(stats, "features", "feature")
        for name, counts in expected.items():
            got = rows[name]
            assert (got["present_samples"], got["total_accesses"], got["unique_raw_ids"]) == counts, (
                reader,
                name,
            )
        for name, histogram in histograms.items():
            got_histogram = {
                r["pooling_factor"]: r["samples"]
                for r in stats.rows("pooling_histogram")
                if r["feature"] == name
            }
            assert got_histogram == histogram, (reader, name)


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_int32_and_int64_files_are_the_same_ids_and_names_match_exactly(spark, tmp_path, reader):
    """One rule in both readers: a day whose files hold a feature's ids as int32 in one and int64
    in another is read whole, as the same ids; a column is the feature's only when spelt exactly
    as the model config spells it (``I`` is not ``i``)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(
        pa.table(
            {"i": pa.array([1, 2, 2], pa.int32()), "m": pa.array([[1], [2, 3], []], pa.list_(pa.int32()))}
        ),
        logs / "part-0.parquet",
    )
    pq.write_table(
        pa.table(
            {"i": pa.array([2, 1 << 40], pa.int64()), "m": pa.array([[3], [1 << 40]], pa.list_(pa.int64()))}
        ),
        logs / "part-1.parquet",
    )
    features = [{"name": "i", "type": "int64"}, {"name": "m", "type": "array<int64>"}]
    tables = [
        {"name": "ti", "features": ["i"], "hash_size": 1000, "dim": 4},
        {"name": "tm", "features": ["m"], "hash_size": 1000, "dim": 4},
    ]
    spec = {"features": features, "tables": tables}
    model = write_yaml(tmp_path / "m.yaml", spec)
    stats = load_stats(run_profile(model, logs, tmp_path / "stats", "2026-12-01", "--parquet-reader", reader))
    rows = _by(stats, "features", "feature")
    assert stats.metadata.num_samples == 5
    # i: 1 2 2 | 2 2^40 ; m: [1] [2 3] [] | [3] [2^40]
    assert (rows["i"]["total_accesses"], rows["i"]["unique_raw_ids"], rows["i"]["unique_rows"]) == (5, 3, 3)
    assert (rows["m"]["total_accesses"], rows["m"]["unique_raw_ids"], rows["m"]["present_samples"]) == (
        5,
        4,
        4,
    )
    upper = write_yaml(
        tmp_path / "upper.yaml",
        {
            "features": [{"name": "I", "type": "int64"}, features[1]],
            "tables": [{**tables[0], "features": ["I"]}, tables[1]],
        },
    )
    with pytest.raises(RecShardError, match=r"feature column 'I' \(type int64\) is missing from the logs"):
        run_profile(upper, logs, tmp_path / "stats-upper", "2026-12-01", "--parquet-reader", reader)


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_a_file_without_the_feature_columns_still_counts_its_samples(spark, tmp_path, reader):
    """One day's file lacks every feature column (another logger wrote it): its rows are samples
    where every feature is absent, with either reader; a multi-hot feature's pooling histogram
    counts them at pooling factor 0 (its coverage and pooling factor come from that histogram)."""
    (tmp_path / "logs").mkdir()
    pq.write_table(
        pa.table(
            {"a": pa.array([1, 2, 2], pa.int64()), "m": pa.array([[1, 2], [], [3]], pa.list_(pa.int64()))}
        ),
        tmp_path / "logs" / "part-0.parquet",
    )
    pq.write_table(
        pa.table({"other": pa.array(list(range(5)), pa.int64())}), tmp_path / "logs" / "part-1.parquet"
    )
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [{"name": "a", "type": "int64"}, {"name": "m", "type": "array<int64>"}],
            "tables": [
                {"name": "t", "features": ["a"], "hash_size": 10, "dim": 4},
                {"name": "tm", "features": ["m"], "hash_size": 10, "dim": 4},
            ],
        },
    )
    stats = load_stats(
        run_profile(model, tmp_path / "logs", tmp_path / "stats", "2026-12-01", "--parquet-reader", reader)
    )
    rows = _by(stats, "features", "feature")
    assert stats.metadata.num_samples == 8
    assert (rows["a"]["present_samples"], rows["a"]["total_accesses"], rows["a"]["coverage"]) == (3, 3, 3 / 8)
    histogram = {
        r["pooling_factor"]: r["samples"] for r in stats.rows("pooling_histogram") if r["feature"] == "m"
    }
    assert histogram == {0: 1 + 5, 1: 1, 2: 1}  # [] and the other file's 5 rows: pooling factor 0
    m = rows["m"]
    assert (m["present_samples"], m["total_accesses"], m["coverage"], m["pf_mean"]) == (2, 3, 2 / 8, 3 / 8)


def test_a_stage_runs_with_its_settings_and_gives_the_session_its_own_back(spark):
    """Stages share one session in a process: what one sets for its reads ends with it, also
    when it fails."""
    key = "spark.sql.csv.parser.columnPruning.enabled"
    spark.conf.set(key, "true")
    seen = {}

    @with_spark_settings(READ_SETTINGS)
    def stage(session):
        seen.update({k: session.conf.get(k) for k in READ_SETTINGS})
        raise RuntimeError("the stage failed")

    try:
        with pytest.raises(RuntimeError, match="the stage failed"):
            stage(spark)
        assert seen == READ_SETTINGS
        assert spark.conf.get(key) == "true"  # set before: set back
        inference = "spark.sql.sources.partitionColumnTypeInference.enabled"
        assert spark.conf.get(inference) == "true"  # not set before: Spark's default again
    finally:
        spark.conf.unset(key)
