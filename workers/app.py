"""The Celery app: queues, routing and delivery guarantees shared by every worker pool."""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from services.config import Settings, get_settings

# The longest task may run this long; the broker's visibility timeout must exceed it, or Redis
# hands a still-running task to a second worker.
TASK_TIME_LIMIT_SECONDS = 15 * 60
VISIBILITY_TIMEOUT_SECONDS = 2 * TASK_TIME_LIMIT_SECONDS

QUEUES = ("ingest", "links")


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("footnote")
    app.conf.update(
        broker_url=settings.broker_url,
        result_backend=settings.broker_url,
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue="ingest",
        task_routes={"documents.*": {"queue": "ingest"}, "links.*": {"queue": "links"}},
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
        worker_hijack_root_logger=False,
        include=["workers.ingest", "workers.links"],
    )
    return app


app = create_app()
