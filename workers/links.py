"""Tasks on the `links` queue: presigned download URLs, signed where the S3 secret lives."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import select

from services.db.models import Document as DocumentRow
from workers.app import app
from workers.resources import resources

MAX_TTL_SECONDS = 7 * 24 * 3600


@app.task(name="links.presign", acks_late=True, reject_on_worker_lost=True, time_limit=30)
def presign(document_ids: list[str], ttl_seconds: int) -> dict[str, dict[str, str]]:
    """Signs a GET URL for each live document; ids that are gone are left out."""
    ttl = timedelta(seconds=max(1, min(int(ttl_seconds), MAX_TTL_SECONDS)))
    r = resources()
    ids = [uuid.UUID(i) for i in document_ids]
    keys = r.db.transact(
        lambda s: dict(
            s.execute(
                select(DocumentRow.id, DocumentRow.object_key).where(
                    DocumentRow.id.in_(ids), DocumentRow.delete_time.is_(None)
                )
            ).all()
        )
    )
    links: dict[str, dict[str, str]] = {}
    for doc_id, key in keys.items():
        url, expire_time = r.storage.presign_get(key, ttl)
        links[str(doc_id)] = {"url": url, "expire_time": expire_time.isoformat()}
    return links
