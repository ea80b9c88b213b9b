"""``recshard serve`` and ``--server``: the real console script, a real server process and its
JVM; the served profile checked against the independent computation of the statistics."""

import json
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from recshard_stats.config import load_model_config
from recshard_stats.generate import generate
from recshard_stats.stats_reader import load_stats
from tests.helpers import SPEC, assert_one_line_error, parquet_keys, write_yaml
from tests.reference import feature_reference

RECSHARD = pathlib.Path(sys.executable).with_name("recshard")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server on a socket a dead server left behind (bound, never removed)."""
    root = tmp_path_factory.mktemp("served")
    spec = write_yaml(root / "spec.yaml", SPEC)
    generate(spec, root / "logs", 2000, seed=3, chunk_rows=700, processes=1)
    sock = root / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    proc = subprocess.Popen(
        [
            str(RECSHARD),
            "serve",
            "--socket",
            str(sock),
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
            "--spark-log",
            str(root / "spark.log"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines = [""]
    deadline = time.time() + 180
    while "serving on" not in lines[-1] and time.time() < deadline and proc.poll() is None:
        lines.append(proc.stderr.readline())
    assert "serving on" in lines[-1], f"the server did not start: {lines}, exit {proc.poll()}"
    assert any("warmed up in" in line for line in lines), lines  # the default: a warm-up first
    yield root, sock, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def profile(out, *extra: str) -> list[str]:
    """``recshard profile`` of the fixture's logs, from the fixture's directory."""
    return [
        "profile",
        "--model",
        "spec.yaml",
        "--input",
        "logs",
        "--out",
        str(out),
        "--ds",
        "2026-12-01",
        *extra,
    ]


def served(root: pathlib.Path, sock: pathlib.Path, *argv: str, cwd: pathlib.Path | None = None):
    return subprocess.run(
        [str(RECSHARD), *argv, "--server", str(sock)],
        cwd=cwd or root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_served_profile_reads_and_writes_relative_to_the_clients_directory(server):
    root, sock, _ = server
    work = root / "work"
    work.mkdir()
    argv = (
        "profile",
        "--model",
        "../spec.yaml",
        "--input",
        "../logs",
        "--ds",
        "2026-12-01",
        "--row-counts",
    )
    first = served(root, sock, *argv, "--out", "stats", cwd=work)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "stats/ds=2026-12-01"
    assert "profiled 2000 samples" in first.stderr  # the command's log reaches the client
    second = served(root, sock, *argv, "--out", "again", cwd=work)
    assert second.returncode == 0, second.stderr
    model = load_model_config(root / "spec.yaml")
    keys = parquet_keys(root / "logs", model)
    for out in ("stats", "again"):
        stats = load_stats(work / out / "ds=2026-12-01")
        features = {r["feature"]: r for r in stats.rows("features")}
        assert set(features) == {f.name for f in model.features}
        for feature in model.features:
            ref = feature_reference(keys[feature.name], model.table_of(feature.name).hash_size)
            row = features[feature.name]
            for key in ("num_samples", "present_samples", "total_accesses", "unique_raw_ids", "unique_rows"):
                assert row[key] == ref[key], (out, feature.name, key)
            assert row["coverage"] == pytest.approx(ref["coverage"], rel=1e-12)
    assert not (root / "stats").exists()  # nothing where the server itself was started


def test_a_failing_command_is_its_line_and_the_server_serves_on(server, tmp_path):
    root, sock, _ = server
    missing = served(root, sock, *profile(tmp_path / "o"), "--input", "nothere")
    assert_one_line_error(missing.returncode, missing.stderr, "[input_missing] input path(s) not found")
    other = served(root, sock, *profile(tmp_path / "o", "--master", "local[1]"))
    assert_one_line_error(
        other.returncode, other.stderr, "--master local[1]: the recshard server's session runs with local[2]"
    )
    nobody = served(root, tmp_path / "none.sock", *profile("o"))
    assert_one_line_error(
        nobody.returncode, nobody.stderr, f"no recshard server listens on {tmp_path / 'none.sock'}"
    )
    ok = served(root, sock, *profile(tmp_path / "o"))
    assert ok.returncode == 0, ok.stderr
    assert load_stats(tmp_path / "o" / "ds=2026-12-01").rows("features")[0]["num_samples"] == 2000


def test_a_client_that_leaves_cancels_its_command(server, tmp_path):
    """The request sent and the connection closed at once: the command's Spark jobs are
    cancelled, nothing is published, and the next command runs."""
    root, sock, _ = server
    request = {"argv": profile(tmp_path / "gone"), "cwd": str(root)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    conn.sendall((json.dumps(request) + "\n").encode())
    conn.close()
    after = served(root, sock, *profile(tmp_path / "next"))
    assert after.returncode == 0, after.stderr  # served once the cancelled command had ended
    assert not (tmp_path / "gone" / "ds=2026-12-01").exists()
    assert (tmp_path / "next" / "ds=2026-12-01" / "_SUCCESS").exists()


def queued(root: pathlib.Path, *argv: str) -> subprocess.Popen:
    """A client started while the server waits for another's request: told so at once."""
    proc = subprocess.Popen([str(RECSHARD), *argv], cwd=root, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    told = proc.stderr.readline()
    assert "recshard server: busy with another client's request; this command waits its turn" in told
    return proc


def test_a_client_that_comes_while_the_server_is_busy_is_told_and_waits_its_turn(server, tmp_path):
    """A first client connects and says nothing yet; a second one is told the server is busy,
    then served once the first has left."""
    root, sock, _ = server
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    first.connect(str(sock))
    waiting = queued(root, *profile(tmp_path / "turn"), "--server", str(sock))
    assert waiting.poll() is None
    first.close()  # left without asking
    assert waiting.wait(timeout=300) == 0, waiting.stderr.read()
    assert (tmp_path / "turn" / "ds=2026-12-01" / "_SUCCESS").exists()


def test_a_second_server_on_the_socket_is_refused_and_stop_ends_the_first(server):
    """The stop waits its turn behind a client; a client queued behind the stop is turned away
    with one line."""
    root, sock, proc = server
    second = subprocess.run(
        [str(RECSHARD), "serve", "--socket", str(sock)], capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(second.returncode, second.stderr, f"a recshard server already listens on {sock}")
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    first.connect(str(sock))  # the server waits for its request
    stop = queued(root, "serve", "--stop", "--socket", str(sock))
    late = queued(root, *profile(root / "late"), "--server", str(sock))
    first.close()
    assert stop.wait(timeout=60) == 0
    assert proc.wait(timeout=60) == 0
    assert not sock.exists()
    assert late.wait(timeout=60) == 2
    assert "the recshard server ended before this command ran" in late.stderr.read()
    assert not (root / "late").exists()


def test_a_socket_path_that_is_a_file_is_refused_and_left_alone(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    proc = subprocess.run(
        [str(RECSHARD), "serve", "--socket", str(precious)], capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(proc.returncode, proc.stderr, f"--socket {precious} exists and is not a socket")
    assert precious.read_text() == "keep me"
