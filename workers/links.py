"""Tasks on the `links` queue: presigned download URLs, signed where the S3 secret lives."""

from __future__ import annotations

from datetime import timedelta

from services import tasks
from services.documents.links import presign_links
from workers.app import app
from workers.resources import resources


@app.task(name=tasks.PRESIGN, acks_late=True, reject_on_worker_lost=True, time_limit=30)
def presign(document_ids: list[str], ttl_seconds: int) -> dict[str, dict[str, str]]:
    """Signs a GET URL for each live document; ids that are gone are left out."""
    r = resources()
    links = presign_links(r.db, r.storage, document_ids, timedelta(seconds=int(ttl_seconds)))
    return {
        doc_id: {"url": link.url, "expire_time": link.expire_time.isoformat()}
        for doc_id, link in links.items()
        if link.expire_time is not None
    }
