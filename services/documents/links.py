"""Presigned links, asked of the `links` worker pool so the frontend never signs them itself."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.exceptions import OperationalError as BrokerError

from services.errors import Unavailable


@dataclass(frozen=True)
class Link:
    url: str
    expire_time: datetime | None = None  # None for links that do not expire


class LinkSigner:
    def __init__(self, celery: Celery, timeout_seconds: float) -> None:
        self.celery = celery
        self.timeout = timeout_seconds

    def _presign(self, document_ids: list[str], ttl: timedelta) -> dict[str, Link]:
        result = self.celery.send_task(
            "links.presign",
            args=[document_ids, int(ttl.total_seconds())],
            expires=self.timeout,
        )
        try:
            raw = result.get(timeout=self.timeout, propagate=True)
        except CeleryTimeout:
            raise Unavailable(
                "the links worker pool did not answer in time", reason="LINKS_UNAVAILABLE"
            ) from None
        finally:
            result.forget()
        return {
            doc_id: Link(url=v["url"], expire_time=datetime.fromisoformat(v["expire_time"]))
            for doc_id, v in raw.items()
        }

    async def presign(self, document_ids: list[str], ttl: timedelta) -> dict[str, Link]:
        """Links for the documents that still exist; UNAVAILABLE if the pool does not answer."""
        if not document_ids:
            return {}
        try:
            return await asyncio.to_thread(self._presign, document_ids, ttl)
        except BrokerError:
            raise Unavailable(
                "the task broker is unavailable", reason="BROKER_UNAVAILABLE"
            ) from None
