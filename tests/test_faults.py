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
