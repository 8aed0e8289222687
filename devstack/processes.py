"""Child processes of the embedded stack: spawned in their own session, stopped for sure.

How children are kept from outliving us:

- Each child runs in its own session (its own process group), so a Ctrl-C in the terminal
  reaches only the supervisor, which then stops the children itself.
- Stopping sends each child its graceful-shutdown signal (SIGINT for Postgres: "fast
  shutdown", which does not wait for clients to disconnect; SIGTERM for the others), waits a
  grace period, then SIGKILLs the process group and any descendant that left it.
- On Linux each child is started with ``prctl(PR_SET_PDEATHSIG)``, so if the supervisor dies
  hard (SIGKILL, OOM) the kernel signals the child. The flag belongs to the forking *thread*,
  so children are forked from one thread that lives as long as the process.
- gRPC's fork handlers are turned off in the processes that fork children
  (GRPC_ENABLE_FORK_SUPPORT=false unless it is set). The prctl above needs a fork that runs
  Python code before exec, and with gRPC calls in flight on other threads (a test run, the
  dev supervisor's health checks) gRPC's handler in the child sometimes aborted it before
  exec: 2 of 200 children forked beside a busy channel, and Postgres "exited with code -6
  while starting" once in a test run (grpc/grpc#43055). Children only exec, so they need no
  gRPC state; turned off, 0 of 800. gRPC reads the setting once, as it is imported, so it
  is set where those processes start, before anything imports gRPC: the `footnote` command
  (footnote/cli/__init__.py) and the tests (tests/conftest.py). This module sets it too, for
  a program that imports it before gRPC; after gRPC, it is too late.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from devstack.errors import StackError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Read by gRPC as it is imported: too late here if it already was (see the docstring).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


@dataclass(frozen=True)
class Launch:
    """How to start one child: its command line and how it is stopped."""

    args: list[str]
    cwd: Path
    stop_signal: signal.Signals = signal.SIGTERM
    # Sent by the kernel if we die first; defaults to stop_signal.
    death_signal: signal.Signals | None = None
    ports: tuple[int, ...] = ()
    env: dict[str, str] | None = None
    user: str | None = None
    grace_cap: float = float("inf")


LOG_TAIL_LINES = 25

PR_SET_PDEATHSIG = 1


@dataclass
class Child:
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
    # How it was started, so that the supervisor can start it again the same way.
    launch: Launch | None = None

    def log_tail(self) -> str:
        """The last lines this run wrote to the child's log."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode(errors="replace")
        except OSError as err:
            return f"(cannot read {self.log_path}: {err})"
        lines = text.splitlines()[-LOG_TAIL_LINES:]
        return "\n".join(lines) if lines else "(empty)"

    def failure(self, what: str, cause: BaseException | None = None) -> StackError:
        reason = f"; last error: {cause!r}" if cause is not None else ""
        return StackError(
            f"{self.name} {what}{reason}\n--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )


def request_stop(child: Child) -> list[psutil.Process]:
    """Sends the child its shutdown signal; returns its descendants, to be checked on later."""
    descendants: list[psutil.Process] = []
    if child.proc.poll() is None:
        # Postgres workers leave the postmaster's process group, so killpg would miss them.
        with contextlib.suppress(psutil.Error):
            descendants = psutil.Process(child.proc.pid).children(recursive=True)
        signal_group(child.proc.pid, child.stop_signal)
    return descendants


def finish_stop(child: Child, descendants: list[psutil.Process], grace: float) -> None:
    proc = child.proc
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        # A capped grace means a known, harmless stall (weed): not worth a warning.
        level = logging.INFO if child.grace_cap < float("inf") else logging.WARNING
        log.log(level, "%s did not stop within %.0fs; killing it", child.name, grace)
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    # The leader may have gone alone (killed from outside); end whatever its group still holds.
    signal_group(proc.pid, signal.SIGKILL)
    alive = wait_gone(descendants, timeout=grace)
    for leftover in alive:
        with contextlib.suppress(psutil.Error):
            leftover.kill()
    wait_gone(alive, timeout=5)


def terminate(proc: subprocess.Popen[str], grace: float = 60.0) -> None:
    """Asks a `footnote` command (dev, serve) to stop, as SIGTERM does, and kills it if it has
    not stopped within grace seconds; it stops what it started itself."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def is_alive(proc: psutil.Process) -> bool:
    """True while the process runs; a zombie has finished and only waits to be reaped."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
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


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


_libc_prctl: Callable[..., int] | None = None


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
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
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class Spawner:
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


spawner = Spawner()
