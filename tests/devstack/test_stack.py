"""The embedded stack against real Postgres, Redis and SeaweedFS processes."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis
from minio import Minio

from devstack.processes import is_alive
from devstack.stack import EmbeddedStack, Endpoints, StackError, running_pids


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Short and under /tmp: the servers' unix sockets must fit in about 100 characters.
    path = Path(tempfile.mkdtemp(prefix="fn", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pg_connect(endpoints: Endpoints) -> psycopg.Connection:
    url = endpoints.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    return psycopg.connect(url, connect_timeout=5, autocommit=True)


def s3_client(endpoints: Endpoints) -> Minio:
    return Minio(
        endpoints.s3_endpoint.removeprefix("http://"),
        endpoints.s3_access_key,
        endpoints.s3_secret_key,
        secure=False,
        region="us-east-1",
    )


def process_tree(stack: EmbeddedStack) -> list[psutil.Process]:
    procs = []
    for pid in stack.pids().values():
        root = psutil.Process(pid)
        procs += [root, *root.children(recursive=True)]
    return procs


def wait_all_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if is_alive(p)]
    return alive


def test_stack_serves_stops_cleanly_and_keeps_data_across_restarts(state_dir: Path) -> None:
    stack = EmbeddedStack(state_dir)
    endpoints = stack.start()

    assert endpoints.database_url.startswith("postgresql+psycopg://")
    assert endpoints.broker_url.startswith("redis://127.0.0.1:")
    assert endpoints.s3_endpoint.startswith("http://127.0.0.1:")
    with pg_connect(endpoints) as conn:
        version = conn.execute("SELECT version()").fetchone()
        assert version is not None and version[0].startswith("PostgreSQL")
        vector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert vector.fetchone() is not None
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text, embedding vector(3))")
        conn.execute("INSERT INTO notes VALUES (1, 'kept', '[1,2,3]')")
    broker = redis.Redis.from_url(endpoints.broker_url, socket_timeout=5)
    broker.set("footnote:test", "kept")
    assert broker.get("footnote:test") == b"kept"
    broker.close()
    s3 = s3_client(endpoints)
    s3.put_object(endpoints.s3_bucket, "docs/a.txt", io.BytesIO(b"kept"), 4)
    assert s3.get_object(endpoints.s3_bucket, "docs/a.txt").read() == b"kept"

    procs = process_tree(stack)
    assert set(stack.pids()) == {"postgres", "redis", "s3"}
    assert {p.pid for p in procs} <= set(running_pids(state_dir))
    stack.stop()
    stack.stop()  # idempotent

    assert wait_all_gone(procs, timeout=1) == []
    assert running_pids(state_dir) == []
    assert stat.S_IMODE((state_dir / "stack.json").stat().st_mode) == 0o600

    with EmbeddedStack(state_dir) as again:
        restarted = again.endpoints
        assert restarted.s3_access_key == endpoints.s3_access_key
        assert restarted.s3_secret_key == endpoints.s3_secret_key
        with pg_connect(restarted) as conn:
            row = conn.execute("SELECT body, embedding::text FROM notes WHERE id = 1").fetchone()
            assert row == ("kept", "[1,2,3]")
        broker = redis.Redis.from_url(restarted.broker_url, socket_timeout=5)
        assert broker.get("footnote:test") == b"kept"
        broker.close()
        # The master starts without its old Raft state (devstack.seaweedfs): what it hands
        # out after a restart must not land on what was stored before.
        s3 = s3_client(restarted)
        s3.put_object(restarted.s3_bucket, "docs/b.txt", io.BytesIO(b"added"), 5)
        assert s3.get_object(restarted.s3_bucket, "docs/a.txt").read() == b"kept"
        assert s3.get_object(restarted.s3_bucket, "docs/b.txt").read() == b"added"
    assert running_pids(state_dir) == []


SLEEPER = "import time; print('worker up', flush=True); time.sleep(120)"


def test_configured_services_are_used_instead_of_started(state_dir: Path) -> None:
    other_dir = Path(tempfile.mkdtemp(prefix="fn", dir="/tmp"))
    first = EmbeddedStack(state_dir)
    try:
        given = first.start()
        with pytest.raises(StackError, match="used by another running stack"):
            EmbeddedStack(state_dir).start()

        second = EmbeddedStack(
            other_dir,
            broker_url=given.broker_url,
            s3_endpoint=given.s3_endpoint,
            s3_access_key=given.s3_access_key,
            s3_secret_key=given.s3_secret_key,
        )
        with second:
            assert set(second.pids()) == {"postgres"}
            worker = second.supervise("worker", [sys.executable, "-c", SLEEPER])
            assert set(second.pids()) == {"postgres", "worker"}
            worker_log = other_dir / "logs" / "worker.log"
            deadline = time.monotonic() + 10
            while "worker up" not in worker_log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "worker up" in worker_log.read_text()
            names = {psutil.Process(pid).name() for pid in running_pids(other_dir)}
            assert names == {"postgres"}
            assert second.endpoints.broker_url == given.broker_url
            assert second.endpoints.s3_endpoint == given.s3_endpoint
            assert second.endpoints.database_url != given.database_url
            with pg_connect(second.endpoints) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        assert worker.poll() is not None
        assert not (other_dir / "redis").exists()
        assert not (other_dir / "s3").exists()
    finally:
        first.stop()
        shutil.rmtree(other_dir, ignore_errors=True)


def test_failed_start_names_the_component_and_cleans_up(state_dir: Path) -> None:
    # A corrupt append-only file makes redis refuse to start.
    (state_dir / "redis").mkdir()
    (state_dir / "redis" / "appendonly.aof").write_text("*garbage\n")
    stack = EmbeddedStack(
        state_dir,
        database_url="postgresql+psycopg://unused@127.0.0.1:1/unused",
        s3_endpoint="http://127.0.0.1:1",
        s3_access_key="unused",
        s3_secret_key="unused",
        start_timeout=20,
    )
    with pytest.raises(StackError) as err:
        stack.start()
    message = str(err.value)
    assert message.startswith("redis exited with code")
    assert str(state_dir / "logs" / "redis.log") in message
    assert "append only file" in message
    assert stack.pids() == {}
    assert running_pids(state_dir) == []
    # The failed attempt released the state dir: a retry fails the same way, not as "in use".
    with pytest.raises(StackError, match=r"^redis exited"):
        stack.start()


HARD_KILLED_PARENT = """
import json, sys
from pathlib import Path
import psutil
from devstack.stack import EmbeddedStack

stack = EmbeddedStack(Path(sys.argv[1]))
stack.start()
stack.supervise("worker", [sys.executable, "-c", "import time; time.sleep(120)"])
pids = []
for pid in stack.pids().values():
    pids += [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
print(json.dumps(pids), flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_children_die_with_a_hard_killed_parent(state_dir: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", HARD_KILLED_PARENT, str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        assert line, "the parent process failed to start its stack"
        procs = [psutil.Process(pid) for pid in json.loads(line)]
        assert procs
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    assert wait_all_gone(procs, timeout=15) == []
    assert running_pids(state_dir) == []
    # The next run on the same state dir starts normally (lock released, data intact).
    with EmbeddedStack(state_dir) as stack, pg_connect(stack.endpoints) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_processes_that_fork_children_turn_grpc_fork_handlers_off() -> None:
    # gRPC's handler sometimes aborted a child between fork and exec while another thread was
    # in a call (Postgres "exited with code -6 while starting"); an explicit setting is kept.
    code = "import os, devstack.processes; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"

    def setting(**env: str) -> str:
        clean = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
        out = subprocess.run(
            [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert setting() == "false"
    assert setting(GRPC_ENABLE_FORK_SUPPORT="true") == "true"


# Children forked, with Python code run before exec as the stack's are, while another thread
# is in a gRPC call; prints how many died before exec. gRPC's fork handlers, when on, log from
# fork_posix.cc at every fork (and sometimes abort the child: SIGABRT, -6).
FORK_BESIDE_A_CALL = """
import socket, subprocess, threading, time, grpc
silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: the call waits
channel = grpc.insecure_channel(f"127.0.0.1:{silent.getsockname()[1]}")
ask = channel.unary_unary("/footnote.test.Nothing/Call")

def call():
    try:
        ask(b"", timeout=2, wait_for_ready=True)
    except grpc.RpcError:
        pass

caller = threading.Thread(target=call)
caller.start()
time.sleep(0.3)
try:
    runs = [subprocess.run(["true"], preexec_fn=lambda: None) for _ in range(20)]
finally:
    caller.join()
    channel.close()
    silent.close()
print(sum(run.returncode != 0 for run in runs))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gRPC's fork handlers are POSIX")
@pytest.mark.parametrize(
    ("first", "handlers_on"),
    [("import footnote.cli", False), ("import grpc, devstack.processes", True)],
    ids=["the footnote command", "devstack imported after grpc"],
)
def test_grpc_fork_handlers_are_off_before_grpc_is_imported(first: str, handlers_on: bool) -> None:
    # gRPC reads GRPC_ENABLE_FORK_SUPPORT once, as it is imported: set any later (the second
    # case) it leaves the handlers on, which is why the command sets it first.
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run(
        [sys.executable, "-c", f"{first}\n{FORK_BESIDE_A_CALL}"],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert ("fork_posix" in out.stderr) is handlers_on, out.stderr[-2000:]
    if not handlers_on:
        assert out.stdout.strip() == "0"  # no child aborted before exec


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gRPC's fork handlers are POSIX")
def test_the_test_process_forks_with_grpc_fork_handlers_off(capfd) -> None:
    capfd.readouterr()
    exec(FORK_BESIDE_A_CALL, {})
    out, err = capfd.readouterr()
    assert "fork_posix" not in err
    assert out.strip() == "0"  # no child aborted before exec
