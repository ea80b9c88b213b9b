#!/usr/bin/env bash
# Build dist/recshard_stats.zip: the package for spark-submit --py-files, laid out as installed
# (solver/ and jobs/ become recshard_stats/solver and recshard_stats/jobs), so executors and a
# cluster-mode driver import it without an install.
#   ./scripts/build_pyfiles.sh && spark-submit --py-files dist/recshard_stats.zip jobs/profile_job.py ...
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
    for folder, package in (("recshard_stats", "recshard_stats"), ("solver", "recshard_stats/solver"),
                            ("jobs", "recshard_stats/jobs")):
        for path in sorted(pathlib.Path(folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".json"):
                zf.write(path, f"{package}/{path.relative_to(folder).as_posix()}")
os.replace(tmp, target)
print(target)
PY
