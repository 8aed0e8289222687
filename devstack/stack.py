"""The embedded stack: Postgres, Redis and S3 started from pip packages for dev, demos and tests.

Every component that is not configured is started as a child process on free loopback ports,
with its data under one state directory, so a restart on the same directory keeps everything.
Before starting, leftovers of an earlier run on the same state directory (found by
``running_pids``) are stopped; a lock file keeps two live stacks off one directory. How each
child is kept from outliving us is in ``devstack.processes``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
import psycopg

from devstack import postgres, redis_server, seaweedfs
from devstack.errors import StackError
from devstack.ports import allocate_ports
from devstack.processes import (
    Child,
    Launch,
    die_with_parent,
    finish_stop,
    request_stop,
    spawner,
    wait_gone,
)
from devstack.state import Endpoints, Layout, new_access_key, read_state, write_private_json
from devstack.supervisor import RestartPolicy, Supervisor

log = logging.getLogger(__name__)

# Process names of the servers we start; postgres backends keep the name "postgres".
SERVER_NAMES = frozenset({"postgres", "redis-server", "weed"})


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
        self._layout = Layout(self.state_dir)
        self._database_url = database_url
        self._broker_url = broker_url
        self._s3_endpoint = s3_endpoint
        self._s3_access_key = s3_access_key
        self._s3_secret_key = s3_secret_key
        self._s3_bucket = s3_bucket
        self._start_timeout = start_timeout
        self._stop_grace = stop_grace
        self._children: list[Child] = []
        self._children_lock = threading.Lock()
        self._supervisor: Supervisor | None = None
        self._lock_fd: int | None = None
        self._endpoints: Endpoints | None = None

    @property
    def endpoints(self) -> Endpoints:
        if self._endpoints is None:
            raise RuntimeError("the stack is not running; call start() first")
        return self._endpoints

    def children(self) -> list[Child]:
        with self._children_lock:
            return list(self._children)

    def supervise_children(
        self, on_fatal: Callable[[str], None], policy: RestartPolicy | None = None
    ) -> Supervisor:
        """Restarts children that die, until one dies too often (see devstack.supervisor)."""
        if self._supervisor is None:
            self._supervisor = Supervisor(self, on_fatal, policy or RestartPolicy())
            self._supervisor.start()
        return self._supervisor

    def respawn(self, child: Child) -> Child:
        """Starts a dead child again, the way it was started, in its place."""
        if child.launch is None:
            raise ValueError(f"{child.name} cannot be restarted")
        if child.name == "s3":
            seaweedfs.remove_sockets(child.ports)
        replacement = self._spawn(child.name, child.launch)
        replacement.client = child.client
        with self._children_lock:
            self._children.remove(replacement)
            self._children[self._children.index(child)] = replacement
        return replacement

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
        if any(c.name == name for c in self.children()):
            raise ValueError(f"a process named {name!r} is already supervised")
        self._layout.logs.mkdir(parents=True, exist_ok=True)
        child = self._spawn(name, Launch(args, cwd or Path.cwd(), stop_signal, env=env))
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
        if self._supervisor is not None:
            # No restart may race the stop.
            self._supervisor.stop()
            self._supervisor = None
        children = self.children()
        # Clients first, so that a worker can finish its tasks while the services still run.
        # Within each wave, signal everyone first and then wait, so they stop side by side.
        for wave in ([c for c in children if c.client], [c for c in children if not c.client]):
            pending = [(child, request_stop(child)) for child in wave]
            for child, descendants in pending:
                finish_stop(child, descendants, min(self._stop_grace, child.grace_cap))
                if child.name == "s3":
                    seaweedfs.remove_sockets(child.ports)
                # Forget a child only once it is gone, so an interrupted stop can be repeated.
                with self._children_lock:
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
        stop_leftovers(layout)

        state = read_state(layout.state_file)
        access_key = self._s3_access_key or state.setdefault("s3_access_key", new_access_key())
        secret_key = self._s3_secret_key or state.setdefault("s3_secret_key", secrets.token_hex(20))
        previous: dict[str, int] = state.get("ports", {})
        wanted: dict[str, tuple[int | None, int]] = {}
        if need_pg:
            wanted["postgres"] = (previous.get("postgres"), 0)
        if need_redis:
            wanted["redis"] = (previous.get("redis"), 0)
        if need_s3:
            for part in seaweedfs.PARTS:
                key = f"s3.{part}"
                wanted[key] = (previous.get(key), seaweedfs.GRPC_OFFSET)
        ports = allocate_ports(str(self.state_dir), wanted)
        # Reusing the same ports next time keeps client URLs stable and weed's per-port dirs few.
        state["ports"] = {**previous, **ports}
        write_private_json(layout.state_file, state)

        # Launch the slow starters first so that they boot while Postgres runs initdb.
        weed_ports = {part: ports[f"s3.{part}"] for part in seaweedfs.PARTS if need_s3}
        if need_s3:
            self._spawn("s3", seaweedfs.launch(layout.s3, weed_ports, access_key, secret_key))
        if need_redis:
            self._spawn("redis", redis_server.launch(layout.redis, ports["redis"]))
        if need_pg:
            self._spawn("postgres", postgres.launch(layout.pgdata, ports["postgres"]))

        embedded: dict[str, str] = {}
        for child in list(self._children):
            if child.name == "postgres":
                port = ports["postgres"]
                self._wait_ready(child, lambda p=port: postgres.probe(p))
                try:
                    postgres.prepare_database(port)
                except psycopg.Error as err:
                    raise child.failure("could not create the database", err) from err
                embedded["database_url"] = postgres.url(port)
            elif child.name == "redis":
                port = ports["redis"]
                self._wait_ready(child, lambda p=port: redis_server.probe(p))
                embedded["broker_url"] = redis_server.url(port)
            elif child.name == "s3":
                endpoint = seaweedfs.endpoint(weed_ports)
                client = seaweedfs.s3_client(endpoint, access_key, secret_key)
                self._wait_ready(child, lambda c=client: seaweedfs.probe(c, self._s3_bucket))
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

    def _spawn(self, name: str, launch: Launch) -> Child:
        log_path = self._layout.logs / f"{name}.log"
        with log_path.open("ab") as log_file:
            log_file.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}\n".encode())
            log_file.flush()
            offset = log_file.tell()
            identity: dict[str, Any] = {}
            if launch.user is not None:
                identity = {"user": launch.user, "group": launch.user, "extra_groups": []}
            proc = spawner.call(
                lambda: subprocess.Popen(
                    launch.args,
                    cwd=launch.cwd,
                    env=launch.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(launch.death_signal or launch.stop_signal),
                    **identity,
                )
            )
        child = Child(
            name,
            proc,
            launch.stop_signal,
            log_path,
            offset,
            launch.ports,
            launch.grace_cap,
            launch=launch,
        )
        with self._children_lock:
            self._children.append(child)
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(launch.args))
        return child

    def _wait_ready(self, child: Child, probe: Callable[[], None]) -> None:
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
    layout = Layout(Path(state_dir).expanduser().absolute())
    roots = [d.resolve() for d in layout.data_dirs()]
    found: list[int] = []
    for proc in psutil.process_iter(["name", "status"]):
        if proc.info["name"] not in SERVER_NAMES or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            cwd = Path(proc.cwd())
            if any(cwd == root or root in cwd.parents for root in roots):
                found.append(proc.pid)
    return sorted(found)


def stop_leftovers(layout: Layout) -> None:
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
    alive = wait_gone(procs, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(alive, timeout=5)
