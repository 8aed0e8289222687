"""Statuses that tell the truth while a dependency is down, and after it returns.

Expected outcomes:
- health is NOT_SERVING while the broker is killed or paused, or Postgres or S3 cannot be
  reached, and SERVING again once they answer; a paused broker does not hold up the check;
- with the broker down, GetDownloadUrl is UNAVAILABLE (BROKER_UNAVAILABLE or
  LINKS_UNAVAILABLE), never INTERNAL;
- with the broker down, Complete on an assistant with PUBLIC links answers, with its
  citations and without links.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from devstack.stack import EmbeddedStack
from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as cpb
from footnote.v1 import chat_service_pb2_grpc as cpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc
from services.health import DependencyHealth
from services.server import LIVENESS_SERVICE, mark_serving
from tests.faults.conftest import serve_on_thread
from tests.support import bearer, error_info

SERVICE = "footnote.v1.DocumentsService"


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_stack(settings) -> Iterator[EmbeddedStack]:
    """An embedded Redis of the test's own, to kill and restart."""
    state = Path(tempfile.mkdtemp(prefix="fnh", dir="/tmp"))
    stack = EmbeddedStack(
        state,
        database_url=settings.database_url,
        s3_endpoint=settings.s3_endpoint,
        s3_access_key=settings.s3_access_key,
        s3_secret_key=settings.s3_secret_key,
        s3_bucket=settings.s3_bucket,
    )
    with stack:
        yield stack
    shutil.rmtree(state, ignore_errors=True)


async def status_of(health: HealthServicer) -> int:
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), None)
    return reply.status


async def test_health_follows_the_broker_down_paused_and_back(settings, redis_stack):
    checked = settings.model_copy(
        update={"broker_url": redis_stack.endpoints.broker_url, "health_check_timeout_seconds": 1}
    )
    health = HealthServicer()
    checker = DependencyHealth.from_settings(checked, health, [SERVICE])
    try:
        assert await checker.check_once() == set()
        assert await status_of(health) == health_pb2.HealthCheckResponse.SERVING

        redis = next(c for c in redis_stack.children() if c.name == "redis")
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            assert await checker.check_once() == {"broker"}
            assert await status_of(health) == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)

        os.kill(redis.proc.pid, signal.SIGKILL)
        redis.proc.wait()
        assert await checker.check_once() == {"broker"}
        redis_stack.respawn(redis)
        for _ in range(100):
            if await checker.check_once() == set():
                break
            time.sleep(0.1)
        assert await status_of(health) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await checker.stop()


async def test_health_is_not_serving_without_postgres_or_s3(settings):
    for update, down in (
        ({"database_url": f"postgresql://postgres@127.0.0.1:{dead_port()}/x"}, "postgres"),
        ({"s3_endpoint": f"http://127.0.0.1:{dead_port()}"}, "s3"),
    ):
        health = HealthServicer()
        checker = DependencyHealth.from_settings(settings.model_copy(update=update), health, [])
        try:
            assert await checker.check_once() == {down}
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), None)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            await checker.stop()


async def test_liveness_stays_serving_while_a_dependency_is_down(settings):
    health = HealthServicer()
    await mark_serving(health)
    dead = {"database_url": f"postgresql://postgres@127.0.0.1:{dead_port()}/x"}
    checker = DependencyHealth.from_settings(settings.model_copy(update=dead), health, [SERVICE])
    try:
        assert await checker.check_once() == {"postgres"}
        overall = await health.Check(health_pb2.HealthCheckRequest(service=""), None)
        alive = await health.Check(health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE), None)
        assert overall.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert alive.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await checker.stop()


@pytest.fixture(scope="module")
def brokerless_target(settings) -> Iterator[str]:
    """A server whose broker cannot be reached; everything else is the session's stack."""
    yield from serve_on_thread(
        settings.model_copy(
            update={"broker_url": f"redis://127.0.0.1:{dead_port()}/0", "link_timeout_seconds": 3}
        )
    )


def test_get_download_url_without_a_broker_is_unavailable(
    brokerless_target, sync_channel, module_key, module_assistant
):
    meta = dpb.UploadDocumentMetadata(assistant_id=module_assistant, display_name="a.md")
    doc = dpb_grpc.DocumentsServiceStub(sync_channel).UploadDocument(
        iter([dpb.UploadDocumentRequest(metadata=meta), dpb.UploadDocumentRequest(chunk=b"hi")]),
        metadata=bearer(module_key),
    )
    with grpc.insecure_channel(brokerless_target) as channel, pytest.raises(grpc.RpcError) as err:
        dpb_grpc.DocumentsServiceStub(channel).GetDownloadUrl(
            dpb.GetDownloadUrlRequest(document_id=doc.id), metadata=bearer(module_key), timeout=60
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert error_info(err.value).reason in ("BROKER_UNAVAILABLE", "LINKS_UNAVAILABLE")


def test_public_answers_without_a_broker_have_no_links(
    brokerless_target, sync_channel, module_key, worker
):
    assistant = apb_grpc.AssistantsServiceStub(sync_channel).CreateAssistant(
        apb.CreateAssistantRequest(
            assistant=apb.Assistant(
                display_name="public",
                settings=apb.AssistantSettings(citation_link_mode=apb.CITATION_LINK_MODE_PUBLIC),
            )
        ),
        metadata=bearer(module_key),
    )
    docs = dpb_grpc.DocumentsServiceStub(sync_channel)
    meta = dpb.UploadDocumentMetadata(assistant_id=assistant.id, display_name="travel.md")
    text = b"# Travel\n\nThe daily meal allowance on business trips is 25 EUR.\n"
    doc = docs.UploadDocument(
        iter([dpb.UploadDocumentRequest(metadata=meta), dpb.UploadDocumentRequest(chunk=text)]),
        metadata=bearer(module_key),
    )
    states = list(
        docs.WatchDocument(
            dpb.WatchDocumentRequest(id=doc.id), metadata=bearer(module_key), timeout=120
        )
    )
    final = states[-1] if states else None
    assert final is not None and final.state == dpb.DOCUMENT_STATE_READY, final
    with grpc.insecure_channel(brokerless_target) as channel:
        answer = cpb_grpc.ChatServiceStub(channel).Complete(
            cpb.CompleteRequest(
                assistant_id=assistant.id,
                messages=[
                    cpb.ChatMessage(role=cpb.ROLE_USER, content="What is the meal allowance?")
                ],
            ),
            metadata=bearer(module_key),
            timeout=120,
        )
    assert "25 EUR" in answer.message.content
    assert answer.citations.sources, "the answer keeps its citations"
    assert all(s.download_url == "" for s in answer.citations.sources)
