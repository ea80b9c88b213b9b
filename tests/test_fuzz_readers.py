"""Fuzzing the TSV and Parquet readers (through the whole profile job) with hypothesis on
generated malformed inputs: the only exception is the documented RecShardError, and a TSV
profile that succeeds accounts for every line (independently counted here).

Each example is a real Spark job, so the example counts are small and the runs derandomized
(the same inputs every run, no flaky CI); raise ``RECSHARD_FUZZ_EXAMPLES`` to search longer."""

import io
import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recshard_stats.errors import RecShardError
from recshard_stats.stats_reader import load_stats
from tests.helpers import assert_one_line_error, run_profile, write_yaml

EXAMPLES = int(os.environ.get("RECSHARD_FUZZ_EXAMPLES", "12"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TSV_MODEL = {
    "name": "c",
    "input": {"format": "criteo_tsv"},
    "features": [{"name": "C1", "type": "hex"}, {"name": "C2", "type": "hex"}],
    "tables": [
        {"name": "t1", "features": ["C1"], "hash_size": 100, "dim": 8},
        {"name": "t2", "features": ["C2"], "hash_size": 1 << 20, "dim": 8},
    ],
}

# no tab (the separator) and no line breaks Hadoop splits on; anything else goes
TEXT = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=["Cs"]), max_size=20)
FIELD = st.one_of(
    st.just(""),
    st.from_regex(r"[0-9a-fA-F]{1,20}", fullmatch=True),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True).map(str),
    TEXT,
)
GOOD_LINE = st.lists(FIELD, min_size=40, max_size=40)
LINE = st.one_of(GOOD_LINE, GOOD_LINE, st.lists(FIELD, min_size=0, max_size=45))
HEX = re.compile(r"[0-9a-fA-F]{1,15}")


def _workdir(tmp_path, name):
    path = tmp_path / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


@pytest.mark.slow  # hypothesis drives Spark through many inputs
@pytest.mark.parametrize("reader", ["arrow", "spark"])
@SETTINGS
@given(lines=st.lists(LINE, min_size=1, max_size=30))
def test_tsv_reader_counts_every_line_or_fails_cleanly(spark, tmp_path, reader, lines):
    work = _workdir(tmp_path, f"tsv-{reader}")
    (work / "day.tsv").write_text("\n".join("\t".join(fields) for fields in lines) + "\n", encoding="utf-8")
    try:
        stats = load_stats(
            run_profile(
                write_yaml(work / "m.yaml", TSV_MODEL),
                work / "day.tsv",
                work / "out",
                "2026-12-01",
                "--max-reject-fraction",
                "1",
                "--parquet-reader",
                reader,
            )
        )
    except RecShardError:
        # the only legitimate failures: no usable sample, or not one id in any feature
        assert not any(HEX.fullmatch(fields[p]) for fields in lines if len(fields) == 40 for p in (14, 15))
        return
    whole = [fields for fields in lines if len(fields) == 40]
    assert stats.metadata.input_rows == len(lines)
    assert stats.metadata.rejected_rows == len(lines) - len(whole)
    rejects = {(r["column"], r["reason"]): r["count"] for r in stats.rows("rejects")}
    features = {r["feature"]: r for r in stats.rows("features")}
    for name, position in (("C1", 14), ("C2", 15)):
        values = [fields[position] for fields in whole]
        not_hex = sum(1 for v in values if v and not HEX.fullmatch(v))
        assert rejects.get((name, "not_hex"), 0) == not_hex
        assert features[name]["present_samples"] == sum(1 for v in values if v and HEX.fullmatch(v))
    assert features["C1"]["num_samples"] == len(whole)


def _valid_parquet() -> bytes:
    buffer = io.BytesIO()
    pq.write_table(
        pa.table(
            {
                "a": pa.array(range(200), pa.int64()),
                "b": pa.array([[i, i + 1] if i % 3 else None for i in range(200)], pa.list_(pa.int64())),
            }
        ),
        buffer,
        row_group_size=64,
    )
    return buffer.getvalue()


VALID_PARQUET = _valid_parquet()
PARQUET_MODEL = {
    "features": [{"name": "a", "type": "int64"}, {"name": "b", "type": "array<int64>"}],
    "tables": [
        {"name": "ta", "features": ["a"], "hash_size": 50, "dim": 4},
        {"name": "tb", "features": ["b"], "hash_size": 50, "dim": 4},
    ],
}
MUTATION = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, len(VALID_PARQUET) - 1), st.just(b"")),
    st.tuples(
        st.just("overwrite"), st.integers(0, len(VALID_PARQUET) - 1), st.binary(min_size=1, max_size=8)
    ),
    st.tuples(st.just("garbage"), st.just(0), st.binary(max_size=64)),
)


def _mutate(kind: str, at: int, data: bytes) -> bytes:
    if kind == "truncate":
        return VALID_PARQUET[:at]
    if kind == "overwrite":
        return VALID_PARQUET[:at] + data + VALID_PARQUET[at + len(data) :]
    return data


@pytest.mark.slow  # hypothesis drives Spark through many inputs
@SETTINGS
@given(mutation=MUTATION)
def test_parquet_reader_reads_or_names_the_bad_file(spark, tmp_path, mutation):
    work = _workdir(tmp_path, "parquet")
    (work / "logs").mkdir()
    (work / "logs" / "part-0.parquet").write_bytes(VALID_PARQUET)
    (work / "logs" / "part-1.parquet").write_bytes(_mutate(*mutation))
    try:
        stats = load_stats(
            run_profile(
                write_yaml(work / "m.yaml", PARQUET_MODEL),
                work / "logs",
                work / "out",
                "2026-12-01",
                "--max-reject-fraction",
                "1",
            )
        )
    except RecShardError as exc:
        assert "part-1.parquet" in str(exc) or exc.reason.value == "schema_mismatch", str(exc)
        return
    # a mutation Parquet's checks cannot see (e.g. inside a value) still yields whole samples
    assert stats.metadata.input_rows >= 200


@pytest.mark.parametrize("kind", ["truncate", "overwrite"])
def test_parquet_fuzz_covers_every_mutation_kind(kind):
    """The mutation strategy above really produces broken files (so the test cannot pass vacuously)."""
    broken = _mutate(kind, len(VALID_PARQUET) - 6, b"\xff\xff")
    with pytest.raises(
        (OSError, ValueError)
    ):  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
        pq.read_table(io.BytesIO(broken))


@pytest.mark.slow
def test_a_decoder_failure_that_names_no_file_is_traced_to_its_file(spark, tmp_path, capsys):
    """Found by a longer fuzz run: this overwrite makes Spark's Parquet decoder fail inside a task
    with a bare ArrayIndexOutOfBoundsException, naming no file; the job finds the file itself."""
    from pyspark.sql import functions as F

    from recshard_stats import cli

    work = _workdir(tmp_path, "decoder")
    logs = work / "logs"
    logs.mkdir()
    (logs / "part-0.parquet").write_bytes(VALID_PARQUET)
    (logs / "part-1.parquet").write_bytes(_mutate("overwrite", 858, bytes.fromhex("f78f49dcbeb2c4d2")))
    with pytest.raises(Exception) as raw:  # the case is real: Spark alone does not say which file
        df = spark.read.parquet(str(logs / "part-1.parquet"))
        df.select(F.max(F.xxhash64(*df.columns))).collect()
    assert "ArrayIndexOutOfBoundsException" in str(raw.value) and "part-1" not in str(raw.value), (
        "this mutation no longer fails without a file name (new pyarrow or Spark?): pick another"
    )

    model = str(write_yaml(work / "m.yaml", PARQUET_MODEL))
    rc = cli.main(
        ["profile", "--model", model, "--input", str(logs), "--out", str(work / "out"), "--ds", "2026-12-01"]
    )
    stderr = capsys.readouterr().err
    assert_one_line_error(rc, stderr, "[input_corrupt] cannot read input file")
    assert re.search(r"^error: .*cannot read input file \S*/part-1.parquet \(corrupt", stderr, re.M), stderr
    assert not (work / "out" / "ds=2026-12-01").exists()

    stats = load_stats(run_profile(model, logs, work / "out", "2026-12-01", "--skip-corrupt-files"))
    assert [p.rsplit("/", 1)[1] for p in stats.metadata.skipped_files] == ["part-1.parquet"]
    assert stats.metadata.input_rows == 200
