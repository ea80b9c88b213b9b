"""The synthetic generator: its output depends on (spec, samples, seed, chunk size) only."""

import pyarrow.parquet as pq

from recshard_stats.generate import generate
from tests.helpers import SPEC, write_yaml


def test_same_files_for_any_number_of_processes(tmp_path):
    spec = write_yaml(tmp_path / "spec.yaml", SPEC)
    one = generate(spec, tmp_path / "one", 5000, seed=4, chunk_rows=1500, processes=1)
    two = generate(spec, tmp_path / "two", 5000, seed=4, chunk_rows=1500, processes=2)
    files = sorted(p.name for p in one.glob("*.parquet"))
    assert files == sorted(p.name for p in two.glob("*.parquet")) and len(files) == 4
    for name in files:
        assert pq.read_table(one / name).equals(pq.read_table(two / name)), name
    assert pq.read_table(one).num_rows == 5000
    other = generate(spec, tmp_path / "other", 5000, seed=5, chunk_rows=1500, processes=1)
    assert not pq.read_table(other / files[0]).equals(pq.read_table(one / files[0]))
