"""``recshard serve``: one Spark session that outlives the commands, for the Spark commands run
from the shell one after another.

A fresh JVM per command spends its first minute compiling Spark's code (BENCHMARKS.md: 22 s of
JIT compile time in a 67-s profile on 2 cores; the CLI was 1.35x the same profile in a warm
session). Java 17 keeps no compiled code between runs, so the only way to keep it is to keep the
JVM: the server starts the session once, and ``recshard profile --server ...`` (and the other Spark
commands) run inside it, the way Gradle's daemon or sbt's server keep theirs.

The protocol, over a Unix socket only its user can open (a client runs commands as the server's
user): the client sends one JSON line, ``{"argv": [...], "cwd": ...}`` or ``{"stop": true}``; the
server answers JSON lines, ``{"stream": "stdout"|"stderr", "text": ...}`` while the command runs
and ``{"exit": code}`` at its end. Commands run one at a time, each in its own SparkSession of the
shared SparkContext (its own SQL settings and temporary views), in the client's directory; a
client that goes away (Ctrl-C) cancels the command's Spark jobs.
"""

from __future__ import annotations

import contextlib
import gc
import getpass
import io
import json
import logging
import os
import pathlib
import queue
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import SparkOptions

DEFAULT_IDLE_TIMEOUT_S = 3 * 3600.0  # Gradle's daemon waits as long before it ends
SERVER_APP = "recshard-server"
WARM_UP_SAMPLES = 100_000
INTERRUPTED = 130  # a shell's exit code for Ctrl-C
REQUEST_TIMEOUT_S = 10.0  # a client sends its one line at once; one that does not is dropped
CANCEL_EVERY_S = 0.2  # after its client left, how often a command's Spark jobs are cancelled


def default_socket() -> pathlib.Path:
    """XDG_RUNTIME_DIR/recshard/server.sock, else <temp dir>/recshard-<user>/server.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        pathlib.Path(runtime, "recshard")
        if runtime
        else pathlib.Path("/tmp", f"recshard-{getpass.getuser()}")
    )
    return base / "server.sock"


class _Client:
    """A client's connection: messages sent whole (the command's threads write at once), and
    nothing more once it has gone (its command is being cancelled)."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.gone = threading.Event()
        self._lock = threading.Lock()

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            if self.gone.is_set():
                return
            try:
                self.conn.sendall(data)
            except OSError:
                self.gone.set()

    def say(self, text: str) -> None:
        self.send({"stream": "stderr", "text": text})


class _Frames(io.TextIOBase):
    """A text stream whose writes reach the client as one stream's frames."""

    def __init__(self, client: _Client, stream: str):
        self._client, self._stream = client, stream

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self._client.send({"stream": self._stream, "text": text})
        return len(text)


class _CurrentStderr(logging.StreamHandler):
    """A log handler writing to whatever ``sys.stderr`` is when a record comes: during a command,
    the client's stderr."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _read_line(conn: socket.socket, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("request too long")
    return data


def _bind(path: pathlib.Path) -> socket.socket:
    """A listening socket at ``path`` that only this user can reach; a socket left by a server
    that died is replaced, a live server's is not."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.parent == default_socket().parent and path.parent.stat().st_uid != os.getuid():
        raise RecShardError(  # another user made it first: they could swap the socket
            Reason.CONFIG_INVALID,
            f"{path.parent} belongs to another user",
            fixes=("give --socket in a directory of yours",),
        )
    if path.is_symlink() or (path.exists() and not stat.S_ISSOCK(path.stat().st_mode)):
        raise RecShardError(
            Reason.CONFIG_INVALID,
            f"--socket {path} exists and is not a socket",
            fixes=("give another --socket",),
        )
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # a dead server's
        except OSError as exc:
            raise RecShardError(
                Reason.CONFIG_INVALID,
                f"--socket {path} exists and is not a recshard server's socket ({exc.strerror or exc})",
                fixes=("give another --socket",),
            ) from None
        else:
            raise RecShardError(
                Reason.OUTPUT_BUSY,
                f"a recshard server already listens on {path}",
                fixes=(f"use it: --server {path}", f"stop it: recshard serve --stop --socket {path}"),
            )
        finally:
            probe.close()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o077)  # the socket file is created as rw for its user only
    try:
        server.bind(str(path))
    finally:
        os.umask(umask)
    server.listen(16)
    return server


def serve(
    options: SparkOptions,
    socket_path: pathlib.Path,
    run_command: Callable[[list[str]], int],
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    on_done: Callable[[Any], object] | None = None,
    warm: bool = True,
) -> int:
    """Start the session (and, with ``warm``, warm it up), then run each client's command with
    ``run_command(argv)`` (the CLI's parse-and-run, output to the client) until stopped, idle
    for ``idle_timeout_s`` or interrupted. ``on_done(spark)`` runs after each command that
    succeeded."""
    from recshard_stats import spark_io

    server = _bind(socket_path)  # a client that comes while the session starts waits for it
    console = sys.stderr
    pending: queue.Queue[socket.socket] = queue.Queue()
    try:
        spark = spark_io.spark_session(SERVER_APP, options)
        if warm:
            started = time.perf_counter()
            warm_up(spark)
            print(
                f"recshard server: warmed up in {time.perf_counter() - started:.1f} s "
                f"(a profile of {WARM_UP_SAMPLES} generated samples)",
                file=console,
                flush=True,
            )
        print(
            f"recshard server: serving on {socket_path} (Spark {spark.version}, "
            f"master {spark.sparkContext.master}); stop it with: recshard serve --stop --socket {socket_path}",
            file=console,
            flush=True,
        )
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        forwarded = _CurrentStderr()
        forwarded.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(forwarded)
        busy: list[str] = []  # what the server is doing, for a client that comes meanwhile
        threading.Thread(
            target=_accept_all, args=(server, pending, busy), daemon=True, name="recshard-accept"
        ).start()
        with spark_io.serving(spark):
            while True:
                try:
                    conn = pending.get(timeout=idle_timeout_s if idle_timeout_s > 0 else None)
                except queue.Empty:
                    print(f"recshard server: idle for {idle_timeout_s:g} s, ending", file=console, flush=True)
                    return 0
                busy[:] = ["another client's request"]
                with conn:
                    conn.settimeout(REQUEST_TIMEOUT_S)
                    try:
                        line = _read_line(conn)
                        request = json.loads(line) if line else None
                    except (ValueError, OSError) as exc:
                        print(f"recshard server: a request dropped ({exc})", file=console, flush=True)
                        request = None
                    if request is None:  # the client left, or never asked
                        busy.clear()
                        continue
                    conn.settimeout(None)
                    if request.get("stop"):
                        _Client(conn).send({"exit": 0})
                        print("recshard server: stopped by a client", file=console, flush=True)
                        return 0
                    argv, cwd = list(request.get("argv", [])), str(request.get("cwd", os.getcwd()))
                    busy[:] = [f"`recshard {' '.join(argv[:1])}` since {time.strftime('%H:%M:%S')}"]
                    started = time.perf_counter()
                    code = _run_for_client(spark, _Client(conn), argv, cwd, run_command, console)
                    print(
                        f"recshard server: {' '.join(argv[:1])} exited {code} in "
                        f"{time.perf_counter() - started:.1f} s",
                        file=console,
                        flush=True,
                    )
                    if code == 0 and on_done is not None:
                        on_done(spark)
                    busy.clear()
    except KeyboardInterrupt:
        print("recshard server: interrupted, ending", file=console, flush=True)
        return INTERRUPTED
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        server.close()
        socket_path.unlink(missing_ok=True)
        _turn_away(pending)


def _turn_away(pending: queue.Queue) -> None:
    """The clients still waiting when the server ends: told so, exit code 2."""
    text = f"error: [{Reason.SPARK_FAILED.value}] the recshard server ended before this command ran\n"
    while not pending.empty():
        with pending.get() as conn:
            client = _Client(conn)
            client.say(text)
            client.send({"exit": 2})


def _accept_all(server: socket.socket, pending: queue.Queue, busy: list[str]) -> None:
    """Accept each client as it comes, for the serving loop to take in turn; one that comes
    while a command runs is told at once what it waits for."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:  # the server is ending
            return
        if busy:
            _Client(conn).say(f"recshard server: busy with {busy[0]}; this command waits its turn\n")
        pending.put(conn)


def _run_for_client(spark, client: _Client, argv: list[str], cwd: str, run_command, console) -> int:
    """One command, in the client's directory, its output to the client; the client's leaving
    cancels its Spark jobs (said on the server's ``console``: the client hears nothing more)."""
    from recshard_stats import spark_io

    finished = threading.Event()

    def watch() -> None:  # the client sends nothing more: end of stream means it has gone
        try:
            while not finished.is_set() and client.conn.recv(1):
                pass
        except OSError:
            pass
        if not finished.is_set():
            client.gone.set()
            print("recshard server: the client went away, its Spark jobs cancelled", file=console, flush=True)
        # the command's jobs yet to start as well: it is the only one running
        while not finished.wait(CANCEL_EVERY_S):
            spark.sparkContext.cancelAllJobs()

    threading.Thread(target=watch, daemon=True, name="recshard-client-watch").start()
    code, interrupted = 1, False
    try:
        with (
            _directory(cwd),
            spark_io.local_working_directory(spark, cwd),
            contextlib.redirect_stdout(_Frames(client, "stdout")),
            contextlib.redirect_stderr(_Frames(client, "stderr")),
        ):
            try:
                code = run_command(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            except KeyboardInterrupt:  # the server's own Ctrl-C: this command ends, then the server
                print("error: the recshard server was interrupted", file=sys.stderr)
                code, interrupted = INTERRUPTED, True
            except BaseException:  # the command's bug must not end the server
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
    finally:
        finished.set()
        spark.catalog.clearCache()
        gc.collect()  # the command's Py4J proxies go, and the JVM objects only they held with them
    client.send({"exit": code})
    if interrupted:
        raise KeyboardInterrupt
    return code


def warm_up(spark) -> None:
    """Profile a few generated samples of the built-in model, every statistic on: the JIT
    compiler compiles the profile's code here, before the first command needs it."""
    from recshard_stats.generate import generate
    from recshard_stats.options import ProfileOptions
    from recshard_stats.stages import profile_logs

    spec = pathlib.Path(__file__).with_name("conf") / "synthetic.yaml"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # the warm-up's progress is nobody's business
    try:
        with tempfile.TemporaryDirectory(prefix="recshard-warm-up-") as tmp:
            logs = generate(spec, pathlib.Path(tmp, "logs"), WARM_UP_SAMPLES, seed=0, processes=1)
            profile_logs(
                spark,
                ProfileOptions(
                    model=str(spec),
                    inputs=(str(logs),),
                    out=str(pathlib.Path(tmp, "stats")),
                    ds="2026-12-01",
                    row_counts=True,
                    id_counts=True,
                ),
            )
    finally:
        root.setLevel(level)


@contextlib.contextmanager
def _directory(path: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _connect(socket_path: pathlib.Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(socket_path))
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        raise RecShardError(
            Reason.SPARK_FAILED,
            f"no recshard server listens on {socket_path}",
            fixes=(
                f"start one: recshard serve --socket {socket_path} &",
                "drop --server to run the command in its own Spark session",
            ),
        ) from None
    return conn


def run_on_server(socket_path: pathlib.Path, argv: list[str]) -> int:
    """Run a command's ``argv`` in the server at ``socket_path``, its output here; its exit code."""
    return _ask(socket_path, {"argv": argv, "cwd": os.getcwd()})


def stop_server(socket_path: pathlib.Path) -> int:
    """Ask the server to end once its current command is done."""
    return _ask(socket_path, {"stop": True})


def _ask(socket_path: pathlib.Path, request: dict) -> int:
    """Send one request; print what comes back until its exit code."""
    with _connect(socket_path) as conn:
        conn.sendall((json.dumps(request) + "\n").encode())
        try:
            for line in conn.makefile("r", encoding="utf-8"):
                message = json.loads(line)
                if "exit" in message:
                    return int(message["exit"])
                out = sys.stdout if message.get("stream") == "stdout" else sys.stderr
                out.write(message.get("text", ""))
                out.flush()
        except KeyboardInterrupt:  # closing the connection cancels the command's Spark jobs
            print("interrupted: the server cancels the command", file=sys.stderr)
            return INTERRUPTED
    raise RecShardError(
        Reason.SPARK_FAILED,
        f"the recshard server at {socket_path} ended during the command",
        fixes=("see the server's own output", "run the command again, or without --server"),
    )
