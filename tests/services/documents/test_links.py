"""Download links by link mode, and what happens when the links pool does not answer."""

from __future__ import annotations

import logging
import time

from celery import Celery

from services.assistants.domain import LinkMode
from services.documents.links import LinkSigner
from services.tasks import TaskClient


async def test_an_unanswered_links_pool_leaves_sources_without_links(private_broker, caplog):
    # Nobody consumes this broker's links queue, as when the pool is down.
    celery = Celery(broker=private_broker, backend=private_broker)
    signer = LinkSigner(TaskClient(celery), timeout_seconds=1.0, public_base_url="http://unused")
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="services.documents.links"):
        links = await signer.links_for(["d1", "d2"], LinkMode.PUBLIC)
    assert time.monotonic() - began < 5
    assert links == {}
    assert "without public links" in caplog.text and "did not answer" in caplog.text
    celery.close()


async def test_authenticated_and_none_modes_need_no_pool(private_broker):
    celery = Celery(broker=private_broker, backend=private_broker)
    signer = LinkSigner(TaskClient(celery), 1.0, "http://host:8080/")
    assert await signer.links_for(["d1"], LinkMode.NONE) == {}
    auth = await signer.links_for(["d1"], LinkMode.AUTHENTICATED)
    assert auth["d1"].url == "http://host:8080/v1/documents/d1/download"
    assert auth["d1"].expire_time is None
    celery.close()
