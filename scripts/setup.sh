#!/usr/bin/env bash
# Idempotent setup of a fresh Debian/Ubuntu machine: Java, GLPK, CBC, and the project's venv.
#   ./scripts/setup.sh          # then: .venv/bin/recshard --help
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v glpsol >/dev/null 2>&1 || need+=(glpk-utils)
command -v cbc >/dev/null 2>&1 || need+=(coinor-cbc)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[dev]"
# TorchRec on CPU: torch's CPU wheel (pinned: an unpinned torch pulls a multi-GB CUDA build), the
# one FBGEMM that loads on it, then torchrec without its CUDA fbgemm-gpu requirement.
if ! .venv/bin/python -c "import torchrec" >/dev/null 2>&1; then
  echo "torch==2.13.0" > .venv/torch-constraint.txt
  .venv/bin/python -m pip install -q -c .venv/torch-constraint.txt -e ".[torchrec]"
  .venv/bin/python -m pip install -q --no-deps "torchrec==1.8.0"
fi
# Airflow lives in its own venv (its pins would fight the package's); the DAG's Spark and solver
# steps call .venv's spark-submit and recshard, so this one needs only Airflow + the Spark provider.
[ -x .venv-airflow/bin/python ] || "$PY" -m venv .venv-airflow
.venv-airflow/bin/python -m pip install -q --upgrade pip >/dev/null
.venv-airflow/bin/python -m pip install -q "apache-airflow==3.3.*" "apache-airflow-providers-apache-spark>=6,<7"
echo "setup: ok ($(.venv/bin/python -c 'import pyspark, pyomo, torchrec; print("pyspark", pyspark.__version__, "pyomo", pyomo.__version__, "torchrec", torchrec.__version__)' 2>/dev/null), $(java -version 2>&1 | head -1), airflow $(.venv-airflow/bin/airflow version 2>/dev/null | tail -1))"
