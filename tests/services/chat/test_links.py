"""Download links by link mode, and what happens when the links pool does not answer."""

from __future__ import annotations

import logging
import time

from celery import Celery

from services.assistants.domain import LinkMode
from services.chat.links import attach_links
from services.citations import CitationSource, SourceLocation
from services.documents.links import LinkSigner


def source(index: int, document_id: str) -> CitationSource:
    return CitationSource(
        index=index,
        document_id=document_id,
        document_name="a.md",
        content_type="text/markdown",
        score=0.5,
        excerpt="text",
        chunk_id=f"c{index}",
        chunk_index=0,
        location=SourceLocation(),
    )


async def test_an_unanswered_links_pool_leaves_sources_without_links(private_broker, caplog):
    # Nobody consumes this broker's links queue, as when the pool is down.
    celery = Celery(broker=private_broker, backend=private_broker)
    signer = LinkSigner(celery, timeout_seconds=1.0)
    sources = (source(1, "d1"), source(2, "d2"))
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="services.chat.links"):
        linked = await attach_links(sources, LinkMode.PUBLIC, signer, "http://unused")
    assert time.monotonic() - began < 5
    assert linked == sources
    assert "without public links" in caplog.text and "did not answer" in caplog.text
    celery.close()


async def test_authenticated_and_none_modes_need_no_pool(private_broker):
    signer = LinkSigner(Celery(broker=private_broker, backend=private_broker), 1.0)
    sources = (source(1, "d1"),)
    none = await attach_links(sources, LinkMode.NONE, signer, "http://host:8080")
    assert none[0].download_url == ""
    auth = await attach_links(sources, LinkMode.AUTHENTICATED, signer, "http://host:8080/")
    assert auth[0].download_url == "http://host:8080/v1/documents/d1/download"
    assert auth[0].download_url_expire_time is None
