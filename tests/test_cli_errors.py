"""Every bad input, run through the ``recshard`` command line (in-process through ``cli.main``,
once through the installed console script): exit code 2 and one readable ``error: [reason] ...``
line (plus indented context), never a stack trace."""

import copy
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recshard_stats import cli
from helpers import assert_one_line_error, run_profile, write_yaml

RECSHARD = pathlib.Path(sys.executable).parent / "recshard"
MODEL = {"name": "c", "input": {"format": "criteo_tsv"},
         "features": [{"name": "C1", "type": "hex"}, {"name": "C2", "type": "hex"}],
         "tables": [{"name": "t1", "features": ["C1"], "hash_size": 100, "dim": 8},
                    {"name": "t2", "features": ["C2"], "hash_size": 100, "dim": 8}]}
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
    (root / "day.tsv").write_text("\n".join(tsv_line(c1=f"{i % 7:x}", c2=f"{i % 13:x}") for i in range(50)) + "\n")
    return run_profile(write_yaml(root / "model.yaml", MODEL), root / "day.tsv", root / "stats")


CONFIG_ERRORS = {
    "unknown feature": (changed(MODEL, ("tables", 1, "features"), ["C9"]), HARDWARE,
                        "table 't2': unknown feature 'C9'"),
    "unknown table": (changed(MODEL, ("tables",), MODEL["tables"] + [
        {"name": "t3", "features": ["C3"], "hash_size": 10, "dim": 8}]) | {
        "features": MODEL["features"] + [{"name": "C3", "type": "hex"}]}, HARDWARE, "have no table 't3'"),
    "hash_size zero": (changed(MODEL, ("tables", 0, "hash_size"), 0), HARDWARE,
                       "hash_size must be a positive integer, got 0"),
    "dim negative": (changed(MODEL, ("tables", 1, "dim"), -4), HARDWARE, "dim must be a positive integer, got -4"),
    "HBM below reserve": (MODEL, {k: v for k, v in HARDWARE.items() if k != "hbm_reserved_fraction"} | {
        "hbm_reserved_gib": 2}, "HBM per GPU (1 GiB) is not larger than the reserve kept for activations (2 GiB)"),
    "reserve fraction": (MODEL, HARDWARE | {"hbm_reserved_fraction": 1.0},
                         "hbm_reserved_fraction must be in [0, 1), got 1.0"),
    "misspelt table key": (changed(MODEL, ("tables", 0, "hash_fn"), "xxhash64"), HARDWARE,
                           "table 't1': unknown key 'hash_fn'; did you mean 'hash'?"),
    "misspelt top-level key": ({("inputs" if k == "input" else k): v for k, v in MODEL.items()}, HARDWARE,
                               "unknown key 'inputs'; did you mean 'input'?"),
    "misspelt hardware key": (MODEL, HARDWARE | {"batch_sise": 128}, "unknown key 'batch_sise'; did you mean "
                                                                      "'batch_size'?"),
    "hash_size too large": (changed(MODEL, ("tables", 0, "hash_size"), 2 ** 63), HARDWARE,
                            "hash_size 9223372036854775808 is above the largest supported"),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS)
def test_config_errors_from_the_cli(case, stats, tmp_path, capsys):
    model, hardware, expected = CONFIG_ERRORS[case]
    rc = cli.main(["solve", "--stats", str(stats), "--model", str(write_yaml(tmp_path / "m.yaml", model)),
                   "--hardware", str(write_yaml(tmp_path / "hw.yaml", hardware)), "--out", str(tmp_path / "manifests")])
    assert_one_line_error(rc, capsys.readouterr().err, expected)
    assert not (tmp_path / "manifests").exists()


SOLVER_OPTION_ERRORS = {
    "time limit": (["--time-limit", "-5"], "--time-limit must be positive, got -5.0"),
    "mip gap": (["--mip-gap", "-1"], "--mip-gap must be in [0, 1), got -1.0"),
    "segments": (["--cdf-segments", "0"], "--cdf-segments must be at least 1, got 0"),
    "bad ds": (["--ds", "../../x"], "ds '../../x' is not a date of the form YYYY-MM-DD"),
}


@pytest.mark.parametrize("case", SOLVER_OPTION_ERRORS)
def test_solver_options_are_range_checked(case, stats, tmp_path, capsys):
    extra, expected = SOLVER_OPTION_ERRORS[case]
    rc = cli.main(["solve", "--stats", str(stats), "--model", str(write_yaml(tmp_path / "m.yaml", MODEL)),
                   "--hardware", str(write_yaml(tmp_path / "hw.yaml", HARDWARE)), "--out", str(tmp_path / "m"),
                   *extra])
    assert_one_line_error(rc, capsys.readouterr().err, expected)
    assert not (tmp_path / "m").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["hw.yaml", "m.yaml"]


def test_config_error_stops_the_profile_before_spark_starts(tmp_path):
    model = write_yaml(tmp_path / "m.yaml", changed(MODEL, ("tables", 0, "hash_size"), -1))
    proc = subprocess.run([str(RECSHARD), "profile", "--model", str(model), "--input", str(tmp_path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, "table 't1': hash_size must be a positive integer, got -1")
    assert "Spark" not in proc.stderr


def corrupt_parquet(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    logs = root / "logs"
    logs.mkdir()
    pq.write_table(pa.table({"a": pa.array(range(100), pa.int64())}), logs / "part-0.parquet")
    (logs / "part-1.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    return ({"features": [{"name": "a", "type": "int64"}],
             "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}]}, logs)


def wrong_type_parquet(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    (root / "logs").mkdir()
    pq.write_table(pa.table({"a": pa.array(["x", "y"])}), root / "logs" / "p.parquet")
    return ({"features": [{"name": "a", "type": "int64"}],
             "tables": [{"name": "t", "features": ["a"], "hash_size": 10, "dim": 4}]}, root / "logs")


def empty_day(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    (root / "ds=2026-12-01").mkdir()
    (root / "ds=2026-12-01" / "_SUCCESS").write_text("")
    return MODEL, root / "ds=2026-12-01"


def rejected_rows(root: pathlib.Path) -> tuple[dict, pathlib.Path]:
    lines = [tsv_line()] * 5 + [tsv_line(fields=39)] * 2 + [tsv_line(c1="xyz")] * 3
    (root / "day.tsv").write_text("\n".join(lines) + "\n")
    return MODEL, root / "day.tsv"


INPUT_ERRORS = {
    "corrupt parquet": (corrupt_parquet, "[input_corrupt] cannot read input file", "part-1.parquet"),
    "wrong column type": (wrong_type_parquet, "[schema_mismatch]", "column 'a' has type string, model config "
                                                                   "says int64"),
    "empty day": (empty_day, "[input_missing]", "hold no data files"),
    "too many rejects": (rejected_rows, "[too_many_rejects]", "3 rejected values in column 'C1' out of 10 rows (30.00%)"),
}


@pytest.mark.parametrize("case", INPUT_ERRORS)
def test_input_errors_from_the_cli(case, spark, tmp_path, capsys):
    make, reason, detail = INPUT_ERRORS[case]
    model, inputs = make(tmp_path)
    rc = cli.main(["profile", "--model", str(write_yaml(tmp_path / "m.yaml", model)), "--input", str(inputs),
                   "--out", str(tmp_path / "stats"), "--ds", "2026-12-01"])
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
    rc = cli.main(["profile", "--model", str(write_yaml(tmp_path / "m.yaml", MODEL)), "--input", str(tmp_path),
                   "--out", str(out), "--ds", ds])
    assert_one_line_error(rc, capsys.readouterr().err, f"ds {ds!r} is not a date of the form YYYY-MM-DD")
    assert (victim / "keep.txt").read_text() == "mine" and not (tmp_path / "a").exists()
