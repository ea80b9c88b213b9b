"""The synthetic generator: its output depends on (spec, samples, seed, chunk size, drift) only."""

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recshard_stats.generate import generate
from recshard_stats.options import SyntheticDrift
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


def _ids(path, feature) -> pd.Series:
    """Every id of a feature (multi-hot flattened), as int64 (pyarrow: no float round trip)."""
    column = pq.read_table(path, columns=[feature])[feature].combine_chunks()
    if pa.types.is_list(column.type):
        column = column.flatten()
    return pd.Series(pc.drop_null(column).to_numpy())


def test_drifting_days(tmp_path):
    """Each drift setting measured on the written files against its definition: day 0 is the
    spec draw for draw; hot ranks move by the rotation; new ids are that share of a day's ids
    and appear on no other day; coverage and mean pooling move by their trend."""
    spec = write_yaml(tmp_path / "spec.yaml", SPEC)
    n = 20000
    base = generate(spec, tmp_path / "base", n, seed=1, chunk_rows=n, processes=1)
    settings: dict = {"hot_rotation": 0.01, "new_ids": 0.1, "coverage_trend": -0.1, "pooling_shift": 0.2}
    day0 = generate(
        spec, tmp_path / "d0", n, seed=1, chunk_rows=n, processes=1, drift=SyntheticDrift(**settings)
    )
    assert pq.read_table(day0).equals(pq.read_table(base))
    days = {
        d: generate(
            spec,
            tmp_path / f"d{d}",
            n,
            seed=d,
            chunk_rows=n,
            processes=1,
            drift=SyntheticDrift(day=d, **settings),
        )
        for d in (1, 2)
    }
    # the hottest user id of day 2 is the id of popularity rank 1 + 2 * 0.01 * 5000 on day 0
    scramble = 0x9E3779B97F4A7C15
    rank_101 = (101 * scramble + 0 * 1_000_003) % (1 << 64) & ((1 << 63) - 1)
    users2 = _ids(days[2], "user")
    assert users2.value_counts().index[0] == rank_101
    assert _ids(base, "user").value_counts().index[0] == (scramble & ((1 << 63) - 1))
    # new ids: ids of day 2 drawn neither on day 1 nor from day 0's whole id space
    hist2, hist1 = _ids(days[2], "hist"), _ids(days[1], "hist")
    base_space = {(r * scramble + 3 * 1_000_003) % (1 << 64) & ((1 << 63) - 1) for r in range(1, 3001)}
    new = ~hist2.isin(base_space)
    assert abs(new.mean() - 0.1) < 0.01
    assert not hist2[new].isin(set(hist1)).any()
    # coverage of a single-hot feature: 0.6 - 2 * 0.1; mean pooling of present hist: 8 * 1.2 ** 2
    query2 = pq.read_table(days[2], columns=["query"]).to_pandas()["query"]
    assert abs(query2.notna().mean() - 0.4) < 0.015
    pf = (
        pq.read_table(days[2], columns=["hist"]).to_pandas()["hist"].map(lambda v: 0 if v is None else len(v))
    )
    present = pf[pf > 0]
    assert abs(len(present) / n - 0.5) < 0.015  # coverage 0.7 - 0.2
    pf0 = pq.read_table(base, columns=["hist"]).to_pandas()["hist"].map(lambda v: 0 if v is None else len(v))
    assert abs(present.mean() / pf0[pf0 > 0].mean() - 1.44) < 0.06
