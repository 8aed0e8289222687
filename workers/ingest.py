"""Tasks on the `ingest` queue: documents.ingest and documents.purge, plus the reconciler."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_ready, worker_shutdown
from celery.utils.time import get_exponential_backoff_interval

from services import tasks
from services.config import get_settings
from services.documents import ingest as ingestion
from services.documents.purge import purge_document
from services.documents.reconcile import Grace, reconcile
from services.observability.worker_metrics import INGEST_DOCUMENTS
from services.tasks import TaskClient
from workers.app import app
from workers.resources import resources

log = logging.getLogger(__name__)
settings = get_settings()


def failure_message(exc: BaseException, attempts: int) -> str:
    if isinstance(exc, SoftTimeLimitExceeded):
        return "ingestion took longer than the time limit; try a smaller file"
    if isinstance(exc, ingestion.TRANSIENT_ERRORS):
        return (
            f"a service ingestion depends on stayed unavailable for {attempts} attempts "
            f"({exc}); the upload is kept, upload it again later"
        )
    return "ingestion failed with an internal error; the upload is kept (see the worker log)"


class IngestTask(Task):
    """Marks the document FAILED in SQL when the task gives up for good."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        message = failure_message(exc, self.request.retries + 1)
        ingestion.mark_failed(resources().db, args[0], message)
        INGEST_DOCUMENTS.labels("failed").inc()


# Retries are explicit rather than autoretry_for: the lease must be handed to the retry
# before it is published, or a fast retry finds the lease still held and is dropped.
@app.task(
    name=tasks.INGEST,
    base=IngestTask,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=settings.ingest_max_retries,
)
def ingest(self: Task, document_id: str) -> str:
    r = resources()
    options = ingestion.IngestOptions(
        lease_seconds=r.settings.ingest_lease_seconds,
        max_bytes=r.settings.max_upload_bytes,
        chunk_chars=r.settings.chunk_chars,
        overlap_chars=r.settings.chunk_overlap_chars,
    )
    try:
        outcome = ingestion.ingest_document(r.db, r.storage, r.embedder, document_id, options)
        INGEST_DOCUMENTS.labels(outcome.value.lower()).inc()
        return outcome.value
    except ingestion.TRANSIENT_ERRORS as exc:
        if self.request.retries >= self.max_retries:
            raise  # on_failure marks the document FAILED
        countdown = get_exponential_backoff_interval(
            factor=r.settings.ingest_retry_backoff_seconds,
            retries=self.request.retries,
            maximum=r.settings.ingest_retry_backoff_max_seconds,
            full_jitter=True,
        )
        log.warning("ingest of %s will retry in %ss: %s", document_id, countdown, exc)
        ingestion.release(r.db, document_id, retry_in=countdown)
        raise self.retry(exc=exc, countdown=countdown) from exc


@app.task(
    name=tasks.PURGE,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=ingestion.TRANSIENT_ERRORS,
    max_retries=10,
    retry_backoff=True,
    retry_jitter=True,
)
def purge(document_id: str) -> bool:
    r = resources()
    return purge_document(r.db, r.storage, document_id)


_stop_reconciler = threading.Event()


def run_reconciler() -> None:
    grace = Grace(queued=timedelta(seconds=settings.reconcile_queued_grace_seconds))
    while True:
        try:
            reconcile(resources().db, TaskClient(app), grace=grace)
        except Exception:  # the next pass tries again; a dead reconciler would lose documents
            log.exception("reconcile pass failed")
        if _stop_reconciler.wait(settings.reconcile_interval_seconds):
            return


@worker_ready.connect
def start_reconciler(sender: Any = None, **_: Any) -> None:
    """Every worker pool reconciles at start and then periodically; duplicates are harmless."""
    threading.Thread(target=run_reconciler, name="reconciler", daemon=True).start()


@worker_shutdown.connect
def stop_reconciler(sender: Any = None, **_: Any) -> None:
    _stop_reconciler.set()
