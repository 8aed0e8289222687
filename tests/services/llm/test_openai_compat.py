"""OpenAIGenerator against a scripted OpenAI-compatible server on a real loopback socket."""

from __future__ import annotations

import asyncio
import base64
import importlib.machinery
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvloop

from services.errors import ResourceExhausted, Unavailable
from services.llm.base import (
    Finished,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    PromptMessage,
    TextPiece,
    estimate_tokens,
)
from services.llm.openai_compat import KEEPALIVE_SECONDS, OpenAIGenerator, chat_completions_url

# --- the scripted server -----------------------------------------------------------------


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class Exchange:
    """One request on the server side: the script answers it through these methods."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, nth: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.nth = nth  # 1 for the first request on this connection
        self.keep_alive = False

    async def start_stream(
        self, status: int = 200, content_type: str = "text/event-stream"
    ) -> None:
        head = (
            f"HTTP/1.1 {status} Scripted\r\ncontent-type: {content_type}\r\n"
            "transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
        )
        self.writer.write(head.encode())
        await self.writer.drain()

    async def chunk(self, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self.writer.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        await self.writer.drain()

    async def event(self, payload: Any) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        await self.chunk(f"data: {text}\n\n")

    async def end_stream(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()
        self.keep_alive = True

    async def reply(
        self,
        status: int,
        body: str | bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        raw = body.encode() if isinstance(body, str) else body
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"HTTP/1.1 {status} Scripted\r\ncontent-type: {content_type}\r\n{extra}"
            f"content-length: {len(raw)}\r\n\r\n"
        )
        self.writer.write(head.encode() + raw)
        await self.writer.drain()
        self.keep_alive = True

    def client_gone(self) -> bool:
        # The kernel delivers the client's FIN (or RST) to the reader even while nobody reads.
        return self.reader.at_eof() or self.writer.is_closing()

    async def wait_client_gone(self, limit: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + limit
        while not self.client_gone() and loop.time() < until:
            await asyncio.sleep(0.01)


Script = Callable[[Exchange], Awaitable[None]]


@dataclass
class ScriptedServer:
    """Answers every request with `script`; records requests, disconnects and live handlers."""

    script: Script | None = None
    port: int = 0
    requests: list[ReceivedRequest] = field(default_factory=list)
    handlers: set[asyncio.Task[None]] = field(default_factory=set)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    events_sent: int = 0
    connections: int = 0
    _server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self.handlers):
            task.cancel()
        await self._server.wait_closed()

    async def wait_idle(self, limit: float) -> bool:
        """True once no handler runs, waiting at most `limit` seconds."""
        loop = asyncio.get_running_loop()
        until = loop.time() + limit
        while self.handlers and loop.time() < until:
            await asyncio.sleep(0.01)
        return not self.handlers

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        self.connections += 1
        try:
            nth = 1
            while await self._serve_one(reader, writer, nth):
                nth += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected.set()
        finally:
            writer.close()
            self.handlers.discard(task)

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, nth: int
    ) -> bool:
        request_line = await reader.readline()
        if not request_line:
            if reader.at_eof():
                self.disconnected.set()  # the client left before (or between) requests
            return False
        method, path, _ = request_line.decode().split(" ", 2)
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(ReceivedRequest(method, path, headers, json.loads(body or b"null")))
        exchange = Exchange(reader, writer, nth)
        assert self.script is not None, "set server.script before calling it"
        await self.script(exchange)
        if exchange.client_gone():
            self.disconnected.set()
        return exchange.keep_alive and not exchange.client_gone()


@pytest.fixture(autouse=True)
def no_proxy_from_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripted upstreams are asked directly, whatever proxy the machine names."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
async def llm_server() -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    await server.start()
    yield server
    # Every handler has ended by now unless the client left a request hanging.
    idle = await server.wait_idle(2.0)
    await server.stop()
    assert idle, "a server handler was still running after the test"


GeneratorFactory = Callable[..., OpenAIGenerator]


@pytest.fixture
async def make_generator(llm_server: ScriptedServer) -> AsyncIterator[GeneratorFactory]:
    made: list[OpenAIGenerator] = []

    def make(**overrides: Any) -> OpenAIGenerator:
        options: dict[str, Any] = {
            "base_url": llm_server.base_url,
            "model": "test-model",
            "api_key": "sk-test",
            "timeout_seconds": 10,
            "connect_timeout": 2,
            "read_timeout": 2,
        }
        options.update(overrides)
        made.append(OpenAIGenerator(**options))
        return made[-1]

    yield make
    # Closing the pools ends the handlers that wait on kept-alive connections.
    for gen in made:
        await gen.aclose()


@pytest.fixture
def generator(make_generator: GeneratorFactory) -> OpenAIGenerator:
    return make_generator()


def chunk(
    content: str | None = None,
    finish: str | None = None,
    *,
    usage: dict[str, int] | None = None,
    refusal: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """One chat.completion.chunk as OpenAI streams it."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if refusal is not None:
        delta["refusal"] = refusal
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, only usage."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


# --- helpers -----------------------------------------------------------------------------

REQUEST = GenerationRequest(
    messages=[
        PromptMessage("system", 'Cite as [N].\n[1] (Source: "paris.md") Paris is in France.'),
        PromptMessage("user", "What is the capital of France?"),
    ],
    temperature=0.1,
    max_output_tokens=64,
)
SECRET = "sk-live-0123456789abcdef"


async def answer_ok(ex: Exchange) -> None:
    """A whole stream answering "ok", then stop."""
    await ex.start_stream()
    await ex.event(chunk("ok", "stop"))
    await ex.event("[DONE]")
    await ex.end_stream()


async def collect(
    gen: OpenAIGenerator, request: GenerationRequest = REQUEST
) -> tuple[list[str], Finished]:
    events: list[GenerationEvent] = [e async for e in gen.generate(request)]
    finals = [e for e in events if isinstance(e, Finished)]
    assert len(finals) == 1 and events[-1] is finals[0], events
    return [e.text for e in events if isinstance(e, TextPiece)], finals[0]


async def answer_once_per_connection(ex: Exchange) -> None:
    """What llama-server does: a connection is closed after its first stream, so a request
    sent on it again finds it closed."""
    if ex.nth > 1:
        ex.writer.close()
        return
    await answer_ok(ex)


async def open_together(server: ScriptedServer, gen: OpenAIGenerator, count: int) -> None:
    """`count` answers at once, each on a connection of its own that stays pooled: each waits
    for the others, so none frees its connection for another, whatever the scheduling."""
    all_in = asyncio.Barrier(count)

    async def answer_together(ex: Exchange) -> None:
        await all_in.wait()
        await answer_ok(ex)

    server.script = answer_together
    answers = await asyncio.gather(*(collect(gen) for _ in range(count)))
    assert [pieces for pieces, _ in answers] == [["ok"]] * count
    assert server.connections == count


async def failure(
    gen: OpenAIGenerator, request: GenerationRequest = REQUEST
) -> tuple[Unavailable, list[str]]:
    pieces: list[str] = []
    with pytest.raises(Unavailable) as info:
        async for event in gen.generate(request):
            assert isinstance(event, TextPiece), "no Finished before a failure"
            pieces.append(event.text)
    return info.value, pieces


def assert_no_secret(err: Unavailable) -> None:
    assert SECRET not in err.message
    assert all(SECRET not in value for value in err.metadata.values())


# --- streaming ---------------------------------------------------------------------------


async def test_streams_pieces_then_one_finished_with_the_server_usage(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("", role="assistant"))
        await ex.event(chunk("Paris is the capital"))
        await ex.event(chunk(" of France ["))
        await ex.event(chunk("1]."))
        await ex.event(chunk(finish="stop"))
        await ex.event(usage_chunk(31, 9))
        await ex.event("[DONE]")
        await ex.end_stream()

    llm_server.script = script
    pieces, finished = await collect(generator)

    # Each read's events come out as one piece; how the events fall into reads is the network's.
    assert "".join(pieces) == "Paris is the capital of France [1]."
    assert finished == Finished(FinishReason.STOP, 31, 9)
    [received] = llm_server.requests
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")
    assert received.headers["authorization"] == "Bearer sk-test"
    assert received.body == {
        "model": "test-model",
        "messages": [{"role": m.role, "content": m.content} for m in REQUEST.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.1,
        "max_tokens": 64,
        "seed": 0,
    }


async def test_the_request_model_wins_and_no_key_sends_no_authorization(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    llm_server.script = answer_ok
    gen = make_generator(base_url=llm_server.base_url + "/v1/", api_key=None)
    request = GenerationRequest(messages=REQUEST.messages, model="other-model")
    await collect(gen, request)
    await collect(gen)

    first, second = llm_server.requests
    assert first.path == second.path == "/v1/chat/completions"
    assert first.body["model"] == "other-model"
    assert second.body["model"] == "test-model"
    assert "authorization" not in first.headers


async def test_events_split_anywhere_across_chunks_are_reassembled(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    first = json.dumps(chunk("Tokyo [")).encode()
    second = json.dumps(chunk("2]")).encode()
    # One JSON object spread over two data lines: SSE joins them with a newline.
    spread = b'data: {"choices": [{"index": 0,\r\ndata: "delta": {"content": "!"}}]}\r\n\r\n'

    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.chunk(b": keep-alive\r\n\r\n")
        await ex.chunk(b"data: " + first[:9])
        await ex.chunk(first[9:] + b"\r")  # the CR here, its LF in the next chunk
        await ex.chunk(b"\n\r\nevent: message\ndata: " + second + b"\n\n" + spread[:5])
        await ex.chunk(spread[5:])
        await ex.chunk(b"data: " + json.dumps(chunk(finish="stop")).encode() + b"\r\r")
        await ex.chunk(b"data: [DONE]\n\n")
        await ex.event(chunk("after the end"))
        await ex.end_stream()

    llm_server.script = script
    pieces, finished = await collect(generator)

    assert "".join(pieces) == "Tokyo [2]!"
    assert finished.reason is FinishReason.STOP


async def test_without_usage_the_token_counts_are_estimated(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris [1]."))
        await ex.event(chunk(" It is in France.", "stop"))
        await ex.event("[DONE]")
        await ex.end_stream()

    llm_server.script = script
    pieces, finished = await collect(generator)

    prompt = "".join(m.content for m in REQUEST.messages)
    assert finished == Finished(
        FinishReason.STOP, estimate_tokens(prompt), estimate_tokens("".join(pieces))
    )


async def test_finish_length_is_reported(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        usage = {"prompt_tokens": 5, "completion_tokens": 2}
        await ex.event(chunk("Paris is", "length", usage=usage))
        await ex.end_stream()  # no [DONE]: the finish_reason is enough

    llm_server.script = script
    pieces, finished = await collect(generator)

    assert pieces == ["Paris is"]
    assert finished == Finished(FinishReason.LENGTH, 5, 2)


async def test_a_server_that_ignores_stream_true_still_answers(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    completion = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"content": "Paris [1]."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 4},
    }

    async def script(ex: Exchange) -> None:
        await ex.reply(200, json.dumps(completion))

    llm_server.script = script
    pieces, finished = await collect(generator)

    assert pieces == ["Paris [1]."]
    assert finished == Finished(FinishReason.STOP, 20, 4)


# --- refusals and upstream errors --------------------------------------------------------


async def test_finish_content_filter_is_a_refusal(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("I will"))
        await ex.event(chunk(finish="content_filter"))
        await ex.event("[DONE]")
        await ex.end_stream()

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == ["I will"]
    assert err.reason == "LLM_REFUSED"
    assert err.metadata["partial"] == "true"
    assert err.metadata["model"] == "test-model"


async def test_a_refusal_in_the_delta_is_a_refusal(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk(refusal="I can't help with that."))
        await ex.event(chunk(finish="stop"))
        await ex.event("[DONE]")
        await ex.end_stream()

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == []
    assert err.reason == "LLM_REFUSED"
    assert "partial" not in err.metadata
    assert "help" not in err.message


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (500, "LLM_UNAVAILABLE"),
        (503, "LLM_UNAVAILABLE"),
        (401, "LLM_AUTH_FAILED"),
        (403, "LLM_AUTH_FAILED"),
        (429, "LLM_RATE_LIMITED"),
        (400, "LLM_REJECTED"),
        (404, "LLM_REJECTED"),
        (504, "LLM_TIMEOUT"),
    ],
)
async def test_http_errors_map_to_a_reason_and_keep_the_body_out_of_the_error(
    llm_server: ScriptedServer,
    generator: OpenAIGenerator,
    caplog: pytest.LogCaptureFixture,
    status: int,
    reason: str,
) -> None:
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {SECRET}"}})

    async def script(ex: Exchange) -> None:
        await ex.reply(status, body, headers={"retry-after": "7"})

    llm_server.script = script
    with caplog.at_level(logging.WARNING, logger="services.llm.openai_compat"):
        err, pieces = await failure(generator)

    assert pieces == []
    assert err.reason == reason
    assert err.metadata["upstream_status"] == str(status)
    if status == 429:
        assert err.metadata["retry_after_seconds"] == "7"
    assert_no_secret(err)
    # The operator still gets the upstream's words, in the log.
    assert SECRET in caplog.text


async def test_malformed_json_is_a_bad_response(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris"))
        await ex.event('{"choices": [{"delta": {"content": "is')
        await ex.event(chunk(" the capital", "stop"))
        await ex.end_stream()

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == ["Paris"]
    assert err.reason == "LLM_BAD_RESPONSE"
    assert err.metadata["partial"] == "true"


@pytest.mark.parametrize(
    "garbage",
    [
        '["a", "list"]',
        '{"choices": {"index": 0}}',
        '{"choices": [{"index": 0, "delta": {"content": 42}}]}',
        '{"choices": [{"index": 0, "delta": "text"}]}',
    ],
)
async def test_well_formed_json_of_the_wrong_shape_is_a_bad_response(
    llm_server: ScriptedServer, generator: OpenAIGenerator, garbage: str
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(garbage)
        await ex.end_stream()

    llm_server.script = script
    err, _ = await failure(generator)
    assert err.reason == "LLM_BAD_RESPONSE"


async def test_a_line_without_end_is_cut_off_as_a_bad_response(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.chunk(b"data: " + b"x" * (1 << 20) + b"x")
        await ex.wait_client_gone()

    llm_server.script = script
    err, _ = await failure(generator)
    assert err.reason == "LLM_BAD_RESPONSE"


async def test_an_error_object_in_the_stream_fails_the_answer(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris"))
        await ex.event(
            {"error": {"message": f"upstream crashed near {SECRET}", "type": "server_error"}}
        )
        await ex.end_stream()

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == ["Paris"]
    assert err.reason == "LLM_UPSTREAM_ERROR"
    assert err.metadata["upstream_error_type"] == "server_error"
    assert err.metadata["partial"] == "true"
    assert_no_secret(err)


async def test_a_stream_that_ends_without_finishing_is_a_bad_response(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris is"))
        await ex.end_stream()

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == ["Paris is"]
    assert err.reason == "LLM_BAD_RESPONSE"


async def test_a_connection_dropped_mid_stream_is_unavailable(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris is"))
        ex.writer.close()  # no terminating chunk: the body is cut

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == ["Paris is"]
    assert err.reason == "LLM_UNAVAILABLE"
    assert err.metadata["partial"] == "true"


async def test_a_body_its_content_encoding_cannot_decode_is_a_bad_response(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        ex.writer.write(
            b"HTTP/1.1 200 Scripted\r\ncontent-type: text/event-stream\r\n"
            b"content-encoding: gzip\r\ncontent-length: 12\r\n\r\nnot gzipped!"
        )
        await ex.writer.drain()
        ex.keep_alive = True

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == []
    assert err.reason == "LLM_BAD_RESPONSE"


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 2x0 Odd\r\ncontent-length: 0\r\n\r\n",  # a status line that is not one
        b"HTTP/1.1 200 OK\r\nx-padding: " + b"x" * 9000 + b"\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 5\r\n\r\nabc",
    ],
    ids=["status-line", "header-too-long", "two-lengths"],
)
async def test_a_response_head_that_cannot_be_read_is_a_bad_response(
    llm_server: ScriptedServer, generator: OpenAIGenerator, head: bytes
) -> None:
    # aiohttp reports these as a ClientResponseError with status 400, two causes deep.
    async def script(ex: Exchange) -> None:
        ex.writer.write(head)
        await ex.writer.drain()
        ex.writer.close()

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == []
    assert err.reason == "LLM_BAD_RESPONSE"


async def test_a_body_shorter_than_its_length_is_unavailable(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        ex.writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 500\r\n\r\n"
            + b"data: "
            + json.dumps(chunk("Paris is")).encode()
            + b"\n\n"
        )
        await ex.writer.drain()
        ex.writer.close()  # the connection ends before the length it promised

    llm_server.script = script
    err, pieces = await failure(generator)

    assert pieces == ["Paris is"]
    assert err.reason == "LLM_UNAVAILABLE"


async def test_nothing_listening_is_unavailable() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()

    gen = OpenAIGenerator(f"http://127.0.0.1:{port}", "m", connect_timeout=2)
    try:
        err, _ = await failure(gen)
    finally:
        await gen.aclose()
    assert err.reason == "LLM_UNAVAILABLE"


async def test_a_kept_alive_connection_the_server_closed_is_retried_on_a_new_one(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    llm_server.script = answer_once_per_connection
    for _ in range(3):
        pieces, _finished = await collect(generator)
        assert pieces == ["ok"]

    # The second answer tried the first one's connection, then a new one, closed after it;
    # the third found none kept and opened one.
    assert len(llm_server.requests) == 4
    assert llm_server.connections == 3


async def test_an_answer_gets_through_when_every_kept_connection_was_closed(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    # After a burst against llama-server every kept connection is closed, and the closes can
    # reach the client after its next request: that request is sent again on a new
    # connection, not on another kept one.
    gen = make_generator()
    await open_together(llm_server, gen, 3)

    llm_server.script = answer_once_per_connection
    assert (await collect(gen))[0] == ["ok"]
    assert len(llm_server.requests) == 3 + 2
    assert llm_server.connections == 3 + 1


async def test_a_request_the_server_keeps_dropping_is_sent_at_most_twice(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    # Three kept-alive connections, then a server that reads each request and drops the
    # connection (as one does that a prompt crashes): the request is sent again once, on a
    # new connection, and not a third time.
    gen = make_generator()
    await open_together(llm_server, gen, 3)

    async def crash(ex: Exchange) -> None:
        ex.writer.close()

    llm_server.script = crash
    err, _ = await failure(gen)

    assert err.reason == "LLM_UNAVAILABLE"
    assert len(llm_server.requests) == 3 + 2
    assert llm_server.connections == 3 + 1


async def test_a_cookie_the_upstream_sets_is_not_sent_back(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    # By name, not address: aiohttp's jar keeps no cookies for an IP address anyway.
    async def script(ex: Exchange) -> None:
        ex.writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"set-cookie: AWSALB=backend-7; Path=/\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        await ex.event(chunk("ok", "stop"))
        await ex.event("[DONE]")
        await ex.end_stream()

    llm_server.script = script
    gen = make_generator(base_url=f"http://localhost:{llm_server.port}/v1")
    for _ in range(2):
        assert (await collect(gen))[0] == ["ok"]

    assert [r.headers.get("cookie") for r in llm_server.requests] == [None, None]


@pytest.mark.parametrize(("keepalive", "connections"), [(30.0, 1), (0.05, 2)])
async def test_an_idle_connection_is_kept_for_the_next_answer_as_long_as_configured(
    llm_server: ScriptedServer, make_generator: GeneratorFactory, keepalive: float, connections: int
) -> None:
    llm_server.script = answer_ok
    generator = make_generator(keepalive_seconds=keepalive)
    for _ in range(2):
        pieces, _finished = await collect(generator)
        assert pieces == ["ok"]
        await asyncio.sleep(0.3)  # idle between answers: longer than 0.05 s, far below 30 s

    # The second answer asked on the first one's connection unless it had expired.
    assert len(llm_server.requests) == 2
    assert llm_server.connections == connections


@pytest.mark.parametrize(
    ("credentials", "proxy_authorization"),
    [("user:p%40ss@", "Basic " + base64.b64encode(b"user:p@ss").decode()), ("", None)],
)
async def test_an_answer_goes_through_the_proxy_the_environment_names(
    llm_server: ScriptedServer,
    make_generator: GeneratorFactory,
    monkeypatch: pytest.MonkeyPatch,
    credentials: str,
    proxy_authorization: str | None,
) -> None:
    # The scripted server stands in for the proxy, which is asked for the whole URL. The API
    # key is the upstream's: aiohttp sends a session's Authorization to a proxy named per
    # request as Proxy-Authorization.
    monkeypatch.setenv("HTTP_PROXY", f"http://{credentials}127.0.0.1:{llm_server.port}")
    llm_server.script = answer_ok
    gen = make_generator(base_url="http://llm.invalid:8080/v1")

    assert (await collect(gen))[0] == ["ok"]
    (request,) = llm_server.requests
    assert request.path == "http://llm.invalid:8080/v1/chat/completions"
    assert request.headers.get("proxy-authorization") == proxy_authorization
    assert request.headers["authorization"] == "Bearer sk-test"


async def test_a_host_the_environment_exempts_is_asked_directly(
    llm_server: ScriptedServer, make_generator: GeneratorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    llm_server.script = answer_ok
    gen = make_generator()

    assert (await collect(gen))[0] == ["ok"]
    assert llm_server.requests[0].path == "/v1/chat/completions"


@pytest.mark.parametrize("proxy", ["http://user:s3cret@proxy:99999", "http://user:s3cret@[::1"])
def test_a_proxy_that_is_not_a_url_stops_the_generator_being_made(
    monkeypatch: pytest.MonkeyPatch, proxy: str
) -> None:
    # Not at the first request, where every answer failed with the URL, password and all, in
    # the log.
    monkeypatch.setenv("HTTP_PROXY", proxy)
    with pytest.raises(ValueError, match="HTTP_PROXY") as info:
        OpenAIGenerator("http://llm.invalid:8080/v1", "m")
    assert "s3cret" not in str(info.value)


async def test_a_netrc_entry_for_the_upstream_does_not_stop_a_keyed_request(
    llm_server: ScriptedServer,
    make_generator: GeneratorFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # aiohttp, trusting the environment, took the entry as credentials and then refused to send
    # them beside the API key's Authorization header.
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    llm_server.script = answer_ok
    gen = make_generator()

    assert (await collect(gen))[0] == ["ok"]
    assert llm_server.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_an_answer_hands_no_job_to_the_event_loop_executor(
    llm_server: ScriptedServer, make_generator: GeneratorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's database reads and embeddings queue on that executor; an answer's request
    # must not wait behind them (aiohttp's trust_env read the environment there, twice).
    llm_server.script = answer_ok
    gen = make_generator()
    await collect(gen)  # the first answer opens the pool
    loop = asyncio.get_running_loop()
    jobs: list[Any] = []
    run_in_executor = loop.run_in_executor

    def counted(executor: Any, func: Any, *args: Any) -> Any:
        jobs.append(func)
        return run_in_executor(executor, func, *args)

    monkeypatch.setattr(loop, "run_in_executor", counted)
    for _ in range(3):
        assert (await collect(gen))[0] == ["ok"]
    assert jobs == []


def test_the_default_keepalive_outlives_httpx_own_five_seconds() -> None:
    generator = OpenAIGenerator("http://127.0.0.1:1", "m")
    assert generator.keepalive_seconds == KEEPALIVE_SECONDS > 5
    with pytest.raises(ValueError, match="keepalive"):
        OpenAIGenerator("http://127.0.0.1:1", "m", keepalive_seconds=0)


async def test_a_new_connection_closed_without_an_answer_is_not_retried(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    async def script(ex: Exchange) -> None:
        ex.writer.close()

    llm_server.script = script
    err, _ = await failure(generator)

    assert err.reason == "LLM_UNAVAILABLE"
    assert len(llm_server.requests) == 1


# --- timeouts ----------------------------------------------------------------------------


async def test_a_stall_between_chunks_hits_the_read_timeout(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris"))
        await ex.wait_client_gone()

    llm_server.script = script
    err, pieces = await failure(make_generator(read_timeout=0.3, timeout_seconds=30))

    assert pieces == ["Paris"]
    assert (err.reason, err.metadata["timeout"]) == ("LLM_TIMEOUT", "read")
    await asyncio.wait_for(llm_server.disconnected.wait(), 1.0)


async def test_a_server_that_never_answers_hits_the_deadline(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.wait_client_gone()

    llm_server.script = script
    err, _ = await failure(make_generator(timeout_seconds=1.0, read_timeout=30))

    assert (err.reason, err.metadata["timeout"]) == ("LLM_TIMEOUT", "deadline")
    assert len(llm_server.requests) == 1
    await asyncio.wait_for(llm_server.disconnected.wait(), 1.0)


async def test_a_stall_after_the_finish_still_ends_the_answer(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris.", "stop"))
        await ex.wait_client_gone()  # the usage chunk and [DONE] never come

    llm_server.script = script
    pieces, finished = await collect(make_generator(read_timeout=0.3))

    assert pieces == ["Paris."]
    assert finished.reason is FinishReason.STOP
    assert finished.completion_tokens == estimate_tokens("Paris.")


async def test_a_steady_stream_longer_than_the_read_timeout_is_not_cut(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        for i in range(12):  # 1.2 s in all, four times the read timeout
            await ex.event(chunk(f"w{i} "))
            await asyncio.sleep(0.1)
        await ex.event(chunk(finish="stop"))
        await ex.chunk("data: [DONE]\n\n")
        await ex.end_stream()

    llm_server.script = script
    pieces, finished = await collect(make_generator(read_timeout=0.3))

    assert "".join(pieces) == "".join(f"w{i} " for i in range(12))
    assert finished.reason is FinishReason.STOP


async def test_reads_are_timed_by_one_timer_per_answer_not_one_per_chunk(
    llm_server: ScriptedServer, generator: OpenAIGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A timer per read filled the event loop's heap with cancelled timers at 100 streams.
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        for i in range(300):
            await ex.event(chunk(f"w{i} "))
            for _ in range(3):  # the client reads each chunk on its own
                await asyncio.sleep(0)
        await ex.event(chunk(finish="stop"))
        await ex.chunk("data: [DONE]\n\n")
        await ex.end_stream()

    llm_server.script = script
    loop = asyncio.get_running_loop()
    timers = 0
    call_at = loop.call_at

    def counted(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        return call_at(*args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counted)
    pieces, finished = await collect(generator)

    assert finished.reason is FinishReason.STOP
    assert len(pieces) >= 100, "the chunks were read together; the test needs separate reads"
    # A few for the request (its deadline, the pool, the connection) and the body's timer
    # moved at most twice (first token, drain): none per chunk.
    assert timers <= 10


# --- cancellation ------------------------------------------------------------------------


def endless_script(server: ScriptedServer) -> Script:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        for i in range(1000):
            if ex.client_gone():
                server.disconnected.set()
                return
            await ex.event(chunk(f"word{i} "))
            server.events_sent += 1
            await asyncio.sleep(0.02)

    return script


async def test_aclose_after_two_pieces_closes_the_upstream_at_once(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    llm_server.script = endless_script(llm_server)
    stream = generator.generate(REQUEST)
    pieces = []
    async for event in stream:
        assert isinstance(event, TextPiece)
        pieces.append(event.text)
        if len(pieces) == 2:
            break
    await stream.aclose()  # what the servicer does when the gRPC client cancels

    await asyncio.wait_for(llm_server.disconnected.wait(), 1.0)
    assert await llm_server.wait_idle(1.0), "the server handler is still streaming"
    assert pieces == ["word0 ", "word1 "]
    assert llm_server.events_sent < 1000


async def test_cancelling_the_consuming_task_closes_the_upstream_at_once(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    llm_server.script = endless_script(llm_server)
    two_pieces = asyncio.Event()

    async def consume() -> None:
        count = 0
        async for _ in generator.generate(REQUEST):
            count += 1
            if count == 2:
                two_pieces.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(two_pieces.wait(), 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await asyncio.wait_for(llm_server.disconnected.wait(), 1.0)
    assert await llm_server.wait_idle(1.0), "the server handler is still streaming"
    assert llm_server.events_sent < 1000


def test_an_abandoned_answer_over_tls_ends_its_connection_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On uvloop, the server's loop, closing a TLS connection says goodbye (close_notify) and
    # waits up to 30 s for the peer's. An upstream that streams without reading never answers:
    # it went on generating, and the socket stayed open, for those 30 s after the answer was
    # given up. An abandoned connection is cut instead.
    ca = trustme.CA()
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    listener = socket.create_server(("127.0.0.1", 0))
    ended = threading.Event()

    def stream_without_reading() -> None:
        try:
            raw, _ = listener.accept()
            with server_tls.wrap_socket(raw, server_side=True) as conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    read = conn.recv(65536)
                    if not read:
                        return  # the client left before asking
                    request += read
                conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                event = f"data: {json.dumps(chunk('x'))}\n\n".encode()
                while True:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                    time.sleep(0.01)
        except OSError:
            ended.set()  # the connection was cut (or the listener closed: the test has failed)

    threading.Thread(target=stream_without_reading, daemon=True).start()
    gen = OpenAIGenerator(f"https://127.0.0.1:{listener.getsockname()[1]}", "m")

    async def give_up_after_the_first_piece() -> None:
        answer = gen.generate(REQUEST)
        assert isinstance(await anext(answer), TextPiece)
        await answer.aclose()
        await gen.aclose()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(give_up_after_the_first_piece())
            assert ended.wait(5.0), "the upstream still streams into the abandoned connection"
    finally:
        listener.close()


# --- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "endpoint"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/chat/completions"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/chat/completions"),
        ("http://localhost:11434/v1", "http://localhost:11434/v1/chat/completions"),
        ("https://api.example.com/v1/", "https://api.example.com/v1/chat/completions"),
        ("https://gw.example.com/llm", "https://gw.example.com/llm/v1/chat/completions"),
        (
            "https://gw.example.com/v1/chat/completions",
            "https://gw.example.com/v1/chat/completions",
        ),
    ],
)
def test_the_endpoint_is_found_from_the_base_url(base_url: str, endpoint: str) -> None:
    assert chat_completions_url(base_url) == endpoint


@pytest.mark.parametrize("base_url", ["localhost:8080", "ftp://example.com", "http://"])
def test_a_base_url_that_is_not_http_is_refused(base_url: str) -> None:
    with pytest.raises(ValueError):
        OpenAIGenerator(base_url, "m")


# --- coalescing and the connection pool --------------------------------------------------


async def test_events_of_one_read_come_out_as_one_piece(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    words = ["Paris ", "is ", "in ", "France ", "[1", "]."]

    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.chunk("".join(f"data: {json.dumps(chunk(w))}\n\n" for w in words))
        await ex.event(chunk(finish="stop"))
        await ex.chunk("data: [DONE]\n\n")
        await ex.end_stream()

    llm_server.script = script
    pieces, _ = await collect(generator)

    assert pieces == ["".join(words)]


async def test_a_piece_is_not_held_back_waiting_for_the_next_read(
    llm_server: ScriptedServer, generator: OpenAIGenerator
) -> None:
    first_seen = asyncio.Event()

    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris "))
        # The second event is sent only once the first has reached the consumer.
        await asyncio.wait_for(first_seen.wait(), 5.0)
        await ex.event(chunk("is in France.", "stop"))
        await ex.chunk("data: [DONE]\n\n")
        await ex.end_stream()

    llm_server.script = script
    pieces = []
    async for event in generator.generate(REQUEST):
        if isinstance(event, TextPiece):
            pieces.append(event.text)
            first_seen.set()

    assert pieces == ["Paris ", "is in France."]


async def test_a_full_pool_is_resource_exhausted_not_the_models_fault(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    llm_server.script = endless_script(llm_server)
    gen = make_generator(max_connections=1, pool_timeout=0.2)
    holding = gen.generate(REQUEST)
    assert isinstance(await anext(holding), TextPiece)  # the one connection is now busy

    with pytest.raises(ResourceExhausted) as info:
        await collect(gen)
    await holding.aclose()

    assert info.value.code.name == "RESOURCE_EXHAUSTED"
    assert info.value.reason == "LLM_POOL_EXHAUSTED"
    assert info.value.metadata == {"max_connections": "1"}
    assert "model" not in info.value.message


async def test_a_request_waits_for_a_pooled_connection_to_come_free(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.start_stream()
        await ex.event(chunk("Paris.", "stop"))
        await asyncio.sleep(0.2)
        await ex.chunk("data: [DONE]\n\n")
        await ex.end_stream()

    llm_server.script = script
    gen = make_generator(max_connections=1, pool_timeout=5)
    answers = await asyncio.gather(collect(gen), collect(gen), collect(gen))

    assert [pieces for pieces, _ in answers] == [["Paris."]] * 3
    assert llm_server.connections == 1


async def test_the_pool_holds_as_many_answers_as_it_has_connections_and_frees_them(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    llm_server.script = endless_script(llm_server)
    gen = make_generator(max_connections=5, pool_timeout=0.3)
    holding = [gen.generate(REQUEST) for _ in range(5)]
    for answer in holding:
        assert isinstance(await anext(answer), TextPiece)

    assert llm_server.connections == 5
    with pytest.raises(ResourceExhausted):
        await collect(gen)
    for answer in holding:
        await answer.aclose()  # each closes its connection: its answer was never read out

    llm_server.script = answer_ok
    answers = await asyncio.gather(*(collect(gen) for _ in range(5)))
    assert [pieces for pieces, _ in answers] == [["ok"]] * 5


async def test_answers_after_a_burst_reuse_its_kept_alive_connections(
    llm_server: ScriptedServer, make_generator: GeneratorFactory
) -> None:
    gen = make_generator(max_connections=8)
    await open_together(llm_server, gen, 6)
    llm_server.script = answer_ok
    again = await asyncio.gather(*(collect(gen) for _ in range(6)))

    assert [pieces for pieces, _ in again] == [["ok"]] * 6
    assert llm_server.connections == 6  # no new connection for the second burst


async def test_answers_do_not_search_the_path_for_a_module_on_every_request(
    llm_server: ScriptedServer, make_generator: GeneratorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # httpcore, the client before aiohttp, imported sniffio whenever it made a lock, and a
    # missing one was searched for anew: 93 us each time, nine times an answer.
    llm_server.script = answer_ok
    gen = make_generator()
    await collect(gen)
    searched: list[str] = []
    find_spec = importlib.machinery.PathFinder.find_spec

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        searched.append(name)
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", counted)
    for _ in range(3):
        assert (await collect(gen))[0] == ["ok"]
    assert searched == []


def test_a_generator_answers_again_under_a_later_event_loop() -> None:
    # A script that calls asyncio.run twice: the first loop's connections cannot serve the
    # second, which opens its own.
    started = threading.Event()
    serving: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        server = ScriptedServer(answer_ok)
        loop.run_until_complete(server.start())
        serving.update(server=server, loop=loop)
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert started.wait(5.0)
        server: ScriptedServer = serving["server"]
        gen = OpenAIGenerator(server.base_url, "m")
        for _ in range(2):
            pieces, _finished = asyncio.run(collect(gen))
            assert pieces == ["ok"]
        asyncio.run(gen.aclose())
        assert server.connections == 2
    finally:
        serving["loop"].call_soon_threadsafe(serving["loop"].stop)
        thread.join(5.0)


def test_the_pool_size_defaults_to_what_the_open_file_limit_allows() -> None:
    gen = OpenAIGenerator("http://127.0.0.1:1", "m")
    assert 16 <= gen.max_connections <= 4096
    assert OpenAIGenerator("http://127.0.0.1:1", "m", max_connections=7).max_connections == 7
    with pytest.raises(ValueError):
        OpenAIGenerator("http://127.0.0.1:1", "m", max_connections=0)
