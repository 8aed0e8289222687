"""The Celery app of the worker pools: Footnote's queues and settings, plus the task modules.

The signal handlers below give the workers Footnote's logs (JSON or text, through one
handler), traces (context from the task headers) and metrics (FOOTNOTE_WORKER_METRICS_PORT).
They act only in worker processes, not in `celery inspect` or other clients of this app.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import signals

from services.config import get_settings
from services.observability import exporter
from services.tasks import create_celery

settings = get_settings()
# Before the task modules import prometheus_client, which picks its storage on import.
exporter.prepare_multiprocess_dir(settings.worker_metrics_port)

app = create_celery(settings)
app.conf.include = ["workers.ingest", "workers.links"]


def log_format() -> str:
    from services.observability.logs import resolve_format

    return resolve_format(settings.log_format, sys.__stdout__)


@signals.celeryd_init.connect
def quiet_banner_in_json_mode(instance: Any = None, **_: Any) -> None:
    """The startup banner is many lines of plain text; in JSON mode Celery logs `ready` instead."""
    if instance is not None and log_format() == "json":
        instance.quiet = True


@signals.setup_logging.connect
def configure_worker_logging(loglevel: Any = None, **_: Any) -> None:
    """Replaces Celery's logging setup; pool processes inherit it when they fork."""
    import logging

    from services.observability.logs import JSON, configure_from_settings

    # The original stdout, which stays the log's stream even when sys.stdout is replaced.
    chosen = configure_from_settings(
        settings.model_copy(update={"log_format": log_format()}), stream=sys.__stdout__
    )
    if loglevel:
        logging.getLogger().setLevel(loglevel)
    if chosen == JSON:
        # Whatever a library prints becomes a JSON record rather than a stray line.
        app.log.redirect_stdouts_to_logger(logging.getLogger("celery.redirected"), logging.WARNING)
        route_shutdown_notices_to_log()


def route_shutdown_notices_to_log() -> None:
    """Celery prints its shutdown notices straight to stdout; in JSON mode they become records."""
    import logging

    import celery.apps.worker as celery_worker

    notices = logging.getLogger("celery.apps.worker")

    def say(message: str, *_: Any, **__: Any) -> None:
        notices.warning(message)

    if hasattr(celery_worker, "safe_say"):
        celery_worker.safe_say = say


@signals.worker_init.connect
def start_worker_observability(**_: Any) -> None:
    """In the worker's main process, before the pool forks: tracing, and the metrics endpoint."""
    from services.observability.tracing import setup_tracing

    setup_tracing("footnote-worker")
    if settings.worker_metrics_port is not None:
        exporter.start_worker_exporter(settings.worker_metrics_host, settings.worker_metrics_port)


@signals.worker_process_shutdown.connect
def flush_pool_process(pid: int | None = None, **_: Any) -> None:
    """A pool process exits without running atexit: send its spans and drop its gauges."""
    from services.observability.tracing import flush_tracing

    flush_tracing()
    exporter.process_exited(pid or os.getpid())


@signals.worker_shutdown.connect
def stop_worker_observability(**_: Any) -> None:
    from services.observability.tracing import shutdown_tracing

    shutdown_tracing()
    exporter.remove_multiprocess_dir()


@signals.task_prerun.connect
def task_started(task_id: str | None = None, **_: Any) -> None:
    from services.observability.task_events import task_started as started

    if task_id:
        started(task_id)


@signals.task_postrun.connect
def task_finished(
    task: Any = None,
    task_id: str | None = None,
    args: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    # Connected before the tracing instrumentation's handler, so the task's span is current.
    from services.observability.task_events import task_finished as finished

    if task is not None and task_id:
        finished(task.name, task_id, state, args or (), task.request.retries or 0)
