"""The built wheel works alone: installed into a fresh venv outside the checkout, `recshard run`
finds its default configs and the built-in example inside the package and runs end to end."""

import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _run(args, cwd, env=None):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_wheel_runs_the_example_outside_the_checkout(tmp_path):
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
        tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("recshard_stats-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for packaged in (
        "recshard_stats/conf/synthetic.yaml",
        "recshard_stats/conf/hardware_example.yaml",
        "recshard_stats/conf/calibration/h200.yaml",
        "recshard_stats/solver/milp.py",
        "recshard_stats/jobs/profile_job.py",
        "recshard_stats/manifest.schema.json",
    ):
        assert packaged in names, packaged
    # a fresh venv with only the wheel installed; its dependencies (pyspark, pyomo, ...) are the
    # checkout venv's packages, seen through a .pth line, which runs none of that venv's own .pth
    # files (so not the editable install of the checkout)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
    ).strip()
    (tmp_path / "venv" / site.split(str(venv) + "/", 1)[1] / "deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp_path)
    where = _run([str(python), "-c", "import recshard_stats; print(recshard_stats.__file__)"], tmp_path)
    assert where.startswith(site), where  # the installed package, not the checkout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = _run(
        [
            str(venv / "bin" / "recshard"),
            "run",
            "--out",
            "example",
            "--samples",
            "20000",
            "--time-limit",
            "20",
        ],
        work,
        env,
    )
    manifest = work / "example" / "manifests" / "ds=2026-12-01" / "manifest.json"
    assert manifest.is_file() and (work / "example" / "report.html").is_file(), out
    check = _run(
        [
            str(python),
            "-c",
            f"from recshard_stats.manifest_loader import load_manifest; "
            f"m = load_manifest({str(manifest)!r}, require_remap=True).manifest; print(m.num_gpus, len(m.tables))",
        ],
        work,
        env,
    )
    # the example's shape, from the checkout's configs
    from recshard_stats.config import load_hardware_config, load_model_config

    model, hardware = (
        load_model_config(ROOT / "conf" / "synthetic.yaml"),
        load_hardware_config(ROOT / "conf" / "hardware_example.yaml"),
    )
    assert check.split() == [str(hardware.num_gpus), str(len(model.tables))], check
