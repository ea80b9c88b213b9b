"""Malformed input is counted and reported, never silently dropped."""

import pytest

from recshard_stats.errors import RecShardError
from recshard_stats.stats_reader import load_stats
from tests.helpers import run_profile, write_yaml

MODEL = {
    "name": "c",
    "input": {"format": "criteo_tsv"},
    "features": [{"name": "C1", "type": "hex"}, {"name": "C2", "type": "hex"}],
    "tables": [
        {"name": "t1", "features": ["C1"], "hash_size": 100, "dim": 8},
        {"name": "t2", "features": ["C2"], "hash_size": 100, "dim": 8},
    ],
}


def line(label="1", ints=("",) * 13, c1="0a", c2="ff", rest=("",) * 24):
    return "\t".join([label, *ints, c1, c2, *rest])


@pytest.mark.parametrize("reader", ["arrow", "spark"])
def test_tsv_rejects_are_counted_per_column_and_reason(spark, tmp_path, reader, caplog):
    lines = [
        line(),
        line(c1=""),
        line(c1="zz"),
        line(label="x"),
        "too\tfew\tfields",
        line() + "\textra",
        line(ints=("7",) * 12 + ("1.5",)),
        line(c2="1F"),
    ]
    (tmp_path / "day.tsv").write_text("\n".join(lines) + "\n")
    model = write_yaml(tmp_path / "m.yaml", MODEL)
    with caplog.at_level("INFO", logger="recshard_stats.spark_io"):
        stats = load_stats(
            run_profile(
                model,
                tmp_path / "day.tsv",
                tmp_path / "out",
                "2026-12-01",
                "--max-reject-fraction",
                "0.5",
                "--parquet-reader",
                reader,
            )
        )
    assert ("with pyarrow in" in caplog.text) == (reader == "arrow")  # the reader asked for ran
    rejects = {(r["column"], r["reason"]): r["count"] for r in stats.rows("rejects")}
    assert rejects == {
        ("C1", "not_hex"): 1,
        ("label", "not_integer"): 1,
        ("I13", "not_integer"): 1,
        ("*", "wrong_field_count"): 2,
    }
    assert stats.metadata.input_rows == 8 and stats.metadata.rejected_rows == 2
    f = {r["feature"]: r for r in stats.rows("features")}
    assert f["C1"]["num_samples"] == 6 and f["C1"]["present_samples"] == 4 and f["C1"]["rejected_values"] == 1
    assert f["C2"]["present_samples"] == 6 and f["C2"]["unique_raw_ids"] == 2  # ff and 1F


def test_too_many_rejects_fails_with_the_count(spark, tmp_path):
    (tmp_path / "day.tsv").write_text("\n".join([line()] * 8 + ["bad row"] * 2) + "\n")
    model = write_yaml(tmp_path / "m.yaml", MODEL)
    with pytest.raises(RecShardError, match=r"2 unparseable rows out of 10 rows \(20.00%\)"):
        run_profile(model, tmp_path / "day.tsv", tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_schema_mismatch_names_the_column(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "logs").mkdir()
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int64())}), tmp_path / "logs" / "p.parquet")
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [{"name": "a", "type": "array<int64>"}],
            "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}],
        },
    )
    with pytest.raises(RecShardError, match="column 'a' has type bigint, model config says array<int64>"):
        run_profile(model, tmp_path / "logs", tmp_path / "out")


def test_corrupt_parquet_file_is_named_and_leaves_no_partition(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "logs").mkdir()
    good = tmp_path / "logs" / "part-0.parquet"
    pq.write_table(pa.table({"a": pa.array(list(range(1000)), pa.int64())}), good)
    (tmp_path / "logs" / "part-1.parquet").write_bytes(good.read_bytes()[:300])  # truncated
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [{"name": "a", "type": "int64"}],
            "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}],
        },
    )
    with pytest.raises(
        RecShardError,
        match=r"\[input_corrupt\] cannot read input file \S*part-1.parquet "
        r"\(corrupt or truncated\)",
    ):
        run_profile(model, tmp_path / "logs", tmp_path / "out")
    assert not (tmp_path / "out" / "ds=2026-12-01").exists()


def test_empty_input_day_is_one_clear_error(spark, tmp_path):
    day = tmp_path / "logs" / "ds=2026-12-01"
    day.mkdir(parents=True)
    (day / "_SUCCESS").write_text("")
    model = write_yaml(tmp_path / "m.yaml", MODEL)
    with pytest.raises(
        RecShardError, match=r"\[input_missing\] input path\(s\) hold no data files: \[\S*ds=2026-12-01"
    ):
        run_profile(model, day, tmp_path / "out")


@pytest.mark.slow
def test_skip_corrupt_files_profiles_the_rest_and_records_them(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    logs = tmp_path / "logs" / "ds=2026-12-01"
    logs.mkdir(parents=True)
    pq.write_table(pa.table({"a": pa.array(list(range(1000)), pa.int64())}), logs / "part-0.parquet")
    pq.write_table(pa.table({"a": pa.array([7] * 500, pa.int64())}), logs / "part-1.parquet")
    (logs / "part-2.parquet").write_bytes((logs / "part-0.parquet").read_bytes()[:300])  # truncated
    (logs / "part-3.parquet").write_bytes(b"PAR1 not parquet at all PAR1")
    model = write_yaml(
        tmp_path / "m.yaml",
        {
            "features": [{"name": "a", "type": "int64"}],
            "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}],
        },
    )
    stats = load_stats(run_profile(model, logs, tmp_path / "out", "2026-12-01", "--skip-corrupt-files"))
    assert sorted(p.rsplit("/", 1)[1] for p in stats.metadata.skipped_files) == [
        "part-2.parquet",
        "part-3.parquet",
    ]
    feature = stats.rows("features")[0]
    assert stats.metadata.input_rows == feature["num_samples"] == 1500
    assert feature["unique_raw_ids"] == 1000 and feature["total_accesses"] == 1500

    with pytest.raises(
        RecShardError,
        match=r"\[input_corrupt\] more than 1 corrupt input files \(skipped so far: "
        r"\['\S*part-[23].parquet'\]; the next: \S*part-[23].parquet\)",
    ):
        run_profile(
            model, logs, tmp_path / "out2", "2026-12-01", "--skip-corrupt-files", "--max-skipped-files", "1"
        )
    assert not (tmp_path / "out2" / "ds=2026-12-01").exists()


def test_bisection_finds_the_one_file_that_does_not_decode(spark, tmp_path):
    """The fallback for task failures that name no file: decode halves until one file is left."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recshard_stats.spark_io import find_unreadable_file

    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(7):
        pq.write_table(
            pa.table({"a": pa.array(list(range(i, i + 50)), pa.int64())}), logs / f"part-{i}.parquet"
        )
    assert find_unreadable_file(spark, "parquet", [str(logs)]) is None
    (logs / "part-4.parquet").write_bytes((logs / "part-0.parquet").read_bytes()[:200])
    assert find_unreadable_file(spark, "parquet", [str(logs)]).endswith("/part-4.parquet")
