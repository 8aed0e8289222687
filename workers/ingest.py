"""Tasks on the `ingest` queue: documents.ingest, documents.purge and
documents.index_assistant, plus the reconciler."""

from __future__ import annotations

import logging
import random
import threading
from datetime import timedelta
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_ready, worker_shutdown
from sqlalchemy import text

from services import tasks
from services.config import get_settings
from services.documents import ingest as ingestion
from services.documents.ingest import FailureKind
from services.documents.purge import purge_document
from services.documents.reconcile import Grace, reconcile
from services.observability.worker_metrics import INGEST_DOCUMENTS
from services.retrieval import indexes, table_stats
from services.retrieval.search import EXACT_MAX_CHUNKS
from services.tasks import TaskClient
from workers.app import app
from workers.resources import resources

log = logging.getLogger(__name__)
settings = get_settings()


def failure(exc: BaseException, attempts: int) -> tuple[str, FailureKind]:
    """The document's error message for a task that gave up, and whether a retry may help."""
    if isinstance(exc, SoftTimeLimitExceeded):
        return (
            "ingestion took longer than the task's time limit; split the file into smaller ones",
            FailureKind.PERMANENT,
        )
    if ingestion.is_transient(exc):
        return (
            f"temporary failure: a service ingestion depends on ({type(exc).__name__}) stayed "
            f"unavailable for {attempts} attempts; the upload is kept and ingestion is retried "
            "automatically once the service is back",
            FailureKind.TRANSIENT,
        )
    # A bug, not the file's fault: worth retrying a bounded number of times.
    return (
        "temporary failure: ingestion failed with an internal error; the upload is kept and "
        "ingestion is retried automatically (see the worker log)",
        FailureKind.TRANSIENT,
    )


def retry_countdown(retries: int) -> float:
    """factor * 2**retries, capped, with jitter between half and all of it."""
    base = min(
        settings.ingest_retry_backoff_seconds * 2**retries,
        settings.ingest_retry_backoff_max_seconds,
    )
    return round(base * random.uniform(0.5, 1.0), 2)


class IngestTask(Task):
    """Marks the document FAILED in SQL, with the kind of failure, when the task gives up."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        message, kind = failure(exc, self.request.retries + 1)
        ingestion.mark_failed(resources().db, args[0], message, kind)
        INGEST_DOCUMENTS.labels("failed").inc()


def holder_of(request: Any) -> ingestion.Holder:
    delivery = getattr(request, "delivery_info", None) or {}
    return ingestion.Holder.current(
        task_id=request.id or "", redelivered=bool(delivery.get("redelivered"))
    )


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
        max_chunks=r.settings.max_chunks_per_document,
        time_budget_seconds=r.settings.ingest_time_budget_seconds,
    )
    holder = holder_of(self.request)
    try:
        outcome = ingestion.ingest_document(
            r.db, r.storage, r.embedder, document_id, options, holder
        )
        INGEST_DOCUMENTS.labels(outcome.value.lower()).inc()
        if outcome is ingestion.Outcome.READY:
            # The document is READY whatever happens to the index or the statistics.
            try:
                request_assistant_index(document_id)
            except Exception:
                log.warning(
                    "could not ask for the index of %s's assistant", document_id, exc_info=True
                )
            try:
                refresh_statistics()
            except Exception:
                log.warning("could not analyse the tables after %s", document_id, exc_info=True)
        return outcome.value
    except ingestion.TRANSIENT_ERRORS as exc:
        if self.request.retries >= self.max_retries:
            raise  # on_failure marks the document FAILED (transient)
        countdown = retry_countdown(self.request.retries)
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


def request_assistant_index(document_id: str) -> None:
    """Sends documents.index_assistant when the document's assistant needs a vector index of
    its own (services/retrieval/indexes.py) and has no valid one yet."""
    r = resources()
    with r.db.engine.connect() as conn:
        assistant = conn.execute(
            text("SELECT assistant_id FROM documents WHERE id = :id"), {"id": document_id}
        ).scalar()
        if assistant is None or not indexes.needs_index(conn, str(assistant), EXACT_MAX_CHUNKS):
            return
    index_assistant.delay(str(assistant))


def refresh_statistics() -> None:
    """Analyses chunks and documents when their statistics (the full-text term shares, the
    planner's counts) are missing or out of date (services/retrieval/table_stats.py)."""
    with resources().db.engine.connect() as conn:
        if analysed := table_stats.analyze_when_grown(conn):
            log.info("analysed %s: statistics missing or out of date", ", ".join(analysed))


# No retries: the next document that becomes READY asks again, and a build that died leaves an
# invalid index that the next build replaces.
@app.task(name=tasks.INDEX_ASSISTANT, acks_late=True, reject_on_worker_lost=True)
def index_assistant(assistant_id: str) -> bool:
    return indexes.build(resources().db.engine, assistant_id, EXACT_MAX_CHUNKS)


_stop_reconciler = threading.Event()


def dependencies_up() -> bool:
    """Whether the object store answers; failed documents wait for it before a retry."""
    try:
        resources().storage.ping()
    except Exception:
        return False
    return True


def run_reconciler() -> None:
    grace = Grace(
        queued=timedelta(seconds=settings.reconcile_queued_grace_seconds),
        lease=timedelta(seconds=settings.ingest_lease_seconds),
        heartbeat_seconds=ingestion.IngestOptions(
            lease_seconds=settings.ingest_lease_seconds
        ).heartbeat_seconds,
        transient_retries=settings.reconcile_transient_retries,
        transient_backoff=timedelta(seconds=settings.reconcile_transient_backoff_seconds),
    )
    while True:
        try:
            reconcile(resources().db, TaskClient(app), grace=grace, ready=dependencies_up)
        except Exception:  # the next pass tries again; a dead reconciler would lose documents
            log.exception("reconcile pass failed")
        try:
            with resources().db.engine.connect() as conn:
                for assistant in indexes.waiting(conn, EXACT_MAX_CHUNKS):
                    index_assistant.delay(assistant)
        except Exception:
            log.exception("looking for assistants without their own index failed")
        if _stop_reconciler.wait(settings.reconcile_interval_seconds):
            return


@worker_ready.connect
def start_reconciler(sender: Any = None, **_: Any) -> None:
    """Every worker pool reconciles at start and then periodically; duplicates are harmless."""
    threading.Thread(target=run_reconciler, name="reconciler", daemon=True).start()


@worker_shutdown.connect
def stop_reconciler(sender: Any = None, **_: Any) -> None:
    _stop_reconciler.set()
