"""The one seam to Celery: queue and task names, the app's settings, and a typed sender.

The gRPC server and the workers both send tasks through `TaskClient`; only `workers/` defines
what the tasks do, and nothing here imports it.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

import redis.exceptions
from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError as KombuOperationalError

from services.config import Settings
from services.errors import Unavailable

INGEST_QUEUE = "ingest"
LINKS_QUEUE = "links"
QUEUES = (INGEST_QUEUE, LINKS_QUEUE)

INGEST = "documents.ingest"
PURGE = "documents.purge"
INDEX_ASSISTANT = "documents.index_assistant"
PRESIGN = "links.presign"

# The longest task may run this long; the broker's visibility timeout must exceed it, or Redis
# hands a still-running task to a second worker.
TASK_TIME_LIMIT_SECONDS = 15 * 60
VISIBILITY_TIMEOUT_SECONDS = 2 * TASK_TIME_LIMIT_SECONDS

# What Celery raises when the broker or the result backend cannot be reached: kombu wraps
# connection errors, the Redis result backend lets its own through, and a backend that gave up
# reconnecting raises RuntimeError.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    KombuOperationalError,
    redis.exceptions.RedisError,
    ConnectionError,
    TimeoutError,
    OSError,
    RuntimeError,
)


def broker_unavailable() -> Unavailable:
    return Unavailable("the task broker is unavailable; retry later", reason="BROKER_UNAVAILABLE")


def create_celery(settings: Settings) -> Celery:
    """A Celery app with Footnote's queues, routing and delivery guarantees, and no tasks."""
    app = Celery("footnote")
    app.conf.update(
        broker_url=settings.broker_url,
        result_backend=settings.broker_url,
        # Each queue has its own exchange and routing key, so a pool bound to one queue never
        # sees another's messages, and `celery inspect active_queues` says what it consumes.
        task_queues=[
            Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES
        ],
        task_default_queue=INGEST_QUEUE,
        task_routes={
            "documents.*": {"queue": INGEST_QUEUE, "routing_key": INGEST_QUEUE},
            "links.*": {"queue": LINKS_QUEUE, "routing_key": LINKS_QUEUE},
        },
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_time_limit=TASK_TIME_LIMIT_SECONDS,
        task_soft_time_limit=TASK_TIME_LIMIT_SECONDS - 60,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS},
        result_backend_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS},
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=4,
        # A frontend publishing while the broker is down must fail fast, not hang the RPC;
        # the reconciler re-sends whatever was not published.
        task_publish_retry_policy={
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 1,
        },
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        # Operators see tasks in Flower and `celery events` without restarting workers with -E.
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
    )
    return app


class TaskClient:
    """Sends Footnote's tasks by name; the sender never imports the code that runs them."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def ingest(self, document_id: str) -> None:
        self.celery.send_task(INGEST, args=[document_id])

    def purge(self, document_id: str) -> None:
        self.celery.send_task(PURGE, args=[document_id])

    def presign(
        self, document_ids: list[str], ttl: timedelta, timeout: float
    ) -> dict[str, tuple[str, datetime]]:
        """URL and expiry per live document, signed by the links pool; blocks up to timeout.

        UNAVAILABLE when the pool does not answer in time or the broker cannot be reached.
        """
        try:
            result = self.celery.send_task(
                PRESIGN, args=[document_ids, int(ttl.total_seconds())], expires=timeout
            )
        except BROKER_ERRORS:
            raise broker_unavailable() from None
        try:
            raw = result.get(timeout=timeout, propagate=True)
        except CeleryTimeout:
            raise Unavailable(
                "the links worker pool did not answer in time", reason="LINKS_UNAVAILABLE"
            ) from None
        except BROKER_ERRORS:
            raise broker_unavailable() from None
        finally:
            with contextlib.suppress(*BROKER_ERRORS):
                result.forget()
        return {
            doc_id: (value["url"], datetime.fromisoformat(value["expire_time"]))
            for doc_id, value in raw.items()
        }

    def close(self) -> None:
        self.celery.close()
