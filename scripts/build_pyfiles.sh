#!/usr/bin/env bash
# Build dist/recshard_stats.zip: the package (recshard_stats, solver, jobs) for spark-submit
# --py-files, so executors and a cluster-mode driver import it without an install.
#   ./scripts/build_pyfiles.sh && spark-submit --py-files dist/recshard_stats.zip jobs/profile.py ...
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p dist
python3 - <<'PY'
import os
import pathlib
import zipfile

target = pathlib.Path("dist/recshard_stats.zip")
tmp = target.with_suffix(".zip.tmp")
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
    for package in ("recshard_stats", "solver", "jobs"):
        for path in sorted(pathlib.Path(package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".json"):
                zf.write(path, path.as_posix())
os.replace(tmp, target)
print(target)
PY
