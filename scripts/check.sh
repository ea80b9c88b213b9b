#!/usr/bin/env bash
# Lint, format and types (CI's first step, before the tests): ruff and mypy as pyproject.toml
# configures them. Fails on the first finding.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
