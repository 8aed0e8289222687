"""Re-enqueues work the broker lost: documents whose attempt died, and unpurged deletions.

Redis hands back an unacknowledged task only after the visibility timeout, and a task can
be lost on a hard kill, so SQL is the source of truth and this pass runs at worker start and
periodically. An attempt counts as dead when its lease ran out, when it missed three
heartbeats, or when its holder is a process on this host that is gone. Documents that FAILED
for a transient reason are re-sent a bounded number of times, with backoff, and only while
their dependencies answer. Every task it sends is idempotent, so a duplicate is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from services.db.models import Document as DocumentRow
from services.db.models import utcnow
from services.db.session import Database
from services.documents.domain import DocumentState
from services.documents.ingest import (
    HEARTBEAT_SECONDS,
    FailureKind,
    abandoned_before,
    holder_gone,
)
from services.tasks import TaskClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grace:
    """How long after its last send a document's task may be sent again, and the retry bounds."""

    queued: timedelta = timedelta(minutes=5)
    abandoned: timedelta = timedelta(seconds=5)
    lease: timedelta = timedelta(seconds=60)
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    transient_retries: int = 5
    transient_backoff: timedelta = timedelta(seconds=60)

    def transient_delay(self, attempts: int) -> timedelta:
        return self.transient_backoff * (2 ** min(attempts, 10))


@dataclass(frozen=True)
class Due:
    ingest: list[str]
    purge: list[str]
    retried: list[str] | None = None


def sent_before(moment: datetime) -> ColumnElement[bool]:
    return or_(DocumentRow.enqueue_time.is_(None), DocumentRow.enqueue_time < moment)


def find_due(s: Session, grace: Grace, limit: int = 500) -> Due:
    """Marks as re-sent, and returns, the documents whose work is due again."""
    now = utcnow()
    # A waiting task may just sit behind a backlog; re-sending it soon would only grow the queue.
    waiting = and_(
        DocumentRow.state == DocumentState.PENDING.value, sent_before(now - grace.queued)
    )
    # A lease that ran out or stopped being renewed means the worker died.
    processing = and_(
        DocumentRow.state == DocumentState.PROCESSING.value, sent_before(now - grace.abandoned)
    )
    unpurged = and_(DocumentRow.delete_time.is_not(None), sent_before(now - grace.queued))
    rows = s.scalars(
        select(DocumentRow)
        .where(or_(unpurged, and_(DocumentRow.delete_time.is_(None), or_(waiting, processing))))
        .order_by(DocumentRow.enqueue_time)
        .limit(limit)
        # Two reconcilers at once split the rows between them instead of both sending them.
        .with_for_update(skip_locked=True)
    ).all()
    stale = abandoned_before(grace.lease, grace.heartbeat_seconds)
    due = [r for r in rows if r.delete_time is not None or is_abandoned(r, now, stale)]
    for row in due:
        row.enqueue_time = now
    return Due(
        ingest=[str(r.id) for r in due if r.delete_time is None],
        purge=[str(r.id) for r in due if r.delete_time is not None],
    )


def is_abandoned(row: DocumentRow, now: datetime, stale: datetime) -> bool:
    if row.state != DocumentState.PROCESSING.value:
        return True  # PENDING past its grace
    if row.lease_until is None or row.lease_until < now:
        return True
    # A lease without a holder waits for a scheduled retry, which no heartbeat keeps alive.
    return row.lease_holder is not None and (
        row.lease_until < stale or holder_gone(row.lease_holder)
    )


def revive_transient(s: Session, grace: Grace, limit: int = 100) -> list[str]:
    """Puts documents that FAILED for a transient reason back to PENDING, within the bounds."""
    now = utcnow()
    rows = s.scalars(
        select(DocumentRow)
        .where(
            DocumentRow.state == DocumentState.FAILED.value,
            DocumentRow.failure_kind == FailureKind.TRANSIENT.value,
            DocumentRow.delete_time.is_(None),
            DocumentRow.reconcile_attempts < grace.transient_retries,
        )
        .order_by(DocumentRow.update_time)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    revived = []
    for row in rows:
        if row.update_time > now - grace.transient_delay(row.reconcile_attempts):
            continue
        row.state = DocumentState.PENDING.value
        row.failure_kind = None
        row.error = ""
        row.reconcile_attempts += 1
        row.lease_until = None
        row.lease_holder = None
        row.enqueue_time = now
        row.update_time = now
        revived.append(str(row.id))
    return revived


def has_transient_failures(s: Session, grace: Grace) -> bool:
    return (
        s.scalar(
            select(DocumentRow.id)
            .where(
                DocumentRow.state == DocumentState.FAILED.value,
                DocumentRow.failure_kind == FailureKind.TRANSIENT.value,
                DocumentRow.delete_time.is_(None),
                DocumentRow.reconcile_attempts < grace.transient_retries,
            )
            .limit(1)
        )
        is not None
    )


def reconcile(
    db: Database,
    tasks: TaskClient,
    grace: Grace = Grace(),
    ready: Callable[[], bool] | None = None,
) -> Due:
    """Re-sends the tasks of documents whose attempt died, and of transient failures.

    ready says whether the dependencies are back; failed documents wait until it is true.
    """
    due = db.transact(lambda s: find_due(s, grace))
    retried: list[str] = []
    if db.transact(lambda s: has_transient_failures(s, grace)) and (ready is None or ready()):
        retried = db.transact(lambda s: revive_transient(s, grace))
    for document_id in (*due.ingest, *retried):
        tasks.ingest(document_id)
    for document_id in due.purge:
        tasks.purge(document_id)
    if due.ingest or due.purge or retried:
        log.info(
            "reconciler re-sent %d ingestions, %d purges and %d transient failures",
            len(due.ingest),
            len(due.purge),
            len(retried),
        )
    return Due(ingest=due.ingest, purge=due.purge, retried=retried)
