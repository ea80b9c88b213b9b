"""spark-submit against a real Spark standalone cluster on loopback (master + 2 workers, started
from the pyspark package's own spark-class), with the package shipped as --py-files: the
statistics equal local mode's, also when a worker is killed mid-job. Every process started
here is stopped, whatever happens."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pyarrow.parquet as pq
import pytest

from recshard_stats.generate import generate
from recshard_stats.schemas import SMALL_TABLES
from tests.conftest import ROOT
from tests.helpers import SPEC, run_profile, write_yaml

pytestmark = pytest.mark.slow  # a standalone Spark cluster: minutes

BIN = ROOT / ".venv" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise TimeoutError(what)


def cluster_state(ui_port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as response:
            return json.loads(response.read())
    except OSError:
        return {}


class Cluster:
    def __init__(self, tmp):
        self.tmp = tmp
        self.port, self.ui = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(tmp),
            "SPARK_WORKER_DIR": str(tmp / "work"),
            "PYSPARK_PYTHON": sys.executable,
        }

    def _start(self, name, *args):
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115 (open for the process's lifetime)
        # own session: killing the group takes the worker's executor JVMs with it
        proc = subprocess.Popen(
            [str(BIN / "spark-class"), *args], env=self.env, stdout=log, stderr=log, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def start(self):
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui),
        )
        wait_for(lambda: cluster_state(self.ui), 60, "master UI")
        self.workers = [
            self._start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(free_port()),
            )
            for i in range(2)
        ]
        wait_for(
            lambda: len([w for w in cluster_state(self.ui).get("workers", []) if w["state"] == "ALIVE"]) == 2,
            90,
            "two workers",
        )

    @property
    def url(self):
        return f"spark://127.0.0.1:{self.port}"

    def kill(self, proc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self):
        for proc in self.procs:
            self.kill(proc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()
    assert all(p.poll() is not None for p in c.procs)


@pytest.fixture(scope="module")
def logs_and_local(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster_data")
    spec = write_yaml(root / "spec.yaml", SPEC)
    logs = generate(spec, root / "logs", 400_000, seed=5, chunk_rows=25_000, processes=1)
    local = run_profile(spec, logs, root / "local", "2026-12-01", "--row-counts")
    subprocess.run([str(ROOT / "scripts" / "build_pyfiles.sh")], check=True, capture_output=True)
    return spec, logs, local


def submit(cluster, spec, logs, out, wait=True):
    cmd = [
        str(BIN / "spark-submit"),
        "--master",
        cluster.url,
        "--py-files",
        str(ROOT / "dist" / "recshard_stats.zip"),
        "--conf",
        "spark.executor.memory=768m",
        "--conf",
        "spark.sql.shuffle.partitions=8",
        "--conf",
        "spark.task.maxFailures=8",
        "--conf",
        "spark.ui.enabled=false",
        str(ROOT / "jobs" / "profile_job.py"),
        "--model",
        str(spec),
        "--input",
        str(logs),
        "--out",
        str(out),
        "--ds",
        "2026-12-01",
        "--row-counts",
    ]
    proc = subprocess.Popen(
        cmd,
        env={**cluster.env, "PYSPARK_DRIVER_PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(cluster.tmp),
    )
    return (*proc.communicate(timeout=600), proc.returncode) if wait else proc


def same_statistics(a, b):
    for name in SMALL_TABLES:
        left, right = (pq.read_table(p / name).to_pandas().astype(str) for p in (a, b))
        left, right = (df.sort_values(list(df.columns)).reset_index(drop=True) for df in (left, right))
        assert len(left) > 0 or name == "rejects"
        assert left.equals(right), name
    rows = [
        pq.read_table(p / "row_counts")
        .to_pandas()
        .astype({"table": str})
        .sort_values(["table", "row"])
        .reset_index(drop=True)
        for p in (a, b)
    ]
    assert rows[0].equals(rows[1])
    meta = [json.loads((p / "metadata.json").read_text()) for p in (a, b)]
    assert meta[0]["num_samples"] == meta[1]["num_samples"] == 400_000


def test_cluster_profile_equals_local_mode(cluster, logs_and_local, tmp_path):
    spec, logs, local = logs_and_local
    output, _, code = submit(cluster, spec, logs, tmp_path)
    assert code == 0, output[-3000:]
    same_statistics(local, tmp_path / "ds=2026-12-01")


def test_worker_killed_mid_job_still_gives_identical_statistics(cluster, logs_and_local, tmp_path):
    spec, logs, local = logs_and_local
    proc = submit(cluster, spec, logs, tmp_path, wait=False)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        # the job logs this as its one pass over the input starts
        wait_for(lambda: any("aggregating" in line for line in lines), 400, "the profile's pass to start")
        time.sleep(3)
        assert proc.poll() is None, "the job finished before a worker could be killed"
        cluster.kill(cluster.workers[0])
        proc.wait(timeout=600)
        reader.join(timeout=30)
        output = "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert "lost" in output.lower(), "Spark never noticed the killed worker"
    same_statistics(local, tmp_path / "ds=2026-12-01")
