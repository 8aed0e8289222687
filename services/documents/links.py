"""Download links: signed by the `links` worker pool, chosen by the assistant's link mode.

The frontend never signs a URL itself: it asks the pool through `TaskClient.presign`, and the
pool's task calls `presign_links` where the presigning credential lives.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select

from services.assistants.domain import LinkMode
from services.db.models import Document as DocumentRow
from services.db.session import Database
from services.errors import FootnoteError, Unavailable
from services.storage import Storage
from services.tasks import BROKER_ERRORS, TaskClient, broker_unavailable

log = logging.getLogger(__name__)
MAX_TTL = timedelta(days=7)
PUBLIC_LINK_TTL = timedelta(hours=1)


@dataclass(frozen=True)
class Link:
    url: str
    expire_time: datetime | None = None  # None for links that do not expire


def presign_links(
    db: Database, storage: Storage, document_ids: Iterable[str], ttl: timedelta
) -> dict[str, Link]:
    """A presigned GET URL for each live document; ids that are gone are left out."""
    ttl = min(max(ttl, timedelta(seconds=1)), MAX_TTL)
    ids = [uuid.UUID(i) for i in document_ids]
    keys = db.transact(
        lambda s: dict(
            s.execute(
                select(DocumentRow.id, DocumentRow.object_key).where(
                    DocumentRow.id.in_(ids), DocumentRow.delete_time.is_(None)
                )
            ).all()
        )
    )
    links = {}
    for doc_id, key in keys.items():
        url, expire_time = storage.presign_get(key, ttl)
        links[str(doc_id)] = Link(url, expire_time)
    return links


class LinkSigner:
    """Links for documents, by link mode; PUBLIC ones are asked of the links pool."""

    def __init__(self, tasks: TaskClient, timeout_seconds: float, public_base_url: str) -> None:
        self.tasks = tasks
        self.timeout = timeout_seconds
        self.public_base_url = public_base_url.rstrip("/")

    async def presign(self, document_ids: list[str], ttl: timedelta) -> dict[str, Link]:
        """Links for the documents that still exist; UNAVAILABLE if the pool does not answer."""
        if not document_ids:
            return {}
        try:
            # The thread may block longer (a broker that does not answer a connect); the call
            # does not wait for it past the link timeout.
            async with asyncio.timeout(self.timeout):
                signed = await asyncio.to_thread(
                    self.tasks.presign, document_ids, ttl, self.timeout
                )
        except TimeoutError:
            raise Unavailable(
                "the links worker pool did not answer in time", reason="LINKS_UNAVAILABLE"
            ) from None
        except BROKER_ERRORS:
            raise broker_unavailable() from None
        return {doc_id: Link(url, expire_time) for doc_id, (url, expire_time) in signed.items()}

    async def links_for(self, document_ids: Iterable[str], mode: LinkMode) -> dict[str, Link]:
        """One link per document, all signed in one round trip; a failing pool gives none."""
        ids = sorted(set(document_ids))
        if mode is LinkMode.AUTHENTICATED:
            return {i: Link(url=f"{self.public_base_url}/v1/documents/{i}/download") for i in ids}
        if mode is LinkMode.PUBLIC and ids:
            try:
                return await self.presign(ids, PUBLIC_LINK_TTL)
            except FootnoteError as err:
                # The answer matters more than its links: serve it without them, and say why.
                log.warning("serving sources without public links: %s", err.message)
        return {}
