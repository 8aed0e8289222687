"""The background health check: Postgres, the broker and S3, probed with short timeouts.

grpc.health.v1 reports NOT_SERVING while any of them cannot be reached and SERVING once all
answer again. Probes run on threads of their own, never on the pool that serves RPCs, and a
probe that hangs (a paused server) counts as down without holding up the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import redis
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from kombu import Connection
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from services.config import Settings
from services.db.session import normalize_url
from services.storage import Storage

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

Probe = Callable[[], None]


def database_probe(url: str, timeout: float) -> Probe:
    engine = create_engine(
        normalize_url(url),
        poolclass=NullPool,
        connect_args={
            "connect_timeout": max(1, int(timeout)),
            "options": f"-c statement_timeout={int(timeout * 1000)}",
        },
    )

    def probe() -> None:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    return probe


def broker_probe(url: str, timeout: float) -> Probe:
    if url.startswith(("redis://", "rediss://", "unix://")):
        client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False
        )

        def ping() -> None:
            client.ping()

        return ping

    def probe() -> None:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)

    return probe


def storage_probe(settings: Settings, timeout: float) -> Probe:
    storage = Storage(
        settings.s3_endpoint or "",
        settings.s3_access_key or "",
        settings.s3_secret_key or "",
        settings.s3_bucket,
        region=settings.s3_region,
        timeout_seconds=timeout,
        retries=0,
    )
    return storage.ping


class DependencyHealth:
    """Probes each dependency every interval and sets the health status of every service."""

    def __init__(
        self,
        health: HealthServicer,
        service_names: Iterable[str],
        probes: dict[str, Probe],
        interval: float = 2.0,
        timeout: float = 2.0,
    ) -> None:
        self.health = health
        self.service_names = ("", *service_names)
        self.probes = probes
        self.interval = interval
        self.timeout = timeout
        self.down: set[str] = set()
        self._running: dict[str, Future[None]] = {}
        self._executor = ThreadPoolExecutor(max_workers=len(probes), thread_name_prefix="health")
        self._task: asyncio.Task[None] | None = None
        self._published = False

    @classmethod
    def from_settings(
        cls, settings: Settings, health: HealthServicer, service_names: Iterable[str]
    ) -> DependencyHealth:
        timeout = settings.health_check_timeout_seconds
        probes = {
            "postgres": database_probe(settings.database_url or "", timeout),
            "broker": broker_probe(settings.broker_url or "", timeout),
            "s3": storage_probe(settings, timeout),
        }
        return cls(health, service_names, probes, settings.health_check_interval_seconds, timeout)

    async def check_once(self) -> set[str]:
        """Runs every probe (or waits on one still running) and returns those that failed."""
        loop = asyncio.get_running_loop()
        waits: dict[str, asyncio.Future[None]] = {}
        for name, probe in self.probes.items():
            running = self._running.get(name)
            if running is None or running.done():
                running = self._executor.submit(probe)
                self._running[name] = running
            waits[name] = asyncio.wrap_future(running, loop=loop)
        down: set[str] = set()
        for name, waiting in waits.items():
            try:
                await asyncio.wait_for(asyncio.shield(waiting), self.timeout)
            except Exception as err:
                down.add(name)
                if name not in self.down:
                    log.warning("%s cannot be reached: %s", name, type(err).__name__)
        await self.publish(down)
        return down

    async def publish(self, down: set[str]) -> None:
        if self._published and down == self.down:
            return
        self._published = True
        for name in self.down - down:
            log.info("%s is reachable again", name)
        self.down = down
        status = NOT_SERVING if down else SERVING
        for service in self.service_names:
            await self.health.set(service, status)

    async def run(self) -> None:
        while True:
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the check must outlive its own bugs
                log.exception("health check round failed")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="health-check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)
