"""gRPC's completions reach the event loop even after a turn of the loop that ran long."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest

from services.completions import drain_wakeups, unread_bytes, wakeup_socket

METHOD = "/test.Echo/Call"


def unread(loop: asyncio.AbstractEventLoop) -> int:
    found = wakeup_socket(loop)
    assert found is not None
    return unread_bytes(found[0])


async def unread_after_a_long_turn(calls: int) -> tuple[int, list[bytes]]:
    """Wake-up bytes left unread one turn after a turn of 0.5 s, with calls under way."""

    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    loop = asyncio.get_running_loop()
    if wakeup_socket(loop) is None:
        # A grpc.aio that wakes its loop another way (its public source has a rewrite that
        # writes a byte only when its queue was empty) needs no reader of ours.
        await server.stop(None)
        pytest.skip("this grpc.aio has no one-byte-a-completion wake-up socket")
    assert drain_wakeups(loop)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = channel.unary_unary(METHOD)
            await stub(b"warm")
            pending = [asyncio.ensure_future(stub(b"%d" % i)) for i in range(calls)]
            await asyncio.sleep(0.05)  # the calls are sent
            time.sleep(0.5)  # a long turn: their completions queue up meanwhile
            await asyncio.sleep(0)
            left = unread(loop)
            answers = await asyncio.gather(*pending)
    finally:
        await server.stop(None)
    return left, answers


async def test_a_long_turn_leaves_no_backlog_of_wake_ups() -> None:
    # gRPC's own reader reads one byte a turn: over 100 were left (at about 280 its poller
    # thread blocks in its write).
    left, answers = await unread_after_a_long_turn(400)
    assert left < 40
    assert answers == [b"%d" % i for i in range(400)]


def test_a_loop_grpc_has_not_bound_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING):
            assert not drain_wakeups(loop)
    finally:
        loop.close()
    assert "wake-up socket not found" in caplog.text
