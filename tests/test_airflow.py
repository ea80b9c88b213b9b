"""The daily DAG with a real Airflow (its own venv, made by scripts/setup.sh): DagBag import and
`airflow dags test` end to end on generated logs, Spark in local mode."""

import json
import os
import shlex
import subprocess

import pytest
import yaml

from recshard_stats.generate import generate
from recshard_stats.manifest_publisher import load_latest
from tests.conftest import ROOT

AIRFLOW_PY = ROOT / ".venv-airflow" / "bin" / "python"
AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"
pytestmark = [
    pytest.mark.slow,  # Airflow's own venv, db migrate and two `dags test` runs: minutes
    pytest.mark.skipif(not AIRFLOW.exists(), reason="no .venv-airflow: run scripts/setup.sh"),
]


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    data = tmp_path_factory.mktemp("airflow_data")
    defaults = yaml.safe_load((ROOT / "conf" / "airflow.yaml").read_text())
    conf = data / "airflow.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                **defaults,
                "retries": 0,
                "time_limit": 30,
                "logs_wait_hours": 1,
                "logs_root": str(data / "logs"),
                "stats_root": "/nowhere",
            }
        )
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "airflow_dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "RECSHARD_AIRFLOW_CONF": str(conf),
        # a Variable overrides the file's setting
        "AIRFLOW_VAR_RECSHARD_STATS_ROOT": str(data / "stats"),
        "AIRFLOW_VAR_RECSHARD_MANIFESTS_ROOT": str(data / "manifests"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }
    subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env, data


def test_dagbag_imports_with_expected_graph(airflow_env):
    env, _ = airflow_env
    script = (
        "import json; from airflow.dag_processing.dagbag import DagBag; "
        f"b = DagBag(dag_folder={str(ROOT / 'airflow_dags')!r}); d = b.get_dag('recshard_daily'); "
        "print(json.dumps({'errors': {k: str(v) for k, v in b.import_errors.items()}, "
        "'edges': {t.task_id: sorted(t.downstream_task_ids) for t in d.tasks}, "
        "'retries': d.default_args['retries']}))"
    )
    out = subprocess.run(
        [str(AIRFLOW_PY), "-c", script], env=env, check=True, capture_output=True, text=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["edges"] == {
        "wait_for_logs": ["profile"],
        "profile": ["solve"],
        "solve": ["remap"],
        "remap": ["validate"],
        "validate": ["publish"],
        "publish": [],
    }
    assert result["retries"] == 0


def test_the_sensors_timeout_names_the_marker_it_waited_for(airflow_env, tmp_path):
    """The DAG's own sensor class, run in poke mode with a second's timeout on a day whose logs
    never land: the timeout names the ``_SUCCESS`` path."""
    env, _ = airflow_env
    marker = tmp_path / "logs" / "ds=2026-12-01" / "_SUCCESS"
    script = (
        "import sys; from airflow.dag_processing.dagbag import DagBag; "
        f"d = DagBag(dag_folder={str(ROOT / 'airflow_dags')!r}).get_dag('recshard_daily'); "
        "t = d.get_task('wait_for_logs'); "
        f"s = type(t)(task_id='w', python_callable=t.python_callable, op_kwargs={{'marker': {str(marker)!r}}}, "
        "timeout=1, poke_interval=0.2, mode='poke')\n"
        "try:  # a non-empty context: PythonSensor merges op_kwargs into it\n    s.execute({'ds': '2026-12-01'})\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    out = subprocess.run(
        [str(AIRFLOW_PY), "-c", script], env=env, check=True, capture_output=True, text=True, timeout=120
    )
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("AirflowSensorTimeout Sensor has timed out"), out.stdout + out.stderr
    assert last.endswith(f"{marker} never appeared: the day's logs have not landed")


def test_dags_test_publishes_a_validated_manifest(airflow_env):
    env, data = airflow_env
    generate(ROOT / "conf" / "synthetic.yaml", data / "logs" / "ds=2026-12-01", 30_000, seed=3, processes=1)
    run = subprocess.run(
        [str(AIRFLOW), "dags", "test", "recshard_daily", "2026-12-01"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for task in ("wait_for_logs", "profile", "solve", "remap", "validate", "publish"):
        assert f"end task task_id={task}" in run.stdout + run.stderr
    manifest = load_latest(data / "manifests", model=ROOT / "conf" / "synthetic.yaml")
    assert manifest.path.parent.name.startswith("ds=2026-12-01-")  # the published snapshot
    assert manifest.path.read_bytes() == (data / "manifests" / "ds=2026-12-01" / "manifest.json").read_bytes()
    assert manifest.manifest.ds == "2026-12-01"
    assert (
        json.loads((data / "stats" / "ds=2026-12-01" / "metadata.json").read_text())["num_samples"] == 30_000
    )
    assert all(t.remap is not None for t in manifest.manifest.tables)
    # idempotent: a re-run of the day replaces its outputs and publishes again
    first = (data / "manifests" / "latest.json").read_text()
    rerun = subprocess.run(
        [str(AIRFLOW), "dags", "test", "recshard_daily", "2026-12-01"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert (
        json.loads((data / "manifests" / "latest.json").read_text())["sha256"] != json.loads(first)["sha256"]
    )
    load_latest(data / "manifests")
    # no temp copy left; the lock files stay (an OS lock on them is what is held, never the file)
    assert sorted(p.name for p in (data / "manifests").iterdir()) == [
        "_lock-ds=2026-12-01",
        "_lock-publish",
        "ds=2026-12-01",
        "latest.json",
        "published",
    ]


def test_a_runs_conf_beats_a_variable_which_beats_the_file(airflow_env):
    """What conf/airflow.yaml documents, rendered by Airflow's own Jinja environment for the DAG:
    the run's conf, else Variable recshard_<key>, else the file's default."""
    env, _ = airflow_env
    script = """
import json, types
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=DAG_FOLDER).get_dag("recshard_daily")
task = dag.get_task("solve")
params = {k: p.value for k, p in dag.params.items()}
out = {}
for name, conf, variables in (("file", {}, {}), ("variable", {}, {"recshard_solver": "glpk"}),
                              ("run", {"solver": "highs"}, {"recshard_solver": "glpk"})):
    context = {"dag_run": types.SimpleNamespace(conf=conf), "var": {"value": variables}, "params": params,
               "ds": "2026-12-01", "ti": types.SimpleNamespace(xcom_pull=lambda task_ids: "")}
    out[name] = task.render_template(task.bash_command, context, jinja_env=dag.get_template_env())
print(json.dumps(out))
""".replace("DAG_FOLDER", repr(str(ROOT / "airflow_dags")))
    out = subprocess.run(
        [str(AIRFLOW_PY), "-c", script], env=env, check=True, capture_output=True, text=True, timeout=120
    )
    rendered = json.loads(out.stdout.strip().splitlines()[-1])
    assert "--solver cbc " in rendered["file"]  # the file's (test copy's) default
    assert "--solver glpk " in rendered["variable"]
    assert "--solver highs " in rendered["run"]
    assert "--ds 2026-12-01 " in rendered["run"] and "--time-limit 30" in rendered["run"]


def test_a_runs_conf_is_one_quoted_argument_and_checked_against_its_schema(airflow_env, tmp_path):
    """Command injection through a run's conf: the rendered command holds the value as one word,
    and `airflow dags test` with it refuses the run (the Param's schema) before any task runs."""
    env, _ = airflow_env
    marker = tmp_path / "injected"
    evil = f"cbc; touch {marker}; echo"
    script = """
import json, types
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=DAG_FOLDER).get_dag("recshard_daily")
params = {k: p.value for k, p in dag.params.items()}
context = {"dag_run": types.SimpleNamespace(conf={"solver": EVIL, "model": "a b/$(touch X).yaml"}),
           "var": {"value": {}}, "params": params, "ds": "2026-12-01",
           "ti": types.SimpleNamespace(xcom_pull=lambda task_ids: "/m/it's here/manifest.json")}
print(json.dumps({t: dag.get_task(t).render_template(dag.get_task(t).bash_command, context,
                  jinja_env=dag.get_template_env()) for t in ("solve", "validate", "publish")}))
""".replace("DAG_FOLDER", repr(str(ROOT / "airflow_dags"))).replace("EVIL", repr(evil))
    out = subprocess.run(
        [str(AIRFLOW_PY), "-c", script], env=env, check=True, capture_output=True, text=True, timeout=120
    )
    rendered = json.loads(out.stdout.strip().splitlines()[-1])
    words = shlex.split(rendered["solve"])
    assert words[words.index("--solver") + 1] == evil  # one argument, not shell syntax
    assert words[words.index("--model") + 1] == "a b/$(touch X).yaml"
    for task in ("validate", "publish"):
        words = shlex.split(rendered[task])
        assert words[words.index("--manifest") + 1] == "/m/it's here/manifest.json"

    run = subprocess.run(
        [str(AIRFLOW), "dags", "test", "recshard_daily", "2026-12-02", "-c", json.dumps({"solver": evil})],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert "solver" in run.stdout + run.stderr and "is not one of" in run.stdout + run.stderr
    assert not marker.exists()
