"""The daily DAG with a real Airflow (its own venv, made by scripts/setup.sh): DagBag import and
`airflow dags test` end to end on generated logs, Spark in local mode."""

import json
import os
import shlex
import subprocess

import pytest
import yaml

from recshard_stats.drift import load_drift
from recshard_stats.generate import generate
from recshard_stats.manifest_publisher import load_latest
from recshard_stats.options import SyntheticDrift
from recshard_stats.stats_reader import load_stats
from tests.conftest import ROOT

AIRFLOW_PY = ROOT / ".venv-airflow" / "bin" / "python"
AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"
pytestmark = [
    pytest.mark.slow,  # Airflow's own venv, db migrate and four `dags test` runs: minutes
    pytest.mark.skipif(not AIRFLOW.exists(), reason="no .venv-airflow: run scripts/setup.sh"),
]


# the DAG's tasks, in their one order
TASKS = (
    "wait_for_logs",
    "profile",
    "window",
    "drift",
    "solve",
    "remap",
    "validate",
    "evaluate",
    "publish",
    "report",
)


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
                "time_limit": 10,  # the DAG is under test, not the plan: a short solve
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
        "AIRFLOW_VAR_RECSHARD_WINDOWS_ROOT": str(data / "windows"),
        "AIRFLOW_VAR_RECSHARD_REPORTS_ROOT": str(data / "reports"),
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
    assert result["edges"] == {task: list(TASKS[i + 1 : i + 2]) for i, task in enumerate(TASKS)}
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


def _dags_test(env, ds: str) -> str:
    run = subprocess.run(
        [str(AIRFLOW), "dags", "test", "recshard_daily", ds],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout + run.stderr


DAYS = ("2026-12-01", "2026-12-02", "2026-12-03")


def test_three_drifting_days_publish_only_a_faster_plan(airflow_env):
    """`airflow dags test` over three generated days that drift (coverage falls 0.1 a day, new
    ids, hot ids rotate), in date order, then a re-run of the last: each day is profiled,
    merged into its window, compared with the window before it, planned, replayed beside the
    published plan and published only when faster by the margin."""
    env, data = airflow_env
    spec = ROOT / "conf" / "synthetic.yaml"
    for day, ds in enumerate(DAYS):
        series = SyntheticDrift(day=day, hot_rotation=0.002, new_ids=0.05, coverage_trend=-0.1)
        generate(spec, data / "logs" / f"ds={ds}", 30_000, seed=3 + day, processes=1, drift=series)
    published: list[str] = []
    for i, ds in enumerate(DAYS):
        out = _dags_test(env, ds)
        for task in TASKS:
            assert f"end task task_id={task}" in out, task
        decision = json.loads((data / "manifests" / f"ds={ds}" / "decision.json").read_text())
        drift = load_drift(data / "reports" / f"ds={ds}" / "drift.json")
        window = load_stats(data / "windows" / f"ds={ds}")
        assert window.metadata.window.days == DAYS[: i + 1] and window.metadata.num_samples == 30_000 * (
            i + 1
        )
        assert (data / "reports" / f"ds={ds}" / "report.html").is_file()
        if i == 0:
            assert decision["publish"] and decision["reason"] == "nothing is published yet"
            assert drift.reference is None
        else:
            # both plans replayed on the day's logs; published only when 2% faster
            new, old = decision["candidate_ms"], decision["published_ms"]
            assert new > 0 and old > 0 and decision["logs"] == [str(data / "logs" / f"ds={ds}")]
            assert decision["publish"] == (new <= old * (1 - 0.02)), decision
            assert decision["published"].startswith(
                str(data / "manifests" / "published" / f"ds={published[-1]}-")
            )
            assert drift.reference == str(data / "windows" / f"ds={DAYS[i - 1]}")
            assert any("coverage" in a for a in drift.alerts), drift.alerts
            assert all(t.hbm_accesses is not None for t in drift.tables)
        if decision["publish"]:
            published.append(ds)
        latest = load_latest(data / "manifests", model=spec)
        assert latest.manifest.ds == published[-1]
        assert (
            latest.path.read_bytes()
            == (data / "manifests" / f"ds={published[-1]}" / "manifest.json").read_bytes()
        )
        assert all(t.remap is not None for t in latest.manifest.tables)
    # idempotent: a re-run of the last day replaces its outputs and decides again
    _dags_test(env, DAYS[-1])
    assert load_stats(data / "windows" / f"ds={DAYS[-1]}").metadata.window.days == DAYS
    load_latest(data / "manifests")
    # no temp copy left; the lock files stay (an OS lock on them is what is held, never the file)
    names = sorted(p.name for p in (data / "manifests").iterdir())
    assert names == sorted(
        [
            *(f"_lock-ds={d}" for d in DAYS),
            "_lock-publish",
            *(f"ds={d}" for d in DAYS),
            "latest.json",
            "published",
        ]
    )
    assert not [p for p in (data / "windows").iterdir() if p.name.startswith("_tmp")]


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
    assert "--ds 2026-12-01 " in rendered["run"] and "--time-limit 10" in rendered["run"]


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
