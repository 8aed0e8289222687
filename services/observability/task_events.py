"""One log line and one duration sample per Celery task run, from the task signals."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from services.observability.worker_metrics import TASK_DURATION, task_outcome

log = logging.getLogger("footnote.task")

# Tasks whose first argument is a document id (documents.ingest, documents.purge).
DOCUMENT_TASK_PREFIX = "documents."

_started: dict[str, float] = {}
_lock = threading.Lock()


def task_started(task_id: str) -> None:
    with _lock:
        _started[task_id] = time.perf_counter()


def task_finished(
    name: str, task_id: str, state: str | None, args: Sequence[Any], retries: int
) -> None:
    """Records the run; call it while the task's span is still current, for the trace id."""
    with _lock:
        began = _started.pop(task_id, None)
    seconds = time.perf_counter() - began if began is not None else 0.0
    outcome = task_outcome(state)
    TASK_DURATION.labels(name, outcome).observe(seconds)
    fields: dict[str, Any] = {
        "event": "task",
        "task": name,
        "task_id": task_id,
        "outcome": outcome,
        "duration_seconds": round(seconds, 6),
        "retries": retries,
    }
    if name.startswith(DOCUMENT_TASK_PREFIX) and args and isinstance(args[0], str):
        fields["document_id"] = args[0]
    level = logging.WARNING if outcome == "failure" else logging.INFO
    log.log(level, "task %s %s %.1fms", name, outcome, seconds * 1000, extra=fields)
