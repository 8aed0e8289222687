"""Re-enqueues work the broker lost: documents stuck past their lease, and unpurged deletions.

Redis hands back an unacknowledged task only after the visibility timeout, and a task can
be lost on a hard kill, so SQL is the source of truth and this pass runs at worker start and
periodically. Every task it sends is idempotent, so a duplicate is harmless.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from services.db.models import Document as DocumentRow
from services.db.models import utcnow
from services.db.session import Database
from services.documents.domain import DocumentState
from services.tasks import TaskClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grace:
    """How long after its last send a document's task may be sent again."""

    queued: timedelta = timedelta(minutes=5)
    abandoned: timedelta = timedelta(seconds=5)


@dataclass(frozen=True)
class Due:
    ingest: list[str]
    purge: list[str]


def sent_before(moment: datetime) -> ColumnElement[bool]:
    return or_(DocumentRow.enqueue_time.is_(None), DocumentRow.enqueue_time < moment)


def find_due(s: Session, grace: Grace, limit: int = 500) -> Due:
    """Marks as re-sent, and returns, the documents whose work is due again."""
    now = utcnow()
    # A waiting task may just sit behind a backlog; re-sending it soon would only grow the queue.
    waiting = and_(
        DocumentRow.state == DocumentState.PENDING.value, sent_before(now - grace.queued)
    )
    # A lease that ran out means the worker died: nobody else will finish this one.
    abandoned = and_(
        DocumentRow.state == DocumentState.PROCESSING.value,
        or_(DocumentRow.lease_until.is_(None), DocumentRow.lease_until < now),
        sent_before(now - grace.abandoned),
    )
    unpurged = and_(DocumentRow.delete_time.is_not(None), sent_before(now - grace.queued))
    rows = s.scalars(
        select(DocumentRow)
        .where(or_(unpurged, and_(DocumentRow.delete_time.is_(None), or_(waiting, abandoned))))
        .order_by(DocumentRow.enqueue_time)
        .limit(limit)
        # Two reconcilers at once split the rows between them instead of both sending them.
        .with_for_update(skip_locked=True)
    ).all()
    for row in rows:
        row.enqueue_time = now
    return Due(
        ingest=[str(r.id) for r in rows if r.delete_time is None],
        purge=[str(r.id) for r in rows if r.delete_time is not None],
    )


def reconcile(db: Database, tasks: TaskClient, grace: Grace = Grace()) -> Due:
    """Re-sends the tasks of documents stuck past their lease or grace."""
    due = db.transact(lambda s: find_due(s, grace))
    for document_id in due.ingest:
        tasks.ingest(document_id)
    for document_id in due.purge:
        tasks.purge(document_id)
    if due.ingest or due.purge:
        log.info("reconciler re-sent %d ingestions and %d purges", len(due.ingest), len(due.purge))
    return due
