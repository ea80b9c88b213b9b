"""The profile's map side, run in each Spark task by ``mapInArrow``: ids -> partial counts
``(code, key, text, count)``, computed with pyarrow.

Counting inside the task, before the shuffle, is what makes the profile cost about what a
hand-written ``groupBy(feature, id).count()`` costs: Spark never builds a record per id (no
per-id structs, no higher-order lambdas), and what it shuffles is already one row per distinct
(code, key) of the task. Codes are :mod:`recshard_stats.record_codes`'s ``kind << 16 |
feature``. A record carries an integer ``key``, or the ``text`` of a string or hex id: Spark
turns it into its key after this step, once per distinct text (pyarrow has neither Spark's
XXH64 nor base-16 parsing).

Three sources feed the same counter (:class:`PartitionCounter`):

- the normalized frame of :mod:`recshard_stats.readers` (any input format, Spark's readers);
- Parquet files read here with pyarrow (:class:`ParquetFileCounter`): Spark's row-based
  reader and its row -> Arrow conversion cost more than the counting itself (the profile
  through them takes 2.2-2.9x as long: BENCHMARKS.md, issue 17);
- Criteo TSV files read here with pyarrow's CSV parser, in byte ranges of whole lines
  (:class:`CriteoTsvCounter`), with the line semantics of Spark's text reader (Hadoop's: a
  line ends at ``\n``, ``\r\n`` or a lone ``\r``; an empty line is a line, and malformed).
  Lines of another number of fields are counted and cut out before pyarrow parses the rest
  (its handler of such rows fails on bytes that are not UTF-8).

Absent values, as in the readers: null and empty strings. In a multi-hot feature a null id
(an empty string too) is not an id, does not count in the pooling factor, and is reported as a
``null_id`` reject. A hex id that is not 1-15 hex digits is a ``not_hex`` reject.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs

from recshard_stats.record_codes import (
    HEX_PATTERN,
    INT_PATTERN,
    RecordKind,
    RowOutcome,
    is_multi_hot,
    record_code,
    reject_code,
    unreadable_file_message,
)

RECORD_SCHEMA = "code int, key bigint, text string, count bigint"
_ARROW_SCHEMA = pa.schema(
    [("code", pa.int32()), ("key", pa.int64()), ("text", pa.string()), ("count", pa.int64())]
)
# ids held per task before they are counted and sent on (bounds a task's memory: ~8 bytes each)
FLUSH_VALUES = 1 << 24
PARQUET_BATCH_ROWS = 1 << 16


@dataclasses.dataclass(frozen=True)
class CountedFeature:
    index: int  # column k{index} of the normalized frame
    name: str  # its column in Parquet logs
    type: str  # the model config's feature type


@dataclasses.dataclass(frozen=True)
class PartitionCounter:
    """Picklable: what each task needs to count the normalized frame's batches."""

    features: tuple[CountedFeature, ...]

    @classmethod
    def of(cls, features: list[tuple[str, str]]) -> PartitionCounter:
        """``features``: (name, type) in model config order."""
        return cls(tuple(CountedFeature(i, name, type_) for i, (name, type_) in enumerate(features)))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending = _Pending()
        for batch in batches:
            columns = {f.index: batch.column(f"k{f.index}") for f in self.features}
            self.count(batch.num_rows, columns, batch.column("_valid"), batch.column("_rejects"), pending)
            yield from pending.flush_if_full()
        yield from pending.flush()

    def count(
        self,
        rows: int,
        columns: dict[int, pa.Array],
        valid: pa.Array | None,
        rejects: pa.Array | None,
        pending: _Pending,
    ) -> None:
        """One batch of ``rows`` samples: feature index -> its column (missing: absent in every
        sample); ``valid``: parseable rows (None: all); ``rejects``: per row, reject codes (or None)."""
        parsed = rows if valid is None else (pc.sum(valid).as_py() or 0)
        pending.tally(record_code(RecordKind.ROW), RowOutcome.PARSED, parsed)
        pending.tally(record_code(RecordKind.ROW), RowOutcome.MALFORMED, rows - parsed)
        keep = valid if parsed < rows else None
        for f in self.features:
            if f.index in columns:
                column = columns[f.index] if keep is None else columns[f.index].filter(keep)
                self._count_feature(f, column, pending)
            elif is_multi_hot(f.type):  # absent from every sample: each one counts at pooling factor 0
                pending.tally(record_code(RecordKind.POOLING, f.index), 0, parsed)
        if rejects is not None:
            pending.add(
                record_code(RecordKind.REJECT), (rejects if keep is None else rejects.filter(keep)).flatten()
            )

    @staticmethod
    def _count_feature(f: CountedFeature, column: pa.Array, pending: _Pending) -> None:
        code = record_code(RecordKind.ID, f.index)
        if not is_multi_hot(f.type):
            if _is_text(column.type):
                present = pc.and_(pc.is_valid(column), pc.not_equal(column, "")).fill_null(False)
                if f.type == "hex":
                    ok = pc.match_substring_regex(column, HEX_PATTERN).fill_null(False)
                    pending.tally(
                        record_code(RecordKind.REJECT),
                        reject_code(f.index, "not_hex"),
                        pc.sum(pc.and_not(present, ok)).as_py() or 0,
                    )
                    present = pc.and_(present, ok)
                pending.add(code, column.filter(present), text=True)
            else:
                pending.add(code, column.drop_null().cast(pa.int64()))
            return
        ids = column.flatten()
        text = _is_text(ids.type)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
        if ids.null_count or text:
            present = pc.is_valid(ids)
            if text:
                present = pc.and_(present, pc.not_equal(ids, "")).fill_null(False)
            kept = np.asarray(present, dtype=bool)
            if not kept.all():
                # per sample, the ids present: the running sum of the mask between the list offsets
                ends = np.concatenate(([0], np.cumsum(lengths)))
                seen = np.concatenate(([0], np.cumsum(kept)))
                lengths = seen[ends[1:]] - seen[ends[:-1]]
                pending.tally(
                    record_code(RecordKind.REJECT), reject_code(f.index, "null_id"), len(kept) - int(seen[-1])
                )
                ids = ids.filter(present)
        pending.add(code, ids if text else ids.cast(pa.int64()), text=text)
        pending.add(record_code(RecordKind.POOLING, f.index), pa.array(lengths, pa.int64()))


@dataclasses.dataclass(frozen=True)
class ParquetFileCounter:
    """Picklable: a task's input batches hold its number (column ``id``), ``tasks`` each task's
    Parquet files, which it reads with pyarrow and counts. A file that cannot be read fails the
    task with ``reading file <uri>``, which the driver turns into a corrupt-input error naming it."""

    counter: PartitionCounter
    tasks: tuple[tuple[str, ...], ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending = _Pending()
        for batch in batches:
            for uri in (uri for task in batch.column("id").to_pylist() for uri in self.tasks[task]):
                for rows, columns in self._read(uri):
                    self.counter.count(rows, columns, None, None, pending)
                    yield from pending.flush_if_full()
        yield from pending.flush()

    def _read(self, uri: str) -> Iterator[tuple[int, dict[int, pa.Array]]]:
        """(rows, feature index -> column) per batch of the file; a file without any feature
        column still has its rows, all absent."""
        import pyarrow.parquet as pq

        try:
            filesystem, path = pyarrow.fs.FileSystem.from_uri(arrow_uri(uri))
        except (pa.ArrowException, OSError, ValueError) as exc:  # the executor's pyarrow, not the file
            raise RuntimeError(
                f"pyarrow on this executor cannot open the filesystem of {uri} ({exc}); "
                "profile with --parquet-reader spark"
            ) from None
        try:
            file = pq.ParquetFile(filesystem.open_input_file(path))
            schema = file.schema_arrow
            wanted = [
                f for f in self.counter.features if f.name in schema.names
            ]  # a missing column: all null
            read_as = {}
            for f in wanted:
                plain = _plain_type(schema.field(f.name).type)
                if not _holds(plain, f.type):
                    raise pa.ArrowInvalid(
                        f"column {f.name!r} has type {schema.field(f.name).type}, "
                        f"the model config says {f.type}"
                    )
                empty = pa.types.is_null(plain) or (
                    pa.types.is_list(plain) and pa.types.is_null(plain.value_type)
                )
                read_as[f.index] = _natural_type(f.type) if empty else plain
            for batch in file.iter_batches(
                PARQUET_BATCH_ROWS, columns=[f.name for f in wanted], use_threads=False
            ):
                # one type per feature whatever each file's writer chose, so a task's chunks concatenate
                yield batch.num_rows, {f.index: batch.column(f.name).cast(read_as[f.index]) for f in wanted}
        except (pa.ArrowException, OSError) as exc:
            raise RuntimeError(unreadable_file_message(uri, exc)) from None


# a task parses this many bytes of TSV at a time (whole lines: a little more)
TSV_CHUNK_BYTES = 32 << 20
_LF, _CR, _TAB = 10, 13, 9


@dataclasses.dataclass(frozen=True)
class CriteoTsvCounter:
    """Picklable: a task's input batches hold its number (column ``id``), ``tasks`` each task's
    byte ranges ``(uri, start, end)`` of Criteo TSV files; a range holds the lines that start in
    it. Each line is what :func:`recshard_stats.readers.normalize_criteo_tsv` makes of it: one of
    exactly ``fields`` tab-separated fields, or malformed (``wrong_field_count``); each feature
    the field at its ``positions`` entry (hex ids; empty: absent); each field of
    ``integer_checks`` (position, reject code) a ``not_integer`` reject unless empty or an
    integer. Fields are read as bytes: a byte that is not UTF-8 makes its value a reject, as
    Spark's replacement character does."""

    counter: PartitionCounter
    fields: int
    positions: tuple[int, ...]  # per counted feature, in the counter's order
    integer_checks: tuple[tuple[int, int], ...]
    tasks: tuple[tuple[tuple[str, int, int], ...], ...]
    chunk_bytes: int  # parsed at a time (TSV_CHUNK_BYTES)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending = _Pending()
        for batch in batches:
            for uri, start, end in (r for task in batch.column("id").to_pylist() for r in self.tasks[task]):
                try:
                    for data in _line_chunks(uri, start, end, self.chunk_bytes):
                        self._count(data, pending)
                        yield from pending.flush_if_full()
                except (pa.ArrowException, OSError) as exc:
                    raise RuntimeError(unreadable_file_message(uri, exc)) from None
        yield from pending.flush()

    def _count(self, data: bytes, pending: _Pending) -> None:
        import pyarrow.csv as csv

        lines, kept, whole = _lines_of_fields(data, self.fields)
        pending.tally(record_code(RecordKind.ROW), RowOutcome.MALFORMED, lines - kept)
        if not kept:
            return
        names = [f"f{i}" for i in range(self.fields)]
        table = csv.read_csv(
            pa.BufferReader(whole),
            read_options=csv.ReadOptions(column_names=names, use_threads=False, block_size=16 << 20),
            parse_options=csv.ParseOptions(
                delimiter="\t",
                quote_char=False,
                escape_char=False,
                double_quote=False,
                newlines_in_values=False,
            ),
            convert_options=csv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.binary()),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
        assert table.num_rows == kept, (table.num_rows, kept)
        ascii_only = not np.any(np.frombuffer(data, np.uint8) >= 0x80)
        for position, code in self.integer_checks:
            column = table.column(position)
            bad = pc.and_not(pc.not_equal(column, b""), pc.match_substring_regex(column, INT_PATTERN))
            pending.tally(record_code(RecordKind.REJECT), code, pc.sum(bad).as_py() or 0)
        columns = {
            f.index: _as_text(table.column(p).combine_chunks(), ascii_only)
            for f, p in zip(self.counter.features, self.positions, strict=True)
        }
        self.counter.count(table.num_rows, columns, None, None, pending)


def _line_tabs(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Per line of ``data`` (whole lines): its number of tabs, and its length with its line end.
    A line ends at ``\n``, ``\r\n`` or a lone ``\r``, as in Hadoop's reader and pyarrow's."""
    b = np.frombuffer(data, np.uint8)
    lf = b == _LF
    lone_cr = b == _CR
    lone_cr[:-1] &= ~lf[1:]
    last = np.flatnonzero(lf | lone_cr)  # each line's last byte
    if len(b) and (not len(last) or last[-1] != len(b) - 1):
        last = np.append(last, len(b) - 1)  # the file's last line, without a line end
    per_line = np.bincount(np.searchsorted(last, np.flatnonzero(b == _TAB)), minlength=len(last))
    return per_line, np.diff(np.concatenate(([-1], last)))


def _lines_of_fields(data: bytes, fields: int) -> tuple[int, int, bytes]:
    """The lines in ``data``, those of exactly ``fields`` tab-separated fields (an empty line has
    one), and the bytes of those alone (pyarrow would stop at the others)."""
    tabs, lengths = _line_tabs(data)
    good = tabs == fields - 1
    kept = int(np.count_nonzero(good))
    if kept < len(tabs):
        data = np.frombuffer(data, np.uint8)[np.repeat(good, lengths)].tobytes()
    return len(tabs), kept, data


def _as_text(column: pa.Array, ascii_only: bool) -> pa.Array:
    """Bytes -> string for the counter. Values that are not UTF-8 cannot be strings: they become
    ``?``, which the counter rejects as not hex as it would have the bytes."""
    if not ascii_only:
        keep = pc.or_(pc.equal(column, b""), pc.match_substring_regex(column, HEX_PATTERN))
        column = pc.if_else(keep, column, pa.scalar(b"?"))
    return column.view(pa.string())


def _line_chunks(uri: str, start: int, end: int, chunk_bytes: int) -> Iterator[bytes]:
    """The lines of a file that start in bytes [start, end), read about ``chunk_bytes`` at a
    time (whole lines). A line starts at byte 0 and after each ``\n``; ranges and chunks are cut
    there, so a lone ``\r`` (a line end too) stays inside the bytes pyarrow parses."""
    filesystem, path = pyarrow.fs.FileSystem.from_uri(arrow_uri(uri))
    with filesystem.open_input_file(path) as file:
        size = file.size()
        stop = _line_start(file, end, size)
        at = _line_start(file, start, size)
        while at < stop:
            upto = min(_line_start(file, at + chunk_bytes, size), stop)
            file.seek(at)
            yield file.read(upto - at)
            at = upto


def _line_start(file, position: int, size: int) -> int:
    """The first byte at or after ``position`` that starts a line (``size`` past the last)."""
    if position <= 0:
        return 0
    at = position - 1
    while at < size:
        file.seek(at)
        block = file.read(1 << 16)
        found = block.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(block)
    return size


def _is_text(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _plain_type(arrow_type: pa.DataType) -> pa.DataType:
    """The type a column is counted as: dictionaries decoded (what pandas writes for a category),
    ``large_string`` and ``string_view`` as ``string``, large, fixed-size and view lists as ``list``."""
    if pa.types.is_dictionary(arrow_type):
        return _plain_type(arrow_type.value_type)
    if pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return pa.string()
    if any(
        check(arrow_type)
        for check in (
            pa.types.is_list,
            pa.types.is_large_list,
            pa.types.is_fixed_size_list,
            pa.types.is_list_view,
            pa.types.is_large_list_view,
        )
    ):
        return pa.list_(_plain_type(arrow_type.value_type))
    return arrow_type


def _natural_type(feature_type: str) -> pa.DataType:
    """A feature's ids as the counter reads them, for a column of Arrow type null (all absent)."""
    single = pa.string() if feature_type in ("string", "hex", "array<string>") else pa.int64()
    return pa.list_(single) if is_multi_hot(feature_type) else single


def _holds(arrow_type: pa.DataType, feature_type: str) -> bool:
    """Whether a Parquet column of (plain, :func:`_plain_type`) ``arrow_type`` holds the ids of a
    ``feature_type`` feature; a column of type null holds none of any feature."""
    if pa.types.is_null(arrow_type):
        return True
    if is_multi_hot(feature_type):
        if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
            return False
        element = arrow_type.value_type
        if pa.types.is_null(element):  # lists that are all empty or null
            return True
        return _is_text(element) if feature_type == "array<string>" else pa.types.is_integer(element)
    return pa.types.is_integer(arrow_type) if feature_type == "int64" else _is_text(arrow_type)


def arrow_uri(uri: str) -> str:
    """Hadoop's spelling of a local file (``file:/x``) -> one pyarrow opens (``file:///x``)."""
    if uri.startswith("file:/") and not uri.startswith("file:///"):
        return "file:///" + uri[len("file:/") :].lstrip("/")
    return uri


class _Pending:
    """Ids waiting to be counted, per (code, integer or text), and counts already known."""

    def __init__(self):
        self.chunks: dict[tuple[int, bool], list[pa.Array]] = {}
        self.known: dict[tuple[int, int], int] = {}
        self.values = 0

    def add(self, code: int, values: pa.Array, text: bool = False) -> None:
        if len(values):
            self.chunks.setdefault((code, text), []).append(values)
            self.values += len(values)

    def tally(self, code: int, key: int, count: int) -> None:
        if count:
            self.known[(code, key)] = self.known.get((code, key), 0) + count

    def flush_if_full(self) -> Iterator[pa.RecordBatch]:
        return self.flush() if self.values >= FLUSH_VALUES else iter(())

    def flush(self) -> Iterator[pa.RecordBatch]:
        for (code, text), chunks in self.chunks.items():
            counted = pc.value_counts(pa.chunked_array(chunks))
            values, counts = counted.field("values"), counted.field("counts")
            n = len(counted)
            if text and not pa.types.is_string(values.type):  # large_string -> the schema's string
                values = values.cast(pa.string())
            none = pa.nulls(n, pa.int64() if text else pa.string())
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(n, code, np.int32)),
                    none if text else values,
                    values if text else none,
                    counts,
                ],
                schema=_ARROW_SCHEMA,
            )
        if self.known:
            codes, keys = zip(*self.known, strict=True)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(codes, pa.int32()),
                    pa.array(keys, pa.int64()),
                    pa.nulls(len(codes), pa.string()),
                    pa.array(list(self.known.values()), pa.int64()),
                ],
                schema=_ARROW_SCHEMA,
            )
        self.chunks, self.known, self.values = {}, {}, 0
