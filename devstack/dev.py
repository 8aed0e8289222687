"""`footnote dev`: the embedded stack, a Celery worker and the gRPC server, as one command."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.stack import EmbeddedStack
from devstack.state import ENDPOINTS_FILE, Endpoints, settings_with_endpoints
from devstack.supervisor import STATUS_FILE
from footnote.client import CLIENT_FILE
from services import auth
from services.config import Settings
from services.db import migrate
from services.db.session import Database, make_engine
from services.server import install_stop_signals, run_on_configured_loop, serve

log = logging.getLogger(__name__)

DEV_KEY_FILE = "dev_api_key"
DEV_TENANT = "dev"


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def ensure_dev_key(db: Database, state_dir: Path, configured: str | None) -> str:
    """The configured dev key, or the one kept in the state dir, or a new one."""
    key_file = state_dir / DEV_KEY_FILE
    key = configured or (key_file.read_text().strip() if key_file.exists() else "")
    if not key:
        key = auth.new_key()
        write_private(key_file, key)
    db.transact(lambda s: auth.store_key(s, DEV_TENANT, key, name="dev"))
    return key


def start_worker(stack: EmbeddedStack, endpoints: Endpoints, log_format: str | None) -> None:
    """Starts one worker for every queue, supervised and stopped with the stack."""
    env = {**os.environ, **endpoints.as_env()}
    if log_format:
        # Its output goes to a file, where it would choose JSON; it logs like dev does.
        env["FOOTNOTE_LOG_FORMAT"] = log_format
    stack.supervise(
        "worker", [sys.executable, "-m", "footnote.cli", "worker", "--concurrency", "2"], env=env
    )


async def wait_healthy(target: str, timeout: float = 30.0) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.1)


async def serve_until_signalled(settings: Settings, key: str, state_dir: Path) -> None:
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    install_stop_signals(stop)
    server = asyncio.create_task(serve(settings, stop, ready))
    await asyncio.wait({server, ready}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        await server  # raises why the server could not start
        return
    target = f"{settings.grpc_host}:{ready.result()}"
    await wait_healthy(target)
    # Lets `footnote upload --state-dir` and friends find this server and its key.
    write_private(state_dir / CLIENT_FILE, json.dumps({"target": target, "api_key": key}))
    print(f"footnote: ready at {target}", flush=True)
    print(f"footnote: api key {key}", flush=True)
    await server


@contextmanager
def signals_raise() -> Iterator[None]:
    """Turns SIGTERM into KeyboardInterrupt while starting up, so cleanup still runs."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_local_llm(stack: EmbeddedStack, settings: Settings, state_dir: Path) -> Settings:
    """Serves the packaged Qwen model through llama-server and points the generator at it."""
    from devstack.local_llm import prepare_local_llm, wait_ready

    local = prepare_local_llm(state_dir)
    proc = stack.supervise("llama-server", local.args, env=local.env)
    seconds = wait_ready(local.base_url, timeout=300, proc=proc)
    log.info("llama-server ready at %s in %.1fs", local.base_url, seconds)
    return settings.model_copy(
        update={"llm_base_url": local.base_url, "llm_model": local.model_name}
    )


class StackFailed:
    """Why the stack stopped by itself, if it did: a child that kept dying, or the server."""

    def __init__(self) -> None:
        self.message: str | None = None

    def child_died_too_often(self, message: str) -> None:
        # Called on the supervisor's thread: the main thread stops everything on SIGTERM.
        self.message = message
        os.kill(os.getpid(), signal.SIGTERM)


def run_dev(settings: Settings, state_dir: Path, llm: str | None = None) -> None:
    """Runs the stack until a signal, a child that keeps dying, or a server crash.

    The gRPC server runs in this process, which also supervises the children: if it crashes,
    nothing is left to supervise, so a server crash stops the whole stack with its error
    (exit code 1) rather than being restarted. Every child is restarted when it dies.
    """
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    failed = StackFailed()
    stack = EmbeddedStack(
        state_dir,
        database_url=settings.database_url,
        broker_url=settings.broker_url,
        s3_endpoint=settings.s3_endpoint,
        s3_access_key=settings.s3_access_key,
        s3_secret_key=settings.s3_secret_key,
        s3_bucket=settings.s3_bucket,
    )
    try:
        with signals_raise():
            endpoints = stack.start()
            settings = settings_with_endpoints(settings, endpoints)
            migrate.upgrade(settings.database_url or "")
            db = Database(make_engine(settings.database_url or "", pool_size=1))
            try:
                key = ensure_dev_key(db, state_dir, settings.dev_api_key)
            finally:
                db.dispose()
            write_private(state_dir / ENDPOINTS_FILE, json.dumps(endpoints.__dict__))
            start_worker(stack, endpoints, settings.log_format)
            if llm == "local":
                settings = start_local_llm(stack, settings, state_dir)
            stack.supervise_children(failed.child_died_too_often)
        run_on_configured_loop(settings, serve_until_signalled(settings, key, state_dir))
    except KeyboardInterrupt:
        pass
    except Exception as err:
        log.exception("the gRPC server failed")
        failed.message = f"the gRPC server failed: {type(err).__name__}: {err}"
    finally:
        # A second signal must not cut the cleanup short and leave children behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
        for name in (ENDPOINTS_FILE, CLIENT_FILE, STATUS_FILE):
            (state_dir / name).unlink(missing_ok=True)
        if failed.message is not None:
            print(f"footnote: stopped: {failed.message}", file=sys.stderr, flush=True)
            print("footnote: stopped", flush=True)
            raise SystemExit(1)
        print("footnote: stopped", flush=True)
