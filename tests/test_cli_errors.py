"""Every bad input, run through the ``recshard`` command line (in-process through ``cli.main``,
once through the installed console script): exit code 2 and one readable ``error: [reason] ...``
line (plus indented context), never a stack trace."""

import copy
import os
import pathlib
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recshard_stats import cli
from tests.helpers import assert_one_line_error, run_profile, write_yaml

RECSHARD = pathlib.Path(sys.executable).parent / "recshard"
MODEL: dict[str, Any] = {
    "name": "c",
    "input": {"format": "criteo_tsv"},
    "features": [{"name": "C1", "type": "hex"}, {"name": "C2", "type": "hex"}],
    "tables": [
        {"name": "t1", "features": ["C1"], "hash_size": 100, "dim": 8},
        {"name": "t2", "features": ["C2"], "hash_size": 100, "dim": 8},
    ],
}
HARDWARE = {"num_gpus": 2, "hbm_per_gpu_gib": 1, "hbm_reserved_fraction": 0.1, "host_gib": 4}


def tsv_line(c1="0a", c2="ff", fields=40):
    return "\t".join((["1"] + [""] * 13 + [c1, c2] + [""] * 24)[:fields] + [""] * max(0, fields - 40))


def changed(base: dict, path: tuple, value) -> dict:
    data = copy.deepcopy(base)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.fixture(scope="module")
def stats(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "day.tsv").write_text(
        "\n".join(tsv_line(c1=f"{i % 7:x}", c2=f"{i % 13:x}") for i in range(50)) + "\n"
    )
    return run_profile(write_yaml(root / "model.yaml", MODEL), root / "day.tsv", root / "stats")


CONFIG_ERRORS: dict[str, tuple[dict, dict, str]] = {
    "unknown feature": (
        changed(MODEL, ("tables", 1, "features"), ["C9"]),
        HARDWARE,
        "table 't2': unknown feature 'C9'",
    ),
    "unknown table": (
        changed(
            MODEL,
            ("tables",),
            MODEL["tables"] + [{"name": "t3", "features": ["C3"], "hash_size": 10, "dim": 8}],
        )
        | {"features": MODEL["features"] + [{"name": "C3", "type": "hex"}]},
        HARDWARE,
        "have no table 't3'",
    ),
    "hash_size zero": (
        changed(MODEL, ("tables", 0, "hash_size"), 0),
        HARDWARE,
        "hash_size must be a positive integer, got 0",
    ),
    "dim negative": (
        changed(MODEL, ("tables", 1, "dim"), -4),
        HARDWARE,
        "dim must be a positive integer, got -4",
    ),
    "HBM below reserve": (
        MODEL,
        {k: v for k, v in HARDWARE.items() if k != "hbm_reserved_fraction"} | {"hbm_reserved_gib": 2},
        "HBM per GPU (1 GiB) is not larger than the reserve kept for activations (2 GiB)",
    ),
    "reserve fraction": (
        MODEL,
        HARDWARE | {"hbm_reserved_fraction": 1.0},
        "hbm_reserved_fraction must be in [0, 1), got 1.0",
    ),
    "misspelt table key": (
        changed(MODEL, ("tables", 0, "hash_fn"), "xxhash64"),
        HARDWARE,
        "table 't1': unknown key 'hash_fn'; did you mean 'hash'?",
    ),
    "misspelt top-level key": (
        {("inputs" if k == "input" else k): v for k, v in MODEL.items()},
        HARDWARE,
        "unknown key 'inputs'; did you mean 'input'?",
    ),
    "misspelt hardware key": (
        MODEL,
        HARDWARE | {"batch_sise": 128},
        "unknown key 'batch_sise'; did you mean 'batch_size'?",
    ),
    "hash_size too large": (
        changed(MODEL, ("tables", 0, "hash_size"), 2**63),
        HARDWARE,
        "hash_size 9223372036854775808 is above the largest supported",
    ),
    # names are paths and module names downstream: one rule, checked before anything is written
    "absolute table name": (
        changed(MODEL, ("tables", 0, "name"), "/abs/path/t"),
        HARDWARE,
        "table name '/abs/path/t' is not allowed",
    ),
    "escaping table name": (
        changed(MODEL, ("tables", 0, "name"), "../../../../escaped"),
        HARDWARE,
        "table name '../../../../escaped' is not allowed",
    ),
    "dotted table name": (
        changed(MODEL, ("tables", 0, "name"), "t.1"),
        HARDWARE,
        "table name 't.1' is not allowed",
    ),
    "reserved suffix": (
        changed(MODEL, ("tables", 0, "name"), "t1__hbm"),
        HARDWARE,
        "table name 't1__hbm' is not allowed",
    ),
    "feature name with a slash": (
        changed(changed(MODEL, ("features", 0, "name"), "C/1"), ("tables", 0, "features"), ["C/1"]),
        HARDWARE,
        "feature name 'C/1' is not allowed",
    ),
    "stats of another hash": (
        changed(MODEL, ("tables", 0, "hash"), "xxhash64"),
        HARDWARE,
        "were profiled with another model config: table 't1' as (features, hash, feature types) "
        "(('C1',), 'mod', ('hex',)), the model config as (('C1',), 'xxhash64', ('hex',))",
    ),
    "NaN bandwidth": (
        MODEL,
        HARDWARE | {"hbm_bandwidth_gbps": float("nan")},
        "must be a positive finite number, got nan",
    ),
    "infinite bandwidth": (
        MODEL,
        HARDWARE | {"uvm_bandwidth_gbps": float("inf")},
        "uvm_bandwidth_gbps must be a positive finite number, got inf",
    ),
    "NaN reserve": (
        MODEL,
        HARDWARE | {"hbm_reserved_fraction": float("nan")},
        "hbm_reserved_fraction must be in [0, 1), got nan",
    ),
    "3-byte weights": (
        MODEL,
        HARDWARE | {"bytes_per_element": 3},
        "bytes_per_element 3: the weights are fp32 (4) or fp16 (2)",
    ),
    "unknown optimizer": (
        MODEL,
        HARDWARE | {"optimizer": "adamw"},
        "optimizer 'adamw': one of sgd, rowwise_adagrad, adagrad, adam",
    ),
    "a state multiplier instead of the optimizer": (
        MODEL,
        HARDWARE | {"optimizer_state_multiplier": 2.0},
        "optimizer_state_multiplier 2.0 (with optimizer sgd): the state's size now follows from the optimizer",
    ),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS)
def test_config_errors_from_the_cli(case, stats, tmp_path, capsys):
    model, hardware, expected = CONFIG_ERRORS[case]
    rc = cli.main(
        [
            "solve",
            "--stats",
            str(stats),
            "--model",
            str(write_yaml(tmp_path / "m.yaml", model)),
            "--hardware",
            str(write_yaml(tmp_path / "hw.yaml", hardware)),
            "--out",
            str(tmp_path / "manifests"),
        ]
    )
    assert_one_line_error(rc, capsys.readouterr().err, expected)
    assert not (tmp_path / "manifests").exists()


SOLVER_OPTION_ERRORS = {
    "time limit": (
        ["--time-limit", "-5"],
        "--time-limit must be a positive finite number of seconds, got -5.0",
    ),
    "infinite time limit": (
        ["--time-limit", "inf"],
        "--time-limit must be a positive finite number of seconds, got inf",
    ),
    "NaN time limit": (
        ["--time-limit", "nan"],
        "--time-limit must be a positive finite number of seconds, got nan",
    ),
    "infinite search": (
        ["--local-search", "inf"],
        "--local-search must be 0 or more seconds (finite), got inf",
    ),
    "mip gap": (["--mip-gap", "-1"], "--mip-gap must be in [0, 1), got -1.0"),
    "segments": (["--cdf-segments", "0"], "--cdf-segments must be at least 1, got 0"),
    "bad ds": (["--ds", "../../x"], "ds '../../x' is not a date of the form YYYY-MM-DD"),
}


@pytest.mark.parametrize("case", SOLVER_OPTION_ERRORS)
def test_solver_options_are_range_checked(case, stats, tmp_path, capsys):
    extra, expected = SOLVER_OPTION_ERRORS[case]
    rc = cli.main(
        [
            "solve",
            "--stats",
            str(stats),
            "--model",
            str(write_yaml(tmp_path / "m.yaml", MODEL)),
            "--hardware",
            str(write_yaml(tmp_path / "hw.yaml", HARDWARE)),
            "--out",
            str(tmp_path / "m"),
            *extra,
        ]
    )
    assert_one_line_error(rc, capsys.readouterr().err, expected)
    assert not (tmp_path / "m").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "hw.yaml",
        "m.yaml",
    ]


def test_config_error_stops_the_profile_before_spark_starts(tmp_path):
    model = write_yaml(tmp_path / "m.yaml", changed(MODEL, ("tables", 0, "hash_size"), -1))
    proc = subprocess.run(
        [
            str(RECSHARD),
            "profile",
            "--model",
            str(model),
            "--input",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(
        proc.returncode, proc.stderr, "table 't1': hash_size must be a positive integer, got -1"
    )
    assert "Spark" not in proc.stderr


def corrupt_parquet(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    logs = root / "logs"
    logs.mkdir()
    pq.write_table(pa.table({"a": pa.array(range(100), pa.int64())}), logs / "part-0.parquet")
    (logs / "part-1.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    return (
        {
            "features": [{"name": "a", "type": "int64"}],
            "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}],
        },
        logs,
    )


def wrong_type_parquet(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    (root / "logs").mkdir()
    pq.write_table(pa.table({"a": pa.array(["x", "y"])}), root / "logs" / "p.parquet")
    return (
        {
            "features": [{"name": "a", "type": "int64"}],
            "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}],
        },
        root / "logs",
    )


def empty_day(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    (root / "ds=2026-12-01").mkdir()
    (root / "ds=2026-12-01" / "_SUCCESS").write_text("")
    return MODEL, root / "ds=2026-12-01"


def rejected_rows(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    lines = [tsv_line()] * 5 + [tsv_line(fields=39)] * 2 + [tsv_line(c1="xyz")] * 3
    (root / "day.tsv").write_text("\n".join(lines) + "\n")
    return MODEL, root / "day.tsv"


def all_null_parquet(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    (root / "logs").mkdir()
    pq.write_table(
        pa.table({"a": pa.array([None] * 20, pa.int64()), "b": pa.array([None] * 20, pa.string())}),
        root / "logs" / "p.parquet",
    )
    return (
        {
            "features": [{"name": "a", "type": "int64"}, {"name": "b", "type": "string"}],
            "tables": [
                {"name": "t", "features": ["a"], "hash_size": 10, "dim": 4},
                {"name": "u", "features": ["b"], "hash_size": 10, "dim": 4, "hash": "xxhash64"},
            ],
        },
        root / "logs",
    )


def null_array_ids(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    (root / "logs").mkdir()
    pq.write_table(
        pa.table(
            {
                "a": pa.array(range(20), pa.int64()),
                "h": pa.array([[None, None]] * 18 + [[1, 2]] * 2, pa.list_(pa.int64())),
            }
        ),
        root / "logs" / "p.parquet",
    )
    return (
        {
            "features": [{"name": "a", "type": "int64"}, {"name": "h", "type": "array<int64>"}],
            "tables": [
                {"name": "t", "features": ["a"], "hash_size": 10, "dim": 4},
                {"name": "u", "features": ["h"], "hash_size": 10, "dim": 4},
            ],
        },
        root / "logs",
    )


INPUT_ERRORS = {
    "all-null parquet": (
        all_null_parquet,
        "[input_missing]",
        "none of the 20 samples has an id in any of the 2 features (every value is null or empty)",
    ),
    "null array ids": (
        null_array_ids,
        "[too_many_rejects]",
        "36 of the 40 ids in column 'h' are null (90.00%)",
    ),
    "corrupt parquet": (corrupt_parquet, "[input_corrupt] cannot read input file", "part-1.parquet"),
    "wrong column type": (
        wrong_type_parquet,
        "[schema_mismatch]",
        "column 'a' has type string, model config says int64",
    ),
    "empty day": (empty_day, "[input_missing]", "hold no data files"),
    "too many rejects": (
        rejected_rows,
        "[too_many_rejects]",
        "3 rejected values in column 'C1' out of 10 rows (30.00%)",
    ),
}


@pytest.mark.parametrize("case", INPUT_ERRORS)
def test_input_errors_from_the_cli(case, spark, tmp_path, capsys):
    make, reason, detail = INPUT_ERRORS[case]
    model, inputs = make(tmp_path)
    rc = cli.main(
        [
            "profile",
            "--model",
            str(write_yaml(tmp_path / "m.yaml", model)),
            "--input",
            str(inputs),
            "--out",
            str(tmp_path / "stats"),
            "--ds",
            "2026-12-01",
        ]
    )
    stderr = capsys.readouterr().err
    assert_one_line_error(rc, stderr, reason)
    assert detail in stderr
    assert not (tmp_path / "stats" / "ds=2026-12-01").exists()


@pytest.mark.parametrize("ds", ["../../../victim", "2026-13-45", ""])
def test_a_run_key_that_is_not_a_date_touches_nothing(ds, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "a" / "b" / "stats"
    rc = cli.main(
        [
            "profile",
            "--model",
            str(write_yaml(tmp_path / "m.yaml", MODEL)),
            "--input",
            str(tmp_path),
            "--out",
            str(out),
            "--ds",
            ds,
        ]
    )
    assert_one_line_error(rc, capsys.readouterr().err, f"ds {ds!r} is not a date of the form YYYY-MM-DD")
    assert (victim / "keep.txt").read_text() == "mine" and not (tmp_path / "a").exists()


def _profile_args(tmp_path, model: dict, inputs, out) -> list[str]:
    return [
        "profile",
        "--model",
        str(write_yaml(tmp_path / "m.yaml", model)),
        "--input",
        str(inputs),
        "--out",
        str(out),
        "--ds",
        "2026-12-01",
    ]


@pytest.mark.parametrize("kind", ["file", "below a file"])
def test_an_out_that_cannot_be_written_fails_before_spark_reads_anything(kind, spark, tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "day.tsv").write_text(tsv_line() + "\n")
    (tmp_path / "taken").write_text("not a directory")
    out = tmp_path / "taken" if kind == "file" else tmp_path / "taken" / "stats"
    rc = cli.main(_profile_args(tmp_path, MODEL, tmp_path / "logs", out))
    stderr = capsys.readouterr().err
    assert_one_line_error(rc, stderr, "[output_invalid]")
    assert ("is a file, not a directory" if kind == "file" else "cannot write in --out") in stderr
    assert "profile: aggregating" not in stderr  # refused before the aggregation
    assert (tmp_path / "taken").read_text() == "not a directory"


def test_generate_refuses_to_replace_a_file(tmp_path, capsys):
    from tests.helpers import SPEC

    (tmp_path / "logs").write_text("keep me")
    rc = cli.main(
        [
            "generate",
            "--spec",
            str(write_yaml(tmp_path / "spec.yaml", SPEC)),
            "--samples",
            "10",
            "--out",
            str(tmp_path / "logs"),
        ]
    )
    assert_one_line_error(rc, capsys.readouterr().err, "[output_invalid] --out")
    assert (tmp_path / "logs").read_text() == "keep me"


@pytest.mark.slow
def test_empty_files_and_notes_beside_the_logs_are_left_out_by_name(spark, tmp_path):
    """A zero-byte file and a README in the log directory: left out, named in the metadata, and
    the statistics are those of the logs alone."""
    import json

    from recshard_stats.stats_reader import load_stats

    model = write_yaml(tmp_path / "m.yaml", MODEL)
    clean, messy = tmp_path / "clean", tmp_path / "messy"
    for d in (clean, messy):
        d.mkdir()
        (d / "day.tsv").write_text("\n".join(tsv_line(c1=f"{i % 5:x}") for i in range(30)) + "\n")
    (messy / "README").write_text("Criteo day 0, copied 2026-12-01\nsee the wiki\n")
    (messy / "part-empty.tsv").write_bytes(b"")
    (messy / "schema.json").write_text('{"columns": 40}\n')
    expected = load_stats(run_profile(model, clean, tmp_path / "s1"))
    got = load_stats(run_profile(model, messy, tmp_path / "s2"))
    for table in ("features", "tables", "count_of_counts", "rejects"):
        assert got.rows(table) == expected.rows(table), table
    metadata = json.loads((got.path / "metadata.json").read_text())
    assert [p.rsplit("/", 1)[-1] for p in metadata["skipped_files"]] == ["part-empty.tsv"]
    assert sorted(p.rsplit("/", 1)[-1] for p in metadata["ignored_files"]) == ["README", "schema.json"]
    assert got.metadata.input_rows == 30


def test_a_killed_runs_temporary_directory_is_removed_by_the_next_run(spark, tmp_path):
    import os
    import time

    model = write_yaml(tmp_path / "m.yaml", MODEL)
    (tmp_path / "day.tsv").write_text(tsv_line() + "\n")
    out = tmp_path / "stats"
    old, young = out / "_tmp-ds=2026-12-01-dead", out / "_tmp-ds=2026-12-01-running"
    other_day = out / "_tmp-ds=2026-11-30-dead"
    for d in (old, young, other_day):
        (d / "features").mkdir(parents=True)
    week_ago = time.time() - 7 * 86400
    for d in (old, other_day):
        os.utime(d, (week_ago, week_ago))
    run_profile(model, tmp_path / "day.tsv", out)
    assert not old.exists()  # this day's, killed long ago
    assert young.exists()  # may be a concurrent run's
    assert other_day.exists()  # another day's run cleans its own
    assert (out / "ds=2026-12-01" / "_SUCCESS").exists()


@pytest.mark.slow
def test_a_corrupt_file_is_one_line_without_javas_stack_trace(tmp_path):
    """Through the console script, Spark started by it: Spark's log goes to a file, the console
    has recshard's line. The file rolls at its size (4 kB here, 64 MB by default), two old
    ones kept."""
    model, logs = corrupt_parquet(tmp_path)
    spark_log = tmp_path / "spark.log"
    proc = subprocess.run(
        [
            str(RECSHARD),
            "profile",
            "--model",
            str(write_yaml(tmp_path / "m.yaml", model)),
            "--input",
            str(logs),
            "--out",
            str(tmp_path / "stats"),
            "--ds",
            "2026-12-01",
            "--master",
            "local[1]",
            "--spark-log",
            str(spark_log),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAVA_TOOL_OPTIONS": "-Drecshard.spark.log.size=4KB"},
    )
    assert_one_line_error(proc.returncode, proc.stderr, "[input_corrupt] cannot read input file")
    assert not [line for line in proc.stderr.splitlines() if line.lstrip().startswith("at ")], proc.stderr
    assert len(proc.stderr.splitlines()) < 25, proc.stderr
    logs_kept = sorted(tmp_path.glob("spark.log*"))
    assert [p.name for p in logs_kept] == ["spark.log", "spark.log.1", "spark.log.2"]
    # each file rolled once it passed the size (by at most the line, a stack trace, that crossed it)
    assert all(p.stat().st_size < 4 * 1024 + 64 * 1024 for p in logs_kept)
    assert any(p.stat().st_size >= 4 * 1024 for p in logs_kept[1:])
    text = "".join(p.read_text() for p in logs_kept)
    assert "part-1.parquet" in text  # the whole story is in Spark's log


def test_a_key_given_twice_in_a_yaml_config_is_refused(stats, tmp_path, capsys):
    model = tmp_path / "m.yaml"
    write_yaml(model, MODEL)
    hardware = tmp_path / "hw.yaml"
    write_yaml(hardware, HARDWARE)
    hardware.write_text(hardware.read_text() + "num_gpus: 64\n")  # the last would win silently
    rc = cli.main(
        [
            "solve",
            "--stats",
            str(stats),
            "--model",
            str(model),
            "--hardware",
            str(hardware),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert_one_line_error(rc, capsys.readouterr().err, "key 'num_gpus' is given twice")


SPARK_OPTION_ERRORS = {
    "master": (["--master", "bogus://x"], "--master 'bogus://x' is not a Spark master URL"),
    "driver memory": (["--driver-memory", "4x"], "--driver-memory '4x' is not a JVM memory size"),
    "spark log": (["--spark-log", "{taken}/spark.log"], "--spark-log {taken}/spark.log: cannot write there"),
}


@pytest.mark.parametrize("case", SPARK_OPTION_ERRORS)
def test_spark_options_are_checked_before_spark_starts(case, tmp_path, capsys):
    """What Spark would refuse only after starting its JVM (a Java gateway trace, or log4j's
    own trace on the console) is one line before it starts."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "day.tsv").write_text(tsv_line() + "\n")
    taken = tmp_path / "taken"
    taken.write_text("a file")
    flags, expected = SPARK_OPTION_ERRORS[case]
    args = _profile_args(tmp_path, MODEL, tmp_path / "logs", tmp_path / "stats")
    rc = cli.main(args + [flag.format(taken=taken) for flag in flags])
    assert_one_line_error(rc, capsys.readouterr().err, expected.format(taken=taken))
    assert not (tmp_path / "stats").exists()


def test_solve_into_a_file_is_refused_before_the_solve(stats, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    args = ["solve", "--stats", str(stats), "--model", str(write_yaml(tmp_path / "m.yaml", MODEL))]
    args += ["--hardware", str(write_yaml(tmp_path / "hw.yaml", HARDWARE)), "--out", str(taken)]
    rc = cli.main(args)
    stderr = capsys.readouterr().err
    assert_one_line_error(rc, stderr, f"--out {taken} is a file, not a directory")
    assert "solving" not in stderr and taken.read_text() == "a file"


def test_a_failure_inside_spark_is_its_root_cause_in_one_line(spark, capsys):
    """A Java exception through Py4J (what a full disk under a Spark write raises) and a failed
    Spark job: the root cause's first line, not Py4J's trace."""
    jvm = spark.sparkContext._jvm
    rc = cli.run_main(lambda: jvm.java.lang.Long.parseLong("4x"))
    assert_one_line_error(
        rc, capsys.readouterr().err, '[spark_failed] java.lang.NumberFormatException: For input string: "4x"'
    )
    rc = cli.run_main(lambda: spark.range(2).rdd.map(lambda row: 1 // 0).collect())
    stderr = capsys.readouterr().err
    assert_one_line_error(rc, stderr, "[spark_failed]")
    assert "ZeroDivisionError" in stderr or "PythonException" in stderr
    assert len(stderr.splitlines()) == 1, stderr


def test_leftovers_hidden_directories_and_link_loops_are_not_read(spark, tmp_path):
    """Parquet logs (the default arrow reader) beside a failed writer's ``_temporary/`` and
    ``.staging/``, a ``.bak`` copy and a link back to their own directory: the statistics are
    those of the logs alone (each sample read once), the ``.bak`` named as not a log."""
    import json
    import shutil

    from recshard_stats.generate import generate
    from recshard_stats.stats_reader import load_stats
    from tests.helpers import SPEC

    model = write_yaml(tmp_path / "spec.yaml", SPEC)
    clean = generate(model, tmp_path / "clean", 2000, seed=3, chunk_rows=500, processes=1)
    messy = tmp_path / "messy"
    shutil.copytree(clean, messy)
    part = sorted(messy.glob("*.parquet"))[0]
    for leftover in (messy / "_temporary" / "0", messy / ".staging"):
        leftover.mkdir(parents=True)
        shutil.copy(part, leftover / part.name)
    shutil.copy(part, messy / f"{part.name}.bak")
    (messy / "loop").symlink_to(messy, target_is_directory=True)
    expected = load_stats(run_profile(model, clean, tmp_path / "s1"))
    got = load_stats(run_profile(model, messy, tmp_path / "s2"))
    assert got.metadata.input_rows == expected.metadata.input_rows == 2000
    for table in ("features", "tables", "count_of_counts"):
        assert got.rows(table) == expected.rows(table), table
    ignored = json.loads((got.path / "metadata.json").read_text())["ignored_files"]
    assert [p.rsplit("/", 1)[-1] for p in ignored] == [f"{part.name}.bak"]


def test_a_csv_file_whose_header_orders_the_columns_differently_is_named(spark, tmp_path, capsys):
    """Two CSV files of one day, the second with its columns in another order: an error naming
    that file, never its columns read under the first file's header."""
    model = {
        "name": "csv",
        "input": {"format": "csv", "separator": ","},
        "features": [{"name": "a", "type": "string"}, {"name": "b", "type": "string"}],
        "tables": [
            {"name": "ta", "features": ["a"], "hash_size": 100, "dim": 8, "hash": "xxhash64"},
            {"name": "tb", "features": ["b"], "hash_size": 100, "dim": 8, "hash": "xxhash64"},
        ],
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "part-0.csv").write_text("a,b\nx,1\ny,2\n")
    (logs / "part-1.csv").write_text("b,a\n3,z\n4,w\n")
    rc = cli.main(_profile_args(tmp_path, model, logs, tmp_path / "stats"))
    stderr = capsys.readouterr().err
    assert_one_line_error(rc, stderr, "[schema_mismatch]")
    assert "part-1.csv" in stderr and "header" in stderr
    assert not (tmp_path / "stats" / "ds=2026-12-01").exists()


def test_a_feature_absent_from_every_row_is_warned_about(spark, tmp_path, caplog):
    (tmp_path / "day.tsv").write_text("\n".join(tsv_line(c1=f"{i % 5:x}", c2="") for i in range(20)) + "\n")
    with caplog.at_level("WARNING"):
        run_profile(write_yaml(tmp_path / "m.yaml", MODEL), tmp_path / "day.tsv", tmp_path / "stats")
    warned = [r.getMessage() for r in caplog.records if "coverage 0" in r.getMessage()]
    assert warned == [
        "feature C2 has no id in any of the 20 samples (coverage 0): is its column named right in the "
        "model config, and is it logged?"
    ]


def test_local_mode_gets_half_of_the_machines_memory_unless_told():
    """Spark's own 1g default starved the 10^7-sample profile (BENCHMARKS.md, issue 28)."""
    import pathlib

    from recshard_stats.spark_io import local_driver_memory

    meminfo = pathlib.Path("/proc/meminfo")
    if not meminfo.is_file():
        pytest.skip("no /proc/meminfo to check against")
    total_kib = int(
        next(line for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")).split()[1]
    )
    given = local_driver_memory()
    assert given.endswith("g") and abs(int(given[:-1]) - total_kib / 2**20 / 2) <= 1
