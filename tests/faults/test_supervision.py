"""Supervision of the embedded stack: dead children are reaped and restarted, or stop it all.

Expected outcomes:
- a child killed with SIGKILL is reaped at once (no zombie), restarted, and counted;
- Redis, Postgres and S3 killed with SIGKILL come back on the same port with their data
  (Redis through its append-only file);
- a child that dies five times within a minute is not restarted again: the stack reports it,
  naming it, with the tail of its log;
- (slow, `make faults`) `footnote dev`: after SIGKILL of the worker's main process, an upload
  still becomes READY; a child that always dies stops `footnote dev` with exit code 1.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import psycopg
import pytest
import redis

from devstack.processes import terminate
from devstack.stack import EmbeddedStack
from devstack.supervisor import STATUS_FILE, RestartPolicy
from footnote.client import CLIENT_FILE
from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from services.storage import Storage
from tests.support import bearer

FAST = RestartPolicy(max_deaths=5, window_seconds=60, backoff_initial_seconds=0.05)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fns", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def configured_stack(state_dir: Path, settings, **overrides) -> EmbeddedStack:
    """A stack that starts nothing of its own unless an override leaves a service unset."""
    options = {
        "database_url": settings.database_url,
        "broker_url": settings.broker_url,
        "s3_endpoint": settings.s3_endpoint,
        "s3_access_key": settings.s3_access_key,
        "s3_secret_key": settings.s3_secret_key,
        "s3_bucket": settings.s3_bucket,
        **overrides,
    }
    return EmbeddedStack(state_dir, **options)


def status(state_dir: Path) -> dict[str, dict[str, int]]:
    return json.loads((state_dir / STATUS_FILE).read_text())


def test_a_killed_child_is_reaped_restarted_and_counted(stack_dir, settings):
    fatal: list[str] = []
    with configured_stack(stack_dir, settings) as stack:
        stack.supervise("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
        supervisor = stack.supervise_children(fatal.append, FAST)
        old = stack.pids()["sleeper"]
        os.kill(old, signal.SIGKILL)
        new = wait_for(
            lambda: (p := stack.pids().get("sleeper")) and p != old and p, 10, "a restart"
        )
        # The new child is visible a moment before the supervisor counts and records it.
        recorded = wait_for(
            lambda: (s := status(stack_dir)["sleeper"])["restarts"] and s, 10, "the status file"
        )
        assert supervisor.restarts["sleeper"] == 1
        assert recorded == {"pid": new, "restarts": 1}
        # Reaped: the dead child is not left behind as a zombie.
        assert not psutil.pid_exists(old) or psutil.Process(old).ppid() != os.getpid()
        assert fatal == []


def test_a_child_that_keeps_dying_stops_the_stack_with_its_log(stack_dir, settings):
    fatal: list[str] = []
    done = threading.Event()

    def report(message: str) -> None:
        fatal.append(message)
        done.set()

    with configured_stack(stack_dir, settings) as stack:
        stack.supervise(
            "crasher",
            [sys.executable, "-c", "print('cannot open the config file', flush=True); exit(3)"],
        )
        supervisor = stack.supervise_children(report, FAST)
        assert done.wait(30), "the supervisor never gave up"
        assert supervisor.restarts["crasher"] == FAST.max_deaths - 1
    message = fatal[0]
    assert "crasher died 5 times" in message and "exit code 3" in message
    assert "cannot open the config file" in message


def test_redis_killed_comes_back_with_its_data(stack_dir, settings):
    fatal: list[str] = []
    with configured_stack(stack_dir, settings, broker_url=None) as stack:
        stack.supervise_children(fatal.append, FAST)
        client = redis.Redis.from_url(stack.endpoints.broker_url, socket_timeout=2)
        client.set("kept", "yes")
        time.sleep(1.5)  # appendfsync everysec: the write is on disk after a second
        old = stack.pids()["redis"]
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: stack.pids().get("redis", old) != old, 10, "a restart")

        def answers() -> bytes | None:
            try:
                return client.get("kept")
            except redis.RedisError:
                return None

        assert wait_for(answers, 20, "redis to answer again") == b"yes"
    assert fatal == []


def dev_process(state_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FOOTNOTE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "footnote.cli", "dev", "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**clean, **(env or {})},
        text=True,
    )


def wait_dev_ready(proc: subprocess.Popen[str], timeout: float = 180) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if line.startswith("footnote: api key"):
            return line.split()[-1]
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"footnote dev did not become ready (exit {proc.poll()})")


@pytest.mark.faults
def test_dev_worker_killed_then_an_upload_becomes_ready(stack_dir):
    proc = dev_process(stack_dir)
    try:
        wait_dev_ready(proc)
        old = status(stack_dir)["worker"]["pid"]
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: status(stack_dir)["worker"]["restarts"] == 1, 30, "the worker to restart")
        assert not any(p.pid == old for p in psutil.Process(proc.pid).children(recursive=True)), (
            "the dead worker is left as a child"
        )
        handbook = Path(__file__).parent.parent / "fixtures" / "documents" / "handbook.md"
        client = json.loads((stack_dir / CLIENT_FILE).read_text())
        with grpc.insecure_channel(client["target"]) as channel:
            assistant_id = (
                apb_grpc.AssistantsServiceStub(channel)
                .CreateAssistant(
                    apb.CreateAssistantRequest(assistant=apb.Assistant(display_name="after")),
                    metadata=bearer(client["api_key"]),
                )
                .id
            )
        uploaded = subprocess.run(
            [sys.executable, "-m", "footnote.cli", "upload", str(handbook), "--assistant",
             assistant_id, "--state-dir", str(stack_dir)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
        assert "READY" in uploaded.stdout
    finally:
        terminate(proc)


@pytest.mark.faults
def test_dev_stops_when_a_child_keeps_dying(stack_dir):
    proc = dev_process(stack_dir)
    try:
        wait_dev_ready(proc)
        # Redis cannot start while its port is taken: every restart dies at once.
        port = json.loads((stack_dir / "stack.json").read_text())["ports"]["redis"]
        blocker = subprocess.Popen(
            [sys.executable, "-c",
             "import socket, time\ns = socket.socket()\n"
             "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             f"os_port = {port}\n"
             "time.sleep(0.1)\n"
             "while True:\n"
             "    try:\n"
             "        s.bind(('127.0.0.1', os_port)); s.listen(); break\n"
             "    except OSError:\n"
             "        time.sleep(0.01)\n"
             "time.sleep(300)"],
        )  # fmt: skip
        try:
            os.kill(status(stack_dir)["redis"]["pid"], signal.SIGKILL)
            code = proc.wait(180)
        finally:
            blocker.kill()
            blocker.wait()
        assert code == 1
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "redis died 5 times" in err and "last lines of" in err, err[-2000:]
    finally:
        terminate(proc)


def test_postgres_killed_comes_back_with_its_data(stack_dir, settings):
    fatal: list[str] = []
    with configured_stack(stack_dir, settings, database_url=None) as stack:
        stack.supervise_children(fatal.append, FAST)
        url = stack.endpoints.database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('yes')")
        old = stack.pids()["postgres"]
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: stack.pids().get("postgres", old) != old, 20, "a restart")

        def read() -> str | None:
            try:
                with psycopg.connect(url, connect_timeout=2) as conn:
                    return conn.execute("SELECT v FROM kept").fetchone()[0]
            except psycopg.Error:
                return None

        assert wait_for(read, 60, "postgres to answer again") == "yes"
    assert fatal == []


def test_s3_killed_comes_back_with_its_objects(stack_dir, settings):
    fatal: list[str] = []
    with configured_stack(
        stack_dir, settings, s3_endpoint=None, s3_access_key=None, s3_secret_key=None
    ) as stack:
        stack.supervise_children(fatal.append, FAST)
        e = stack.endpoints
        storage = Storage(e.s3_endpoint, e.s3_access_key, e.s3_secret_key, e.s3_bucket)
        storage.ensure_bucket()
        storage.put("kept", io.BytesIO(b"yes"), 3, "text/plain")
        old = stack.pids()["s3"]
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: stack.pids().get("s3", old) != old, 20, "a restart")

        def read() -> bytes | None:
            try:
                return b"".join(storage.stream("kept"))
            except Exception:
                return None

        assert wait_for(read, 60, "S3 to answer again") == b"yes"
    assert fatal == []
