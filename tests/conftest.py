"""Session fixtures: one real embedded stack (Postgres, Redis, S3) and a real gRPC server."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest

from services import auth
from services.config import Settings
from services.db import migrate
from services.db.session import Database, make_engine
from services.dev import settings_with_endpoints
from services.server import Deps, create_server, mark_serving
from services.stack import EmbeddedStack


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    # Postgres listens on a unix socket inside the state dir, and socket paths stop at ~100 chars.
    path = Path(tempfile.mkdtemp(prefix="fnt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(state_dir: Path) -> Iterator[Settings]:
    with EmbeddedStack(state_dir) as stack:
        configured = settings_with_endpoints(
            Settings(_env_file=None, grpc_port=0, shutdown_grace_seconds=1.0), stack.endpoints
        )
        migrate.upgrade(configured.database_url or "")
        yield configured


@pytest.fixture(scope="session")
def db(settings: Settings) -> Iterator[Database]:
    database = Database(make_engine(settings.database_url or "", pool_size=2))
    yield database
    database.dispose()


@pytest.fixture(scope="session")
async def grpc_target(settings: Settings) -> AsyncIterator[str]:
    deps = Deps.from_settings(settings)
    server, port = create_server(settings, deps)
    await server.start()
    await mark_serving(deps.health)
    yield f"127.0.0.1:{port}"
    await server.stop(1.0)
    deps.close()


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
