"""The profile's driver side without Spark: aggregates written by hand for a tiny log, assembled
into output rows, checked against what the definitions give for that log."""

import dataclasses

import pytest

from recshard_stats.config import parse_model_config
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import SketchOptions
from recshard_stats.profile_assembly import (
    CollectedAggregates,
    ProfileLayout,
    SketchedTotals,
    assemble,
    check_rejects,
)
from recshard_stats.record_codes import REJECT_REASONS
from recshard_stats.schemas import TABLES, output_row

MODEL = parse_model_config(
    {
        "features": [
            {"name": "u", "type": "int64"},
            {"name": "h", "type": "array<int64>"},
            {"name": "g", "type": "array<int64>"},
        ],
        "tables": [
            {"name": "tu", "features": ["u"], "hash_size": 10, "dim": 4},
            {"name": "ts", "features": ["h", "g"], "hash_size": 5, "dim": 8, "hash": "xxhash64"},
        ],
    }
)

# Five parseable samples (and one unparseable row):
#   u: 7, 7, 17, absent, 3     -> keys 7, 17, 3; rows 7 (x3: 7, 7, 17), 3 (x1); 3 distinct keys
#   h: [1, 1], [], [2], [], [1] -> pooling 2, 0, 1, 0, 1; rows of its keys: r1 x3, r2 x1
#   g: [], [], [], [], []       -> never present; one null element in sample 2 rejected
#   ts's count-of-counts (h and g share it): as h's
U_COC = [(3, 1, 2), (1, 1, 1)]  # (access count, rows, distinct keys behind those rows)
H_COC = [(3, 1, 1), (1, 1, 1)]
AGGREGATES = CollectedAggregates(
    num_samples=5,
    bad_rows=1,
    pooling={1: {2: 1, 0: 2, 1: 2}, 2: {0: 5}},
    rejects={(2, REJECT_REASONS.index("null_id")): 1},
    feature_ids={0: 4, 1: 4},
    feature_coc={0: U_COC, 1: H_COC},
    table_coc={0: U_COC, 1: H_COC},
)


def _rows(out, table, key):
    return {r[key]: r for r in out[table]}


def test_layout_names_each_features_table_and_the_shared_ones():
    layout = ProfileLayout.of(MODEL)
    assert [(f.name, f.table, f.hash_size, f.hash_ids) for f in layout.features] == [
        ("u", 0, 10, False),
        ("h", 1, 5, True),
        ("g", 1, 5, True),
    ]
    assert layout.shared_tables == frozenset({1}) and layout.features_of(1) == [1, 2]
    assert layout.sample_bits == (0, 0)
    big = parse_model_config(
        {
            "features": [{"name": "u", "type": "int64"}],
            "tables": [{"name": "t", "features": ["u"], "hash_size": 1 << 22, "dim": 4}],
        }
    )
    assert ProfileLayout.of(big, SketchOptions(14, 8)).sample_bits == (6,)  # keeps >= 65536 of 2**22 rows


def test_assembled_rows_match_the_definitions():
    out = assemble(ProfileLayout.of(MODEL), AGGREGATES, cdf_points=8)
    features = _rows(out, "features", "feature")
    u, h, g = features["u"], features["h"], features["g"]
    assert (u["num_samples"], u["present_samples"], u["coverage"]) == (5, 4, 0.8)
    assert (u["total_accesses"], u["unique_raw_ids"], u["unique_rows"], u["unused_rows"]) == (4, 3, 2, 8)
    assert (u["pf_mean"], u["pf_min"], u["pf_max"], u["pf_p50"]) == (0.8, 1, 1, 1)
    assert u["expected_unique_rows"] == pytest.approx(10 * (1 - 0.9**3))
    assert (h["present_samples"], h["coverage"], h["pf_mean"], h["pf_mean_present"]) == (3, 0.6, 0.8, 4 / 3)
    assert (h["pf_min"], h["pf_max"], h["pf_p50"], h["pf_p90"]) == (1, 2, 1, 2)
    assert (g["present_samples"], g["total_accesses"], g["null_ids"], g["rejected_values"]) == (0, 0, 1, 0)
    tables = _rows(out, "tables", "table")
    assert (tables["ts"]["total_accesses"], tables["ts"]["accesses_per_sample"]) == (4, 0.8)
    assert (tables["tu"]["max_row_accesses"], tables["tu"]["unique_keys"]) == (3, 3)
    hist = {(r["feature"], r["pooling_factor"]): r["samples"] for r in out["pooling_histogram"]}
    assert hist == {("u", 0): 1, ("u", 1): 4, ("h", 0): 2, ("h", 1): 2, ("h", 2): 1, ("g", 0): 5}
    coc = [(r["level"], r["name"], r["access_count"], r["rows"]) for r in out["count_of_counts"]]
    assert ("table", "ts", 3, 1) in coc and ("feature", "u", 1, 1) in coc and len(coc) == 8
    cdf = [(r["rows"], r["access_fraction"]) for r in out["access_cdf"] if r["name"] == "tu"]
    assert cdf == [(1, 0.75), (2, 1.0)]
    assert out["rejects"] == [
        {"column": "g", "reason": "null_id", "count": 1},
        {"column": "*", "reason": "wrong_field_count", "count": 1},
    ]
    for table, rows in out.items():  # every row has exactly the declared columns, in order
        assert all(list(r) == [c for c, _ in TABLES[table]] for r in rows), table


def test_approximate_totals_replace_counted_distincts():
    totals = {
        0: SketchedTotals(4, 2.6, None),
        1: SketchedTotals(4, 2.2, None),
        2: SketchedTotals(0, 0.0, None),
    }
    sketched = dataclasses.replace(
        AGGREGATES, feature_totals=totals, table_totals={0: totals[0], 1: SketchedTotals(4, 2.0, 1.7)}
    )
    features = _rows(assemble(ProfileLayout.of(MODEL), sketched, 8), "features", "feature")
    assert (features["u"]["unique_raw_ids"], features["u"]["unique_rows"]) == (3, 2)  # rows: count-of-counts
    assert (features["h"]["unique_raw_ids"], features["h"]["unique_rows"]) == (2, 2)
    tables = _rows(assemble(ProfileLayout.of(MODEL), sketched, 8), "tables", "table")
    assert (tables["ts"]["unique_keys"], tables["ts"]["unique_rows"]) == (
        2,
        2,
    )  # min(rows estimate 2, keys 2)


def test_output_row_refuses_a_misspelt_or_missing_column():
    with pytest.raises(KeyError, match=r"missing \['count'\], undeclared \['cnt'\]"):
        output_row("rejects", column="a", reason="null_id", cnt=1)


def test_reject_limits():
    check_rejects(MODEL, AGGREGATES, limit=1.0)
    # g's one id is null: 100% of its ids
    with pytest.raises(RecShardError, match=r"1 of the 1 ids in column 'g' are null \(100.00%\)") as err:
        check_rejects(MODEL, AGGREGATES, limit=0.5)
    assert err.value.reason is Reason.TOO_MANY_REJECTS
    no_nulls = dataclasses.replace(AGGREGATES, rejects={})
    check_rejects(MODEL, no_nulls, limit=0.2)  # 1 unparseable row of 6
    with pytest.raises(RecShardError) as err:
        check_rejects(MODEL, no_nulls, limit=0.1)
    assert err.value.reason is Reason.TOO_MANY_REJECTS and "1 unparseable rows out of 6 rows" in str(
        err.value
    )
    nothing = CollectedAggregates(0, 3, {}, {}, {}, {}, {})
    with pytest.raises(RecShardError, match=r"no usable samples \(3 rows read, 3 unparseable\)"):
        check_rejects(MODEL, nothing, limit=1.0)
    absent = dataclasses.replace(no_nulls, feature_ids={})
    with pytest.raises(
        RecShardError, match=r"none of the 5 samples has an id in any of the 3 features"
    ) as err:
        check_rejects(MODEL, absent, limit=1.0)
    assert err.value.reason is Reason.INPUT_MISSING


@pytest.mark.parametrize(
    "csv_input, message",
    [
        ({"multiline": "yes"}, "multiline must be true or false, got 'yes'"),
        ({"separator": '"'}, "separator must be one character (not the quote or a line end), got '\"'"),
        ({"quote": "ab"}, "quote must be one character"),
        ({"list_separator": ","}, "separator and list_separator are both ','"),
    ],
)
def test_csv_input_settings_are_checked_with_the_reason(csv_input, message):
    base = {
        "features": [{"name": "s", "type": "string"}],
        "tables": [{"name": "t", "features": ["s"], "hash_size": 10, "dim": 4, "hash": "xxhash64"}],
    }
    with pytest.raises(RecShardError) as err:
        parse_model_config({**base, "input": {"format": "csv", **csv_input}}, source="m.yaml")
    assert message in str(err.value) and err.value.reason is Reason.CONFIG_INVALID
    parsed = parse_model_config({**base, "input": {"format": "csv"}}, source="m.yaml").csv
    assert parsed is not None and (parsed.quote, parsed.escape, parsed.multiline) == ('"', '"', True)
