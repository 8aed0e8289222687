"""Supervision of the stack's children: a child that dies is reaped, logged, and restarted.

Each child that exits while the stack runs is reaped at once (so no zombie is left), logged
with its exit code, counted, and started again with the same command line, ports and data
after a backoff that doubles with each recent death (0.5 s, 1 s, 2 s, ... up to 10 s). A child
that dies `max_deaths` times within `window_seconds` is not restarted: the supervisor reports
it, with the tail of its log, through `on_fatal`, and `footnote dev` stops the whole stack.
The counts are kept in `supervisor.json` in the state directory.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from devstack.processes import Child, signal_group

if TYPE_CHECKING:
    from devstack.stack import EmbeddedStack

log = logging.getLogger(__name__)
STATUS_FILE = "supervisor.json"
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    max_deaths: int = 5
    window_seconds: float = 60.0
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 10.0

    def backoff(self, recent_deaths: int) -> float:
        return min(
            self.backoff_max_seconds, self.backoff_initial_seconds * 2 ** max(0, recent_deaths - 1)
        )


class Supervisor:
    """Watches the stack's children on a thread of its own; `stop()` before stopping them."""

    def __init__(
        self,
        stack: EmbeddedStack,
        on_fatal: Callable[[str], None],
        policy: RestartPolicy = RestartPolicy(),
    ) -> None:
        self.stack = stack
        self.on_fatal = on_fatal
        self.policy = policy
        self.restarts: dict[str, int] = defaultdict(int)
        self.fatal: str | None = None
        self._deaths: dict[str, deque[float]] = defaultdict(deque)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def status_file(self) -> Path:
        return self.stack.state_dir / STATUS_FILE

    def start(self) -> None:
        self.write_status()
        self._thread = threading.Thread(target=self._run, name="footnote-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def write_status(self) -> None:
        status = {
            child.name: {"pid": child.proc.pid, "restarts": self.restarts[child.name]}
            for child in self.stack.children()
        }
        path = self.status_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            for child in self.stack.children():
                code = child.proc.poll()  # reaps a dead child at once
                if code is None or self._stop.is_set():
                    continue
                if not self._handle_death(child, code):
                    return

    def _handle_death(self, child: Child, code: int) -> bool:
        """Restarts the child after its backoff; False once it died too often."""
        now = time.monotonic()
        deaths = self._deaths[child.name]
        deaths.append(now)
        while deaths and deaths[0] < now - self.policy.window_seconds:
            deaths.popleft()
        # Whatever the child left in its process group (a worker's pool) goes with it.
        signal_group(child.proc.pid, signal.SIGKILL)
        if len(deaths) >= self.policy.max_deaths:
            self.fatal = (
                f"{child.name} died {len(deaths)} times within "
                f"{self.policy.window_seconds:.0f}s (last exit code {code}); stopping the "
                f"stack\n--- last lines of {child.log_path} ---\n{child.log_tail()}"
            )
            log.error("%s", self.fatal)
            self.on_fatal(self.fatal)
            return False
        delay = self.policy.backoff(len(deaths))
        log.warning(
            "%s (pid %d) exited with code %d; restarting it in %.1fs (restart %d)",
            child.name,
            child.proc.pid,
            code,
            delay,
            self.restarts[child.name] + 1,
        )
        if self._stop.wait(delay):
            return False
        replacement = self.stack.respawn(child)
        self.restarts[child.name] += 1
        log.info("%s restarted (pid %d)", child.name, replacement.proc.pid)
        self.write_status()
        return True
