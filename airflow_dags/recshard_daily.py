"""recshard_daily: each day's logs -> stats -> the window of the last days -> drift -> a candidate
plan -> remap -> replayed beside the published plan -> published only when faster -> report.

    wait_for_logs -> profile -> window -> drift -> solve -> remap -> validate -> evaluate
        -> publish -> report

Keyed by ``{{ ds }}``: every task writes only that day's outputs, atomically, so a re-run
replaces them cleanly. ``profile`` keeps the day's per-id counts; ``window`` merges the last
``window_days`` days (fewer at the start of a series); ``drift`` compares the day with the
window that ended the day before and with the published plan (``<reports_root>/ds=<day>/
drift.json``); the candidate is solved from the window; ``evaluate`` replays the day's logs
through the candidate and the published plan; ``publish --compare`` moves
``<manifests_root>/latest.json`` to the candidate only when it loads, validates and is faster
by the margin (or nothing comparable is published), and writes ``decision.json`` beside it;
``report`` writes ``<reports_root>/ds=<day>/report.html``. Each candidate records its diff
against the published plan (``solve --previous``: tables that change GPU, rows entering and
leaving HBM), what a trainer moves to apply it. A backfill runs the days in date
order (one run at a time), since each window reads the days before it. Tasks pass paths through
XCom, never data.

Settings: ``conf/airflow.yaml`` (or the file named by the environment variable
RECSHARD_AIRFLOW_CONF); a Variable ``recshard_<key>`` overrides the file for every run of a
deployment, and a run's own conf (``airflow dags trigger recshard_daily -c '{"solver":
"highs"}'``) overrides both. Nothing heavy happens at import: one small YAML file is read.

Every setting is a Param with a schema: a run's conf that breaks one (an unknown solver, a
negative time limit, a path with a newline) is refused when the run is created. In the shell
commands every templated value is quoted (``shell_quote``): a value is one argument, never shell
syntax, so ``{"solver": "cbc; touch /tmp/x"}`` reaches recshard as that one (refused) word.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import shlex

import yaml
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, Param
from airflow.sdk.exceptions import AirflowSensorTimeout

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULTS = yaml.safe_load(
    pathlib.Path(os.environ.get("RECSHARD_AIRFLOW_CONF", ROOT / "conf" / "airflow.yaml")).read_text()
)
PATHS = ("model", "hardware", "recshard", "pyspark_python", "py_files", "drift_thresholds")


def _default(key: str):
    value = DEFAULTS[key]
    if key in PATHS and value and not pathlib.Path(value).is_absolute():
        return str(ROOT / value)
    return value


# each setting's schema (JSON Schema, as Airflow's Param checks a run's conf): solver names as
# the CLI's --solver takes them, a time limit the CLI takes, paths without control characters
_PATH: dict[str, object] = {"type": "string", "pattern": "^[^\\x00-\\x1f]*$"}
SCHEMAS: dict[str, dict[str, object]] = {
    "model": {**_PATH, "minLength": 1},
    "hardware": {**_PATH, "minLength": 1},
    "logs_root": {**_PATH, "minLength": 1},
    "stats_root": {**_PATH, "minLength": 1},
    "manifests_root": {**_PATH, "minLength": 1},
    "windows_root": {**_PATH, "minLength": 1},
    "reports_root": {**_PATH, "minLength": 1},
    "drift_thresholds": {**_PATH, "minLength": 1},
    "window_days": {"type": "integer", "minimum": 1, "maximum": 366},
    "recshard": {**_PATH, "minLength": 1},
    "pyspark_python": {**_PATH, "minLength": 1},
    "py_files": _PATH,
    "spark_conn_id": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
    "solver": {"type": "string", "enum": ["glpk", "cbc", "highs"]},
    "time_limit": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
}


def _expression(key: str) -> str:
    return f"(dag_run.conf['{key}'] if '{key}' in (dag_run.conf or {{}}) else var.value.get('recshard_{key}', params.{key}))"


def setting(key: str) -> str:
    """A templated setting: the run's conf if it gives the key, else Variable recshard_<key>, else
    the file's default (the param's default)."""
    return f"{{{{ {_expression(key)} }}}}"


def shell_setting(key: str) -> str:
    """A setting in a shell command: quoted, one argument whatever it holds."""
    return f"{{{{ {_expression(key)} | string | shell_quote }}}}"


def _logs_landed(marker: str) -> bool:
    return pathlib.Path(marker).is_file()


class LogsLandedSensor(PythonSensor):
    """Waits for the day's ``_SUCCESS`` marker; its timeout names the marker it waited for."""

    def execute(self, context):
        try:
            return super().execute(context)
        except AirflowSensorTimeout as exc:
            raise AirflowSensorTimeout(
                f"{exc} {self.op_kwargs['marker']} never appeared: the day's logs have not landed"
            ) from None


STATS = setting("stats_root") + "/ds={{ ds }}"
WINDOW = setting("windows_root") + "/ds={{ ds }}"
REPORTS = setting("reports_root") + "/ds={{ ds }}"
MANIFEST = "{{ ti.xcom_pull(task_ids='solve') }}"
MANIFEST_QUOTED = "{{ ti.xcom_pull(task_ids='solve') | string | shell_quote }}"
SPARK_CONF = {
    "spark.pyspark.python": setting("pyspark_python"),
    "spark.pyspark.driver.python": setting("pyspark_python"),
}


def spark_job(task_id: str, job: str, args: list[str]) -> SparkSubmitOperator:
    return SparkSubmitOperator(
        task_id=task_id,
        application=str(ROOT / "jobs" / f"{job}_job.py"),
        conn_id=DEFAULTS["spark_conn_id"],
        conf=SPARK_CONF,
        py_files=setting("py_files"),
        name=f"recshard-{job}-{{{{ ds }}}}",
        application_args=args,
    )


with DAG(
    dag_id="recshard_daily",
    description="Profile the day's training logs and publish a RecShard sharding manifest",
    schedule="@daily",
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": DEFAULTS["retries"], "retry_delay": datetime.timedelta(minutes=5)},
    params={
        key: Param(_default(key), **SCHEMAS[key])
        for key in DEFAULTS
        if key not in ("retries", "logs_wait_hours")
    },
    user_defined_filters={"shell_quote": shlex.quote},
    tags=["recshard"],
    doc_md=__doc__,
) as dag:
    wait_for_logs = LogsLandedSensor(
        task_id="wait_for_logs",
        python_callable=_logs_landed,
        op_kwargs={"marker": setting("logs_root") + "/ds={{ ds }}/_SUCCESS"},
        poke_interval=300,
        timeout=DEFAULTS["logs_wait_hours"] * 3600,
        mode="reschedule",
    )
    profile = spark_job(
        "profile",
        "profile",
        [
            "--model",
            setting("model"),
            "--input",
            setting("logs_root") + "/ds={{ ds }}",
            "--out",
            setting("stats_root"),
            "--ds",
            "{{ ds }}",
            "--row-counts",
            "--id-counts",
        ],
    )
    window = spark_job(
        "window",
        "window",
        [
            "--model",
            setting("model"),
            "--stats",
            setting("stats_root"),
            "--out",
            setting("windows_root"),
            "--ds",
            "{{ ds }}",
            "--days",
            setting("window_days"),
            "--min-days",
            "1",
        ],
    )
    drift = spark_job(
        "drift",
        "drift",
        [
            "--day",
            STATS,
            "--reference",
            setting("windows_root") + "/ds={{ macros.ds_add(ds, -1) }}",
            "--missing-reference-ok",
            "--published-root",
            setting("manifests_root"),
            "--thresholds",
            setting("drift_thresholds"),
            "--out",
            REPORTS + "/drift.json",
        ],
    )
    solve = BashOperator(
        task_id="solve",  # prints the manifest's path last: that line is the XCom
        bash_command=(
            shell_setting("recshard")
            + " solve --stats "
            + shell_setting("windows_root")
            + "/ds={{ ds }} --model "
            + shell_setting("model")
            + " --hardware "
            + shell_setting("hardware")
            + " --out "
            + shell_setting("manifests_root")
            + " --previous "
            + shell_setting("manifests_root")
            + " --ds {{ ds }} --solver "
            + shell_setting("solver")
            + " --time-limit "
            + shell_setting("time_limit")
        ),
    )
    remap = spark_job("remap", "remap", ["--manifest", MANIFEST, "--stats", WINDOW])
    validate = BashOperator(
        task_id="validate",
        bash_command=shell_setting("recshard")
        + " validate --manifest "
        + MANIFEST_QUOTED
        + " --model "
        + shell_setting("model"),
    )
    evaluate = spark_job(
        "evaluate",
        "replay",
        [
            "--manifest",
            MANIFEST,
            "--logs",
            setting("logs_root") + "/ds={{ ds }}",
            "--published-root",
            setting("manifests_root"),
        ],
    )
    publish = BashOperator(
        task_id="publish",
        bash_command=shell_setting("recshard")
        + " publish --compare --manifest "
        + MANIFEST_QUOTED
        + " --root "
        + shell_setting("manifests_root")
        + " --model "
        + shell_setting("model"),
    )
    report = BashOperator(
        task_id="report",
        bash_command=shell_setting("recshard")
        + " report --manifest "
        + MANIFEST_QUOTED
        + " --stats "
        + shell_setting("windows_root")
        + "/ds={{ ds }} --drift "
        + shell_setting("reports_root")
        + "/ds={{ ds }}/drift.json --out "
        + shell_setting("reports_root")
        + "/ds={{ ds }}/report.html",
    )
    (
        wait_for_logs
        >> profile
        >> window
        >> drift
        >> solve
        >> remap
        >> validate
        >> evaluate
        >> publish
        >> report
    )
