"""No loss under faults: a profile killed mid-write leaves no partial partition, a re-run
publishes a complete one, and two runs of the same day cannot corrupt each other."""

import os
import signal
import subprocess
import time

import pytest

from recshard_stats.generate import generate
from recshard_stats.stats_reader import load_stats
from tests.conftest import ROOT
from tests.helpers import SPEC, write_yaml

pytestmark = pytest.mark.slow  # kills and races real profile runs: minutes

RECSHARD = str(ROOT / ".venv" / "bin" / "recshard")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault_logs")
    spec = write_yaml(root / "spec.yaml", SPEC)
    return spec, generate(spec, root / "logs", 200_000, seed=9, chunk_rows=20_000, processes=1)


def profile_cmd(spec, logs, out):
    return [
        RECSHARD,
        "profile",
        "--model",
        str(spec),
        "--input",
        str(logs),
        "--out",
        str(out),
        "--ds",
        "2026-12-01",
        "--row-counts",
        "--master",
        "local[1]",
    ]


def test_killed_mid_write_leaves_no_partial_partition_and_rerun_completes(logs, tmp_path):
    spec, data = logs
    proc = subprocess.Popen(
        profile_cmd(spec, data, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while (
            not any(p.name.startswith("_tmp-ds=") for p in tmp_path.iterdir()) if tmp_path.exists() else True
        ):
            assert time.time() < deadline and proc.poll() is None, "the job ended before it started writing"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the Python driver and its JVM, mid-write
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    partition = tmp_path / "ds=2026-12-01"
    assert not partition.exists() or (partition / "_SUCCESS").exists()
    assert any(p.name.startswith("_tmp-ds=") for p in tmp_path.iterdir())  # the debris readers ignore
    subprocess.run(profile_cmd(spec, data, tmp_path), check=True, capture_output=True, timeout=600)
    stats = load_stats(partition)
    assert stats.metadata.num_samples == 200_000


def test_concurrent_runs_of_one_day_do_not_corrupt_each_other(logs, tmp_path):
    spec, data = logs
    runs = [
        subprocess.Popen(
            profile_cmd(spec, data, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [r.communicate(timeout=600)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outputs
    partition = tmp_path / "ds=2026-12-01"
    stats = load_stats(partition)
    assert stats.metadata.num_samples == 200_000
    # one run's files only: no nested partition, no leftovers, no lock
    assert sorted(p.name for p in partition.iterdir() if p.is_dir()) == sorted(
        ["access_cdf", "count_of_counts", "features", "pooling_histogram", "rejects", "row_counts", "tables"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds=2026-12-01"]


def test_a_swap_that_dies_between_its_renames_leaves_a_loadable_and_recoverable_plan(tmp_path, monkeypatch):
    """The injected fault: the old directory moved aside, then death before the new one moves in.
    Readers still load the published plan; the next writer puts it back before its own swap."""
    import dataclasses
    import pathlib

    from recshard_stats.atomic import building_dir, recover_dir
    from recshard_stats.manifest import Manifest
    from recshard_stats.manifest_loader import MANIFEST_NAME, load_manifest

    base = Manifest.from_json((ROOT / "tests" / "data" / "manifest_v1_2b2c487.json").read_text())
    text = dataclasses.replace(
        base, tables=tuple(dataclasses.replace(t, remap=None) for t in base.tables)
    ).to_json()
    target = tmp_path / "ds=2026-12-01"
    with building_dir(target) as tmp:
        (tmp / MANIFEST_NAME).write_text(text)
    published = load_manifest(target).manifest

    real_rename = pathlib.Path.rename
    calls = []

    def dies_on_the_second_rename(self, to):
        calls.append(self)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        return real_rename(self, to)

    monkeypatch.setattr(pathlib.Path, "rename", dies_on_the_second_rename)
    try:
        with building_dir(target) as tmp:
            (tmp / MANIFEST_NAME).write_text("the new plan")
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(pathlib.Path, "rename", real_rename)
    assert not target.exists()  # the fault happened where it was injected
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["_old"]
    assert load_manifest(target).manifest == published  # readers get the published plan
    assert load_manifest(target / MANIFEST_NAME).manifest == published
    recover_dir(target)  # what the next writer does first
    assert [p.name for p in tmp_path.iterdir()] == ["ds=2026-12-01"]
    assert load_manifest(target).manifest == published


KILLED_WRITER = """
import os, pathlib, signal, sys
from recshard_stats.atomic import building_dir
with building_dir(pathlib.Path(sys.argv[1])) as tmp:
    (tmp / "half.parquet").write_text("half a copy")
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 mid-write: no cleanup runs
"""


def test_a_killed_writers_half_copy_is_removed_by_the_next_writer(tmp_path):
    """``kill -9`` during a directory swap (what a killed remap does) leaves its ``_tmp-*`` half
    copy; the next writer of the same target removes it (its process is gone) and leaves a live
    writer's, and another host's young one, alone."""
    import socket
    import sys

    from recshard_stats.atomic import building_dir

    target = tmp_path / "ds=2026-12-01"
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], cwd=ROOT)
    assert killed.returncode == -signal.SIGKILL
    (left,) = tmp_path.glob("_tmp-ds=2026-12-01-*")
    assert (left / "half.parquet").exists() and not target.exists()
    live = tmp_path / f"_tmp-ds=2026-12-01-{socket.gethostname()}.{os.getpid()}-{'a' * 32}"
    elsewhere = tmp_path / f"_tmp-ds=2026-12-01-otherhost.1-{'b' * 32}"
    old = tmp_path / f"_tmp-ds=2026-12-01-otherhost.2-{'c' * 32}"
    for entry in (live, elsewhere, old):
        entry.mkdir()
    os.utime(old, (time.time() - 7 * 3600,) * 2)  # untouched for 7 hours: a killed run's anywhere
    with building_dir(target) as tmp:
        (tmp / "manifest.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ds=2026-12-01", live.name, elsewhere.name])


HOLDER = """
import sys, time
from recshard_stats.atomic import output_lock
with output_lock(sys.argv[1], "recshard run --out " + sys.argv[2]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_run_on_the_same_output_is_refused_naming_the_first(tmp_path, capsys):
    """Two `recshard run --out X` at once: the second fails at once in one line naming the run
    that holds X (its pid), touching nothing; the lock dies with its holder (kill -9)."""
    import sys

    from recshard_stats import cli
    from tests.helpers import assert_one_line_error

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out / "_lock-run"), str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rc = cli.main(["run", "--out", str(out), "--samples", "1000"])
        assert_one_line_error(
            rc,
            capsys.readouterr().err,
            f"{out} is being written by recshard run --out {out} (pid {holder.pid} on",
        )
        assert sorted(p.name for p in out.iterdir()) == ["_lock-run"]  # nothing generated or written
    finally:
        holder.kill()
        holder.wait()
    from recshard_stats.atomic import output_lock

    with output_lock(out / "_lock-run", "the next run"):  # a killed holder's lock is free again
        pass
