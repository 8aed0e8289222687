"""Session fixtures: one real embedded stack (Postgres, Redis, S3) and a real gRPC server."""

from __future__ import annotations

import os

# Before gRPC is imported, which reads this once: the stack's children are forked beside the
# tests' gRPC calls (devstack/processes.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from devstack.dev import settings_with_endpoints
from devstack.stack import EmbeddedStack
from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2_grpc as chat_pb_grpc
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from services import auth
from services.config import Settings
from services.db import migrate
from services.db.session import Database, make_engine
from services.server import Deps, create_server, mark_serving
from services.storage import Storage


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    # A short path keeps log and data paths readable; nothing depends on its length.
    path = Path(tempfile.mkdtemp(prefix="fnt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# Small limits and short leases so failure paths play out in seconds, not minutes.
TEST_LIMITS = {
    "max_upload_bytes": 2 * 1024 * 1024,
    "ingest_lease_seconds": 6.0,
    "ingest_max_retries": 2,
    "ingest_retry_backoff_seconds": 1,
    "ingest_retry_backoff_max_seconds": 2,
    "reconcile_interval_seconds": 2.0,
    "reconcile_queued_grace_seconds": 10.0,
    "link_timeout_seconds": 10.0,
}


def worker_env(settings: Settings, **overrides: str) -> dict[str, str]:
    """The environment of a worker process pointed at the test stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOOTNOTE_")}
    for name in (
        "database_url",
        "broker_url",
        "s3_endpoint",
        "s3_access_key",
        "s3_secret_key",
        "s3_bucket",
        *TEST_LIMITS,
    ):
        env[f"FOOTNOTE_{name.upper()}"] = str(getattr(settings, name))
    env.update(overrides)
    return env


def start_worker(
    env: dict[str, str], log_path: Path, queues: str = "ingest,links"
) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "footnote.cli",
                "worker",
                "--queues",
                queues,
                "--concurrency",
                "2",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_worker_ready(broker_url: str, timeout: float = 90.0) -> None:
    from celery import Celery

    probe = Celery(broker=broker_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if probe.control.ping(timeout=1.0):
                return
        raise AssertionError("the Celery worker did not answer a ping in time")
    finally:
        probe.close()


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def settings(state_dir: Path) -> Iterator[Settings]:
    with EmbeddedStack(state_dir) as stack:
        configured = settings_with_endpoints(
            Settings(_env_file=None, grpc_port=0, shutdown_grace_seconds=1.0, **TEST_LIMITS),
            stack.endpoints,
        )
        migrate.upgrade(configured.database_url or "")
        yield configured


@pytest.fixture(scope="session")
def worker(settings: Settings, state_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """One real Celery worker for both queues, shared by the session."""
    proc = start_worker(worker_env(settings), state_dir / "worker.log")
    try:
        wait_worker_ready(settings.broker_url or "")
        yield proc
    finally:
        kill_group(proc)


@pytest.fixture(scope="session")
def db(settings: Settings) -> Iterator[Database]:
    database = Database(make_engine(settings.database_url or "", pool_size=2))
    yield database
    database.dispose()


@contextlib.asynccontextmanager
async def running_server(settings: Settings) -> AsyncIterator[str]:
    """A real aio server on a free port, as create_server builds it; yields its target."""
    deps = Deps.from_settings(settings)
    server, port = create_server(settings, deps)
    await server.start()
    await mark_serving(deps.health)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(1.0)
        await deps.aclose()


@pytest.fixture(scope="session")
async def grpc_target(settings: Settings) -> AsyncIterator[str]:
    async with running_server(settings) as target:
        yield target


@pytest.fixture
async def channel(grpc_target: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(grpc_target) as ch:
        yield ch


@pytest.fixture(scope="session")
def make_key(db: Database) -> Callable[[str], str]:
    """Creates an API key for a tenant and returns it."""

    def create(tenant: str) -> str:
        return db.transact(lambda s: auth.create_key(s, tenant))

    return create


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def api_key(make_key: Callable[[str], str], tenant: str) -> str:
    return make_key(tenant)


@pytest.fixture
def private_broker(settings) -> Iterator[str]:
    """A Redis of this test's own; everything else is the session's stack."""
    state = Path(tempfile.mkdtemp(prefix="fnb", dir="/tmp"))
    stack = EmbeddedStack(
        state,
        database_url=settings.database_url,
        s3_endpoint=settings.s3_endpoint,
        s3_access_key=settings.s3_access_key,
        s3_secret_key=settings.s3_secret_key,
        s3_bucket=settings.s3_bucket,
    )
    with stack:
        yield stack.endpoints.broker_url
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def storage(settings: Settings) -> Storage:
    return Storage(
        settings.s3_endpoint or "",
        settings.s3_access_key or "",
        settings.s3_secret_key or "",
        settings.s3_bucket,
    )


@pytest.fixture
def docs(channel: grpc.aio.Channel) -> dpb_grpc.DocumentsServiceStub:
    return dpb_grpc.DocumentsServiceStub(channel)


@pytest.fixture
async def assistant_id(channel: grpc.aio.Channel, api_key: str) -> str:
    """A fresh assistant with default settings, owned by api_key's tenant."""
    created = await apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
        apb.CreateAssistantRequest(assistant=apb.Assistant(display_name="test")),
        metadata=(("authorization", f"Bearer {api_key}"),),
    )
    return created.id


@pytest.fixture
async def llm_chat(llm_target: str) -> AsyncIterator[chat_pb_grpc.ChatServiceStub]:
    """ChatService on the server of the module's own llm_target fixture."""
    async with grpc.aio.insecure_channel(llm_target) as channel:
        yield chat_pb_grpc.ChatServiceStub(channel)
