"""The layering docs/architecture.md states, checked on the source: imports go one way, Spark
code never pulls in Pyomo, a trainer's imports need neither Spark nor Pyomo, and no two modules
share a name."""

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT

LIBRARY = ROOT / "recshard_stats"
SOURCES = [p for d in ("recshard_stats", "solver", "jobs") for p in (ROOT / d).glob("*.py")]
TORCHREC_MODULES = (
    LIBRARY / "torchrec_trainer.py",
    LIBRARY / "torchrec_checkpoint.py",
    LIBRARY / "torchrec_planner.py",
)


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_library_never_imports_the_jobs_and_nothing_imports_top_level_solver_or_jobs():
    for path in SOURCES:
        imported = _imports(path)
        assert not {m for m in imported if m.split(".")[0] in ("jobs", "solver")}, path
        if path.parent == LIBRARY:
            assert not {m for m in imported if m.startswith("recshard_stats.jobs")}, path


def test_no_two_modules_share_a_name_and_none_shadows_the_standard_library():
    names = [p.stem for p in SOURCES if p.stem != "__init__"]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not set(names) & sys.stdlib_module_names


@pytest.mark.parametrize(
    "modules, absent",
    [
        (
            "recshard_stats.jobs.remap_job, recshard_stats.stages, recshard_stats.remap, recshard_stats.manifest, "
            "recshard_stats.stats_reader, recshard_stats.replay",
            ("pyomo",),
        ),
        ("recshard_stats.manifest, recshard_stats.hashing, recshard_stats.config", ("pyomo", "pyspark")),
    ],
)
def test_what_each_side_may_not_import(modules, absent):
    code = f"import sys, {modules}; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_only_the_torchrec_adapter_and_the_timed_kernels_import_torch():
    for path in SOURCES:
        imported = {m.split(".")[0] for m in _imports(path)}
        if "torchrec" in imported:
            assert path in TORCHREC_MODULES, path
        if imported & {"torch", "fbgemm_gpu"}:
            assert path in (*TORCHREC_MODULES, LIBRARY / "lookup_kernels.py"), path
