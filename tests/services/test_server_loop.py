"""The server's event loop and how long a call may wait for the server to pick it up."""

from __future__ import annotations

import asyncio
import gc
import sys
import time

import grpc
import pytest
from pydantic import ValidationError

from services.chat.pipeline import ChatEngine
from services.config import Settings
from services.retrieval import search as searching
from services.server import loop_factory, run_on_configured_loop, serve, server_options

METHOD = "/test.Blocking/Call"


async def calls_while_the_loop_is_blocked(accept_timeout: int) -> list[str]:
    """The first call blocks the server's loop for 2.5 s; three more arrive meanwhile.

    The server asks gRPC for one call at a time: one of the three is handed over at once,
    the others wait in gRPC's queue until the loop is free again.
    """

    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if request == b"block":
            time.sleep(2.5)  # a loop too busy to pick up the next call
        return request

    server = grpc.aio.server(
        options=server_options(Settings(grpc_accept_timeout_seconds=accept_timeout))
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Blocking", {"Call": grpc.unary_unary_rpc_method_handler(call)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        # The client has its own threads: the server's blocked loop must not hold it up.
        later = await asyncio.to_thread(call_from_another_thread, port)
    finally:
        await server.stop(None)
    return later


def call_from_another_thread(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = channel.unary_unary(METHOD)
        first = stub.future(b"block")
        time.sleep(0.5)
        later = [stub.future(f"call {i}".encode()) for i in range(3)]
        first.result()
        results = []
        for future in later:
            try:
                results.append(future.result().decode())
            except grpc.RpcError as err:
                results.append(err.code().name)
        return results


async def test_a_call_left_unaccepted_past_the_limit_is_cancelled_by_grpc() -> None:
    # What 1,000 streams met with gRPC's default of 30 s: CANCELLED, with no handler run.
    assert "CANCELLED" in await calls_while_the_loop_is_blocked(1)


async def test_within_the_limit_the_call_waits_and_is_answered() -> None:
    assert await calls_while_the_loop_is_blocked(300) == ["call 0", "call 1", "call 2"]


def test_the_server_runs_on_uvloop_unless_told_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    monkeypatch.delenv("FOOTNOTE_EVENT_LOOP", raising=False)
    assert loop_factory(Settings().event_loop) is uvloop.new_event_loop
    assert loop_factory(Settings(event_loop="asyncio").event_loop) is None  # asyncio's own


def test_an_unknown_event_loop_is_refused() -> None:
    with pytest.raises(ValidationError, match="event_loop"):
        Settings(event_loop="trio")


def test_the_server_runs_with_a_thread_switch_interval_of_1_ms_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FOOTNOTE_THREAD_SWITCH_INTERVAL_MS", raising=False)
    seen: list[float] = []

    async def note_the_interval() -> None:
        seen.append(sys.getswitchinterval())

    before = sys.getswitchinterval()
    try:
        run_on_configured_loop(Settings(event_loop="asyncio"), note_the_interval())
        told = Settings(event_loop="asyncio", thread_switch_interval_ms=2.5)
        run_on_configured_loop(told, note_the_interval())
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.001), pytest.approx(0.0025)]


@pytest.mark.parametrize("bad", [0, -1, 1000])
def test_a_switch_interval_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValidationError, match="thread_switch_interval_ms"):
        Settings(thread_switch_interval_ms=bad)


async def test_a_started_server_freezes_its_startup_objects_and_takes_its_search_settings(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = asyncio.Event()

    async def prepare(engine: ChatEngine) -> None:
        prepared.set()

    monkeypatch.setattr(ChatEngine, "prepare", prepare)
    gc.unfreeze()
    ef_search = searching.EF_SEARCH
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    configured = settings.model_copy(update={"http_port": 0, "hnsw_ef_search": 250})
    running = asyncio.create_task(serve(configured, stop, ready))
    try:
        await asyncio.wait_for(asyncio.shield(ready), 60)
        assert gc.get_freeze_count() > 10_000
        assert searching.EF_SEARCH == 250  # FOOTNOTE_HNSW_EF_SEARCH reaches the searches
        # The question model loads once the server serves, not in the first answer.
        await asyncio.wait_for(prepared.wait(), 10)
    finally:
        stop.set()
        await running
        gc.unfreeze()  # this test process's objects go back to the collector
        searching.configure(ef_search=ef_search)
