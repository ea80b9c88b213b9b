"""The daily DAG with a real Airflow (its own venv, made by scripts/setup.sh): DagBag import and
`airflow dags test` end to end on generated logs, Spark in local mode."""

import json
import os
import subprocess

import pytest
import yaml

from recshard_stats.generate import generate
from recshard_stats.manifest import load_latest
from tests.conftest import ROOT

AIRFLOW_PY = ROOT / ".venv-airflow" / "bin" / "python"
AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"
pytestmark = pytest.mark.skipif(not AIRFLOW.exists(), reason="no .venv-airflow: run scripts/setup.sh")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    data = tmp_path_factory.mktemp("airflow_data")
    defaults = yaml.safe_load((ROOT / "conf" / "airflow.yaml").read_text())
    conf = data / "airflow.yaml"
    conf.write_text(yaml.safe_dump({**defaults, "retries": 0, "time_limit": 30, "logs_wait_hours": 1,
                                    "logs_root": str(data / "logs"), "stats_root": "/nowhere"}))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "airflow_dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "RECSHARD_AIRFLOW_CONF": str(conf),
           # a Variable overrides the file's setting
           "AIRFLOW_VAR_RECSHARD_STATS_ROOT": str(data / "stats"),
           "AIRFLOW_VAR_RECSHARD_MANIFESTS_ROOT": str(data / "manifests"),
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
           "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env, data


def test_dagbag_imports_with_expected_graph(airflow_env):
    env, _ = airflow_env
    script = ("import json; from airflow.dag_processing.dagbag import DagBag; "
              f"b = DagBag(dag_folder={str(ROOT / 'airflow_dags')!r}); d = b.get_dag('recshard_daily'); "
              "print(json.dumps({'errors': {k: str(v) for k, v in b.import_errors.items()}, "
              "'edges': {t.task_id: sorted(t.downstream_task_ids) for t in d.tasks}, "
              "'retries': d.default_args['retries']}))")
    out = subprocess.run([str(AIRFLOW_PY), "-c", script], env=env, check=True, capture_output=True, text=True,
                         timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["edges"] == {"wait_for_logs": ["profile"], "profile": ["solve"], "solve": ["remap"],
                               "remap": ["validate"], "validate": ["publish"], "publish": []}
    assert result["retries"] == 0


def test_dags_test_publishes_a_validated_manifest(airflow_env):
    env, data = airflow_env
    generate(ROOT / "conf" / "synthetic.yaml", data / "logs" / "ds=2026-12-01", 30_000, seed=3, processes=1)
    run = subprocess.run([str(AIRFLOW), "dags", "test", "recshard_daily", "2026-12-01"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for task in ("wait_for_logs", "profile", "solve", "remap", "validate", "publish"):
        assert f"end task task_id={task}" in run.stdout + run.stderr
    manifest = load_latest(data / "manifests", model=ROOT / "conf" / "synthetic.yaml")
    assert manifest.path == (data / "manifests" / "ds=2026-12-01" / "manifest.json").resolve()
    assert manifest.data["ds"] == "2026-12-01"
    assert json.loads((data / "stats" / "ds=2026-12-01" / "metadata.json").read_text())["num_samples"] == 30_000
    assert all(t.remap_path is not None for t in manifest.tables.values())
    # idempotent: a re-run of the day replaces its outputs and publishes again
    first = (data / "manifests" / "latest.json").read_text()
    rerun = subprocess.run([str(AIRFLOW), "dags", "test", "recshard_daily", "2026-12-01"], env=env,
                           capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert json.loads((data / "manifests" / "latest.json").read_text())["sha256"] != json.loads(first)["sha256"]
    load_latest(data / "manifests")
    assert sorted(p.name for p in (data / "manifests").iterdir()) == ["ds=2026-12-01", "latest.json"]
