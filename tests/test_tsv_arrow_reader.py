"""The pyarrow reader of Criteo TSV (partition_counts.CriteoTsvCounter), in process: files cut
into byte ranges and chunks of whole lines, counted, and checked against plain Python reading
the same bytes as Spark's text reader does (Hadoop's lines: ``\\n``, ``\\r\\n`` or a lone
``\\r`` ends a line; an empty line is a line) and splitting each line on tabs."""

import itertools
import re

import numpy as np
import pyarrow as pa
import pytest

from recshard_stats.partition_counts import (
    CriteoTsvCounter,
    PartitionCounter,
    _line_chunks,
    _lines_of_fields,
)
from recshard_stats.record_codes import (
    HEX_PATTERN,
    INT_PATTERN,
    RecordKind,
    RowOutcome,
    record_code,
    reject_code,
)

# bytes lines are made of: separators, line ends, hex and integer text, non-ASCII and non-UTF-8
PIECES = [
    b"\t",
    b"\t",
    b"\t",
    b"\n",
    b"\r\n",
    b"\r",
    b"0a",
    b"F",
    b"12",
    b"-3",
    b"z",
    b"\xc3\xa9",
    b"\xff",
    b"",
]


def hadoop_lines(data: bytes) -> list[bytes]:
    lines = re.split(rb"\r\n|\r|\n", data)
    return lines[:-1] if lines and lines[-1] == b"" else lines


def _lines_with_ends(data: bytes) -> list[tuple[bytes, bytes]]:
    """(line, its line end) of Hadoop's lines; the last line may have none."""
    pieces = re.split(rb"(\r\n|\r|\n)", data)
    pairs = list(zip(pieces[0::2], [*pieces[1::2], b""], strict=True))
    return pairs[:-1] if pairs and pairs[-1] == (b"", b"") else pairs


def _random_file(rng, path, lines: int) -> bytes:
    parts = []
    for _ in range(lines):
        if rng.random() < 0.7:  # mostly lines of three fields
            parts.append(b"\t".join(rng.choice(PIECES[6:]) for _ in range(3)))
        else:
            parts.append(b"".join(rng.choice(PIECES) for _ in range(int(rng.integers(0, 6)))))
        parts.append(rng.choice([b"\n", b"\r\n", b"\r"]))
    data = b"".join(parts)
    if rng.random() < 0.5:
        data = data.rstrip(b"\r\n")  # no line end after the last line
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("seed", range(6))
def test_ranges_and_chunks_hold_every_line_once(tmp_path, seed):
    rng = np.random.default_rng(seed)
    data = _random_file(rng, tmp_path / "day.tsv", 300)
    uri = (tmp_path / "day.tsv").as_uri()
    for piece in (1, 7, 64, 500, len(data) + 1):
        cuts = [*list(range(0, len(data), piece)), len(data)]
        chunks = [
            c for a, b in itertools.pairwise(cuts) for c in _line_chunks(uri, a, b, int(rng.integers(1, 90)))
        ]
        assert b"".join(chunks) == data, piece
        # each chunk is whole lines: split alone, the chunks give the file's lines
        assert [line for c in chunks for line in hadoop_lines(c)] == hadoop_lines(data), piece
        for fields in (1, 3):
            got = [_lines_of_fields(c, fields) for c in chunks]
            ended = _lines_with_ends(data)
            assert [sum(g[0] for g in got), sum(g[1] for g in got)] == [
                len(hadoop_lines(data)),
                sum(1 for line in hadoop_lines(data) if line.count(b"\t") == fields - 1),
            ]
            # the bytes pyarrow parses: those lines, each with its own line end
            assert b"".join(g[2] for g in got) == b"".join(
                line + end for line, end in ended if line.count(b"\t") == fields - 1
            )


def _decode(batches) -> dict:
    counts: dict = {}
    for batch in batches:
        for code, key, text, n in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
            counts[(code, text if key is None else key)] = (
                counts.get((code, text if key is None else key), 0) + n
            )
    return counts


@pytest.mark.parametrize("seed", range(6))
def test_counts_equal_plain_python_over_the_lines(tmp_path, seed):
    """Three fields: an integer-checked one, a hex feature, and a field not read."""
    rng = np.random.default_rng(100 + seed)
    data = _random_file(rng, tmp_path / "day.tsv", 400)
    uri = (tmp_path / "day.tsv").as_uri()
    not_integer = reject_code(1, "not_integer")
    cuts = [0, len(data) // 3, len(data) // 2, len(data)]
    counter = CriteoTsvCounter(
        PartitionCounter.of([("C1", "hex")]),
        fields=3,
        positions=(1,),
        integer_checks=((0, not_integer),),
        tasks=(((uri, cuts[0], cuts[1]), (uri, cuts[2], cuts[3])), ((uri, cuts[1], cuts[2]),)),
        chunk_bytes=int(rng.integers(5, 200)),
    )
    got = _decode(b for task in (0, 1) for b in counter(iter([pa.record_batch({"id": [task]})])))

    lines = hadoop_lines(data)
    whole = [line.split(b"\t") for line in lines if line.count(b"\t") == 2]
    expected: dict = {}

    def add(key, n=1):
        if n:
            expected[key] = expected.get(key, 0) + n

    row = record_code(RecordKind.ROW)
    add((row, RowOutcome.PARSED), len(whole))
    add((row, RowOutcome.MALFORMED), len(lines) - len(whole))
    reject = record_code(RecordKind.REJECT)
    add(
        (reject, not_integer),
        sum(1 for f in whole if f[0] and not re.fullmatch(INT_PATTERN[1:-1].encode(), f[0])),
    )
    for f in whole:
        if f[1] and re.fullmatch(HEX_PATTERN[1:-1].encode(), f[1]):
            add((record_code(RecordKind.ID, 0), f[1].decode()))
        elif f[1]:
            add((reject, reject_code(0, "not_hex")))
    assert got == expected
    assert len(whole) > 50 and len(lines) - len(whole) > 20  # both kinds of line are exercised
