"""The Spark side of every stage: the SparkSession, reading the logs, and input failures turned
into one line that names the file. The transforms themselves are pure DataFrame -> DataFrame
code in :mod:`recshard_stats.readers`, :mod:`recshard_stats.profiler` and friends."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import getpass
import logging
import os
import pathlib
import re
import sys
import tempfile
import time
from typing import TypeVar

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.jvm_class_archive import ARCHIVE_CONF, archive_java_options, archive_path
from recshard_stats.options import SparkOptions
from recshard_stats.record_codes import unreadable_file_in

log = logging.getLogger(__name__)


class HadoopFS:
    """The few filesystem calls the job needs, through Spark's own Hadoop client (local, HDFS, S3...)."""

    def __init__(self, spark, uri: str):
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self.fs = self._path(uri).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        self.links_skipped = 0  # directories file_sizes reached again through a link

    def path(self, uri: str):
        return self._path(uri)

    def exists(self, uri: str) -> bool:
        return self.fs.exists(self.path(uri))

    def data_files(self, uri: str):
        """The file, or the files at any depth under the directory, that are not hidden or markers
        (as Spark's readers see them), as qualified URIs; lazily."""
        return (path for path, _ in self.file_sizes(uri))

    def write_text(self, uri: str, text: str) -> None:
        stream = self.fs.create(self.path(uri), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def rename(self, src: str, dst: str) -> None:
        if not self.fs.rename(self.path(src), self.path(dst)):
            raise OSError(f"could not rename {src} to {dst}")

    def delete(self, uri: str) -> None:
        self.fs.delete(self.path(uri), True)

    def create_exclusive(self, uri: str, text: str) -> bool:
        """Create a file only if it does not exist (atomic on HDFS and local disks)."""
        try:
            stream = self.fs.create(self.path(uri), False)
        except Exception as exc:  # Py4J wraps Hadoop's FileAlreadyExistsException
            if "FileAlreadyExists" in str(exc) or "already exists" in str(exc):
                return False
            raise
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        return True

    def age_seconds(self, uri: str) -> float:
        return time.time() - self.fs.getFileStatus(self.path(uri)).getModificationTime() / 1000

    def children(self, uri: str) -> list[tuple[str, str, float]]:
        """(name, uri, age in seconds) of each entry of a directory."""
        now = time.time()
        return [
            (s.getPath().getName(), s.getPath().toString(), now - s.getModificationTime() / 1000)
            for s in self.fs.listStatus(self.path(uri))
        ]

    def file_sizes(self, uri: str):
        """(uri, bytes) of the file, or of every file at any depth under the directory, in name
        order, outside hidden and ``_`` directories and not hidden or a marker itself (as Spark's
        readers see them: a failed writer's ``_temporary/`` or ``.staging/`` is not read); a
        directory reached again through a link is read once. Lazily."""
        root = self.path(uri)
        status = self.fs.getFileStatus(root)
        if not status.isDirectory():
            yield status.getPath().toString(), status.getLen()
            return
        seen: set[str] = set()
        stack = [root]
        while stack:
            directory = stack.pop()
            where = _real_directory(directory.toString())
            if where in seen:
                log.warning("skipping %s: a link to a directory already read", directory.toString())
                self.links_skipped += 1
                continue
            seen.add(where)
            entries = sorted(self.fs.listStatus(directory), key=lambda s: s.getPath().getName())
            for entry in reversed(entries):  # a stack: the first name comes out first
                if entry.getPath().getName().startswith((".", "_")):
                    continue
                if entry.isDirectory():
                    stack.append(entry.getPath())
            for entry in entries:
                if not entry.isDirectory() and not entry.getPath().getName().startswith((".", "_")):
                    yield entry.getPath().toString(), entry.getLen()

    def check_writable(self, uri: str) -> None:
        """``uri`` is (or can be made) a directory this job can write in: checked before the work."""
        path = self.path(uri)
        if self.fs.exists(path) and not self.fs.getFileStatus(path).isDirectory():
            raise RecShardError(
                Reason.OUTPUT_INVALID,
                f"--out {uri} is a file, not a directory",
                fixes=("give a directory (it is created if missing)",),
            )
        probe = f"{uri.rstrip('/')}/_write-probe-{os.getpid()}-{time.time_ns()}"
        try:
            self.write_text(probe, "")
            self.delete(probe)
        except Exception as exc:  # Py4J wraps Hadoop's AccessControlException, IOException...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RecShardError(
                Reason.OUTPUT_INVALID,
                f"cannot write in --out {uri}: {first}",
                fixes=("check the directory's permissions", "give another --out"),
            ) from None


LOCAL_DRIVER_MEMORY_SHARE = 0.5  # the rest is the Python workers' (pyarrow counts there) and the OS's


def local_driver_memory() -> str:
    """The local-mode driver's heap when none is given: half of the machine's memory, at least 1g."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "1g"
    return f"{max(1, int(total * LOCAL_DRIVER_MEMORY_SHARE / 2**30))}g"


_served = None  # the session of a `recshard serve` process, while it serves


@contextlib.contextmanager
def serving(spark):
    """While inside, :func:`spark_session` gives each command a new session of ``spark``'s
    context (its own SQL settings and views) instead of starting one."""
    global _served
    _served = spark
    try:
        yield
    finally:
        _served = None


def _served_session(served, options: SparkOptions):
    conf = served.sparkContext.getConf()
    asked = {
        "--master": (options.master, conf.get("spark.master", "")),
        "--driver-memory": (options.driver_memory, conf.get("spark.driver.memory", "")),
    }
    for flag, (wanted, held) in asked.items():
        if wanted is not None and wanted != held:
            raise RecShardError(
                Reason.CONFIG_INVALID,
                f"{flag} {wanted}: the recshard server's session runs with {held}",
                fixes=(f"drop {flag}", f"start a server with {flag} {wanted}", "drop --server"),
            )
    if options.spark_log is not None:
        raise RecShardError(
            Reason.CONFIG_INVALID,
            "--spark-log: the recshard server's session writes Spark's log where the server was told",
            fixes=("drop --spark-log", "drop --server"),
        )
    return _with_local_defaults(served.newSession())


@contextlib.contextmanager
def local_working_directory(spark, directory: str):
    """Relative paths given to Spark (Hadoop's local filesystem) resolve in ``directory`` while
    inside; a JVM's own working directory cannot change, the filesystem's can."""
    jvm = spark.sparkContext._jvm
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())
    before = local.getWorkingDirectory()
    local.setWorkingDirectory(jvm.org.apache.hadoop.fs.Path(local_uri(directory)))
    try:
        yield
    finally:
        local.setWorkingDirectory(before)


def spark_session(app: str, options: SparkOptions = SparkOptions()):
    """The job's session. Under spark-submit the master, memory and conf come from its flags
    (``--master`` here overrides); run from the CLI it is local mode on every core; inside
    ``recshard serve``, a new session of the server's."""
    if _served is not None:
        return _served_session(_served, options)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # the JVM spark-submit started holds its conf
    if options.master or not under_spark_submit:
        master = options.master or "local[*]"
        builder = builder.master(master)
        if master.startswith("local"):
            # local mode talks to itself only: never bind the driver to an outside interface
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
    driver_memory = options.driver_memory
    if driver_memory is None and not under_spark_submit and (options.master or "local").startswith("local"):
        # local mode is the whole cluster in this JVM: Spark's 1g default made the 10^7-sample
        # profile 24% slower (83 s against 67 s with 8g, BENCHMARKS.md)
        driver_memory = local_driver_memory()
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    spark_log = None
    if not under_spark_submit:  # this process starts the JVM: its log goes to a file
        spark_log = options.spark_log or os.path.join(
            tempfile.gettempdir(), f"recshard-spark-{getpass.getuser()}.log"
        )
        config = pathlib.Path(__file__).with_name("spark_log4j2.properties")
        java_options = f"-Dlog4j2.configurationFile={config} -Drecshard.spark.log={spark_log}"
        archive = archive_path(driver_memory) if options.class_archive else None
        if archive is not None:
            java_options += " " + archive_java_options(archive)
            if not archive.exists():
                builder = builder.config(ARCHIVE_CONF, str(archive))
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if spark_log is not None:
        try:  # log4j would print its own Java trace and Spark's log to the console instead
            pathlib.Path(spark_log).parent.mkdir(parents=True, exist_ok=True)
            open(spark_log, "a").close()
        except OSError as exc:
            raise RecShardError(
                Reason.CONFIG_INVALID,
                f"--spark-log {spark_log}: cannot write there ({exc.strerror or exc})",
                fixes=("pass --spark-log a file in a writable directory",),
            ) from None
    if not under_spark_submit:
        # the profile runs Python (pyarrow) in the executors: this interpreter, not whatever python3
        # is on PATH (PySpark reads only the environment; spark-submit sets it from spark.pyspark.python)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        reason = spark_failure(exc)
        if reason is None:
            raise
        raise RecShardError(
            Reason.SPARK_FAILED,
            f"Spark did not start (master {options.master or 'local[*]'}): {reason}",
            fixes=(
                f"see Spark's log {spark_log}" if spark_log else "see spark-submit's output",
                "check JAVA_HOME (Java 17 or 21) and the --master URL",
            ),
        ) from None
    if spark_log is None:
        spark.sparkContext.setLogLevel("WARN")
    else:
        log.info("Spark's own log: %s", spark_log)
    log.info("Spark %s, master %s", spark.version, spark.sparkContext.master)
    return _with_local_defaults(spark)


def _with_local_defaults(spark):
    conf = spark.sparkContext.getConf()
    if conf.get("spark.master", "").startswith("local") and not conf.contains("spark.sql.shuffle.partitions"):
        # Spark's default of 200 shuffle partitions costs more in task overhead than the work
        # itself on a few local cores; a few per core is right there.
        spark.conf.set("spark.sql.shuffle.partitions", str(4 * (os.cpu_count() or 1)))
    return spark


def spark_failure(exc: BaseException) -> str | None:
    """One line for a failure inside Spark (a Py4J call, the JVM, a PySpark error): the Java
    exception at the root of the chain, or the error's first line; None for any other error."""
    module = type(exc).__module__
    if not (module.startswith("py4j") or module.startswith("pyspark")):
        return None
    # Py4J's error holds the Java exception; PySpark's captured error (what Py4J's becomes) its origin
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if java is not None:
        try:  # the root cause: a disk full, a permission, a lost executor
            while java.getCause() is not None:
                java = java.getCause()
            text = str(java.toString())
        except Exception:  # the JVM may be gone; its text is still here
            text = str(exc)
    else:
        text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if "Traceback (most recent call last)" in lines[0] and len(lines) > 1:
        # a Python worker's error: what was thrown, not the traceback's frames
        return f"{lines[0].split('Traceback')[0].strip()} {lines[-1]}"
    return lines[0]


def _real_directory(uri: str) -> str:
    """A directory's identity: its real path on the local filesystem (links resolved), else its URI."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    return os.path.realpath(unquote(parsed.path)) if parsed.scheme in ("", "file") else uri


def local_uri(path) -> str:
    """An explicit local-filesystem URI (``Path.as_uri`` would escape the ``=`` of ``ds=``)."""
    return "file://" + str(pathlib.Path(path).resolve())


# names that are not logs: notes, configs, checksums and scripts left beside them
NOT_LOGS = re.compile(
    r"(?i)^(readme|license|notice|changelog)([._-].*)?$|"
    r"\.(md|rst|json|ya?ml|toml|py|sh|html|pdf|sha256|md5|crc|lock|bak|orig|tmp|swp)$|~$"
)


@dataclasses.dataclass(frozen=True)
class InputFiles:
    """What to read of the given inputs: the paths as given, or their log files when some files
    are left out; and what was left out, by name."""

    paths: tuple[str, ...]
    empty: tuple[str, ...]  # zero-byte files (no rows; a Parquet reader would skip them unsaid)
    not_logs: tuple[str, ...]  # files whose names say they are not logs (README, *.json, ...)


def screen_inputs(spark, inputs: list[str]) -> InputFiles:
    """The inputs' files, without zero-byte files and files that are not logs by their name
    (hidden, ``_`` and ``.`` files are never read): each left out is logged by name. Paths that
    do not exist or hold no log file are a clear error."""
    fs = HadoopFS(spark, inputs[0])
    missing = [p for p in inputs if not fs.exists(p)]
    if missing:
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"input path(s) not found: {missing}",
            fixes=("check --input and that the day's logs have landed",),
        )
    empty, not_logs, kept, barren = [], [], [], []
    for p in inputs:
        logs = []
        for path, size in fs.file_sizes(p):
            if size == 0:
                empty.append(path)
                log.warning("skipping empty input file %s (0 bytes)", path)
            elif NOT_LOGS.search(path.rsplit("/", 1)[-1]):
                not_logs.append(path)
                log.warning("skipping input file %s: its name says it is not a log", path)
            else:
                logs.append(path)
        kept += logs
        if not logs:
            barren.append(p)
    if barren:
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"input path(s) hold no data files: {barren}"
            + (f" ({len(empty)} empty, {len(not_logs)} not logs)" if empty or not_logs else ""),
            fixes=("the day's logs may not have landed yet, or were written elsewhere",),
        )
    # the paths as given unless some file must be left out (Spark lists them as we do, but
    # would follow a link back into a directory it already read)
    left_out = empty or not_logs or fs.links_skipped
    return InputFiles(tuple(kept) if left_out else tuple(inputs), tuple(empty), tuple(not_logs))


def read_normalized(spark, model, inputs: list[str], sample_fraction: float = 1.0, seed: int = 0):
    """The logs at ``inputs`` (format from the model config; screened by :func:`screen_inputs`)
    as the normalized frame of :mod:`recshard_stats.readers`, optionally Bernoulli-sampled."""
    from recshard_stats.readers import normalize_criteo_tsv, normalize_csv, normalize_parquet

    def sample(df):
        return df if sample_fraction >= 1 else df.sample(fraction=sample_fraction, seed=seed)

    if model.input_format == "criteo_tsv":
        return normalize_criteo_tsv(sample(spark.read.text(inputs)), model)
    if model.input_format == "csv":
        return normalize_csv(sample(read_csv(spark, model, inputs)), model)
    from recshard_stats.readers import check_parquet_schema, parquet_read_schema

    source = ", ".join(inputs)
    check_parquet_schema(spark.read.parquet(*inputs).schema, model, source)
    # read as the model's types: one file's int32 ids and another's int64 are the same ids (the
    # pyarrow reader casts them too); the schema of the first file read would refuse the wider
    logs = spark.read.schema(parquet_read_schema(model)).parquet(*inputs)
    return normalize_parquet(sample(logs), model, source=source)


def read_partial_counts(
    spark,
    model,
    inputs: list[str],
    *,
    parquet_reader: str = "arrow",
    sample_fraction: float = 1.0,
    seed: int = 0,
):
    """The logs at ``inputs`` (screened by :func:`screen_inputs`) as the profile's partial counts
    (:mod:`recshard_stats.partition_counts`). At full sample, with ``parquet_reader="arrow"`` and
    a filesystem pyarrow opens, Parquet and uncompressed Criteo TSV of hex features are read by
    pyarrow inside the tasks; everything else goes through Spark's reader and the normalized
    frame."""
    from recshard_stats import partition_counts
    from recshard_stats.partition_counts import (
        RECORD_SCHEMA,
        CriteoTsvCounter,
        ParquetFileCounter,
        PartitionCounter,
    )

    counter = PartitionCounter.of([(f.name, f.type) for f in model.features])
    files = _arrow_files(spark, model, inputs) if parquet_reader == "arrow" and sample_fraction >= 1 else None
    if files is not None:
        parallelism = spark.sparkContext.defaultParallelism
        reader: ParquetFileCounter | CriteoTsvCounter
        if model.input_format == "parquet":
            from recshard_stats.readers import check_parquet_schema

            check_parquet_schema(spark.read.parquet(*inputs).schema, model, ", ".join(inputs))
            reader = ParquetFileCounter(counter, _byte_tasks(files, parallelism))
        else:
            from recshard_stats.readers import CRITEO_COLUMNS, CRITEO_FIELDS
            from recshard_stats.record_codes import criteo_integer_checks

            reader = CriteoTsvCounter(
                counter,
                CRITEO_FIELDS,
                tuple(CRITEO_COLUMNS.index(f.name) for f in model.features),
                criteo_integer_checks(model),
                _range_tasks(files, parallelism),
                partition_counts.TSV_CHUNK_BYTES,
            )
            log.info(
                "reading %d Criteo TSV file(s), %.1f MB, with pyarrow in %d tasks",
                len(files),
                sum(size for _, size in files) / 1e6,
                len(reader.tasks),
            )
        # one partition per task, each holding its task's number
        tasks = len(reader.tasks)
        return spark.range(tasks, numPartitions=tasks).mapInArrow(reader, RECORD_SCHEMA)
    return read_normalized(spark, model, inputs, sample_fraction, seed).mapInArrow(counter, RECORD_SCHEMA)


T = TypeVar("T")
# a task reads about this many bytes (more: fewer partial counts to shuffle, more memory per task)
TASK_BYTES = 512 << 20
# what Spark's text source decompresses by name: such files are read whole, by Spark
COMPRESSED = re.compile(r"(?i)\.(gz|bz2|deflate|lz4|snappy|zst|zstd|xz|br)$")


def _byte_tasks(items: list[tuple[T, int]], parallelism: int) -> tuple[tuple[T, ...], ...]:
    """Items (files, or byte ranges of files) with their bytes, grouped into a multiple of
    ``parallelism`` tasks of about equal bytes (largest first, each to the lightest task)."""
    total = sum(size for _, size in items)
    count = min(len(items), parallelism * max(1, -(-total // (parallelism * TASK_BYTES))))
    tasks: list[list[T]] = [[] for _ in range(count)]
    loads = [0] * count
    for item, size in sorted(items, key=lambda f: -f[1]):
        lightest = loads.index(min(loads))
        tasks[lightest].append(item)
        loads[lightest] += size
    return tuple(tuple(task) for task in tasks)


def _range_tasks(
    files: list[tuple[str, int]], parallelism: int
) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Text files cut into byte ranges (each task's lines are those that start in its ranges) so
    that one large file still keeps every core busy, then grouped into tasks."""
    total = sum(size for _, size in files)
    piece = max(1, min(TASK_BYTES, -(-total // parallelism)))
    ranges = [
        ((uri, start, min(start + piece, size)), min(piece, size - start))
        for uri, size in files
        for start in range(0, size, piece)
    ]
    return _byte_tasks(ranges, parallelism)


def _arrow_files(spark, model, inputs: list[str]) -> list[tuple[str, int]] | None:
    """(uri, bytes) of every data file when pyarrow reads these logs in the tasks: Parquet, or
    Criteo TSV of hex features (others: Spark's reader keeps its text semantics) that is not
    compressed, on a filesystem pyarrow opens; else None (logged when the filesystem is why)."""
    tsv = model.input_format == "criteo_tsv"
    if not (model.input_format == "parquet" or (tsv and all(f.type == "hex" for f in model.features))):
        return None
    files = _arrow_readable_files(spark, inputs)
    if files is not None and tsv and any(COMPRESSED.search(uri) for uri, _ in files):
        return None
    return files


def _arrow_readable_files(spark, inputs: list[str]) -> list[tuple[str, int]] | None:
    """(uri, bytes) of every data file, or None (logged) when pyarrow cannot open their filesystem."""
    import pyarrow.fs

    from recshard_stats.partition_counts import arrow_uri

    fs = HadoopFS(spark, inputs[0])
    files = [f for p in inputs for f in fs.file_sizes(p)]
    try:
        pyarrow.fs.FileSystem.from_uri(arrow_uri(files[0][0]))
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        log.warning("reading with Spark's reader (slower): pyarrow cannot open %s (%s)", files[0][0], exc)
        return None
    return files


def python_csv_dialect(options) -> dict:
    """Python's ``csv`` module parameters for the model's CSV options (Spark's reader reads them
    the same way): the header is read with them, and tests write with them."""
    doubled = options.escape == options.quote
    return {
        "delimiter": options.separator,
        "quotechar": options.quote,
        "doublequote": doubled,
        "escapechar": None if doubled else options.escape,
    }


def read_csv(spark, model, inputs: list[str]):
    """CSV/TSV logs with a header row: every column a string, plus ``_corrupt_record`` for a
    line whose field count is not the header's (counted as unparseable, not read)."""
    from pyspark.sql import types as T

    from recshard_stats.readers import CORRUPT_COLUMN, check_csv_columns

    csv = model.csv
    reader = (
        spark.read.option("header", True)
        .option("sep", csv.separator)
        .option("quote", csv.quote)
        .option("escape", csv.escape)
        .option("multiLine", csv.multiline)
        .option("encoding", csv.encoding)
        .option("mode", "PERMISSIVE")
    )
    columns = _csv_header(spark, inputs, csv)
    check_csv_columns(columns, model, ", ".join(inputs))
    schema = T.StructType(
        [T.StructField(c, T.StringType()) for c in columns] + [T.StructField(CORRUPT_COLUMN, T.StringType())]
    )
    # a malformed line is found only when every column is parsed: the stage runs with READ_SETTINGS
    return reader.schema(schema).option("columnNameOfCorruptRecord", CORRUPT_COLUMN).csv(inputs)


def _csv_header(spark, inputs: list[str], options) -> list[str]:
    """The columns every file's header names, in order. Spark reads every file under one file's
    header: a file with its columns in another order would be read with its columns swapped,
    so it is an error naming it."""
    import csv

    fs = HadoopFS(spark, inputs[0])
    columns, first_file = None, None
    for file in input_files(spark, inputs):
        stream = fs.fs.open(fs.path(file))
        try:
            reader = fs._jvm.java.io.BufferedReader(
                fs._jvm.java.io.InputStreamReader(stream, options.encoding)
            )
            line = reader.readLine()
        finally:
            stream.close()
        header = next(csv.reader([line or ""], **python_csv_dialect(options)), [])
        if columns is None:
            columns, first_file = header, file
        elif header != columns:
            raise RecShardError(
                Reason.SCHEMA_MISMATCH,
                f"{file}: its header {header} is not {first_file}'s {columns} (Spark would read its "
                "columns under one file's names)",
                fixes=("write every file of a day with the same header",),
            )
    return columns or []


# settings the stages read logs and stats partitions with, set for the stage and then given back
READ_SETTINGS = {
    # a malformed CSV line is found only when every column is parsed
    "spark.sql.csv.parser.columnPruning.enabled": "false",
    # table names such as "123" must stay strings when read back from table=<name> directories
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # a feature's column is the one spelt as the model config spells it, in both Parquet readers
    # (pyarrow matches names exactly)
    "spark.sql.caseSensitive": "true",
}


def with_spark_settings(settings: dict[str, str]):
    """A stage ``stage(spark, ...)`` run with these session settings, the session's own given
    back after it: several stages share one session in a process (a DAG task, ``recshard run``,
    the tests), and one stage's settings must not change the next one's reads."""

    def wrap(stage):
        @functools.wraps(stage)
        def run(spark, *args, **kwargs):
            before = {key: spark.conf.get(key, None) for key in settings}
            for key, value in settings.items():
                spark.conf.set(key, value)
            try:
                return stage(spark, *args, **kwargs)
            finally:
                for key, value in before.items():
                    if value is None:
                        spark.conf.unset(key)
                    else:
                        spark.conf.set(key, value)

        return run

    return wrap


@contextlib.contextmanager
def input_errors(spark, input_format: str, inputs: list[str]):
    """A corrupt or truncated input file becomes one line naming it (Spark buries the name in a
    stack trace, or leaves it out when a decoder fails inside a task: then the file is found by
    decoding halves of ``inputs``, see :func:`find_unreadable_file`); everything else passes through."""
    try:
        yield
    except Exception as exc:  # Py4J / Spark exceptions have no common importable base here
        text = str(exc)
        bad = unreadable_file_in(text)
        if bad is None and _decoder_failure(text):
            log.warning("a task failed without naming its input file; decoding the inputs to find it")
            bad = find_unreadable_file(spark, input_format, inputs)
        if bad is None:
            raise
        raise RecShardError(
            Reason.INPUT_CORRUPT,
            f"cannot read input file {bad} (corrupt or truncated)",
            fixes=(
                "remove or replace that file and re-run",
                "or pass --skip-corrupt-files to profile without it (recorded in the metadata)",
                "check the input format in the model config",
            ),
            context={"file": bad},
        ) from None


def _decoder_failure(text: str) -> bool:
    """A task failed (not the driver, not for memory): the kind of failure a corrupt file causes."""
    return "Job aborted due to stage failure" in text and "OutOfMemoryError" not in text


def find_unreadable_file(spark, input_format: str, inputs: list[str]) -> str | None:
    """The data file under ``inputs`` that fails to decode in full, found by bisection (about
    2 log2(files) Spark jobs reading at most twice the input); None if every file decodes."""
    from pyspark.sql import functions as F

    def fails(files: list[str]) -> bool:
        try:
            df = spark.read.parquet(*files) if input_format == "parquet" else spark.read.text(files)
            df.select(F.max(F.xxhash64(*df.columns))).collect()  # decodes every column of every row
            return False
        except Exception:  # any failure to decode is what is being searched for
            return True

    files = input_files(spark, inputs)
    if not fails(files):
        return None
    while len(files) > 1:
        half = files[: len(files) // 2]
        files = half if fails(half) else files[len(half) :]
    return files[0] if fails(files) else None


def input_files(spark, inputs: list[str]) -> list[str]:
    """Every data file under the input paths."""

    fs = HadoopFS(spark, inputs[0])
    return [f for p in inputs for f in fs.data_files(p)]


def same_file(a: str, b: str) -> bool:
    """Whether two spellings of a path (``file:/x``, ``file:///x``, escaped or not) name one file."""
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(a).path) == unquote(urlparse(b).path)


def without_file(spark, inputs: list[str], bad: str) -> list[str]:
    """The data files under ``inputs`` except ``bad``; an error if ``bad`` is not among them."""
    files = input_files(spark, inputs)
    kept = [f for f in files if not same_file(f, bad)]
    if len(kept) == len(files):
        raise RecShardError(
            Reason.INPUT_CORRUPT,
            f"cannot read input file {bad}, and it is not one of the "
            f"{len(files)} input files, so it cannot be skipped",
            context={"file": bad},
        )
    return kept
