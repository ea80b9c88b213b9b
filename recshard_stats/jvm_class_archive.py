"""The JVM's class-data archive for local runs: a fresh JVM spends seconds loading and verifying
Spark's classes (BENCHMARKS.md: about 4 s of a CLI profile). The first local run records which
classes it loaded and saves them, once, as a dynamic CDS archive in the user's cache; later
runs map it instead of loading each class again.

The archive is keyed by the Java runtime and Spark's jars (path, size, mtime), so an upgraded
JDK or Spark writes a new one; a JVM that still refuses an archive (another heap mode) starts
without it, silently, as it would have anyway.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import shutil
import time

log = logging.getLogger(__name__)

ARCHIVE_CONF = "spark.recshard.classArchive"  # set while a JVM records: where to save its archive
# the JVM's own warnings about an unusable archive would reach the console
QUIET = "-Xlog:cds=off,cds+dynamic=off"
COMPRESSED_OOPS_LIMIT = 32 << 30  # above it the JVM uses another base archive
UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def cache_dir() -> pathlib.Path:
    """RECSHARD_CACHE_DIR/jvm, else the user's cache (XDG_CACHE_HOME or ~/.cache)/recshard/jvm."""
    if os.environ.get("RECSHARD_CACHE_DIR"):
        return pathlib.Path(os.environ["RECSHARD_CACHE_DIR"], "jvm")
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache", "recshard", "jvm")


def _java() -> pathlib.Path | None:
    """The java that spark-submit starts: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = pathlib.Path(home, "bin", "java") if home else shutil.which("java")
    return pathlib.Path(found).resolve() if found and os.path.exists(found) else None


def _spark_jars() -> pathlib.Path | None:
    from pyspark.find_spark_home import _find_spark_home

    jars = pathlib.Path(_find_spark_home(), "jars")
    return jars if jars.is_dir() else None


def _bytes(memory: str) -> int:
    number = memory.lower().rstrip("b")
    unit = UNITS.get(number[-1:])
    return int(number[:-1]) * unit if unit else int(number)


def archive_path(driver_memory: str | None) -> pathlib.Path | None:
    """Where this Java and Spark keep their archive, or None when either is not found."""
    java, jars = _java(), _spark_jars()
    if java is None or jars is None:
        return None
    key = hashlib.sha256()
    for path in (java, java.parent.parent / "lib" / "server" / "libjvm.so", *sorted(jars.glob("*.jar"))):
        if path.exists():
            stat = path.stat()
            key.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    large_heap = driver_memory is not None and _bytes(driver_memory) >= COMPRESSED_OOPS_LIMIT
    key.update(b"large heap" if large_heap else b"compressed oops")
    return cache_dir() / f"spark-{key.hexdigest()[:20]}.jsa"


def archive_java_options(path: pathlib.Path) -> str:
    """The driver JVM's options: map the archive when it exists, else record for saving one."""
    if path.exists():
        return f"-XX:SharedArchiveFile={path} {QUIET}"
    return f"-XX:+RecordDynamicDumpInfo {QUIET}"


def _diagnostic_command(spark, command: str, *arguments: str) -> None:
    """Run a jcmd command inside the session's JVM, through the platform MBean server: no JDK
    tools needed beside the runtime. Called through reflection on the public interface, since
    Py4J cannot call the server's own class (not exported from java.management)."""
    jvm, gateway = spark.sparkContext._jvm, spark.sparkContext._gateway

    def array(kind, *values):
        out = gateway.new_array(kind, len(values))
        for index, value in enumerate(values):
            out[index] = value
        return out

    klass = jvm.java.lang.Class.forName
    invoke = klass("javax.management.MBeanServerConnection").getMethod(
        "invoke",
        array(
            jvm.java.lang.Class,
            klass("javax.management.ObjectName"),
            klass("java.lang.String"),
            klass("[Ljava.lang.Object;"),
            klass("[Ljava.lang.String;"),
        ),
    )
    console = jvm.java.lang.System.out
    # the command prints its own line to the JVM's stdout, which is this console
    jvm.java.lang.System.setOut(jvm.java.io.PrintStream(jvm.java.io.ByteArrayOutputStream()))
    try:
        invoke.invoke(
            jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer(),
            array(
                jvm.java.lang.Object,
                jvm.javax.management.ObjectName("com.sun.management:type=DiagnosticCommand"),
                command,
                array(jvm.java.lang.Object, array(jvm.java.lang.String, *arguments)),
                array(jvm.java.lang.String, "[Ljava.lang.String;"),
            ),
        )
    finally:
        jvm.java.lang.System.setOut(console)


def save_class_archive(spark) -> pathlib.Path | None:
    """Save the archive of the classes this session's JVM loaded, if it recorded them and no
    other run has saved one meanwhile. Called once the command's work is done, so the archive
    holds the classes that work used. Failing to save costs only the speed-up: logged, not raised."""
    target = spark.sparkContext.getConf().get(ARCHIVE_CONF, None)
    if not target or os.path.exists(target):
        return None
    path = pathlib.Path(target)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    started = time.perf_counter()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _diagnostic_command(spark, "vmCds", "dynamic_dump", str(tmp))
        if not tmp.exists():
            raise OSError(f"the JVM wrote no archive to {tmp}")
        os.replace(tmp, path)
    except Exception as exc:  # the JVM refused (another JDK build), a full disk, a read-only home
        tmp.unlink(missing_ok=True)
        log.debug("no JVM class archive saved: %s", exc)
        return None
    for stale in path.parent.glob("spark-*.jsa"):
        if stale != path:  # another JDK's or Spark's: never used again
            stale.unlink(missing_ok=True)
    log.info(
        "saved the JVM's class archive (%.0f MB in %.1f s): later local runs start faster (%s)",
        path.stat().st_size / 1e6,
        time.perf_counter() - started,
        path,
    )
    return path
