"""Fixtures of the fault suite: a real server on a thread of its own, for blocking clients.

Hypothesis drives plain (blocking) test functions, so the server under test runs its own event
loop on a thread instead of the session's loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future

import grpc
import pytest

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from services.config import Settings
from tests.conftest import running_server
from tests.support import bearer


def serve_on_thread(settings: Settings) -> Iterator[str]:
    """A real server built by create_server, on its own loop and thread; yields its target."""
    loop = asyncio.new_event_loop()
    target: Future[str] = Future()
    stop = asyncio.Event()

    async def main() -> None:
        try:
            async with running_server(settings) as address:
                target.set_result(address)
                await stop.wait()
        except BaseException as err:
            if not target.done():
                target.set_exception(err)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        yield target.result(timeout=120)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


@pytest.fixture(scope="module")
def thread_target(settings: Settings) -> Iterator[str]:
    yield from serve_on_thread(settings)


@pytest.fixture(scope="module")
def sync_channel(thread_target: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(thread_target) as channel:
        yield channel


@pytest.fixture(scope="module")
def module_key(make_key) -> str:
    return make_key("faults-tenant")


@pytest.fixture(scope="module")
def module_assistant(sync_channel: grpc.Channel, module_key: str) -> str:
    created = apb_grpc.AssistantsServiceStub(sync_channel).CreateAssistant(
        apb.CreateAssistantRequest(assistant=apb.Assistant(display_name="faults")),
        metadata=bearer(module_key),
    )
    return created.id
